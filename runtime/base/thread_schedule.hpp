#pragma once
// How long the calling thread has run on a core, and how long it has waited
// runnable for one. On a host with fewer cores than busy threads the second
// is the time work queued behind other work: what a benchmark needs to tell
// a slow copy from a copy that was not running.
#include <chrono>
#include <optional>
#include <string_view>

namespace rlsync {

struct thread_schedule {
  std::chrono::nanoseconds ran{0};    ///< CPU time (CLOCK_THREAD_CPUTIME_ID)
  std::chrono::nanoseconds queued{0}; ///< runnable, waiting for a core (Linux schedstat)
  bool queued_known = false;          ///< whether the kernel keeps schedstat

  /// The calling thread's figures so far.
  static thread_schedule now();
  /// What passed between `earlier` and this (the same thread's).
  thread_schedule since(const thread_schedule& earlier) const;
};

/// The run-queue wait of /proc/thread-self/schedstat's line ("<ran ns>
/// <waited ns> <timeslices>"); nullopt for a line of another shape.
std::optional<std::chrono::nanoseconds> schedstat_queued(std::string_view line);

} // namespace rlsync
