#include "runtime/base/thread_schedule.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

using namespace rlsync;
using namespace std::chrono_literals;

TEST_CASE("parse_schedstat reads a schedstat line's time on a core and run-queue wait, nothing else") {
  struct row {
    std::string line;
    bool parses;
    std::chrono::nanoseconds ran, queued;
  };
  const std::vector<row> rows = {
      {"1503008 0 1\n", true, 1503008ns, 0ns},
      {"987654321 12345 678\n", true, 987654321ns, 12345ns},
      {"987654321 12345 678", true, 987654321ns, 12345ns}, // no newline
      {"1 2\n", false, 0ns, 0ns},                          // two fields
      {"1 2 3 4\n", false, 0ns, 0ns},                      // four
      {"1 -2 3\n", false, 0ns, 0ns},
      {"a b c\n", false, 0ns, 0ns},
      {"", false, 0ns, 0ns},
      {"1 99999999999999999999 3\n", false, 0ns, 0ns}, // past 64 bits
      {"18446744073709551615 1 3\n", false, 0ns, 0ns}, // past what nanoseconds hold
  };
  for (const auto& r : rows) {
    CAPTURE(r.line);
    const auto s = parse_schedstat(r.line);
    REQUIRE(s.has_value() == r.parses);
    if (s) {
      CHECK(s->ran == r.ran);
      CHECK(s->queued == r.queued);
      CHECK(s->queued_known);
    }
  }
}

TEST_CASE("thread_schedule: a thread's CPU time grows as it works, and since() never goes below zero") {
  const auto before = thread_schedule::now();
  volatile std::uint64_t sink = 0;
  const auto until = std::chrono::steady_clock::now() + 20ms;
  while (std::chrono::steady_clock::now() < until)
    sink = sink + 1;
  const auto after = thread_schedule::now();
  const auto d = after.since(before);
  CHECK(d.ran > 0ns);
  if (::access("/proc/thread-self/schedstat", R_OK) == 0) // read and parsed where the kernel has it
    CHECK(before.queued_known);
  const auto backwards = before.since(after); // the wrong order: zeros, not negatives
  CHECK(backwards.ran == 0ns);
  CHECK(backwards.queued == 0ns);
  if (before.queued_known) // the kernel keeps schedstat: this thread's, read as any thread's
    CHECK(thread_schedule::of_task(::gettid()).ran > 0ns);
  CHECK(thread_schedule::of_task(-1).ran == 0ns); // no such thread: zeros
  CHECK_FALSE(thread_schedule::of_task(-1).queued_known);
}

TEST_CASE("thread_schedule: two threads sharing one core each wait for it") {
  if (!thread_schedule::now().queued_known) {
    MESSAGE("skipped: this kernel keeps no schedstat");
    return;
  }
  cpu_set_t mine;
  REQUIRE(::sched_getaffinity(0, sizeof mine, &mine) == 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &mine))
    ++cpu;
  REQUIRE(cpu < CPU_SETSIZE);
  const auto until = std::chrono::steady_clock::now() + 100ms;
  thread_schedule spent[2];
  bool pinned[2] = {false, false};
  auto spin = [&](int k) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pinned[k] = ::pthread_setaffinity_np(::pthread_self(), sizeof one, &one) == 0;
    const auto start = thread_schedule::now();
    volatile std::uint64_t sink = 0;
    while (std::chrono::steady_clock::now() < until)
      sink = sink + 1;
    spent[k] = thread_schedule::now().since(start);
  };
  std::thread a(spin, 0), b(spin, 1);
  a.join();
  b.join();
  if (!pinned[0] || !pinned[1]) {
    MESSAGE("skipped: threads cannot be pinned to one core here");
    return;
  }
  // Both runnable on one core for most of 100 ms: each ran part of it and
  // queued behind the other for part of it, and neither ran more than the time.
  for (const auto& s : spent) {
    CHECK(s.ran > 0ns);
    CHECK(s.queued > 0ns);
    CHECK(s.ran < 150ms);
  }
}
