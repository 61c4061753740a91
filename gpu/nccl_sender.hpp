#pragma once
// A trainer rank's side of the nccl backend: one thread sends the groups
// engine workers asked for over the rank's link, one at a time in the order
// asked (NCCL's non-blocking mode takes an operation only once the last
// polled done), each against the deadline its puller gave. It also runs
// the collective baseline: one version broadcast bucket by bucket to every
// member, packing bucket i + 1 while bucket i is on the wire (or, from the
// device, filling each bucket into the staging in turn). With several
// trainer ranks the collective runs on the rank's own communicator (a
// second link, `root`, where it is rank 0); one thread serves both links,
// so that this rank's device never runs two of its communicators at once.
//
//   submit ─▶ [queue, bounded] ─▶ thread: init done? ─▶ expired? drop ─▶ send ─▶ wait_for(deadline)
//                                          │ failed, past the deadline, a member dead,
//                                          ▼ or the sender stopping
//                                   abort the link; failure() says why
//
// NCCL cannot recover a communicator once an operation on it failed, so the
// first failure ends this sender: every later submit is refused, and the
// coordinator rebuilds the communicator without the dead member at the next
// boundary (nccl_group.hpp's decide()).
#include "gpu/nccl_link.hpp"
#include "runtime/base/bounded_queue.hpp"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

namespace rlsync::gpu {

class nccl_sender {
public:
  struct job {
    std::shared_ptr<const std::vector<std::uint8_t>> bytes;
    int peer = 0;              ///< the worker's NCCL rank
    clock::time_point deadline; ///< when the worker stops waiting
    std::string what;           ///< "group 3 to engine rollout-0 worker 1"
    /// Instead of bytes: `fill_bytes` bytes written into the link's staging
    /// by `fill` (packed on the device, device_pack.hpp).
    std::function<void(void* staging)> fill;
    std::size_t fill_bytes = 0;
  };

  /// `buckets` broadcasts from this rank to every member (each a bucket of
  /// one or more whole groups: nccl_manifest::packed).
  struct collective {
    std::size_t buckets = 0;
    /// Packs bucket i into `out` (resizing it). Called on the sender's
    /// thread: bucket i + 1 while bucket i is on the wire (two buffers, as
    /// vLLM's packed broadcast). What it throws fails the communicator.
    std::function<void(std::size_t i, std::vector<std::uint8_t>& out)> pack;
    clock::time_point deadline; ///< when the members stop waiting
    std::string what;           ///< "version 3 to every member"
    /// Instead of pack: bucket i is `fill_bytes[i]` bytes written into the
    /// link's staging by `fill` (from the rank's device copy): bucket i + 1
    /// is filled once bucket i polled done (one staging). `prepare`, when
    /// set, runs first for bucket 0, then for bucket i + 1 while bucket i is
    /// on the wire: the work of a fill that needs no staging (a checksum).
    /// What either throws fails the communicator.
    std::function<void(std::size_t i, void* staging)> fill;
    std::vector<std::size_t> fill_bytes;
    std::function<void(std::size_t i)> prepare;
  };

  /// Serves `link` (must not be null) from a thread of its own; at most
  /// `queue_bound` sends wait. `hooks`: comm_wait's world (tests). `root`:
  /// the link collectives broadcast on (this rank's own communicator, whose
  /// rank 0 it must be); null: `link`.
  nccl_sender(std::shared_ptr<p2p_link> link, std::size_t queue_bound, wait_hooks hooks = {},
              std::shared_ptr<p2p_link> root = nullptr);
  /// Stops the thread; a send in flight is aborted with the link (bounded by
  /// one poll interval, never by a peer).
  ~nccl_sender();
  nccl_sender(const nccl_sender&) = delete;
  nccl_sender& operator=(const nccl_sender&) = delete;

  /// Queues `j`. Empty when queued, else why not: the link failed, the
  /// queue is full, the peer is not another member, the bytes exceed the
  /// link's capacity.
  std::string submit(job j);
  /// Queues `c`, behind the sends queued before it. Empty when queued, else
  /// why not (the link failed, the queue is full, nothing to broadcast).
  std::string submit(collective c);

  const comm_layout& layout() const { return layout_; }
  int rank() const { return rank_; }
  std::size_t capacity() const { return capacity_; }
  /// The link collectives use: its communicator, this rank in it, its staging.
  const comm_layout& collective_layout() const { return root_->layout(); }
  int collective_rank() const { return root_->rank(); }
  std::size_t collective_capacity() const { return root_->capacity(); }
  /// Why the link failed; empty while it serves.
  std::string failure() const;
  /// Groups whose send completed.
  std::uint64_t sent() const { return sent_.load(); }
  /// Sends and collectives dropped unposted: their deadline passed while they queued.
  std::uint64_t expired() const { return expired_.load(); }
  /// Buckets whose broadcast completed.
  std::uint64_t broadcast() const { return broadcast_.load(); }

  /// How long the communicator's init may take at least (every member joins).
  static constexpr std::chrono::seconds init_wait{60};

private:
  void run();
  void send_one(const job& j);
  void broadcast_all(const collective& c);
  clock::time_point now() const;
  void fail(const std::string& why);

  std::shared_ptr<p2p_link> link_;
  std::shared_ptr<p2p_link> root_; ///< where collectives broadcast: link_ unless a rank's own communicator
  const comm_layout layout_;
  const int rank_;
  const std::size_t capacity_;
  wait_hooks hooks_;
  bounded_queue<std::variant<job, collective>> queue_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> sent_{0};
  std::atomic<std::uint64_t> expired_{0};
  std::atomic<std::uint64_t> broadcast_{0};
  mutable std::mutex mutex_;
  std::string failure_;
  std::thread thread_;
};

} // namespace rlsync::gpu
