// A round's figures from the recorded times, row by row, and its log line.
#include "runtime/control/round_figures.hpp"

#include <doctest/doctest.h>

#include <limits>
#include <vector>

using namespace rlsync;

TEST_CASE("figures_of: stall, transfer and control, summed over waves") {
  struct row {
    const char* what;
    std::vector<wave_times> waves;
    std::uint64_t end;
    std::uint64_t stall, transfer, control;
  };
  constexpr auto max = std::numeric_limits<std::uint64_t>::max();
  // wave_times: pause_sent, transfer_sent, transfer_done, last_resume_ack, ended
  const std::vector<row> rows = {
    {"no wave (nobody to sync)", {}, 500, 0, 0, 0},
    {"one wave", {{100, 200, 2200, 2300, 2300}}, 2300, 2200, 2000, 200},
    {"no resume acknowledged: until the wave's end", {{100, 200, 300, 0, 900}}, 1000, 800, 100, 700},
    {"not ended: until the round's end", {{100, 0, 0, 0, 0}}, 1000, 900, 0, 900},
    {"an aborted transfer never ended", {{100, 200, 0, 400, 400}}, 400, 300, 0, 300},
    {"transfer longer than stall: control 0", {{100, 100, 900, 500, 900}}, 900, 400, 800, 0},
    {"three waves add up",
     {{0, 10, 60, 100, 100}, {100, 110, 160, 200, 200}, {200, 210, 260, 300, 300}},
     300, 300, 150, 150},
    {"clock before the pause: 0, not a wrap", {{500, 0, 0, 400, 400}}, 400, 0, 0, 0},
    {"sums saturate", {{0, 0, 0, max, max}, {0, 0, 0, max, max}}, max, max, 0, max},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    auto f = figures_of(r.waves, r.end);
    CHECK(f.stall_ns == r.stall);
    CHECK(f.transfer_ns == r.transfer);
    CHECK(f.control_ns == r.control);
  }
}

TEST_CASE("report_of carries the record and the figures") {
  round_record rec;
  rec.id = 4;
  rec.version = 9;
  rec.waves = {{1'000, 2'000, 5'000, 6'000, 6'000}};
  rec.bytes = 12'345;
  rec.engines_synced = 3;
  rec.evicted = {"b"};
  auto rep = report_of(rec, 7'000);
  CHECK(rep.version == 9);
  CHECK(rep.engines_synced == 3);
  CHECK(rep.evicted == std::vector<std::string>{"b"});
  CHECK(rep.stall_ns == 5'000);
  CHECK(rep.transfer_ns == 3'000);
  CHECK(rep.control_ns == 2'000);
  CHECK(rep.bytes == 12'345);
  CHECK(!rep.aborted);
}

TEST_CASE("transfer_gbps and millis") {
  struct row {
    std::uint64_t bytes, ns;
    double gbps;
  };
  const row rows[] = {{0, 0, 0.0}, {1'000'000'000, 0, 0.0}, {1'000'000'000, 1'000'000'000, 1.0},
                      {3'000'000'000, 1'000'000'000, 3.0}, {500, 1'000, 0.5}};
  for (auto& r : rows) {
    CAPTURE(r.bytes);
    CAPTURE(r.ns);
    CHECK(transfer_gbps(r.bytes, r.ns) == doctest::Approx(r.gbps));
  }
  CHECK(millis(0) == "0.000 ms");
  CHECK(millis(2'100'000'000) == "2100.000 ms");
  CHECK(millis(1'500) == "0.002 ms");
}

TEST_CASE("slowest_pull_ms: the slowest engine's pull, in ms, under the names every report uses") {
  sync_report r;
  r.slowest_pull_ns = 9'000'000;
  r.slowest_wait_ns = 2'000'000;
  r.slowest_store_ns = 6'500'000;
  r.slowest_ran_ns = 4'250'000;
  r.slowest_queued_ns = 0; // not measured, or no wait
  const std::vector<std::pair<std::string, double>> want = {{"slowest_pull_ms", 9.0},
                                                            {"slowest_wait_ms", 2.0},
                                                            {"slowest_store_ms", 6.5},
                                                            {"slowest_ran_ms", 4.25},
                                                            {"slowest_queued_ms", 0.0}};
  CHECK(slowest_pull_ms(r) == want);
}

TEST_CASE("log_line_of: completed, with evictions, aborted, in waves") {
  struct row {
    const char* what;
    round_record rec;
    const char* line;
  };
  round_record done;
  done.id = 3;
  done.version = 7;
  done.waves = {{0, 0, 0, 2'000'000, 2'000'000}};
  done.engines_synced = 2;
  done.bytes = 2000;
  auto evicted = done;
  evicted.eviction_notes = {"c (pause: no answer within 5000 ms)"};
  auto aborted = done;
  aborted.engines_synced = 0;
  aborted.aborted = true;
  aborted.abort_reason = "the trainer is down";
  aborted.old_version = 1;
  aborted.dirty = 1;
  auto waves = done;
  waves.engines_synced = 5;
  waves.waves = {{0, 0, 0, 1'000'000, 1'000'000}, {1'000'000, 0, 0, 2'000'000, 2'000'000}};
  auto aborted_late = waves;
  aborted_late.engines_synced = 2;
  aborted_late.aborted = true;
  aborted_late.abort_reason = "the trainer is down";
  aborted_late.old_version = 3;
  const std::vector<row> rows = {
    {"completed", done,
     "sync round 3 v7: 2 engines synced; stall 2.000 ms, transfer 0.000 ms, 2000 bytes, control 2.000 ms"},
    {"an eviction", evicted,
     "sync round 3 v7: 2 engines synced, evicted c (pause: no answer within 5000 ms); stall 2.000 ms, "
     "transfer 0.000 ms, 2000 bytes, control 2.000 ms"},
    {"aborted", aborted,
     "sync round 3 v7: ABORTED (the trainer is down): 1 engines resume on their old version, 1 dirty; "
     "stall 2.000 ms, transfer 0.000 ms, 2000 bytes, control 2.000 ms"},
    {"waves", waves,
     "sync round 3 v7: 5 engines synced in 2 waves; stall 2.000 ms, transfer 0.000 ms, 2000 bytes, "
     "control 2.000 ms"},
    {"aborted after a wave", aborted_late,
     "sync round 3 v7: ABORTED (the trainer is down): 3 engines resume on their old version, 0 dirty, "
     "2 synced in earlier waves; stall 2.000 ms, transfer 0.000 ms, 2000 bytes, control 2.000 ms"},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    CHECK(log_line_of(r.rec, report_of(r.rec, 2'000'000)) == r.line);
  }
}
