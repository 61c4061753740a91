#pragma once
// The producer side of the cuda_ipc backend: one device buffer, exported
// once and reused, split into one slot per consumer (an engine worker).
// A consumer's pull of a version is one session: it asks for chunk 0, 1,
// ... in order; each chunk is written into its slot and the consumer copies
// it out of its mapping before asking for the next, which acks the one
// before. Slots per consumer keep consumers independent: a slow or dead
// worker never holds up another, and nothing waits on it (the next chunk
// 0 it asks for, or its release, ends its session; an idle slot is given
// to a new consumer when every slot is taken).
//
// Session numbers start from the steady clock at construction, so they
// grow across a restarted producer on the same host (consumers refuse a
// session that does not grow: ipc_consumer_session).
#include "gpu/device_pack.hpp"
#include "gpu/ipc_memory.hpp"
#include "gpu/ipc_session.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace rlsync::gpu {

/// Where a consumer finds one chunk.
struct ipc_placement {
  std::uint64_t session = 0;
  std::uint32_t chunk = 0;
  ipc_handle handle{};
  std::uint64_t buffer_bytes = 0;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

struct ipc_producer_stats {
  std::uint64_t sessions = 0;  ///< sessions begun
  std::uint64_t aborted = 0;   ///< ended by a new chunk 0 or a failed write, not a release
  std::uint64_t chunks = 0;    ///< chunks written
  std::uint64_t bytes = 0;     ///< bytes written
  std::size_t buffer_bytes = 0; ///< the exported buffer
};

class ipc_producer {
public:
  /// `slots` consumers at once, each chunk at most `slot_bytes`. Allocates
  /// the buffer (slots x slot_bytes, overflow-checked) now. Throws
  /// std::invalid_argument for zero sizes or an overflowing product,
  /// gpu_error when the device cannot hold it.
  /// `workers_per_engine`: the most workers any engine has (the topology's
  /// largest tp), which bounds the slots one engine's consumers can hold;
  /// 0: unbounded. The trainer refuses a worker index at or past it.
  ipc_producer(std::shared_ptr<ipc_memory> memory, std::size_t slot_bytes, std::size_t slots,
               std::size_t workers_per_engine = 0);

  /// Writes chunk `chunk` of consumer `who` (`n` bytes at `bytes`) into its
  /// slot. Chunk 0 with session 0 begins a new session (ending one `who`
  /// still had open); chunk k > 0 names the session chunk 0 began and acks
  /// chunk k - 1. Throws std::runtime_error saying why a request is refused
  /// (out of order, a chunk larger than a slot, every slot busy), gpu_error
  /// when the device fails (the session then ends: nothing is awaited).
  ipc_placement place(const std::string& who, std::uint64_t session, std::uint32_t chunk,
                      const std::uint8_t* bytes, std::size_t n);
  /// As place(), the chunk being `pieces` of memory from packer() (the
  /// producer's device copy of a version) laid back to back, copied device
  /// to device.
  ipc_placement place_from_device(const std::string& who, std::uint64_t session, std::uint32_t chunk,
                                  const std::vector<pack_device::piece>& pieces);
  /// Where this producer keeps its copies of versions (the memory's).
  std::shared_ptr<pack_device> packer() const;
  /// `who` copied out what it wanted of session `session`, or gave up: its
  /// session ends and its slot is free. Another session's release is ignored.
  void release(const std::string& who, std::uint64_t session);

  ipc_producer_stats stats() const;
  std::size_t workers_per_engine() const { return workers_per_engine_; }

private:
  struct consumer {
    std::size_t slot = 0;
    ipc_producer_session book{1};
  };
  consumer& slot_for(const std::string& who);
  ipc_placement place_with(const std::string& who, std::uint64_t session, std::uint32_t chunk, std::size_t n,
                           const std::function<void(std::size_t offset)>& write);

  std::shared_ptr<ipc_memory> memory_;
  std::size_t slot_bytes_;
  std::size_t slots_;
  std::size_t workers_per_engine_;
  mutable std::mutex mutex_;
  std::unique_ptr<ipc_memory::buffer> buffer_;
  std::map<std::string, consumer> consumers_; ///< at most slots_
  std::uint64_t next_session_;
  ipc_producer_stats stats_;
};

} // namespace rlsync::gpu
