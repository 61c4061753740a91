// The data plane's fault hooks: a withheld group stays withheld only for
// its version and only until its release time (a drill in another process
// bounds it, so a fault that never comes cannot hang a version for good).
#include "runtime/transfer/faults.hpp"

#include <doctest/doctest.h>

using namespace rlsync::transfer;
using namespace std::chrono_literals;

TEST_CASE("fault_hooks: a withheld group, by version and release time") {
  const auto t0 = fault_hooks::clock::time_point{} + 1h;
  struct row {
    const char* what;
    std::uint32_t group;
    std::uint64_t version; // withheld (0: any)
    bool bounded;          // released at t0 + 5 s
    std::uint64_t asked_version;
    std::uint32_t asked_group;
    std::chrono::milliseconds asked_at; // after t0
    bool withheld;
  };
  const row rows[] = {
    {"that group of that version", 3, 12, false, 12, 3, 0ms, true},
    {"another group", 3, 12, false, 12, 2, 0ms, false},
    {"another version", 3, 12, false, 13, 3, 0ms, false},
    {"any version", 3, 0, false, 13, 3, 0ms, true},
    {"unbounded: still withheld much later", 3, 12, false, 12, 3, 3600000ms, true},
    {"bounded: withheld before its release", 3, 12, true, 12, 3, 4999ms, true},
    {"bounded: released at its time", 3, 12, true, 12, 3, 5000ms, false},
    {"bounded: released after it", 3, 12, true, 12, 3, 60000ms, false},
  };
  for (const auto& r : rows) {
    CAPTURE(r.what);
    fault_hooks hooks;
    if (r.bounded)
      hooks.withhold(r.group, r.version, t0 + 5s);
    else
      hooks.withhold(r.group, r.version);
    CHECK(hooks.is_withheld_at(r.asked_version, r.asked_group, t0 + r.asked_at) == r.withheld);
  }
}

TEST_CASE("fault_hooks: a released withhold stays released, and clear drops every one") {
  const auto t0 = fault_hooks::clock::time_point{} + 1h;
  fault_hooks hooks;
  hooks.withhold(1, 7, t0 + 1s);
  hooks.withhold(2, 7);
  CHECK(hooks.is_withheld_at(7, 1, t0));
  CHECK_FALSE(hooks.is_withheld_at(7, 1, t0 + 2s));
  CHECK_FALSE(hooks.is_withheld_at(7, 1, t0)); // dropped once released, even asked about an earlier time
  CHECK(hooks.is_withheld_at(7, 2, t0 + 2s));
  hooks.clear();
  CHECK_FALSE(hooks.is_withheld_at(7, 2, t0));
}

TEST_CASE("fault_hooks: a corruption of one version, or from it on") {
  struct row {
    const char* what;
    std::uint64_t version;
    bool or_later;
    std::uint64_t received;
    bool altered;
  };
  const row rows[] = {
    {"that version", 12, false, 12, true},   {"a later version, exact", 12, false, 13, false},
    {"an earlier version", 12, true, 11, false}, {"that version, or later", 12, true, 12, true},
    {"a later version, or later", 12, true, 14, true}, {"any version", 0, false, 3, true},
  };
  for (const auto& r : rows) {
    CAPTURE(r.what);
    fault_hooks hooks;
    corruption c;
    c.engine = "rollout-a";
    c.version = r.version;
    c.or_later = r.or_later;
    hooks.corrupt(c);
    CHECK_FALSE(hooks.take_corruption("rollout-b", 0, r.received, 0)); // another engine
    CHECK_FALSE(hooks.take_corruption("rollout-a", 0, r.received, 1)); // another group
    CHECK(hooks.take_corruption("rollout-a", 0, r.received, 0) == r.altered);
    if (r.altered)
      CHECK_FALSE(hooks.take_corruption("rollout-a", 0, r.received + 1, 0)); // once at most
    // What landed, per engine: a drill's proof that its corruption was used.
    CHECK(hooks.corruptions_landed("rollout-a") == (r.altered ? 1u : 0u));
    CHECK(hooks.corruptions_landed("rollout-b") == 0);
  }
}
