#include "gpu/ipc_producer.hpp"

#include "runtime/base/checked.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace rlsync::gpu {

ipc_producer::ipc_producer(std::shared_ptr<ipc_memory> memory, std::size_t slot_bytes, std::size_t slots,
                           std::size_t workers_per_engine)
  : memory_(std::move(memory)), slot_bytes_(slot_bytes), slots_(slots), workers_per_engine_(workers_per_engine),
    next_session_(static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) | 1) {
  if (!memory_)
    throw std::invalid_argument("an IPC producer without device memory");
  if (slot_bytes == 0 || slots == 0)
    throw std::invalid_argument("an IPC producer of " + std::to_string(slots) + " slots of "
                                + std::to_string(slot_bytes) + " bytes");
  if (!checked_mul(slot_bytes, slots))
    throw std::invalid_argument("an IPC producer of " + std::to_string(slots) + " slots of "
                                + std::to_string(slot_bytes) + " bytes overflows");
  // At start: a device without the memory fails the node now, not its first sync.
  buffer_ = memory_->allocate(slot_bytes_ * slots_);
  stats_.buffer_bytes = buffer_->size();
}

ipc_producer::consumer& ipc_producer::slot_for(const std::string& who) {
  if (auto it = consumers_.find(who); it != consumers_.end())
    return it->second;
  std::size_t slot = consumers_.size();
  if (consumers_.size() == slots_) {
    // Every slot is assigned: take the first whose consumer has no session
    // open (it finished, gave up, or its engine is gone).
    auto idle = consumers_.begin();
    while (idle != consumers_.end() && idle->second.book.open())
      ++idle;
    if (idle == consumers_.end())
      throw std::runtime_error("every one of the " + std::to_string(slots_) + " IPC slots is in an open session");
    slot = idle->second.slot;
    consumers_.erase(idle);
  }
  auto& c = consumers_[who];
  c.slot = slot;
  return c;
}

ipc_placement ipc_producer::place(const std::string& who, std::uint64_t session, std::uint32_t chunk,
                                  const std::uint8_t* bytes, std::size_t n) {
  return place_with(who, session, chunk, n, [&](std::size_t offset) { buffer_->write(offset, bytes, n); });
}

ipc_placement ipc_producer::place_from_device(const std::string& who, std::uint64_t session, std::uint32_t chunk,
                                              const std::vector<pack_device::piece>& pieces) {
  std::size_t n = 0;
  for (const auto& p : pieces) {
    if (p.bytes > slot_bytes_ - std::min(n, slot_bytes_))
      throw std::runtime_error("a chunk of more than " + std::to_string(slot_bytes_)
                               + " bytes does not fit an IPC slot of " + std::to_string(slot_bytes_));
    n += p.bytes;
  }
  return place_with(who, session, chunk, n, [&](std::size_t offset) {
    for (const auto& p : pieces) {
      buffer_->write_from_device(offset, p.data, p.bytes);
      offset += p.bytes;
    }
  });
}

std::shared_ptr<pack_device> ipc_producer::packer() const { return memory_->packer(); }

ipc_placement ipc_producer::place_with(const std::string& who, std::uint64_t session, std::uint32_t chunk,
                                       std::size_t n, const std::function<void(std::size_t offset)>& write) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (n > slot_bytes_)
    throw std::runtime_error("a chunk of " + std::to_string(n) + " bytes does not fit an IPC slot of "
                             + std::to_string(slot_bytes_));
  if (chunk == 0) {
    if (session != 0)
      throw std::runtime_error(who + " asked for chunk 0 of session " + std::to_string(session)
                               + "; chunk 0 begins a session and names none");
    auto& c = slot_for(who);
    if (c.book.open()) {
      c.book.abort();
      ++stats_.aborted;
    }
    if (auto why = c.book.begin(next_session_++, {who}); !why.empty())
      throw std::runtime_error(why);
    ++stats_.sessions;
  }
  auto it = consumers_.find(who);
  if (it == consumers_.end() || !it->second.book.open())
    throw std::runtime_error(who + " asked for chunk " + std::to_string(chunk) + " of session "
                             + std::to_string(session) + " and has no session open");
  auto& c = it->second;
  if (chunk > 0) {
    if (session != c.book.session())
      throw std::runtime_error(who + " asked for chunk " + std::to_string(chunk) + " of session "
                               + std::to_string(session) + "; its session is " + std::to_string(c.book.session()));
    if (chunk != c.book.next_chunk())
      throw std::runtime_error(who + " asked for chunk " + std::to_string(chunk) + "; the next is "
                               + std::to_string(c.book.next_chunk()));
    if (auto why = c.book.ack(session, who, chunk - 1); !why.empty())
      throw std::runtime_error(why);
  }
  const std::size_t offset = c.slot * slot_bytes_;
  try {
    write(offset);
  } catch (...) {
    c.book.abort(); // the consumer gets the error and no chunk: nothing of the session is awaited
    ++stats_.aborted;
    throw;
  }
  if (auto why = c.book.publish(); !why.empty())
    throw std::runtime_error(why);
  ++stats_.chunks;
  stats_.bytes += n;
  ipc_placement p;
  p.session = c.book.session();
  p.chunk = chunk;
  p.handle = buffer_->handle();
  p.buffer_bytes = buffer_->size();
  p.offset = offset;
  p.bytes = n;
  return p;
}

void ipc_producer::release(const std::string& who, std::uint64_t session) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = consumers_.find(who);
  if (it == consumers_.end() || !it->second.book.open() || it->second.book.session() != session)
    return;
  // The consumer has copied what it read: nothing it holds is still awaited.
  it->second.book.abort();
}

ipc_producer_stats ipc_producer::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

} // namespace rlsync::gpu
