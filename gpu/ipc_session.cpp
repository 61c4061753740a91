#include "gpu/ipc_session.hpp"

#include "runtime/base/checked.hpp"

#include <algorithm>

namespace rlsync::gpu {

ipc_producer_session::ipc_producer_session(std::size_t slots) : slots_(std::max<std::size_t>(1, slots)) {}

std::string ipc_producer_session::begin(std::uint64_t session, const std::vector<std::string>& consumers) {
  if (open_)
    return "session " + std::to_string(session_) + " is still open";
  if (session <= session_)
    return "session " + std::to_string(session) + " is not newer than " + std::to_string(session_);
  if (consumers.empty())
    return "a session without consumers";
  open_ = true;
  session_ = session;
  next_chunk_ = 0;
  consumers_ = {consumers.begin(), consumers.end()};
  pending_.clear();
  return {};
}

std::optional<std::size_t> ipc_producer_session::free_slot() const {
  if (!open_)
    return std::nullopt;
  if (next_chunk_ >= slots_ && pending_.count(next_chunk_ - static_cast<std::uint32_t>(slots_)))
    return std::nullopt; // the slot's last chunk is still being read
  return next_chunk_ % slots_;
}

std::string ipc_producer_session::publish() {
  if (!open_)
    return "no session is open";
  if (!free_slot())
    return "the next slot still holds a chunk not yet acked";
  if (consumers_.empty())
    return "every consumer is gone";
  pending_[next_chunk_] = consumers_;
  ++next_chunk_;
  return {};
}

std::string ipc_producer_session::ack(std::uint64_t session, const std::string& who, std::uint32_t chunk) {
  if (!open_)
    return "no session is open";
  if (session != session_)
    return who + " acked chunk " + std::to_string(chunk) + " of session " + std::to_string(session)
           + "; session " + std::to_string(session_) + " is open";
  if (!consumers_.count(who))
    return who + " is not a consumer of session " + std::to_string(session_);
  auto it = pending_.find(chunk);
  if (it == pending_.end() || !it->second.count(who))
    return who + " acked chunk " + std::to_string(chunk) + ", which it does not hold";
  it->second.erase(who);
  if (it->second.empty())
    pending_.erase(it);
  return {};
}

void ipc_producer_session::consumer_gone(const std::string& who) {
  consumers_.erase(who);
  for (auto it = pending_.begin(); it != pending_.end();) {
    it->second.erase(who);
    it = it->second.empty() ? pending_.erase(it) : std::next(it);
  }
}

std::string ipc_producer_session::finish() {
  if (!open_)
    return "no session is open";
  if (!pending_.empty())
    return std::to_string(pending_.size()) + " chunk(s) not acked, the first " + std::to_string(pending_.begin()->first);
  open_ = false;
  consumers_.clear();
  return {};
}

std::vector<std::string> ipc_producer_session::abort() {
  std::vector<std::string> out(consumers_.begin(), consumers_.end());
  open_ = false;
  consumers_.clear();
  pending_.clear();
  return out;
}

ipc_consumer_session::open_result ipc_consumer_session::open(std::uint64_t session) {
  if (session <= last_session_)
    return {"session " + std::to_string(session) + " is not newer than " + std::to_string(last_session_)
              + " (a replay)",
            std::nullopt};
  open_result r{{}, mapped_};
  mapped_ = session;
  last_session_ = session;
  next_chunk_ = 0;
  return r;
}

std::string ipc_consumer_session::chunk(std::uint64_t session, std::uint32_t chunk, std::uint64_t offset,
                                        std::uint64_t bytes, std::uint64_t buffer_bytes) {
  if (mapped_ != session)
    return "chunk of session " + std::to_string(session) + ", which is not mapped";
  if (chunk != next_chunk_)
    return "chunk " + std::to_string(chunk) + " where " + std::to_string(next_chunk_) + " was next";
  const auto end = checked_add(offset, bytes);
  if (!end || *end > buffer_bytes)
    return "chunk " + std::to_string(chunk) + " at [" + std::to_string(offset) + ", +" + std::to_string(bytes)
           + ") lies outside the " + std::to_string(buffer_bytes) + "-byte buffer";
  ++next_chunk_;
  return {};
}

bool ipc_consumer_session::close(std::uint64_t session) {
  if (mapped_ != session)
    return false;
  mapped_.reset();
  return true;
}

} // namespace rlsync::gpu
