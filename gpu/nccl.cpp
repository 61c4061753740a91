// NCCL behind nccl_comm.hpp. Every NCCL call below returns at once in
// non-blocking mode (ncclInProgress is not an error); completion is seen by
// poll() through ncclCommGetAsyncError and the stream.
#include "gpu/device.hpp"
#include "gpu/kernels.hpp"
#include "gpu/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

namespace rlsync::gpu {

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess)
    return {};
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "."
         + std::to_string(v % 100);
}

namespace {

static_assert(sizeof(ncclUniqueId) == nccl_id_bytes, "NCCL_UNIQUE_ID_BYTES changed");

bool started(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

void check_nccl(ncclResult_t r, const char* what) {
  if (!started(r))
    throw gpu_error(std::string(what) + ": " + ncclGetErrorString(r));
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw gpu_error(std::string(what) + ": " + cudaGetErrorString(e));
}

} // namespace

nccl_id make_nccl_id() {
  ncclUniqueId raw;
  check_nccl(ncclGetUniqueId(&raw), "ncclGetUniqueId");
  nccl_id id;
  std::memcpy(id.data(), &raw, id.size());
  return id;
}

struct nccl_comm::state {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0, rank = 0, size = 0;
  bool aborted = false;
  bool ready = false;      ///< init done and no operation running: NCCL takes the next call
  bool op_pending = false; ///< an enqueued operation the stream has not finished
};

nccl_comm::nccl_comm(std::unique_ptr<state> s) : s_(std::move(s)) {}

std::unique_ptr<nccl_comm> nccl_comm::start(const nccl_id& id, int rank, int size, int device) {
  auto s = std::make_unique<state>();
  s->device = device;
  s->rank = rank;
  s->size = size;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  check_cuda(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  ncclUniqueId raw;
  std::memcpy(&raw, id.data(), id.size());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = ncclCommInitRankConfig(&s->comm, size, raw, rank, &config);
  if (!started(r)) {
    cudaStreamDestroy(s->stream);
    throw gpu_error(std::string("ncclCommInitRankConfig: ") + ncclGetErrorString(r));
  }
  return std::unique_ptr<nccl_comm>(new nccl_comm(std::move(s)));
}

nccl_comm::~nccl_comm() {
  abort();
  if (s_->stream)
    cudaStreamDestroy(s_->stream);
}

comm_poll nccl_comm::poll(std::string& why) {
  if (s_->aborted) {
    why = "the communicator was aborted";
    return comm_poll::failed;
  }
  ncclResult_t async = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(s_->comm, &async);
  if (r != ncclSuccess) {
    why = std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(r);
    return comm_poll::failed;
  }
  if (async == ncclInProgress)
    return comm_poll::in_progress;
  if (async != ncclSuccess) {
    why = std::string(ncclGetErrorString(async)) + ": " + ncclGetLastError(s_->comm);
    return comm_poll::failed;
  }
  if (!s_->op_pending) {
    s_->ready = true;
    return comm_poll::done;
  }
  const cudaError_t q = cudaStreamQuery(s_->stream);
  if (q == cudaErrorNotReady)
    return comm_poll::in_progress;
  s_->op_pending = false;
  s_->ready = q == cudaSuccess;
  if (q != cudaSuccess) {
    why = std::string("stream: ") + cudaGetErrorString(q);
    return comm_poll::failed;
  }
  return comm_poll::done;
}

void nccl_comm::abort() {
  if (s_->aborted || !s_->comm)
    return;
  s_->aborted = true;
  ncclCommAbort(s_->comm); // frees the communicator and unblocks its kernels, whatever the peers do
  s_->comm = nullptr;
}

namespace {
/// In non-blocking mode NCCL takes a call only once the last one (and the
/// init) polled as done.
void require_ready(bool aborted, bool ready, const char* what) {
  if (aborted)
    throw gpu_error(std::string(what) + " on an aborted communicator");
  if (!ready)
    throw gpu_error(std::string(what) + " before the communicator's init or last operation finished: wait_for it first");
}
} // namespace

void nccl_comm::enqueue_broadcast(void* data, std::size_t bytes, int root) {
  require_ready(s_->aborted, s_->ready, "broadcast");
  check_cuda(cudaSetDevice(s_->device), "cudaSetDevice");
  s_->ready = false;
  check_nccl(ncclBroadcast(data, data, bytes, ncclUint8, root, s_->comm, s_->stream), "ncclBroadcast");
  s_->op_pending = true;
}

void nccl_comm::enqueue_p2p(const std::vector<p2p_op>& ops) {
  require_ready(s_->aborted, s_->ready, "send/recv");
  check_cuda(cudaSetDevice(s_->device), "cudaSetDevice");
  s_->ready = false;
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (const auto& op : ops) {
    const ncclResult_t r = op.send ? ncclSend(op.data, op.bytes, ncclUint8, op.peer, s_->comm, s_->stream)
                                   : ncclRecv(op.data, op.bytes, ncclUint8, op.peer, s_->comm, s_->stream);
    if (!started(r)) {
      ncclGroupEnd();
      throw gpu_error(std::string(op.send ? "ncclSend: " : "ncclRecv: ") + ncclGetErrorString(r));
    }
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  s_->op_pending = true;
}

int nccl_comm::rank() const { return s_->rank; }
int nccl_comm::size() const { return s_->size; }

} // namespace rlsync::gpu
