#include "gpu/nccl_sender.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace rlsync::gpu {

nccl_sender::nccl_sender(std::shared_ptr<p2p_link> link, std::size_t queue_bound, wait_hooks hooks,
                         std::shared_ptr<p2p_link> root)
  : link_(link ? std::move(link) : throw std::invalid_argument("an nccl sender without a link")),
    root_(root ? std::move(root) : link_), layout_(link_->layout()), rank_(link_->rank()), capacity_(link_->capacity()),
    hooks_(std::move(hooks)), queue_(queue_bound) {
  if (root_ != link_ && (root_->rank() != 0 || root_->layout().epoch != layout_.epoch))
    throw std::invalid_argument("an nccl sender's own communicator must have it as rank 0, in epoch "
                                + std::to_string(layout_.epoch));
  // Stopping counts as a dead member: a send in flight ends at the next poll.
  hooks_.dead_member = [this, dead = std::move(hooks_.dead_member)]() -> std::optional<std::string> {
    if (stopping_.load())
      return std::string("the trainer's nccl sender is stopping");
    return dead ? dead() : std::nullopt;
  };
  thread_ = std::thread([this] { run(); });
}

nccl_sender::~nccl_sender() {
  stopping_ = true;
  queue_.close();
  thread_.join();
  link_->abort();
  root_->abort();
}

std::string nccl_sender::submit(job j) {
  if (auto why = failure(); !why.empty())
    return "the communicator of epoch " + std::to_string(layout_.epoch) + " failed (" + why
           + "): it is rebuilt at the next sync boundary";
  if (!j.bytes && !j.fill)
    return "no bytes to send";
  try {
    check_p2p(layout_, rank_, j.peer, j.bytes ? j.bytes->size() : j.fill_bytes, capacity_, "nccl send");
  } catch (const std::exception& e) {
    return e.what();
  }
  if (!queue_.try_push(std::move(j)))
    return "the send queue is full or closed";
  return {};
}

std::string nccl_sender::submit(collective c) {
  if (auto why = failure(); !why.empty())
    return "the communicator of epoch " + std::to_string(layout_.epoch) + " failed (" + why
           + "): it is rebuilt at the next sync boundary";
  if (c.buckets == 0 || (!c.pack && !c.fill))
    return "nothing to broadcast";
  if (c.fill && c.fill_bytes.size() != c.buckets)
    return "a filled broadcast needs the size of each of its " + std::to_string(c.buckets) + " buckets";
  for (std::size_t i = 0; c.fill && i < c.buckets; ++i)
    if (c.fill_bytes[i] > root_->capacity())
      return "bucket " + std::to_string(i) + " of " + std::to_string(c.fill_bytes[i]) + " bytes exceeds the staging's "
             + std::to_string(root_->capacity());
  if (!queue_.try_push(std::move(c)))
    return "the send queue is full or closed";
  return {};
}

std::string nccl_sender::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void nccl_sender::fail(const std::string& why) {
  link_->abort(); // wait_for may have already: aborting is idempotent
  root_->abort();
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure_.empty())
    failure_ = why;
}

clock::time_point nccl_sender::now() const { return hooks_.now ? hooks_.now() : clock::now(); }

void nccl_sender::run() {
  bool initialized = false, root_initialized = root_ == link_;
  while (true) {
    auto next = queue_.pop_until(clock::now() + std::chrono::milliseconds(100));
    if (!next) {
      if (queue_.closed())
        return;
      continue;
    }
    // After a failure, queued sends are dropped: their workers' receives
    // end at their own deadlines, as they would against a dead trainer.
    if (!failure().empty() || stopping_.load())
      continue;
    const auto deadline = std::visit([](const auto& x) { return x.deadline; }, *next);
    // An init waits for every member's join, not for one worker: it gets
    // its own bound rather than the first job's, which may be short.
    auto await_init = [&](p2p_link& l, bool& done, const std::string& what) {
      if (done)
        return true;
      auto init = wait_for(l, std::max(deadline, now() + init_wait), what, hooks_);
      if (!init.ok())
        fail(init.why);
      return done = init.ok();
    };
    if (!await_init(*link_, initialized, "init of epoch " + std::to_string(layout_.epoch)))
      continue;
    if (std::holds_alternative<collective>(*next)
        && !await_init(*root_, root_initialized,
                       "init of trainer rank " + std::to_string(root_->layout().members[0].rank)
                         + "'s own communicator, epoch " + std::to_string(layout_.epoch)))
      continue;
    // Its worker stopped waiting: posted now, the send could only time out
    // and take the communicator down with it for everyone.
    if (now() >= deadline) {
      ++expired_;
      continue;
    }
    if (const auto* j = std::get_if<job>(&*next))
      send_one(*j);
    else
      broadcast_all(std::get<collective>(*next));
  }
}

void nccl_sender::send_one(const job& j) {
  try {
    if (j.bytes)
      link_->send(j.bytes->data(), j.bytes->size(), j.peer);
    else
      link_->send_filled(j.fill, j.fill_bytes, j.peer);
  } catch (const std::exception& e) {
    fail(j.what + ": " + e.what());
    return;
  }
  auto done = wait_for(*link_, j.deadline, j.what, hooks_);
  if (!done.ok()) {
    fail(done.why);
    return;
  }
  ++sent_;
}

// Bucket i + 1 is made ready while bucket i is on the wire: packed into the
// second of two host buffers, or, for buckets filled from the device, its
// preparation (the link's one staging takes bucket i + 1 only once bucket
// i's broadcast polled done).
void nccl_sender::broadcast_all(const collective& c) {
  std::vector<std::uint8_t> on_wire, next;
  auto ahead = [&](std::size_t i) {
    try {
      if (!c.fill)
        c.pack(i, next);
      else if (c.prepare)
        c.prepare(i);
      return true;
    } catch (const std::exception& e) {
      fail(c.what + (c.fill ? ": preparing bucket " : ": packing bucket ") + std::to_string(i) + ": " + e.what());
      return false;
    }
  };
  if (!ahead(0))
    return;
  for (std::size_t i = 0; i < c.buckets; ++i) {
    const auto what = c.what + ", bucket " + std::to_string(i) + " of " + std::to_string(c.buckets);
    try {
      if (c.fill) {
        root_->broadcast_filled([&](void* staging) { c.fill(i, staging); }, c.fill_bytes[i]);
      } else {
        std::swap(on_wire, next);
        root_->broadcast(on_wire.data(), on_wire.size(), root_->rank());
      }
    } catch (const std::exception& e) {
      fail(what + ": " + e.what());
      return;
    }
    if (i + 1 < c.buckets && !ahead(i + 1))
      return; // the link is aborted: every member's wait ends
    auto done = wait_for(*root_, c.deadline, what, hooks_);
    if (!done.ok()) {
      fail(done.why);
      return;
    }
    ++broadcast_;
  }
}

} // namespace rlsync::gpu
