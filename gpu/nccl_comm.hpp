#pragma once
// NCCL communicators driven by comm_wait's loop: created non-blocking
// (ncclCommInitRankConfig with blocking = 0) and aborted, never waited on
// blindly. Every call returns at once; wait_for() decides when to give up.
//
// Built without NCCL (nccl_stub.cpp), make_nccl_id and start throw
// gpu_error "rlsync was built without NCCL".
#include "gpu/comm_wait.hpp"
#include "gpu/nccl_group.hpp"

#include <cstddef>
#include <memory>
#include <vector>

namespace rlsync::gpu {

/// A new unique id (ncclGetUniqueId). The process that makes it is the
/// communicator's root: NCCL opens its bootstrap listening socket here (on
/// the interface NCCL_SOCKET_IFNAME names; see the README's security
/// model). Throws gpu_error.
nccl_id make_nccl_id();

/// One send or receive of a sharded transfer, enqueued in one NCCL group.
struct p2p_op {
  bool send = true;
  int peer = 0;         ///< NCCL rank
  void* data = nullptr; ///< device memory
  std::size_t bytes = 0;
};

class nccl_comm final : public communicator {
public:
  /// Begins joining communicator `id` as `rank` of `size` on CUDA device
  /// `device`; returns at once: drive it with wait_for() until done.
  /// Throws gpu_error when NCCL or CUDA refuse at once.
  static std::unique_ptr<nccl_comm> start(const nccl_id& id, int rank, int size, int device);
  ~nccl_comm() override; ///< aborts if not yet aborted (never blocks on peers)

  comm_poll poll(std::string& why) override;
  void abort() override;

  /// ncclBroadcast of `bytes` at `data` (device memory) from `root`, in
  /// place, on the communicator's stream. Only once the init, and the last
  /// operation, polled done (NCCL's non-blocking rule). Throws gpu_error.
  void enqueue_broadcast(void* data, std::size_t bytes, int root);
  /// The sends and receives of one step of a sharded pull, as one NCCL group.
  void enqueue_p2p(const std::vector<p2p_op>& ops);

  int rank() const;
  int size() const;

private:
  struct state;
  explicit nccl_comm(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

} // namespace rlsync::gpu
