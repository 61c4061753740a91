#pragma once
// One member's end of an NCCL communicator as the nccl backend uses it: a
// trainer rank sends groups to engine workers point to point, or
// broadcasts buckets of whole groups to every member at once (the
// collective baseline). Host bytes go in and come out (or are used where
// they lie: use_received); each member stages them through one device
// buffer as large as the largest group, or a bucket if larger. (The
// built-in engine keeps its weights on the host; on a device it also copies
// them from the staging, use_received.)
//
// nccl_link() is NCCL's (nccl_comm.hpp, driven non-blocking); the CPU
// tests run the protocol above it over tests/gpu/fake_nccl_world.hpp, a
// world of members in host memory, so only the copies need a device.
//
// Like nccl_comm, a link takes one operation at a time: after send() or
// recv(), wait_for() it (comm_wait.hpp) before the next one.
#include "gpu/comm_wait.hpp"
#include "gpu/kernels.hpp" // gpu_error
#include "gpu/nccl_group.hpp"

#include <cstddef>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>

namespace rlsync::gpu {

class p2p_link : public communicator {
public:
  /// The layout of the communicator this link belongs to, and its rank in it.
  virtual const comm_layout& layout() const = 0;
  virtual int rank() const = 0;
  /// The most bytes one send or receive carries (the staging's size).
  virtual std::size_t capacity() const = 0;
  /// Copies `n` host bytes into staging and enqueues their send to NCCL
  /// rank `peer`. Throws gpu_error (an aborted link, an operation still
  /// running, a peer outside the communicator) or std::out_of_range past
  /// capacity().
  virtual void send(const std::uint8_t* host, std::size_t n, int peer) = 0;
  /// As send, with the staging filled where it lies by `fill` (called with
  /// the staging's address, this link's device current) instead of from
  /// host bytes: a producer packing on the device (device_pack.hpp).
  /// Throws as send, and what `fill` throws.
  virtual void send_filled(const std::function<void(void* staging)>& fill, std::size_t n, int peer) = 0;
  /// Enqueues the receive of `n` bytes from `peer` into staging. Throws as send.
  virtual void recv(std::size_t n, int peer) = 0;
  /// Enqueues a broadcast of `n` bytes from NCCL rank `root` to every
  /// member, a collective: every member calls it, in the same order, with
  /// the same `n` and `root`. The root passes its `n` host bytes (copied
  /// into staging first); the others pass nullptr and read() once it polled
  /// done. Throws as send.
  virtual void broadcast(const std::uint8_t* host, std::size_t n, int root) = 0;
  /// The root's broadcast (this rank's) with the staging filled where it
  /// lies by `fill`, as send_filled. Throws as broadcast, and what `fill` throws.
  virtual void broadcast_filled(const std::function<void(void* staging)>& fill, std::size_t n) = 0;
  /// Copies the last receive's (or broadcast's) first `n` bytes to host
  /// memory, once it polled done. Throws gpu_error or std::out_of_range.
  virtual void read(std::uint8_t* host, std::size_t n) = 0;
  /// Hands the last receive's (or broadcast's) first `n` bytes where they
  /// lie (the staging, on device `device`, current during the call) to
  /// `use`, once it polled done: a consumer keeping them on the device
  /// copies from there. Throws as read, and what `use` throws.
  virtual void use_received(const std::function<void(const void* staging, int device)>& use, std::size_t n) = 0;

  /// Held by whoever runs one exchange on the link (ask, receive, wait,
  /// read): an engine worker pulling from several trainer ranks at once
  /// (holder_pull.hpp) shares its one link between them. Take it with a
  /// deadline (try_lock_until): the holder's exchange is bounded by its own.
  std::timed_mutex& turn() { return turn_; }

private:
  std::timed_mutex turn_;
};

/// Joins `layout` (its epoch's unique id: `id`) as `rank` on CUDA device
/// `device`, with `capacity` bytes of device staging; returns at once:
/// wait_for() the init like any other operation. Throws gpu_error (built
/// without CUDA or NCCL, no device, out of memory) or
/// std::invalid_argument (a rank outside the layout).
std::unique_ptr<p2p_link> nccl_link(const nccl_id& id, comm_layout layout, int rank, int device, std::size_t capacity);

/// The checks every link makes before an operation; throws gpu_error or
/// std::out_of_range naming what is wrong.
void check_p2p(const comm_layout& layout, int rank, int peer, std::size_t n, std::size_t capacity, const char* what);
/// As check_p2p, for a broadcast: `root` is a member (possibly this one),
/// and the root passes bytes.
void check_broadcast(const comm_layout& layout, int rank, int root, const std::uint8_t* host, std::size_t n,
                     std::size_t capacity);

} // namespace rlsync::gpu
