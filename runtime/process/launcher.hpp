#pragma once
// Process supervision for `rlsync launch`: start several child processes,
// pass their output on line by line with a `[NAME] ` prefix, and stop them
// all cleanly (SIGTERM, a grace period, then SIGKILL) when asked to or when
// one of them fails. Plain POSIX (fork/exec, pipes, poll, waitpid, signals);
// Linux for PR_SET_PDEATHSIG, which makes children die with the launcher.
//
// Also here: which nodes of a topology live on this machine (loopback or an
// address of a local interface).
#include "runtime/config/topology.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rlsync {

/// What the supervisor does when a child fails on its own (non-zero exit, a
/// signal, or it could not start): stop the others (the default), or start
/// it again after a backoff, a bounded number of times.
struct restart_policy {
  bool on_failure = false;
  std::uint32_t max_restarts = 3;
  /// Before the first restart; doubled before each further one, up to max_backoff.
  std::chrono::milliseconds first_backoff{500};
  std::chrono::milliseconds max_backoff{30000};
};

/// How long to wait before the restart that follows `restarts_done` earlier
/// ones, or nullopt when `p` allows no more: first_backoff × 2^restarts_done,
/// capped at max_backoff (no overflow however large restarts_done is).
std::optional<std::chrono::milliseconds> restart_delay(const restart_policy& p, std::uint32_t restarts_done);

/// One process to run. `argv[0]` is the path executed (no PATH search); the
/// child inherits the environment and the working directory, reads
/// /dev/null, and writes into pipes read by the supervisor.
struct child_spec {
  child_spec() = default;
  child_spec(std::string child_name, std::vector<std::string> child_argv)
      : name(std::move(child_name)), argv(std::move(child_argv)) {}

  std::string name; // the output prefix and the name in reports
  std::vector<std::string> argv;
  restart_policy restart;
  /// Its exit ends the run: exiting 0, it stops the others (they do not count
  /// as failed); failing, it fails the run (the job's head).
  bool ends_run = false;
};

/// Which of the supervisor's streams a line belongs to: a child's stdout
/// goes to `out`, its stderr and the supervisor's own reports to `err`.
enum class output_stream { out, err };

/// Receives whole lines, prefix and trailing '\n' included, one call per
/// line, from the thread running supervisor::run.
using line_sink = std::function<void(output_stream, std::string_view line)>;

/// Writes lines to two file descriptors (stdout and stderr by default), each
/// line with as few write() calls as it takes and never more than a bounded
/// wait: a reader that stops reading must not stall the supervisor (its
/// stop and grace deadlines would slip). A line that cannot be written within
/// `stall` is dropped and counted; after a drop, later lines get no wait at
/// all until one goes through whole, so a reader that never comes back costs
/// one `stall` in total, not one per line.
class fd_sink {
public:
  explicit fd_sink(int out_fd = 1, int err_fd = 2, std::chrono::milliseconds stall = std::chrono::seconds(2));
  void operator()(output_stream s, std::string_view line);
  std::uint64_t dropped() const { return dropped_; }

private:
  struct target {
    int fd;
    bool stalled = false;
  };
  bool write_all(target& t, std::string_view line);

  target out_, err_;
  std::chrono::milliseconds stall_;
  std::uint64_t dropped_ = 0;
};

struct supervisor_options {
  /// After SIGTERM, how long the children get before SIGKILL.
  std::chrono::milliseconds grace{10000};
  /// Longer lines are split into pieces of this many bytes (prefix aside);
  /// it is also what one child stream buffers at most.
  std::size_t max_line = 64 * 1024;
  /// Where lines go; empty means an fd_sink on stdout/stderr.
  line_sink sink;
};

/// How one child ended, as reported by waitpid.
struct child_exit {
  std::string name;
  int pid = 0;
  bool reaped = false;   // false: it survived even SIGKILL within the bound (see supervisor::run)
  bool signaled = false; // killed by a signal rather than exiting
  int code = 0;          // the exit status, or the signal number when `signaled`
  bool stopped = false;  // the supervisor had sent it SIGTERM by then (it did not end on its own)
  bool killed = false;   // the supervisor sent it SIGKILL after the grace period
  bool exec_failed = false; // it never ran: fork or exec failed (`code` is the errno)
  std::uint32_t restarts = 0; // times it was started again after failing (restart_policy)

  bool success() const { return reaped && !signaled && code == 0 && !exec_failed; }
  /// "exited 0", "exited 3", "killed by signal 9", "could not start: No such file or directory".
  std::string describe() const;
};

enum class launch_outcome {
  succeeded,    // every child exited 0 on its own
  child_failed, // a child failed on its own (non-zero exit, signal, could not start) with no
                // restart left; the rest were stopped
  stopped,      // request_stop() (e.g. SIGINT/SIGTERM to the launcher) stopped them
};

struct launch_result {
  launch_outcome outcome = launch_outcome::succeeded;
  std::string failed;            // child_failed: the child that failed first
  std::vector<child_exit> exits; // one per child started (or tried), in the order given
};

/// Runs a set of children to completion. One supervisor runs at a time per
/// process (run() installs a SIGCHLD handler); run() throws
/// std::logic_error if another is running.
///
/// Output: each child's stdout and stderr lines are passed to the sink as
/// "[NAME] line\n"; the supervisor's own reports ("[NAME] started, pid N",
/// "[NAME] exited 0", ...) go to the `err` stream. Lines never interleave:
/// the sink is only ever called from run()'s thread with whole lines.
///
/// Stopping: every child gets its own process group, and signals go to the
/// group, so that a shell child's own children stop too and a Ctrl-C at the
/// terminal reaches only the launcher, which then stops everything in order:
/// SIGTERM, up to `grace`, then SIGKILL.
///
/// Children get PR_SET_PDEATHSIG SIGTERM: if the thread that called run()
/// dies (the launcher is SIGKILLed, say), they are sent SIGTERM. So call
/// run() from a thread that outlives it — normally the main thread.
class supervisor {
public:
  explicit supervisor(supervisor_options options = {});
  ~supervisor();
  supervisor(const supervisor&) = delete;
  supervisor& operator=(const supervisor&) = delete;

  /// Starts every child, then waits for all of them, passing output on.
  /// Returns when every child has been reaped (or, for a child that
  /// survives SIGKILL, a bounded time after it was sent). Never leaves a
  /// child running: on an exception the remaining ones are SIGKILLed.
  launch_result run(const std::vector<child_spec>& children);

  /// Asks run() to stop the children (SIGTERM, grace, SIGKILL). A second
  /// request while stopping skips the rest of the grace period. Safe from a
  /// signal handler and from any thread; a request made before run() makes
  /// it start nothing.
  void request_stop() noexcept;

private:
  supervisor_options options_;
  int wake_[2] = {-1, -1}; // self-pipe: stop requests and SIGCHLD wake poll()
};

/// While alive, SIGINT, SIGTERM and SIGHUP call `s.request_stop()` instead of
/// terminating this process; the previous handlers come back when it is
/// destroyed. One at a time per process.
class stop_on_signals {
public:
  explicit stop_on_signals(supervisor& s);
  ~stop_on_signals();
  stop_on_signals(const stop_on_signals&) = delete;
  stop_on_signals& operator=(const stop_on_signals&) = delete;

  /// The first stop signal received (SIGINT or SIGTERM), 0 if none.
  int received() const;
};

/// In a forked child, before exec: every descriptor above stderr closes at
/// exec, whatever this process inherited or opened without O_CLOEXEC (a
/// node must not hold its launcher's shell's pipes). Async-signal-safe.
void close_inherited_at_exec() noexcept;

/// This process's executable, from /proc/self/exe. Throws std::runtime_error.
std::string self_executable();

/// The addresses of this machine's network interfaces (getifaddrs), in
/// numeric form ("10.1.2.3", "fe80::1"); empty if they cannot be listed.
std::vector<std::string> interface_addresses();

/// Whether `address` (an IPv4 or IPv6 literal, or a host name) is on this
/// machine: loopback (127.0.0.0/8, ::1, "localhost") or one of
/// `interfaces`. A host name is resolved with getaddrinfo (it can take as
/// long as the resolver's own timeouts); one that does not resolve is not local.
bool is_local_address(const std::string& address, const std::vector<std::string>& interfaces);

/// The nodes of `t` whose address is on this machine, in topology order.
std::vector<const node_spec*> local_nodes(const topology& t);

/// `argv` as one line a POSIX shell reads back into the same words.
std::string shell_quote(const std::vector<std::string>& argv);

} // namespace rlsync
