#pragma once
// Waiting on an NCCL communicator without ever hanging. NCCL's blocking
// calls wait forever on a dead peer (TRL, vime and vLLM each have an issue
// of a broadcast hung for 600 s); rlsync creates communicators
// non-blocking and drives every wait (init and each transfer) from this
// loop, which polls the communicator, asks who died, and aborts on the
// first of: an error, a dead member, the phase deadline.
//
//   poll -> done ------------------------------------------> done
//        -> failed ------------------------------> abort --> failed
//        -> in progress -> a member died? ------> abort --> peer_dead
//                        -> past the deadline? -> abort --> deadline
//                        -> sleep (never past the deadline), poll again
//
// The communicator is behind an interface so that the loop is tested with
// a fake one (tests/gpu) and runs NCCL's (nccl_comm.hpp) on a device.
#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace rlsync::gpu {

using clock = std::chrono::steady_clock;

/// What polling reports, as ncclCommGetAsyncError (and the stream of the
/// last enqueued operation) does: still running, finished, or failed.
enum class comm_poll { in_progress, done, failed };

class communicator {
public:
  virtual ~communicator() = default;
  /// Non-blocking. On failed, `why` says what NCCL or CUDA reported.
  virtual comm_poll poll(std::string& why) = 0;
  /// ncclCommAbort: unblocks every enqueued operation and frees the
  /// communicator. Idempotent; nothing may be enqueued after it.
  virtual void abort() = 0;
};

struct wait_outcome {
  enum class kind { done, failed, peer_dead, deadline };
  kind result = kind::done;
  std::string why; ///< empty when done
  bool ok() const { return result == kind::done; }
};

const char* to_string(wait_outcome::kind k);

/// The world the loop lives in; the defaults are the real clock and sleep.
struct wait_hooks {
  std::function<clock::time_point()> now = [] { return clock::now(); };
  std::function<void(clock::duration)> sleep;
  /// A member of this communicator that died (the coordinator's view), or
  /// nullopt. Null: never asked.
  std::function<std::optional<std::string>()> dead_member;
  clock::duration poll_every = std::chrono::microseconds(200);
};

/// Drives `c` until it is done or must be aborted (see the diagram); aborts
/// it at most once. `what` names the operation in the outcome ("init of
/// epoch 3", "broadcast of group 7").
wait_outcome wait_for(communicator& c, clock::time_point deadline, const std::string& what,
                      const wait_hooks& hooks = {});

} // namespace rlsync::gpu
