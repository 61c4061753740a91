#pragma once
// Plumbing for jobs that run their own child processes (the process drill):
// a short helper command run to its end within a deadline, how a child
// ended in words, and a scope in which SIGINT/SIGTERM/SIGHUP ask the job to
// stop instead of killing it (so that it can stop its children and remove
// what it made first).
#include <chrono>
#include <csignal>
#include <string>
#include <vector>

namespace rlsync {

/// A waitpid status in words: "exited 3", "killed by signal 9".
std::string describe_wait_status(int status);

/// Runs `argv` (a short command such as deploy/netns.sh; PATH is searched)
/// in a process group of its own, to its end. False when it failed or
/// outlived `deadline`, with `why` naming the command: then its group gets
/// SIGTERM (so that a script's EXIT trap cleans up) and SIGKILL at most 5 s
/// later, and the call returns at most 10 s after the deadline.
bool run_short_command(const std::vector<std::string>& argv, std::chrono::milliseconds deadline, std::string& why);

/// While one lives, SIGINT, SIGTERM and SIGHUP only record themselves
/// (stop_signal()); the handlers before it come back when it ends. One at a
/// time per process.
class stop_signal_scope {
public:
  stop_signal_scope();
  ~stop_signal_scope();
  stop_signal_scope(const stop_signal_scope&) = delete;
  stop_signal_scope& operator=(const stop_signal_scope&) = delete;

private:
  struct sigaction old_int_ {}, old_term_ {}, old_hup_ {};
};

/// The last stop signal received inside a stop_signal_scope since it began;
/// 0 when none.
int stop_signal();

} // namespace rlsync
