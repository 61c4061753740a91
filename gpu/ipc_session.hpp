#pragma once
// The bookkeeping of the cuda_ipc backend, as two pure state machines the
// transports drive and the CPU tests check. A producer owns one reusable
// device buffer of `slots` chunk slots; per session (one version's start
// .. finish bracket) it exports the buffer once (cudaIpcGetMemHandle),
// every consumer maps it once (cudaIpcOpenMemHandle), and chunks flow
// through the slots: the producer packs chunk k into slot k % slots, each
// consumer copies it out and acks; a slot is reused once every consumer
// still alive has acked. Abort (a deadline, a dead producer) releases the
// session on both sides: no mapping outlives it, no ack is awaited from
// the dead.
//
//   producer:  idle --begin--> open --publish/ack*--> finish --> idle
//                                 \--abort (any time)----------> idle
//   consumer:  idle --open(s)--> mapped(s) --chunk k, k+1..--> close(s) --> idle
//                      \ a newer s while mapped: unmap the old one first
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace rlsync::gpu {

class ipc_producer_session {
public:
  /// `slots` chunks in flight at once (2: double-buffered), at least 1.
  explicit ipc_producer_session(std::size_t slots = 2);

  /// Opens session `session` (newer than any before) for `consumers`.
  /// Returns "" (then export the buffer and send the handle) or why not.
  std::string begin(std::uint64_t session, const std::vector<std::string>& consumers);
  /// The slot chunk `next_chunk()` goes into (next_chunk() % slots), or
  /// nullopt while the chunk that slot last held is not acked by every live
  /// consumer (acks may come out of order), or no session is open.
  std::optional<std::size_t> free_slot() const;
  std::uint32_t next_chunk() const { return next_chunk_; }
  /// Announces chunk next_chunk() as packed into free_slot(). "" or why not.
  std::string publish();
  /// Consumer `who` has copied chunk `chunk` of `session` out. "" or why the
  /// ack is refused (another session's: a late ack of an aborted one must
  /// not free a slot of the next; an unknown consumer; a chunk not
  /// outstanding; a second ack).
  std::string ack(std::uint64_t session, const std::string& who, std::uint32_t chunk);
  /// `who` died or left: its acks are no longer awaited.
  void consumer_gone(const std::string& who);
  /// Closes the session once every chunk is acked. "" or why not.
  std::string finish();
  /// Closes the session whatever its state; returns the consumers that
  /// must unmap it (every consumer still alive).
  std::vector<std::string> abort();

  bool open() const { return open_; }
  std::uint64_t session() const { return session_; }
  std::size_t outstanding() const { return pending_.size(); }

private:
  std::size_t slots_;
  bool open_ = false;
  std::uint64_t session_ = 0;
  std::uint32_t next_chunk_ = 0;
  std::set<std::string> consumers_;
  std::map<std::uint32_t, std::set<std::string>> pending_; ///< chunk -> consumers yet to ack
};

class ipc_consumer_session {
public:
  struct open_result {
    std::string error;                  ///< non-empty: refuse, map nothing
    std::optional<std::uint64_t> unmap; ///< a session still mapped: unmap it first
  };
  /// A handle for session `session` arrived. Sessions only move forward: an
  /// older or repeated one is a replay and refused.
  open_result open(std::uint64_t session);
  /// Chunk `chunk` of `session` is ready at [offset, offset + bytes) of a
  /// buffer of `buffer_bytes`. "" (copy it out, then ack) or why not: a
  /// session not mapped, a chunk out of order, a range outside the buffer
  /// (a producer that lies must not make us read out of bounds).
  std::string chunk(std::uint64_t session, std::uint32_t chunk, std::uint64_t offset, std::uint64_t bytes,
                    std::uint64_t buffer_bytes);
  /// The session ended (finish or abort): true when it was mapped and must
  /// now be unmapped.
  bool close(std::uint64_t session);

  std::optional<std::uint64_t> mapped() const { return mapped_; }

private:
  std::optional<std::uint64_t> mapped_;
  std::uint64_t last_session_ = 0;
  std::uint32_t next_chunk_ = 0;
};

} // namespace rlsync::gpu
