#include "runtime/process/launcher.hpp"

#include <algorithm>
#include <cctype>
#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <ifaddrs.h>
#include <memory>
#include <netdb.h>
#include <netinet/in.h>
#include <optional>
#include <poll.h>
#include <stdexcept>
#include <string>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <system_error>
#include <unistd.h>
#include <vector>

namespace rlsync {

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// After every child has been reaped, how long their pipes may stay open
/// (a grandchild that inherited them and lives on) before we stop reading.
constexpr milliseconds drain_after_exit{1000};
/// After SIGKILL, how long to wait for the reap. SIGKILL cannot be caught,
/// but a process stuck in uninterruptible sleep (a hung NFS or device
/// driver) dies only when it leaves it; we report it rather than hang.
constexpr milliseconds wait_after_kill{5000};
/// The longest single poll(): deadlines are computed exactly, but a lost
/// wake-up (which the self-pipe should make impossible) then costs at most this.
constexpr milliseconds max_poll{1000};
/// One read() from a child's pipe: the pipe's default capacity.
constexpr std::size_t read_chunk = 64 * 1024;
/// When a child is reaped, at most this many reads per stream drain what it
/// left in its pipes before its exit is reported, so that "[NAME] exited"
/// comes after its last lines. Bounded because a grandchild may still be
/// writing into the same pipe.
constexpr int drain_reads_at_exit = 16;

// The running supervisor's self-pipe (write end), for the SIGCHLD handler.
std::atomic<int> g_wake_fd{-1};
std::atomic<bool> g_supervisor_running{false};

// stop_on_signals: where SIGINT/SIGTERM/SIGHUP go, and the first one received.
std::atomic<supervisor*> g_stop_target{nullptr};
std::atomic<int> g_stop_signal{0};
struct sigaction g_old_int, g_old_term, g_old_hup;

static_assert(std::atomic<int>::is_always_lock_free, "signal handlers need lock-free atomics");

extern "C" void on_sigchld(int) {
  int saved = errno;
  int fd = g_wake_fd.load();
  if (fd >= 0)
    (void)!::write(fd, "C", 1); // a full pipe already holds a wake-up
  errno = saved;
}

extern "C" void on_stop_signal(int sig) {
  int expected = 0;
  g_stop_signal.compare_exchange_strong(expected, sig);
  if (supervisor* s = g_stop_target.load())
    s->request_stop();
}

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

int ms_until(clock_type::time_point deadline, clock_type::time_point now) {
  if (deadline <= now)
    return 0;
  auto d = std::chrono::ceil<milliseconds>(deadline - now);
  return static_cast<int>(std::min(d, max_poll).count());
}

void close_fd(int& fd) {
  if (fd >= 0)
    ::close(fd);
  fd = -1;
}

/// Sends `sig` to the child's process group (so that its own children get it
/// too), or to the child alone where the group is gone (it made its own).
void signal_child(pid_t pid, int sig) {
  if (::kill(-pid, sig) != 0)
    ::kill(pid, sig);
}

struct stream_state {
  int fd = -1;
  output_stream which = output_stream::out;
  std::string partial; // the current line so far; never longer than max_line
};

struct child_state {
  const child_spec* spec = nullptr;
  std::string prefix; // "[NAME] "
  pid_t pid = -1;
  stream_state out, err;
  child_exit exit;
  std::optional<clock_type::time_point> restart_at; // it failed and starts again then
  bool running() const { return pid > 0 && !exit.reaped; }
};

/// Installs the SIGCHLD handler and ignores SIGPIPE (a closed stdout must
/// give EPIPE, not kill the launcher) for the duration of run(); both are
/// restored on the way out, exceptions included.
class signal_scope {
public:
  explicit signal_scope(int wake_fd) {
    struct sigaction sa {};
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    if (::sigaction(SIGPIPE, &sa, &old_pipe_) != 0)
      throw_errno("sigaction(SIGPIPE)");
    pipe_was_ignored_ = old_pipe_.sa_handler == SIG_IGN;
    g_wake_fd = wake_fd;
    sa.sa_handler = on_sigchld;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    if (::sigaction(SIGCHLD, &sa, &old_chld_) != 0) {
      int e = errno;
      ::sigaction(SIGPIPE, &old_pipe_, nullptr);
      g_wake_fd = -1;
      errno = e;
      throw_errno("sigaction(SIGCHLD)");
    }
  }
  ~signal_scope() {
    ::sigaction(SIGCHLD, &old_chld_, nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    g_wake_fd = -1;
  }
  signal_scope(const signal_scope&) = delete;
  signal_scope& operator=(const signal_scope&) = delete;

  bool pipe_was_ignored() const { return pipe_was_ignored_; }

private:
  struct sigaction old_chld_ {};
  struct sigaction old_pipe_ {};
  bool pipe_was_ignored_ = false;
};

/// Forks and execs one child with its stdout/stderr on fresh pipes. Returns 0,
/// or the errno of what failed (fork, pipe, or exec in the child — the child
/// reports the latter through a close-on-exec pipe, so a bad path is known
/// here, synchronously, rather than as a mysterious exit 127).
int spawn(child_state& c, int devnull, bool sigpipe_was_ignored) {
  const auto& words = c.spec->argv;
  if (words.empty() || words[0].empty())
    return EINVAL;
  // Everything the child needs is built before fork: between fork and exec
  // only async-signal-safe calls are allowed (other threads may hold locks).
  std::vector<char*> argv;
  argv.reserve(words.size() + 1);
  for (auto& w : words)
    argv.push_back(const_cast<char*>(w.c_str()));
  argv.push_back(nullptr);

  int out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
  auto close_all = [&] {
    for (int* p : {out, err, status}) {
      close_fd(p[0]);
      close_fd(p[1]);
    }
  };
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 || ::pipe2(status, O_CLOEXEC) != 0) {
    int e = errno;
    close_all();
    return e;
  }

  // Block every signal across fork: until the child has reset our handlers
  // (which write into our self-pipe) to the defaults, a signal must not run
  // them in the child.
  sigset_t all, old_mask;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction sa {};
      if (sig == SIGKILL || sig == SIGSTOP || ::sigaction(sig, nullptr, &sa) != 0)
        continue;
      if (sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN) {
        sa = {};
        sa.sa_handler = SIG_DFL;
        sigemptyset(&sa.sa_mask);
        ::sigaction(sig, &sa, nullptr);
      }
    }
    if (!sigpipe_was_ignored) { // only we ignore it, and exec would keep SIG_IGN
      struct sigaction sa {};
      sa.sa_handler = SIG_DFL;
      sigemptyset(&sa.sa_mask);
      ::sigaction(SIGPIPE, &sa, nullptr);
    }
    // Own process group: a terminal's Ctrl-C reaches only the launcher, which
    // stops the children in order; and our signals reach the child's children.
    ::setpgid(0, 0);
    // Die with the launcher. If it died before the prctl, we were already
    // reparented and the death signal would never come: give up now.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent)
      ::_exit(128 + SIGTERM);
    int e = 0;
    if (::dup2(devnull, 0) < 0 || ::dup2(out[1], 1) < 0 || ::dup2(err[1], 2) < 0)
      e = errno;
    if (e == 0) {
      close_inherited_at_exec();
      ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
      ::execv(argv[0], argv.data());
      e = errno;
    }
    (void)!::write(status[1], &e, sizeof e);
    ::_exit(127);
  }
  int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  if (pid < 0) {
    close_all();
    return fork_errno;
  }
  // Also from this side: whichever of the two setpgid calls comes first makes
  // the group, so it exists before we could ever signal it. (After the
  // child's exec this one fails with EACCES, harmlessly.)
  ::setpgid(pid, pid);
  close_fd(out[1]);
  close_fd(err[1]);
  close_fd(status[1]);
  // EOF when exec succeeds (close-on-exec), an errno when it fails. Bounded:
  // the child does nothing but the few calls above before either.
  int child_errno = 0;
  ssize_t n;
  do
    n = ::read(status[0], &child_errno, sizeof child_errno);
  while (n < 0 && errno == EINTR);
  close_fd(status[0]);
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    int st;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    close_all();
    return child_errno != 0 ? child_errno : EIO;
  }
  ::fcntl(out[0], F_SETFL, ::fcntl(out[0], F_GETFL) | O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, ::fcntl(err[0], F_GETFL) | O_NONBLOCK);
  c.pid = pid;
  c.exit.pid = pid;
  c.out.fd = out[0];
  c.err.fd = err[0];
  return 0;
}

/// The state of one run(): the children, their output, the stop sequence.
class run_state {
public:
  run_state(const std::vector<child_spec>& specs, const supervisor_options& options, const line_sink& sink)
      : options_(options), sink_(sink), buffer_(read_chunk) {
    children_.resize(specs.size());
    for (std::size_t i = 0; i < specs.size(); ++i) {
      auto& c = children_[i];
      c.spec = &specs[i];
      c.prefix = "[" + specs[i].name + "] ";
      c.exit.name = specs[i].name;
      c.out.which = output_stream::out;
      c.err.which = output_stream::err;
    }
  }

  /// Never leaves a child behind, even when run() is left by an exception:
  /// SIGKILL whatever still runs and reap it, within a bound.
  ~run_state() {
    for (auto& c : children_) {
      if (c.running())
        signal_child(c.pid, SIGKILL);
    }
    auto deadline = clock_type::now() + wait_after_kill;
    for (auto& c : children_) {
      while (c.running()) {
        int st;
        pid_t r = ::waitpid(c.pid, &st, WNOHANG);
        if (r == c.pid || (r < 0 && errno != EINTR) || clock_type::now() >= deadline)
          break;
        if (r == 0) {
          struct timespec ts {0, 10 * 1000 * 1000};
          ::nanosleep(&ts, nullptr);
        }
      }
      close_fd(c.out.fd);
      close_fd(c.err.fd);
    }
  }

  launch_result run(int wake_fd, int devnull, bool sigpipe_was_ignored) {
    wake_fd_ = wake_fd;
    devnull_ = devnull;
    sigpipe_was_ignored_ = sigpipe_was_ignored;
    for (auto& c : children_) {
      // A stop requested before or during start-up: start nothing more.
      read_wake();
      if (stopping_)
        break;
      int e = spawn(c, devnull, sigpipe_was_ignored);
      started_.push_back(&c);
      if (e != 0) {
        c.exit.exec_failed = true;
        c.exit.reaped = true;
        c.exit.code = e;
        report(c, c.exit.describe());
        fail(c);
        break;
      }
      report(c, "started: pid " + std::to_string(c.pid));
    }
    loop();
    launch_result result;
    result.outcome = outcome_;
    result.failed = failed_;
    for (auto* c : started_)
      result.exits.push_back(c->exit);
    return result;
  }

private:
  void loop() {
    std::optional<clock_type::time_point> drain_deadline;
    std::vector<pollfd> fds;
    std::vector<stream_state*> streams;
    for (;;) {
      reap();
      restart_due();
      auto now = clock_type::now();
      bool any_running = std::any_of(started_.begin(), started_.end(), [](auto* c) { return c->running(); });
      // A child waiting for its restart keeps the run going as if it ran.
      std::optional<clock_type::time_point> next_restart;
      for (auto* c : started_)
        if (c->restart_at && (!next_restart || *c->restart_at < *next_restart))
          next_restart = c->restart_at;
      if (stopping_ && !killing_ && any_running && now >= grace_deadline_)
        escalate("still running after the grace period (" + std::to_string(options_.grace.count()) + " ms)");
      if (killing_ && any_running && now >= kill_deadline_) {
        for (auto* c : started_)
          if (c->running())
            report(*c, "still running " + std::to_string(wait_after_kill.count())
                         + " ms after SIGKILL; giving up on it");
        break;
      }
      fds.clear();
      streams.clear();
      fds.push_back({wake_fd_, POLLIN, 0});
      for (auto* c : started_)
        for (stream_state* s : {&c->out, &c->err})
          if (s->fd >= 0) {
            fds.push_back({s->fd, POLLIN, 0});
            streams.push_back(s);
          }
      if (!any_running && !next_restart) {
        if (streams.empty())
          break;
        if (!drain_deadline)
          drain_deadline = now + drain_after_exit;
        else if (now >= *drain_deadline)
          break;
      }
      // Only live deadlines: a past one with nobody left to signal would spin.
      clock_type::time_point next = now + max_poll;
      if (any_running && stopping_ && !killing_)
        next = std::min(next, grace_deadline_);
      if (any_running && killing_)
        next = std::min(next, kill_deadline_);
      if (drain_deadline)
        next = std::min(next, *drain_deadline);
      if (next_restart)
        next = std::min(next, *next_restart);
      int r = ::poll(fds.data(), fds.size(), ms_until(next, now));
      if (r < 0) {
        if (errno == EINTR)
          continue;
        throw_errno("poll");
      }
      if (fds[0].revents)
        read_wake();
      for (std::size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents)
          read_once(*owner(streams[i - 1]), *streams[i - 1]);
    }
    // Whatever is still open belongs to a grandchild that outlived the bound.
    for (auto* c : started_) {
      close_stream(*c, c->out);
      close_stream(*c, c->err);
    }
  }

  child_state* owner(stream_state* s) {
    for (auto* c : started_)
      if (s == &c->out || s == &c->err)
        return c;
    return nullptr; // unreachable: every stream belongs to a child
  }

  /// Drains the self-pipe: 'S' bytes are stop requests, 'C' bytes only wake
  /// us to reap (which every loop iteration does anyway).
  void read_wake() {
    char bytes[64];
    for (;;) {
      ssize_t n = ::read(wake_fd_, bytes, sizeof bytes);
      if (n <= 0)
        return; // EAGAIN: empty (the pipe is non-blocking)
      for (ssize_t i = 0; i < n; ++i) {
        if (bytes[i] != 'S')
          continue;
        if (!stopping_) {
          outcome_ = launch_outcome::stopped;
          begin_stop();
        } else if (!killing_) {
          escalate("asked to stop again"); // skip the rest of the grace period
        }
      }
    }
  }

  void reap() {
    for (auto* c : started_) {
      if (!c->running())
        continue;
      int st = 0;
      pid_t r = ::waitpid(c->pid, &st, WNOHANG);
      if (r == 0 || (r < 0 && errno == EINTR))
        continue;
      c->exit.reaped = true;
      if (r < 0) {
        c->exit.code = -1; // ECHILD: someone else reaped it; the status is lost
      } else if (WIFSIGNALED(st)) {
        c->exit.signaled = true;
        c->exit.code = WTERMSIG(st);
      } else {
        c->exit.code = WEXITSTATUS(st);
      }
      for (stream_state* s : {&c->out, &c->err})
        for (int i = 0; i < drain_reads_at_exit && s->fd >= 0; ++i)
          if (!read_once(*c, *s))
            break;
      report(*c, c->exit.describe());
      if (!c->exit.stopped && !c->exit.success()) {
        failed_on_its_own(*c);
      } else if (c->spec->ends_run && !stopping_) {
        report(*c, "the job is over; stopping the others");
        begin_stop();
      }
    }
  }

  /// A child failed on its own: restarted after a backoff while its policy
  /// allows, else the run fails.
  void failed_on_its_own(child_state& c) {
    const auto& policy = c.spec->restart;
    auto delay = stopping_ ? std::nullopt : restart_delay(policy, c.exit.restarts);
    if (!delay) {
      if (policy.on_failure && !stopping_)
        report(c, "failed after " + std::to_string(c.exit.restarts) + " restart(s), the most allowed");
      fail(c);
      return;
    }
    c.restart_at = clock_type::now() + *delay;
    report(c, "restarting in " + std::to_string(delay->count()) + " ms (restart "
                + std::to_string(c.exit.restarts + 1) + " of " + std::to_string(policy.max_restarts) + ")");
  }

  /// Starts again every child whose restart is due.
  void restart_due() {
    auto now = clock_type::now();
    for (auto* c : started_) {
      if (!c->restart_at || *c->restart_at > now || stopping_)
        continue;
      c->restart_at.reset();
      // Streams a grandchild still holds open belong to the old incarnation.
      close_stream(*c, c->out);
      close_stream(*c, c->err);
      auto restarts = c->exit.restarts + 1;
      c->exit = child_exit{};
      c->exit.name = c->spec->name;
      c->exit.restarts = restarts;
      c->pid = -1;
      int e = spawn(*c, devnull_, sigpipe_was_ignored_);
      if (e != 0) {
        c->exit.exec_failed = true;
        c->exit.reaped = true;
        c->exit.code = e;
        report(*c, c->exit.describe());
        failed_on_its_own(*c);
        continue;
      }
      report(*c, "restarted: pid " + std::to_string(c->pid) + " (restart " + std::to_string(restarts) + ")");
    }
  }

  /// A child failed on its own: it names the result, the others are stopped.
  void fail(child_state& c) {
    if (stopping_)
      return;
    outcome_ = launch_outcome::child_failed;
    failed_ = c.spec->name;
    begin_stop();
  }

  void begin_stop() {
    stopping_ = true;
    grace_deadline_ = clock_type::now() + options_.grace;
    for (auto* c : started_)
      c->restart_at.reset(); // a stop cancels pending restarts
    for (auto* c : started_)
      if (c->running()) {
        signal_child(c->pid, SIGTERM);
        c->exit.stopped = true;
      }
  }

  void escalate(const std::string& why) {
    killing_ = true;
    kill_deadline_ = clock_type::now() + wait_after_kill;
    for (auto* c : started_)
      if (c->running()) {
        report(*c, why + "; sending SIGKILL");
        signal_child(c->pid, SIGKILL);
        c->exit.killed = true;
      }
  }

  /// One read from a stream. Returns whether more may be waiting.
  bool read_once(child_state& c, stream_state& s) {
    ssize_t n = ::read(s.fd, buffer_.data(), buffer_.size());
    if (n > 0) {
      feed(c, s, std::string_view(buffer_.data(), static_cast<std::size_t>(n)));
      return true;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
      return false;
    close_stream(c, s); // EOF, or an error we cannot read past
    return false;
  }

  /// Cuts `data` into lines. A line longer than max_line is split; what
  /// remains without a newline waits in `partial`, bounded by max_line.
  void feed(child_state& c, stream_state& s, std::string_view data) {
    const std::size_t max = std::max<std::size_t>(options_.max_line, 1);
    while (!data.empty()) {
      std::size_t nl = data.find('\n');
      std::size_t room = max - s.partial.size();
      if (nl != std::string_view::npos && nl <= room) {
        emit(c, s, data.substr(0, nl));
        data.remove_prefix(nl + 1);
      } else if (nl == std::string_view::npos && data.size() <= room) {
        s.partial.append(data);
        return;
      } else {
        emit(c, s, data.substr(0, room)); // too long: split here
        data.remove_prefix(room);
      }
    }
  }

  /// Passes on `partial` + `tail` as one line and clears `partial`.
  void emit(child_state& c, stream_state& s, std::string_view tail) {
    line_.assign(c.prefix);
    line_.append(s.partial);
    line_.append(tail);
    line_.push_back('\n');
    s.partial.clear();
    sink_(s.which, line_);
  }

  /// Closes a stream; a last line without a newline is passed on now.
  void close_stream(child_state& c, stream_state& s) {
    if (s.fd < 0)
      return;
    close_fd(s.fd);
    if (!s.partial.empty())
      emit(c, s, {});
  }

  void report(child_state& c, const std::string& text) {
    line_.assign(c.prefix);
    line_.append(text);
    line_.push_back('\n');
    sink_(output_stream::err, line_);
  }

  const supervisor_options& options_;
  const line_sink& sink_;
  std::vector<child_state> children_;
  std::vector<child_state*> started_; // those spawned (or tried), in order
  std::vector<char> buffer_;
  std::string line_;
  int wake_fd_ = -1;
  int devnull_ = -1;
  bool sigpipe_was_ignored_ = false;
  bool stopping_ = false, killing_ = false;
  clock_type::time_point grace_deadline_, kill_deadline_;
  launch_outcome outcome_ = launch_outcome::succeeded;
  std::string failed_;
};

bool is_loopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    auto a = ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr);
    return (a >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    auto& a = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&a) || (IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127);
  }
  return false;
}

/// The numeric form of an IPv4/IPv6 socket address ("" for other families).
/// An IPv4-mapped IPv6 address gives its IPv4 form, as interfaces list it.
std::string numeric(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, text, sizeof text);
  } else if (sa->sa_family == AF_INET6) {
    auto& a = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a))
      ::inet_ntop(AF_INET, &a.s6_addr[12], text, sizeof text);
    else
      ::inet_ntop(AF_INET6, &a, text, sizeof text);
  }
  return text;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

} // namespace

// ---------------------------------------------------------------------------

void close_inherited_at_exec() noexcept {
  if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) == 0)
    return;
  // A kernel before 5.11: each possible descriptor (fcntl is async-signal-safe).
  rlimit limit{};
  const rlim_t top = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                       ? std::min<rlim_t>(limit.rlim_cur, rlim_t{1} << 20)
                       : rlim_t{1} << 16;
  for (rlim_t fd = 3; fd < top; ++fd)
    if (const int flags = ::fcntl(static_cast<int>(fd), F_GETFD); flags >= 0 && !(flags & FD_CLOEXEC))
      ::fcntl(static_cast<int>(fd), F_SETFD, flags | FD_CLOEXEC);
}

std::optional<std::chrono::milliseconds> restart_delay(const restart_policy& p, std::uint32_t restarts_done) {
  if (!p.on_failure || restarts_done >= p.max_restarts)
    return std::nullopt;
  auto cap = std::max(p.max_backoff, milliseconds(0));
  auto delay = std::min(std::max(p.first_backoff, milliseconds(0)), cap);
  // Doubling stops at the cap, so it never overflows.
  for (std::uint32_t i = 0; i < restarts_done && delay > milliseconds(0) && delay < cap; ++i)
    delay = delay.count() > cap.count() / 2 ? cap : delay * 2;
  return delay;
}

std::string child_exit::describe() const {
  if (exec_failed)
    return "could not start: " + std::string(std::strerror(code));
  if (!reaped)
    return "did not exit";
  if (signaled)
    return "killed by signal " + std::to_string(code);
  if (code < 0)
    return "exited (status unknown)";
  return "exited " + std::to_string(code);
}

fd_sink::fd_sink(int out_fd, int err_fd, std::chrono::milliseconds stall)
    : out_{out_fd}, err_{err_fd}, stall_(stall) {}

void fd_sink::operator()(output_stream s, std::string_view line) {
  if (!write_all(s == output_stream::out ? out_ : err_, line))
    ++dropped_;
}

bool fd_sink::write_all(target& t, std::string_view line) {
  auto deadline = clock_type::now() + (t.stalled ? milliseconds(0) : stall_);
  while (!line.empty()) {
    pollfd p{t.fd, POLLOUT, 0};
    auto now = clock_type::now();
    int wait = deadline > now ? static_cast<int>(std::chrono::ceil<milliseconds>(deadline - now).count()) : 0;
    int r = ::poll(&p, 1, wait);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    if (r == 0) {
      t.stalled = true;
      return false;
    }
    if (p.revents & (POLLERR | POLLNVAL))
      return false; // e.g. a pipe whose reader is gone
    // At most PIPE_BUF per write: POLLOUT on a pipe promises room for that
    // much, so a blocking descriptor cannot block here (we must not change
    // its flags to non-blocking: the open file is shared with our parent).
    ssize_t n = ::write(t.fd, line.data(), std::min<std::size_t>(line.size(), PIPE_BUF));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
        continue;
      return false;
    }
    line.remove_prefix(static_cast<std::size_t>(n));
  }
  t.stalled = false;
  return true;
}

supervisor::supervisor(supervisor_options options) : options_(std::move(options)) {
  // Non-blocking both ways: request_stop() from a signal handler must never
  // block, and draining must stop when the pipe is empty.
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
    throw_errno("pipe2");
}

supervisor::~supervisor() {
  close_fd(wake_[0]);
  close_fd(wake_[1]);
}

void supervisor::request_stop() noexcept {
  int saved = errno;
  (void)!::write(wake_[1], "S", 1);
  errno = saved;
}

launch_result supervisor::run(const std::vector<child_spec>& children) {
  if (g_supervisor_running.exchange(true))
    throw std::logic_error("supervisor::run: another supervisor is running in this process");
  struct running_guard {
    ~running_guard() { g_supervisor_running = false; }
  } guard;

  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0)
    throw_errno("open /dev/null");
  struct fd_guard {
    int& fd;
    ~fd_guard() { close_fd(fd); }
  } devnull_guard{devnull};

  std::optional<fd_sink> default_sink;
  line_sink sink = options_.sink;
  if (!sink) {
    default_sink.emplace();
    sink = [&](output_stream s, std::string_view line) { (*default_sink)(s, line); };
  }
  signal_scope signals(wake_[1]);
  run_state state(children, options_, sink);
  return state.run(wake_[0], devnull, signals.pipe_was_ignored());
}

stop_on_signals::stop_on_signals(supervisor& s) {
  supervisor* expected = nullptr;
  if (!g_stop_target.compare_exchange_strong(expected, &s))
    throw std::logic_error("stop_on_signals: already installed");
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
  // The terminal closed: by default it would kill this process alone, and
  // the children (each in its own process group) would get only their
  // parent-death SIGTERM, with no grace, no SIGKILL after it and no reaping.
  ::sigaction(SIGHUP, &sa, &g_old_hup);
}

stop_on_signals::~stop_on_signals() {
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  ::sigaction(SIGHUP, &g_old_hup, nullptr);
  g_stop_target = nullptr;
}

int stop_on_signals::received() const { return g_stop_signal.load(); }

std::string self_executable() {
  std::vector<char> buf(PATH_MAX);
  // A path longer than the buffer comes back truncated: grow, a few times.
  for (int attempt = 0; attempt < 4; ++attempt) {
    ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size());
    if (n < 0)
      throw_errno("readlink /proc/self/exe");
    if (static_cast<std::size_t>(n) < buf.size())
      return std::string(buf.data(), static_cast<std::size_t>(n));
    buf.resize(buf.size() * 4);
  }
  throw std::runtime_error("readlink /proc/self/exe: path too long");
}

std::vector<std::string> interface_addresses() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0)
    return {};
  std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> owner(list, ::freeifaddrs);
  std::vector<std::string> result;
  for (auto* p = list; p; p = p->ifa_next) {
    if (!p->ifa_addr)
      continue;
    std::string text = numeric(p->ifa_addr);
    if (!text.empty() && std::find(result.begin(), result.end(), text) == result.end())
      result.push_back(std::move(text));
  }
  return result;
}

bool is_local_address(const std::string& address, const std::vector<std::string>& interfaces) {
  std::string host = address;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') // "[::1]"
    host = host.substr(1, host.size() - 2);
  if (host.empty())
    return false;
  if (iequals(host, "localhost"))
    return true; // without asking a resolver, which might say otherwise
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM; // one entry per address, not one per socket type
  hints.ai_flags = AI_NUMERICHOST; // literals first: no resolver involved
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) {
    hints.ai_flags = 0;
    res = nullptr;
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0)
      return false;
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> owner(res, ::freeaddrinfo);
  for (auto* p = res; p; p = p->ai_next) {
    if (!p->ai_addr)
      continue;
    if (is_loopback(p->ai_addr))
      return true;
    std::string text = numeric(p->ai_addr);
    if (!text.empty() && std::find(interfaces.begin(), interfaces.end(), text) != interfaces.end())
      return true;
  }
  return false;
}

std::vector<const node_spec*> local_nodes(const topology& t) {
  auto interfaces = interface_addresses();
  std::vector<const node_spec*> result;
  for (auto& n : t.nodes)
    if (is_local_address(n.address, interfaces))
      result.push_back(&n);
  return result;
}

std::string shell_quote(const std::vector<std::string>& argv) {
  std::string out;
  for (auto& word : argv) {
    if (!out.empty())
      out += ' ';
    bool plain = !word.empty() && std::all_of(word.begin(), word.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || (ch != '\0' && std::strchr("_@%+=:,./-", ch));
    });
    if (plain) {
      out += word;
      continue;
    }
    out += '\'';
    for (char ch : word) {
      if (ch == '\'')
        out += "'\\''";
      else
        out += ch;
    }
    out += '\'';
  }
  return out;
}

} // namespace rlsync
