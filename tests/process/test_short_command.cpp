// The process drill's plumbing: a short command run to its end within a
// deadline (its whole process group stopped past it), wait statuses in
// words, and the scope in which stop signals only record themselves.
#include "runtime/process/short_command.hpp"
#include "tests/support/scratch_dir.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace rlsync;
using rlsync::test::scratch_dir;
using std::chrono::milliseconds;

namespace {

/// True once `pid` no longer runs (gone, or a zombie waiting for its reaper),
/// polled for at most 10 s.
bool ended_within_10s(pid_t pid) {
  for (int i = 0; i < 1000; ++i) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string pid_field, comm, state;
    if (!(stat >> pid_field >> comm >> state) || state == "Z")
      return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return false;
}

} // namespace

TEST_CASE("describe_wait_status names an exit code or a signal") {
  CHECK(describe_wait_status(W_EXITCODE(0, 0)) == "exited 0");
  CHECK(describe_wait_status(W_EXITCODE(3, 0)) == "exited 3");
  CHECK(describe_wait_status(W_EXITCODE(0, SIGKILL)) == "killed by signal 9");
}

TEST_CASE("run_short_command: success, failure and a missing program") {
  std::string why;
  CHECK(run_short_command({"true"}, milliseconds(10000), why));
  CHECK(why.empty());

  CHECK_FALSE(run_short_command({"sh", "-c", "exit 3"}, milliseconds(10000), why));
  CHECK(why.find("sh -c") != std::string::npos);
  CHECK(why.find("exited 3") != std::string::npos);

  CHECK_FALSE(run_short_command({"/nonexistent/rlsync-helper"}, milliseconds(10000), why));
  CHECK(why.find("exited 127") != std::string::npos);

  CHECK_FALSE(run_short_command({}, milliseconds(10000), why));
  CHECK(why == "no command");
}

TEST_CASE("run_short_command past its deadline stops the command's whole group") {
  scratch_dir dir;
  auto pid_file = dir / "child.pid";
  // The shell ignores SIGTERM (so SIGKILL must follow) and starts a child in
  // its group that would outlive it.
  std::string script = "trap '' TERM; sleep 300 & echo $! > '" + pid_file + "'; wait";
  std::string why;
  CHECK_FALSE(run_short_command({"sh", "-c", script}, milliseconds(300), why));
  CHECK(why.find("still running after 300 ms") != std::string::npos);
  pid_t child = 0;
  std::ifstream(pid_file) >> child;
  REQUIRE(child > 0);
  CHECK(ended_within_10s(child));
}

TEST_CASE("stop_signal_scope records stop signals and restores the handlers before it") {
  struct sigaction before {};
  REQUIRE(sigaction(SIGTERM, nullptr, &before) == 0);
  {
    stop_signal_scope scope;
    CHECK(stop_signal() == 0);
    REQUIRE(raise(SIGTERM) == 0); // the default action would end this test binary
    CHECK(stop_signal() == SIGTERM);
    REQUIRE(raise(SIGHUP) == 0);
    CHECK(stop_signal() == SIGHUP);
  }
  struct sigaction after {};
  REQUIRE(sigaction(SIGTERM, nullptr, &after) == 0);
  CHECK((after.sa_handler == before.sa_handler));
  stop_signal_scope again;
  CHECK(stop_signal() == 0); // a new scope starts clean
}
