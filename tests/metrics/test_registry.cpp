// The metrics registry: names, escaping, values and the text format, row by row.
#include "runtime/metrics/registry.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace rlsync::metrics;

TEST_CASE("metrics: metric and label names") {
  struct row {
    const char* name;
    bool metric, label;
  };
  const std::vector<row> rows = {
    {"rlsync_rounds_total", true, true},
    {"vllm:num_requests_running", true, false},
    {":leading_colon", true, false},
    {"_underscore", true, true},
    {"__reserved", true, false},
    {"9starts_with_digit", false, false},
    {"", false, false},
    {"has-dash", false, false},
    {"has space", false, false},
    {"ünicode", false, false},
    {"a1", true, true},
  };
  for (auto& r : rows) {
    CAPTURE(r.name);
    CHECK(valid_metric_name(r.name) == r.metric);
    CHECK(valid_label_name(r.name) == r.label);
  }
}

TEST_CASE("metrics: label values and help escaped") {
  struct row {
    std::string in, label, help;
  };
  const std::vector<row> rows = {
    {"plain", "plain", "plain"},
    {"a\"b", "a\\\"b", "a\"b"},
    {"back\\slash", "back\\\\slash", "back\\\\slash"},
    {"two\nlines", "two\\nlines", "two\\nlines"},
    {"", "", ""},
  };
  for (auto& r : rows) {
    CAPTURE(r.in);
    CHECK(escape_label_value(r.in) == r.label);
    CHECK(escape_help(r.in) == r.help);
  }
}

TEST_CASE("metrics: sample values") {
  struct row {
    double v;
    const char* text;
  };
  const std::vector<row> rows = {
    {0, "0"},
    {42, "42"},
    {-3, "-3"},
    {0.5, "0.5"},
    {0.01, "0.01"},
    {1e300, "1e+300"},
    {9007199254740992.0, "9007199254740992"},
    {std::numeric_limits<double>::infinity(), "+Inf"},
    {-std::numeric_limits<double>::infinity(), "-Inf"},
    {std::nan(""), "NaN"},
  };
  for (auto& r : rows) {
    CAPTURE(r.text);
    CHECK(format_value(r.v) == r.text);
  }
}

TEST_CASE("metrics: the text format, family by family") {
  struct row {
    const char* what;
    std::function<void(registry&)> fill;
    std::string text;
  };
  const std::vector<row> rows = {
    {"an empty registry renders nothing", [](registry&) {}, ""},
    {"a family without series: HELP and TYPE only",
     [](registry& r) { r.counters("rlsync_rounds_total", "Sync rounds", {"outcome"}); },
     "# HELP rlsync_rounds_total Sync rounds\n# TYPE rlsync_rounds_total counter\n"},
    {"a counter without labels",
     [](registry& r) { r.counters("rlsync_bytes_total", "Bytes").only().inc(1024); },
     "# HELP rlsync_bytes_total Bytes\n# TYPE rlsync_bytes_total counter\nrlsync_bytes_total 1024\n"},
    {"counters never go down",
     [](registry& r) {
       auto& c = r.counters("c_total", "c").only();
       c.inc(2);
       c.inc(-1);
       c.inc(std::nan(""));
       c.inc(std::numeric_limits<double>::infinity());
     },
     "# HELP c_total c\n# TYPE c_total counter\nc_total 2\n"},
    {"series ordered by label values, values escaped",
     [](registry& r) {
       auto& f = r.gauges("rlsync_engines", "Engines by state", {"state"});
       f.with({"serving"}).set(2);
       f.with({"evicted"}).set(1);
       f.with({"odd\"one\\\n"}).set(0);
     },
     "# HELP rlsync_engines Engines by state\n# TYPE rlsync_engines gauge\n"
     "rlsync_engines{state=\"evicted\"} 1\nrlsync_engines{state=\"odd\\\"one\\\\\\n\"} 0\n"
     "rlsync_engines{state=\"serving\"} 2\n"},
    {"gauges go both ways, two labels",
     [](registry& r) {
       auto& g = r.gauges("vllm:num_requests_running", "Running", {"engine", "model_name"}).with({"e0", "m"});
       g.set(5);
       g.dec(2);
       g.inc(0.5);
     },
     "# HELP vllm:num_requests_running Running\n# TYPE vllm:num_requests_running gauge\n"
     "vllm:num_requests_running{engine=\"e0\",model_name=\"m\"} 3.5\n"},
    {"a histogram: cumulative buckets, le on the bound, +Inf, sum, count",
     [](registry& r) {
       auto& h = r.histograms("rlsync_sync_phase_seconds", "Phase", {0.1, 1, 10}, {"phase"}).with({"pause"});
       h.observe(0.05);
       h.observe(1); // on a bound: that bucket
       h.observe(3);
       h.observe(100);
       h.observe(std::nan("")); // ignored
     },
     "# HELP rlsync_sync_phase_seconds Phase\n# TYPE rlsync_sync_phase_seconds histogram\n"
     "rlsync_sync_phase_seconds_bucket{phase=\"pause\",le=\"0.1\"} 1\n"
     "rlsync_sync_phase_seconds_bucket{phase=\"pause\",le=\"1\"} 2\n"
     "rlsync_sync_phase_seconds_bucket{phase=\"pause\",le=\"10\"} 3\n"
     "rlsync_sync_phase_seconds_bucket{phase=\"pause\",le=\"+Inf\"} 4\n"
     "rlsync_sync_phase_seconds_sum{phase=\"pause\"} 104.05\n"
     "rlsync_sync_phase_seconds_count{phase=\"pause\"} 4\n"},
    {"a histogram without labels, nothing observed",
     [](registry& r) { r.histograms("h_seconds", "h", {0.5}).only(); },
     "# HELP h_seconds h\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"0.5\"} 0\n"
     "h_seconds_bucket{le=\"+Inf\"} 0\nh_seconds_sum 0\nh_seconds_count 0\n"},
    {"families by name; help escaped",
     [](registry& r) {
       r.gauges("b", "second\\line\nbreak").only().set(1);
       r.gauges("a", "first").only().set(-1);
     },
     "# HELP a first\n# TYPE a gauge\na -1\n# HELP b second\\\\line\\nbreak\n# TYPE b gauge\nb 1\n"},
    {"a full family drops new label sets and says so",
     [](registry& r) {
       auto& f = r.counters("per_engine_total", "p", {"engine"}, 2);
       f.with({"a"}).inc();
       f.with({"b"}).inc();
       f.with({"c"}).inc(); // dropped
       f.with({"a"}).inc(); // existing: kept
     },
     "# HELP per_engine_total p\n# TYPE per_engine_total counter\nper_engine_total{engine=\"a\"} 2\n"
     "per_engine_total{engine=\"b\"} 1\n"
     "# HELP rlsync_metrics_dropped_series_total Updates dropped because their family held too many label sets\n"
     "# TYPE rlsync_metrics_dropped_series_total counter\nrlsync_metrics_dropped_series_total 1\n"},
    {"a collector runs before the render",
     [](registry& r) {
       r.add_collector([&r] { r.gauges("collected", "c").only().set(7); });
     },
     "# HELP collected c\n# TYPE collected gauge\ncollected 7\n"},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    registry reg;
    r.fill(reg);
    CHECK(reg.render() == r.text);
  }
}

TEST_CASE("metrics: bad registrations refused") {
  struct row {
    const char* what;
    std::function<void(registry&)> act;
  };
  const std::vector<row> rows = {
    {"bad metric name", [](registry& r) { r.counters("1bad", "x"); }},
    {"bad label name", [](registry& r) { r.counters("ok", "x", {"bad-label"}); }},
    {"reserved label name", [](registry& r) { r.counters("ok", "x", {"__name"}); }},
    {"label named twice", [](registry& r) { r.counters("ok", "x", {"a", "a"}); }},
    {"histogram label le", [](registry& r) { r.histograms("ok", "x", {1}, {"le"}); }},
    {"histogram without buckets", [](registry& r) { r.histograms("ok", "x", {}); }},
    {"buckets not ascending", [](registry& r) { r.histograms("ok", "x", {1, 1}); }},
    {"infinite bucket", [](registry& r) { r.histograms("ok", "x", {1, std::numeric_limits<double>::infinity()}); }},
    {"same name, other type",
     [](registry& r) {
       r.counters("same", "x");
       r.gauges("same", "x");
     }},
    {"same name, other labels",
     [](registry& r) {
       r.counters("same", "x", {"a"});
       r.counters("same", "x", {"b"});
     }},
    {"same histogram, other buckets",
     [](registry& r) {
       r.histograms("same", "x", {1});
       r.histograms("same", "x", {2});
     }},
    {"wrong number of label values", [](registry& r) { r.counters("ok", "x", {"a"}).with({"1", "2"}); }},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    registry reg;
    CHECK_THROWS_AS(r.act(reg), std::invalid_argument);
  }
  registry reg;
  auto& a = reg.counters("again_total", "x", {"l"});
  CHECK(&reg.counters("again_total", "x", {"l"}) == &a); // the same family again
}

TEST_CASE("metrics: concurrent updates all count") {
  registry reg;
  auto& c = reg.counters("c_total", "c").only();
  auto& h = reg.histograms("h", "h", {1}).only();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.inc();
        h.observe(i % 2 ? 0.5 : 2.0);
      }
    });
  for (auto& t : threads)
    t.join();
  CHECK(c.value() == 40000);
  CHECK(h.count() == 40000);
  CHECK(h.cumulative() == std::vector<std::uint64_t>{20000, 40000});
  CHECK(h.sum() == doctest::Approx(50000.0));
}
