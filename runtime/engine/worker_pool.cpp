#include "runtime/engine/worker_pool.hpp"

#include <stdexcept>

namespace rlsync::engine {

namespace {
// Polls of the barrier generation before blocking: about a microsecond or
// two, enough to catch a partner that is nearly there.
constexpr int spin_polls = 2000;
} // namespace

worker_pool::worker_pool(int size) : size_(size) {
  if (size < 1)
    throw std::invalid_argument("engine worker pool: size must be at least 1");
  killed_.assign(static_cast<std::size_t>(size), false);
  threads_.reserve(static_cast<std::size_t>(size - 1));
  for (int w = 1; w < size; ++w)
    threads_.emplace_back([this, w] { thread_main(w); });
}

worker_pool::~worker_pool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  job_cv_.notify_all();
  for (auto& t : threads_)
    t.join();
}

void worker_pool::fail(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_)
      error_ = e;
  }
  {
    std::lock_guard<std::mutex> lock(barrier_mutex_);
    broken_ = true;
  }
  barrier_cv_.notify_all();
}

void worker_pool::kill(int worker) {
  if (worker < 0 || worker >= size_)
    throw std::out_of_range("engine worker pool: no worker " + std::to_string(worker));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    killed_[static_cast<std::size_t>(worker)] = true;
    int none = -1;
    dead_.compare_exchange_strong(none, worker);
  }
  job_cv_.notify_all(); // its thread wakes and ends
}

void worker_pool::run(const std::function<void(int)>& fn) {
  if (auto w = dead_.load(); w >= 0)
    throw worker_died("engine worker " + std::to_string(w) + " died");
  {
    // No worker is inside a barrier between runs; reset before publishing.
    std::lock_guard<std::mutex> lock(barrier_mutex_);
    arrived_ = 0;
    broken_ = false;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    running_ = size_;
    error_ = nullptr;
    ++job_generation_;
  }
  job_cv_.notify_all();
  try {
    fn(0);
  } catch (const worker_pool_broken&) {
  } catch (...) {
    fail(std::current_exception());
  }
  std::unique_lock<std::mutex> lock(mutex_);
  --running_;
  done_cv_.wait(lock, [this] { return running_ == 0; });
  job_ = nullptr;
  if (error_)
    std::rethrow_exception(error_);
}

void worker_pool::thread_main(int worker) {
  std::uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const auto killed = [&] { return killed_[static_cast<std::size_t>(worker)]; };
      job_cv_.wait(lock, [&] { return stopping_ || killed() || job_generation_ != seen; });
      if (stopping_)
        return;
      if (killed()) {
        if (job_generation_ != seen) { // a run counts on this worker: fail it, do not hang it
          lock.unlock();
          fail(std::make_exception_ptr(worker_died("engine worker " + std::to_string(worker) + " died")));
          lock.lock();
          if (--running_ == 0)
            done_cv_.notify_one();
        }
        return;
      }
      seen = job_generation_;
      job = job_;
    }
    try {
      (*job)(worker);
    } catch (const worker_pool_broken&) {
    } catch (...) {
      fail(std::current_exception());
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (--running_ == 0)
      done_cv_.notify_one();
  }
}

void worker_pool::barrier() {
  if (size_ == 1)
    return;
  std::unique_lock<std::mutex> lock(barrier_mutex_);
  if (broken_)
    throw worker_pool_broken{};
  const std::uint64_t generation = barrier_generation_.load();
  if (++arrived_ == size_) {
    arrived_ = 0;
    barrier_generation_.store(generation + 1);
    lock.unlock();
    barrier_cv_.notify_all();
    return;
  }
  lock.unlock();
  for (int i = 0; i < spin_polls; ++i)
    if (barrier_generation_.load(std::memory_order_acquire) != generation || broken_.load())
      break;
  lock.lock();
  barrier_cv_.wait(lock, [&] { return barrier_generation_.load() != generation || broken_.load(); });
  if (barrier_generation_.load() == generation)
    throw worker_pool_broken{};
}

} // namespace rlsync::engine
