#include "runtime/base/thread_schedule.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

using namespace rlsync;
using namespace std::chrono_literals;

TEST_CASE("schedstat_queued reads the run-queue wait of a schedstat line, nothing else") {
  struct row {
    std::string line;
    std::optional<std::chrono::nanoseconds> queued;
  };
  const std::vector<row> rows = {
      {"1503008 0 1\n", 0ns},
      {"987654321 12345 678\n", 12345ns},
      {"987654321 12345 678", 12345ns}, // no newline
      {"1 2\n", std::nullopt},          // two fields
      {"1 2 3 4\n", std::nullopt},      // four
      {"1 -2 3\n", std::nullopt},
      {"a b c\n", std::nullopt},
      {"", std::nullopt},
      {"1 99999999999999999999 3\n", std::nullopt},  // past 64 bits
      {"1 18446744073709551615 3\n", std::nullopt},  // past what nanoseconds hold
  };
  for (const auto& r : rows) {
    CAPTURE(r.line);
    CHECK(schedstat_queued(r.line) == r.queued);
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
  CHECK(d.queued >= 0ns);
  CHECK(d.queued_known == before.queued_known);
  const auto backwards = before.since(after); // the wrong order: zeros, not negatives
  CHECK(backwards.ran == 0ns);
  CHECK(backwards.queued == 0ns);
}
