#pragma once
// A bounded multi-producer queue with deadlines. Producers never block: a full
// queue refuses (the caller reports queue_full). Consumers wait at most until
// a deadline. close() wakes everyone; a closed queue refuses pushes and drains.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>

namespace rlsync {

template <class T>
class bounded_queue {
public:
  explicit bounded_queue(std::size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  /// Appends `x` unless the queue is full or closed; returns whether it did.
  bool try_push(T x) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_ || items_.size() >= capacity_)
        return false;
      items_.push_back(std::move(x));
    }
    ready_.notify_one();
    return true;
  }

  /// Takes the oldest item, waiting until `deadline` at most. Empty result on
  /// timeout, or when the queue is closed and drained.
  template <class Clock, class Duration>
  std::optional<T> pop_until(std::chrono::time_point<Clock, Duration> deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait_until(lock, deadline, [&] { return closed_ || !items_.empty(); });
    return take(lock);
  }

  /// Takes the oldest item if there is one, without waiting.
  std::optional<T> try_pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    return take(lock);
  }

  /// Refuses further pushes and wakes every waiting consumer.
  void close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    ready_.notify_all();
  }

  bool closed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return closed_;
  }

  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return items_.size();
  }

  std::size_t capacity() const { return capacity_; }

private:
  std::optional<T> take(std::unique_lock<std::mutex>&) {
    if (items_.empty())
      return std::nullopt;
    T x = std::move(items_.front());
    items_.pop_front();
    return x;
  }

  const std::size_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<T> items_;
  bool closed_ = false;
};

} // namespace rlsync
