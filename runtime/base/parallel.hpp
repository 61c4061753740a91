#pragma once
// One way to fan work out over threads, shared by the loader, the weight
// sources and the in-process data plane.
#include <algorithm>
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

namespace rlsync {

/// Runs job(i) for every i in [0, n) on `threads` threads (the caller's
/// among them; at most n), indices dealt round robin. Waits for all, then
/// rethrows the exception of the lowest-numbered thread that threw. A
/// thread the system cannot start leaves its share to the caller.
template <class Job>
void parallel_for(std::size_t n, std::size_t threads, Job job) {
  threads = std::max<std::size_t>(1, std::min(threads, n));
  std::vector<std::exception_ptr> errors(threads);
  auto run = [&](std::size_t t) {
    try {
      for (std::size_t i = t; i < n; i += threads)
        job(i);
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  std::size_t started = 1;
  try {
    pool.reserve(threads - 1);
    for (; started < threads; ++started)
      pool.emplace_back(run, started);
  } catch (...) { // out of threads or memory: the shares not started run here
  }
  run(0);
  for (std::size_t t = started; t < threads; ++t)
    run(t);
  for (auto& th : pool)
    th.join();
  for (auto& e : errors)
    if (e)
      std::rethrow_exception(e);
}

} // namespace rlsync
