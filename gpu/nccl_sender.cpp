#include "gpu/nccl_sender.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace rlsync::gpu {

nccl_sender::nccl_sender(std::shared_ptr<p2p_link> link, std::size_t queue_bound, wait_hooks hooks)
  : link_(link ? std::move(link) : throw std::invalid_argument("an nccl sender without a link")),
    layout_(link_->layout()), rank_(link_->rank()), capacity_(link_->capacity()), hooks_(std::move(hooks)),
    queue_(queue_bound) {
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
}

std::string nccl_sender::submit(job j) {
  if (auto why = failure(); !why.empty())
    return "the communicator of epoch " + std::to_string(layout_.epoch) + " failed (" + why
           + "): it is rebuilt at the next sync boundary";
  if (!j.bytes)
    return "no bytes to send";
  try {
    check_p2p(layout_, rank_, j.peer, j.bytes->size(), capacity_, "nccl send");
  } catch (const std::exception& e) {
    return e.what();
  }
  if (!queue_.try_push(std::move(j)))
    return "the send queue is full or closed";
  return {};
}

std::string nccl_sender::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void nccl_sender::fail(const std::string& why) {
  link_->abort(); // wait_for may have already: aborting is idempotent
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure_.empty())
    failure_ = why;
}

clock::time_point nccl_sender::now() const { return hooks_.now ? hooks_.now() : clock::now(); }

void nccl_sender::run() {
  bool initialized = false;
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
    const auto& j = *next;
    if (!initialized) {
      // The init waits for every member's join, not for one worker: it gets
      // its own bound rather than the first job's, which may be short.
      const auto init_until = std::max(j.deadline, now() + init_wait);
      auto init = wait_for(*link_, init_until, "init of epoch " + std::to_string(layout_.epoch), hooks_);
      if (!init.ok()) {
        fail(init.why);
        continue;
      }
      initialized = true;
    }
    // Its worker stopped waiting: posted now, the send could only time out
    // and take the communicator down with it for everyone.
    if (now() >= j.deadline) {
      ++expired_;
      continue;
    }
    try {
      link_->send(j.bytes->data(), j.bytes->size(), j.peer);
    } catch (const std::exception& e) {
      fail(j.what + ": " + e.what());
      continue;
    }
    auto done = wait_for(*link_, j.deadline, j.what, hooks_);
    if (!done.ok()) {
      fail(done.why);
      continue;
    }
    ++sent_;
  }
}

} // namespace rlsync::gpu
