// Built without NCCL: the entry points say so and nothing pretends to run.
#include "gpu/device.hpp"
#include "gpu/kernels.hpp"
#include "gpu/nccl_comm.hpp"

namespace rlsync::gpu {

std::string nccl_version() { return {}; }

namespace {
[[noreturn]] void unavailable() { throw gpu_error("rlsync was built without NCCL"); }
} // namespace

struct nccl_comm::state {};

nccl_id make_nccl_id() { unavailable(); }
std::unique_ptr<nccl_comm> nccl_comm::start(const nccl_id&, int, int, int) { unavailable(); }
nccl_comm::nccl_comm(std::unique_ptr<state> s) : s_(std::move(s)) {}
nccl_comm::~nccl_comm() = default;
comm_poll nccl_comm::poll(std::string& why) {
  why = "rlsync was built without NCCL";
  return comm_poll::failed;
}
void nccl_comm::abort() {}
void nccl_comm::enqueue_broadcast(void*, std::size_t, int) { unavailable(); }
void nccl_comm::enqueue_p2p(const std::vector<p2p_op>&) { unavailable(); }
int nccl_comm::rank() const { return 0; }
int nccl_comm::size() const { return 0; }

} // namespace rlsync::gpu
