#pragma once
// How long a thread has run on a core, and how long it has waited runnable
// for one. On a host with fewer cores than busy threads the second is the
// time work queued behind other work: what a benchmark needs to tell a slow
// copy from a copy that was not running.
#include <chrono>
#include <optional>
#include <string_view>

namespace rlsync {

struct thread_schedule {
  std::chrono::nanoseconds ran{0};    ///< CPU time
  std::chrono::nanoseconds queued{0}; ///< runnable, waiting for a core (Linux schedstat)
  bool queued_known = false;          ///< whether the kernel keeps schedstat

  /// The calling thread's figures so far (its CPU clock: exact to the call).
  static thread_schedule now();
  /// Thread `tid` of this process (gettid()), from its schedstat; zeros
  /// where it cannot be read (the thread gone, no schedstat).
  static thread_schedule of_task(long tid);
  /// What passed between `earlier` and this (the same thread's).
  thread_schedule since(const thread_schedule& earlier) const;
};

/// The fields of a schedstat line ("<ran ns> <queued ns> <timeslices>");
/// nullopt for a line of another shape.
std::optional<thread_schedule> parse_schedstat(std::string_view line);

} // namespace rlsync
