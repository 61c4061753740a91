// The launcher's supervisor with /bin/sh children: prefixed, whole lines;
// a failing child stops the others; SIGTERM escalates to SIGKILL after the
// grace period; all-zero exits succeed. Children that must be in a given
// state before something happens say so by creating a file, which the other
// side waits for: no fixed sleeps as synchronisation.
#include "runtime/process/launcher.hpp"
#include "tests/support/scratch_dir.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <string>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

using namespace rlsync;
using rlsync::test::scratch_dir;
using std::chrono::milliseconds;
using clock_type = std::chrono::steady_clock;

namespace {

struct captured {
  std::vector<std::pair<output_stream, std::string>> lines;

  line_sink sink() {
    return [this](output_stream s, std::string_view line) { lines.emplace_back(s, std::string(line)); };
  }
  bool has(output_stream s, const std::string& line) const {
    return std::find(lines.begin(), lines.end(), std::make_pair(s, line)) != lines.end();
  }
  /// Index of the first line equal to `line` on any stream, or -1.
  long index(const std::string& line) const {
    for (std::size_t i = 0; i < lines.size(); ++i)
      if (lines[i].second == line)
        return static_cast<long>(i);
    return -1;
  }
};

child_spec sh(const std::string& name, const std::string& script) {
  return {name, {"/bin/sh", "-c", script}};
}

/// Shell: wait (bounded, 10 s) for `file` to exist.
std::string wait_for(const std::string& file) {
  return "i=0; while [ ! -e '" + file + "' ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done; ";
}

const child_exit& exit_of(const launch_result& r, const std::string& name) {
  for (auto& e : r.exits)
    if (e.name == name)
      return e;
  FAIL("no exit for " << name);
  throw 0; // unreachable
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

} // namespace

TEST_CASE("launcher: two chatty children, every line whole and prefixed, streams kept apart") {
  // 300 lines of 5000 bytes each from both children at once: each line takes
  // several pipe reads, so whole lines come only from correct buffering.
  const std::string body =
    "s=$(printf '%05000d' 0); i=0; while [ $i -lt 300 ]; do echo \"$N$i:$s\"; i=$((i+1)); done; "
    "echo \"$N-err\" >&2; printf \"$N-tail\"";
  captured out;
  supervisor_options opts;
  opts.sink = out.sink();
  supervisor sup(opts);
  auto r = sup.run({sh("alpha", "N=A; " + body), sh("beta", "N=B; " + body)});
  CHECK(r.outcome == launch_outcome::succeeded);
  REQUIRE(r.exits.size() == 2);
  CHECK(r.exits[0].describe() == "exited 0");
  CHECK(r.exits[1].describe() == "exited 0");

  const std::string zeros(5000, '0');
  int next[2] = {0, 0};
  for (auto& [stream, line] : out.lines) {
    REQUIRE(!line.empty());
    CHECK(line.back() == '\n');
    CHECK(std::count(line.begin(), line.end(), '\n') == 1);
    bool a = line.rfind("[alpha] ", 0) == 0, b = line.rfind("[beta] ", 0) == 0;
    REQUIRE((a || b));
    if (stream != output_stream::out)
      continue;
    std::string body_line = line.substr(a ? 8 : 7);
    if (body_line == (a ? "A-tail\n" : "B-tail\n"))
      continue;
    int& n = next[a ? 0 : 1];
    CHECK(body_line == std::string(a ? "A" : "B") + std::to_string(n) + ":" + zeros + "\n");
    ++n;
  }
  CHECK(next[0] == 300);
  CHECK(next[1] == 300);
  CHECK(out.has(output_stream::err, "[alpha] A-err\n"));
  CHECK(out.has(output_stream::err, "[beta] B-err\n"));
  // A last line without a newline is passed on at the end, before the exit report.
  CHECK(out.has(output_stream::out, "[alpha] A-tail\n"));
  CHECK(out.has(output_stream::out, "[beta] B-tail\n"));
  CHECK(out.index("[alpha] A-tail\n") < out.index("[alpha] exited 0\n"));
  CHECK(out.index("[alpha] A299:" + zeros + "\n") < out.index("[alpha] exited 0\n"));
}

TEST_CASE("launcher: lines longer than max_line are split, never buffered beyond it") {
  captured out;
  supervisor_options opts;
  opts.sink = out.sink();
  opts.max_line = 16;
  supervisor sup(opts);
  auto r = sup.run({sh("x", "printf '0123456789abcdef0123456789ABCDEFtail\\nshort\\n0123456789abcdef\\n'")});
  CHECK(r.outcome == launch_outcome::succeeded);
  std::vector<std::string> got;
  for (auto& [s, line] : out.lines)
    if (s == output_stream::out)
      got.push_back(line);
  CHECK(got == std::vector<std::string>{"[x] 0123456789abcdef\n", "[x] 0123456789ABCDEF\n", "[x] tail\n",
                                        "[x] short\n", "[x] 0123456789abcdef\n"});
}

TEST_CASE("launcher: a failing child stops the others, which get SIGTERM, and is named") {
  scratch_dir dir;
  captured out;
  supervisor_options opts;
  opts.sink = out.sink();
  opts.grace = std::chrono::seconds(5); // the survivor exits at once on SIGTERM
  supervisor sup(opts);
  auto t0 = clock_type::now();
  auto r = sup.run({
    sh("steady",
       "trap 'echo got-term; exit 7' TERM; touch '" + dir / "ready" + "'; while :; do sleep 1; done"),
    sh("flaky", wait_for(dir / "ready") + "echo failing; exit 3"),
  });
  CHECK(seconds_since(t0) < 3);
  CHECK(r.outcome == launch_outcome::child_failed);
  CHECK(r.failed == "flaky");
  auto& flaky = exit_of(r, "flaky");
  CHECK(flaky.describe() == "exited 3");
  CHECK(!flaky.stopped);
  auto& steady = exit_of(r, "steady");
  CHECK(steady.stopped);
  CHECK(!steady.killed);
  CHECK(steady.describe() == "exited 7");
  CHECK(out.has(output_stream::out, "[steady] got-term\n"));
  CHECK(out.has(output_stream::err, "[steady] exited 7\n"));
  CHECK(out.has(output_stream::err, "[flaky] exited 3\n"));
  CHECK(out.index("[flaky] exited 3\n") < out.index("[steady] got-term\n"));
}

TEST_CASE("launcher: a child that ignores SIGTERM is killed after the grace period") {
  scratch_dir dir;
  captured out;
  supervisor_options opts;
  opts.sink = out.sink();
  opts.grace = milliseconds(200);
  supervisor sup(opts);
  auto t0 = clock_type::now();
  // `trap '' TERM` ignores SIGTERM in the shell and in `sleep`, which inherits it.
  auto r = sup.run({
    sh("stubborn", "trap '' TERM; touch '" + dir / "ready" + "'; sleep 30"),
    sh("flaky", wait_for(dir / "ready") + "kill -SEGV $$"),
  });
  double took = seconds_since(t0);
  CHECK(took >= 0.2);
  CHECK(took < 3);
  CHECK(r.outcome == launch_outcome::child_failed);
  CHECK(r.failed == "flaky");
  CHECK(exit_of(r, "flaky").describe() == "killed by signal " + std::to_string(SIGSEGV));
  auto& stubborn = exit_of(r, "stubborn");
  CHECK(stubborn.stopped);
  CHECK(stubborn.killed);
  CHECK(stubborn.describe() == "killed by signal 9");
  CHECK(out.has(output_stream::err,
                "[stubborn] still running after the grace period (200 ms); sending SIGKILL\n"));
  CHECK(out.has(output_stream::err, "[stubborn] killed by signal 9\n"));
}

TEST_CASE("launcher: a child inherits no descriptor above stderr") {
  // One this process holds without O_CLOEXEC (as from the shell that started it).
  const int held = 217;
  const int fd = ::open("/dev/null", O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::dup2(fd, held) == held);
  ::close(fd);
  captured out;
  supervisor_options opts;
  opts.sink = out.sink();
  supervisor sup(opts);
  auto r = sup.run({sh("fds", "if [ -e /proc/self/fd/217 ]; then echo inherited; else echo clean; fi")});
  ::close(held);
  CHECK(r.outcome == launch_outcome::succeeded);
  CHECK(out.has(output_stream::out, "[fds] clean\n"));
}

TEST_CASE("launcher: children that all exit 0, one long before the other, succeed") {
  scratch_dir dir;
  captured out;
  supervisor_options opts;
  opts.sink = out.sink();
  supervisor sup(opts);
  auto r = sup.run({
    sh("quick", "echo bye; touch '" + dir / "quick-done" + "'"),
    sh("slow", wait_for(dir / "quick-done") + "echo done"),
  });
  CHECK(r.outcome == launch_outcome::succeeded);
  CHECK(r.failed.empty());
  for (auto& e : r.exits) {
    CHECK(e.success());
    CHECK(!e.stopped);
  }
  CHECK(out.has(output_stream::out, "[quick] bye\n"));
  CHECK(out.has(output_stream::out, "[slow] done\n"));
}

TEST_CASE("launcher: request_stop (what SIGINT does) stops every child") {
  scratch_dir dir;
  captured out;
  supervisor_options opts;
  opts.sink = out.sink();
  opts.grace = std::chrono::seconds(5);
  supervisor sup(opts);
  // The stop comes from another thread once both children are ready.
  std::thread stopper([&] {
    for (int i = 0; i < 1000; ++i) {
      if (std::filesystem::exists(dir / "a") && std::filesystem::exists(dir / "b"))
        break;
      std::this_thread::sleep_for(milliseconds(10));
    }
    sup.request_stop();
  });
  auto r = sup.run({
    sh("a", "trap 'exit 0' TERM; touch '" + dir / "a" + "'; while :; do sleep 1; done"),
    sh("b", "touch '" + dir / "b" + "'; exec sleep 30"),
  });
  stopper.join();
  CHECK(r.outcome == launch_outcome::stopped);
  CHECK(r.failed.empty());
  CHECK(exit_of(r, "a").describe() == "exited 0");
  CHECK(exit_of(r, "b").describe() == "killed by signal " + std::to_string(SIGTERM));
  CHECK(exit_of(r, "a").stopped);
  CHECK(exit_of(r, "b").stopped);
}

TEST_CASE("launcher: SIGTERM, SIGINT or SIGHUP (the terminal closed) stop the children while stop_on_signals is installed") {
  for (const int sig : {SIGTERM, SIGINT, SIGHUP}) {
    CAPTURE(sig);
    scratch_dir dir;
    captured out;
    supervisor_options opts;
    opts.sink = out.sink();
    opts.grace = std::chrono::seconds(5);
    supervisor sup(opts);
    launch_result r;
    int received = 0;
    {
      stop_on_signals guard(sup);
      std::thread signaller([&] {
        for (int i = 0; i < 1000 && !std::filesystem::exists(dir / "ready"); ++i)
          std::this_thread::sleep_for(milliseconds(10));
        ::kill(::getpid(), sig);
      });
      r = sup.run(
        {sh("a", "trap 'echo stopping; exit 0' TERM; touch '" + dir / "ready" + "'; while :; do sleep 1; done")});
      signaller.join();
      received = guard.received();
    }
    CHECK(received == sig);
    CHECK(r.outcome == launch_outcome::stopped);
    CHECK(exit_of(r, "a").describe() == "exited 0");
    CHECK(out.has(output_stream::out, "[a] stopping\n"));
  }
}

TEST_CASE("launcher: a stop requested before run starts nothing") {
  captured out;
  supervisor_options opts;
  opts.sink = out.sink();
  supervisor sup(opts);
  sup.request_stop();
  auto r = sup.run({sh("never", "echo ran")});
  CHECK(r.outcome == launch_outcome::stopped);
  CHECK(r.exits.empty());
  CHECK(out.lines.empty());
}

TEST_CASE("launcher: a child that cannot start fails the run, and the others are stopped") {
  captured out;
  supervisor_options opts;
  opts.sink = out.sink();
  opts.grace = std::chrono::seconds(5);
  supervisor sup(opts);
  auto r = sup.run({sh("fine", "exec sleep 30"), {"missing", {"/nonexistent/rlsync-launcher-test"}}});
  CHECK(r.outcome == launch_outcome::child_failed);
  CHECK(r.failed == "missing");
  auto& missing = exit_of(r, "missing");
  CHECK(missing.exec_failed);
  CHECK(missing.describe() == "could not start: No such file or directory");
  CHECK(exit_of(r, "fine").describe() == "killed by signal " + std::to_string(SIGTERM));
}

TEST_CASE("fd_sink: a reader that stops reading costs one bounded wait, then lines are dropped") {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  ::fcntl(p[1], F_SETPIPE_SZ, 4096);
  fd_sink sink(p[1], p[1], milliseconds(50));
  const std::string line(1000, 'x');
  auto t0 = clock_type::now();
  for (int i = 0; i < 200; ++i)
    sink(output_stream::out, line);
  CHECK(seconds_since(t0) < 2);
  CHECK(sink.dropped() > 0);
  ::close(p[0]);
  ::close(p[1]);
}

TEST_CASE("local addresses: loopback, localhost and this machine's interfaces") {
  auto interfaces = interface_addresses();
  CHECK(is_local_address("127.0.0.1", interfaces));
  CHECK(is_local_address("127.3.2.1", interfaces));
  CHECK(is_local_address("::1", interfaces));
  CHECK(is_local_address("[::1]", interfaces));
  CHECK(is_local_address("localhost", interfaces));
  CHECK(is_local_address("LocalHost", interfaces));
  for (auto& a : interfaces)
    CHECK_MESSAGE(is_local_address(a, interfaces), a);
  // TEST-NET-1 (RFC 5737): not on this machine unless an interface says so.
  bool assigned = std::find(interfaces.begin(), interfaces.end(), "192.0.2.77") != interfaces.end();
  CHECK(is_local_address("192.0.2.77", interfaces) == assigned);
  CHECK(is_local_address("192.0.2.77", {"192.0.2.77"}));
  CHECK(!is_local_address("", interfaces));
}

TEST_CASE("shell_quote: plain words stay, others are single-quoted") {
  CHECK(shell_quote({"/usr/bin/rlsync", "node", "--node", "a-1"}) == "/usr/bin/rlsync node --node a-1");
  CHECK(shell_quote({"a b", "it's", ""}) == "'a b' 'it'\\''s' ''");
}

TEST_CASE("restart_delay: attempts, exponential backoff, cap") {
  using ms = milliseconds;
  struct row {
    const char* name;
    restart_policy policy;
    std::uint32_t restarts_done;
    std::optional<ms> expected;
  };
  const restart_policy on{true, 3, ms(500), ms(30000)};
  const restart_policy capped{true, 100, ms(500), ms(3000)};
  const row rows[] = {
    {"never restarts by default", restart_policy{}, 0, std::nullopt},
    {"first restart: the first backoff", on, 0, ms(500)},
    {"second: doubled", on, 1, ms(1000)},
    {"third: doubled again", on, 2, ms(2000)},
    {"past max_restarts: none", on, 3, std::nullopt},
    {"zero restarts allowed", restart_policy{true, 0, ms(500), ms(30000)}, 0, std::nullopt},
    {"capped at max_backoff", capped, 3, ms(3000)},
    {"capped, far past the cap, no overflow", capped, 99, ms(3000)},
    {"no backoff stays none", restart_policy{true, 5, ms(0), ms(1000)}, 4, ms(0)},
    {"first backoff beyond the cap is the cap", restart_policy{true, 5, ms(9000), ms(1000)}, 0, ms(1000)},
    {"huge count, huge cap: still the cap", restart_policy{true, 4000000000u, ms(1), ms::max()}, 3999999999u,
     ms::max()},
  };
  for (auto& r : rows) {
    CAPTURE(r.name);
    CHECK(restart_delay(r.policy, r.restarts_done) == r.expected);
  }
}

TEST_CASE("launcher: a child with restart on-failure is restarted with backoff, the others keep running") {
  scratch_dir dir;
  const std::string count = dir / "count";
  const std::string peer_done = dir / "peer-done";
  captured out;
  supervisor_options opts;
  opts.sink = out.sink();
  supervisor sup(opts);
  // flaky fails twice (SIGKILL, then exit 3) and succeeds the third time;
  // peer runs until flaky succeeded and must never be stopped.
  auto flaky = sh("flaky", "echo x >> '" + count + "'; n=$(wc -l < '" + count
                             + "'); if [ $n -eq 1 ]; then kill -9 $$; fi; if [ $n -eq 2 ]; then exit 3; fi; "
                               "touch '" + peer_done + "'");
  flaky.restart = restart_policy{true, 3, milliseconds(50), milliseconds(1000)};
  auto t0 = clock_type::now();
  auto r = sup.run({flaky, sh("peer", wait_for(peer_done) + "exit 0")});
  CHECK(r.outcome == launch_outcome::succeeded);
  CHECK(exit_of(r, "flaky").success());
  CHECK(exit_of(r, "flaky").restarts == 2);
  CHECK(exit_of(r, "peer").success());
  CHECK(!exit_of(r, "peer").stopped);
  CHECK(out.has(output_stream::err, "[flaky] restarting in 50 ms (restart 1 of 3)\n"));
  CHECK(out.has(output_stream::err, "[flaky] restarting in 100 ms (restart 2 of 3)\n"));
  CHECK(seconds_since(t0) >= 0.15); // both backoffs were waited
}

TEST_CASE("launcher: restarts run out, then the failure stops the others") {
  captured out;
  supervisor_options opts;
  opts.sink = out.sink();
  supervisor sup(opts);
  auto bad = sh("bad", "exit 4");
  bad.restart = restart_policy{true, 2, milliseconds(10), milliseconds(100)};
  auto r = sup.run({bad, sh("peer", "sleep 30")});
  CHECK(r.outcome == launch_outcome::child_failed);
  CHECK(r.failed == "bad");
  CHECK(exit_of(r, "bad").restarts == 2);
  CHECK(exit_of(r, "bad").code == 4);
  CHECK(exit_of(r, "peer").stopped);
  CHECK(out.has(output_stream::err, "[bad] failed after 2 restart(s), the most allowed\n"));
}

TEST_CASE("launcher: a stop cancels a pending restart") {
  captured out;
  supervisor_options opts;
  opts.sink = out.sink();
  supervisor sup(opts);
  auto bad = sh("bad", "exit 1");
  bad.restart = restart_policy{true, 3, milliseconds(60000), milliseconds(60000)};
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(300));
    sup.request_stop();
  });
  auto t0 = clock_type::now();
  auto r = sup.run({bad});
  stopper.join();
  CHECK(r.outcome == launch_outcome::stopped);
  CHECK(exit_of(r, "bad").restarts == 0);
  CHECK(seconds_since(t0) < 10);
}

TEST_CASE("launcher: a child that ends the run stops the others when it exits 0") {
  captured out;
  supervisor_options opts;
  opts.sink = out.sink();
  supervisor sup(opts);
  auto head = sh("head", "exit 0");
  head.ends_run = true;
  auto member = sh("member", "sleep 30");
  member.restart = restart_policy{true, 3, milliseconds(10), milliseconds(10)};
  auto t0 = clock_type::now();
  auto r = sup.run({head, member});
  CHECK(r.outcome == launch_outcome::succeeded);
  CHECK(exit_of(r, "member").stopped);
  CHECK(exit_of(r, "member").restarts == 0); // stopped, not failed: no restart
  CHECK(seconds_since(t0) < 10);
}
