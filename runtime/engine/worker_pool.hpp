#pragma once
// The engine's tensor-parallel workers: a fixed set of threads that run one
// function together and meet at barriers inside it. Worker 0 is the calling
// thread, so tp = 1 costs no thread hand-off at all.
//
// Waiting is on condition variables, after a short bounded spin (a forward
// step crosses a barrier twice per layer, and a blocked wake-up costs tens
// of microseconds). Nothing ever sleeps for a fixed time.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace rlsync::engine {

class worker_pool {
public:
  /// Starts `size - 1` threads (size >= 1).
  explicit worker_pool(int size);
  ~worker_pool();
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  int size() const { return size_; }

  /// Runs fn(w) for every worker w in [0, size) at once and returns when all
  /// have returned. If any throws, barrier() throws in the others so that
  /// none waits forever, and run() rethrows the first exception. One run at
  /// a time (callers serialise).
  void run(const std::function<void(int)>& fn);

  /// From inside fn: returns once every worker has called it (the n-th time).
  void barrier();

  /// Fault injection (drills): worker `worker` dies — its thread ends — and
  /// every later run() throws worker_died at once instead of waiting for it.
  /// Meant for run()'s caller between runs; a kill that lands while a run is
  /// being handed out fails that run (worker_died) rather than hang it.
  void kill(int worker);
  /// The first worker that died, or -1.
  int dead() const { return dead_.load(); }

private:
  void thread_main(int worker);
  void fail(std::exception_ptr e);

  const int size_;
  std::vector<std::thread> threads_;

  // Job hand-off.
  std::mutex mutex_;
  std::condition_variable job_cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  std::uint64_t job_generation_ = 0;
  int running_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::vector<bool> killed_; ///< per worker, under mutex_
  std::atomic<int> dead_{-1};

  // Barrier: arrivals in this round, and a generation that flips when the
  // last one arrives. `broken_` releases every waiter after a failure.
  std::mutex barrier_mutex_;
  std::condition_variable barrier_cv_;
  int arrived_ = 0;
  std::atomic<std::uint64_t> barrier_generation_{0};
  std::atomic<bool> broken_{false};
};

/// Thrown by run() once a worker has died.
struct worker_died : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Thrown by barrier() in the other workers when one worker failed.
struct worker_pool_broken : std::exception {
  const char* what() const noexcept override { return "engine worker pool: another worker failed"; }
};

} // namespace rlsync::engine
