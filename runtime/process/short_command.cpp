#include "runtime/process/short_command.hpp"

#include "runtime/process/launcher.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace rlsync {

std::string describe_wait_status(int status) {
  if (WIFEXITED(status))
    return "exited " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "killed by signal " + std::to_string(WTERMSIG(status));
  return "ended (status " + std::to_string(status) + ")";
}

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// A status no waitpid returns: the child ended but its status was lost.
constexpr int lost_status = -1;

/// Polls for `pid`'s end until `until`: true (and its status) when reaped.
bool reaped_by(pid_t pid, clock_type::time_point until, int& status) {
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid)
      return true;
    if (r < 0 && errno == ECHILD) { // reaped elsewhere (SIGCHLD ignored): gone, its status lost
      status = lost_status;
      return true;
    }
    if (clock_type::now() >= until)
      return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
}

} // namespace

bool run_short_command(const std::vector<std::string>& argv, milliseconds deadline, std::string& why) {
  if (argv.empty()) {
    why = "no command";
    return false;
  }
  pid_t pid = fork();
  if (pid < 0) {
    why = std::string("fork: ") + std::strerror(errno);
    return false;
  }
  if (pid == 0) {
    setpgid(0, 0); // with the commands it starts (ip ...): one group to stop
    close_inherited_at_exec();
    std::vector<char*> args;
    for (auto& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  setpgid(pid, pid); // also here: the group exists before any kill(-pid), whoever runs first
  int status = 0;
  if (reaped_by(pid, clock_type::now() + deadline, status)) {
    if (status != lost_status && WIFEXITED(status) && WEXITSTATUS(status) == 0)
      return true;
    why = shell_quote(argv) + ": " + (status == lost_status ? "ended, its exit status lost" : describe_wait_status(status));
    return false;
  }
  kill(-pid, SIGTERM);
  bool gone = reaped_by(pid, clock_type::now() + milliseconds(5000), status);
  kill(-pid, SIGKILL); // what is left of the group (the script itself, if it is still there)
  if (!gone)
    reaped_by(pid, clock_type::now() + milliseconds(5000), status);
  why = shell_quote(argv) + ": still running after " + std::to_string(deadline.count()) + " ms";
  return false;
}

namespace {

volatile std::sig_atomic_t last_stop_signal = 0;

void record_stop_signal(int sig) { last_stop_signal = sig; }

} // namespace

stop_signal_scope::stop_signal_scope() {
  last_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = record_stop_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
  sigaction(SIGHUP, &sa, &old_hup_); // the terminal closed
}

stop_signal_scope::~stop_signal_scope() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGHUP, &old_hup_, nullptr);
}

int stop_signal() { return last_stop_signal; }

} // namespace rlsync
