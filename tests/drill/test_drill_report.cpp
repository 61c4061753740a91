// The drill report: lane segments row by row, the verdict, JSON that a strict
// parser reads back (duplicate keys refused), and an HTML page whose every
// record string is escaped.
#include "runtime/drill/drill_report.hpp"

#include "tests/support/scratch_dir.hpp"

#include "runtime/base/json.hpp"

#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

using namespace rlsync;
using S = lane_state;

namespace {

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++n;
  return n;
}

// Strict: a duplicate key or a syntax error throws.
nlohmann::json parse_json(const std::string& text) { return read_json_strict(text); }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

/// A small drill: two engines, a fault on e1 and its recovery, a sync round.
drill_record sample() {
  drill_record r;
  r.name = "two-engines";
  r.source = "topologies/two.yaml";
  r.duration_ms = 1000;
  r.engines = {"e0", "e1"};
  r.lanes = {{0, "e0", S::generating}, {0, "e1", S::generating},  {300, "e1", S::dead},
             {500, "e1", S::rejoining}, {600, "e1", S::generating}, {700, "e0", S::paused},
             {720, "e0", S::transferring}, {760, "e0", S::generating}};
  r.marks = {{300, "fault", "kill e1"}, {340, "detect", "e1 down"}, {500, "heal", "restart e1"},
             {700, "sync", "round 1 (v2)"}};
  r.throughput = {{100, 2000}, {400, 1000}, {800, 1900.5}};
  r.invariants = {{"no request lost", true, "400/400 answered"},
                  {"versions never go backwards", true, "checked 3 rounds"}};
  r.figures = {{"detection time", 40, "ms", "< 100 ms"},
               {"throughput after", 1900.5, "tokens/s", ""}};
  r.log = {"t=300 kill e1", "t=340 e1 evicted"};
  return r;
}

} // namespace

TEST_CASE("drill report: lane states have names") {
  CHECK(to_string(S::generating) == "generating");
  CHECK(to_string(S::paused) == "paused");
  CHECK(to_string(S::transferring) == "transferring");
  CHECK(to_string(S::dirty) == "dirty");
  CHECK(to_string(S::dead) == "dead");
  CHECK(to_string(S::rejoining) == "rejoining");
}

TEST_CASE("drill report: lane segments from events") {
  struct row {
    const char* what;
    double duration_ms;
    std::vector<lane_event> events;
    std::vector<lane_segment> want;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const row rows[] = {
    {"state persists to the end", 100, {{10, "a", S::generating}}, {{"a", S::generating, 10, 100}}},
    {"until the next event",
     100,
     {{0, "a", S::generating}, {40, "a", S::paused}},
     {{"a", S::generating, 0, 40}, {"a", S::paused, 40, 100}}},
    {"clipped at the duration",
     100,
     {{50, "a", S::dirty}, {150, "a", S::dead}, {200, "a", S::rejoining}},
     {{"a", S::dirty, 50, 100}}},
    {"unsorted input",
     100,
     {{60, "a", S::dead}, {0, "a", S::generating}, {30, "a", S::paused}},
     {{"a", S::generating, 0, 30}, {"a", S::paused, 30, 60}, {"a", S::dead, 60, 100}}},
    {"same state back to back merges",
     100,
     {{0, "a", S::generating}, {50, "a", S::generating}},
     {{"a", S::generating, 0, 100}}},
    {"same time: the later event wins",
     100,
     {{20, "a", S::paused}, {20, "a", S::transferring}},
     {{"a", S::transferring, 20, 100}}},
    {"before 0 starts at 0", 100, {{-5, "a", S::generating}}, {{"a", S::generating, 0, 100}}},
    {"non-finite time ignored", 100, {{nan, "a", S::dead}}, {}},
    {"duration 0: nothing", 0, {{0, "a", S::generating}}, {}},
    {"unknown engine ignored", 100, {{0, "zz", S::generating}}, {}},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    drill_record rec;
    rec.duration_ms = r.duration_ms;
    rec.engines = {"a"};
    rec.lanes = r.events;
    auto got = lane_segments(rec);
    REQUIRE(got.size() == r.want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i].engine == r.want[i].engine);
      CHECK(got[i].state == r.want[i].state);
      CHECK(got[i].begin_ms == r.want[i].begin_ms);
      CHECK(got[i].end_ms == r.want[i].end_ms);
    }
  }
}

TEST_CASE("drill report: lane segments follow engine order, an engine without events has none") {
  drill_record r;
  r.duration_ms = 10;
  r.engines = {"z", "idle", "a"};
  r.lanes = {{5, "a", S::paused}, {0, "a", S::generating}, {2, "z", S::dirty}};
  auto got = lane_segments(r);
  REQUIRE(got.size() == 3);
  CHECK(got[0].engine == "z");
  CHECK(got[1].engine == "a");
  CHECK(got[1].begin_ms == 0);
  CHECK(got[2].engine == "a");
  CHECK(got[2].begin_ms == 5);
}

TEST_CASE("drill report: passed means every invariant held, and at least one was checked") {
  drill_record r;
  CHECK_FALSE(r.passed());
  r.invariants = {{"a", true, ""}, {"b", true, ""}};
  CHECK(r.passed());
  r.invariants.push_back({"c", false, "v3 after v4"});
  CHECK_FALSE(r.passed());
}

TEST_CASE("drill report: an invariant not judged never fails the drill, nor passes it alone") {
  struct row {
    const char* what;
    std::vector<invariant_result> invariants;
    bool passed;
  };
  const row rows[] = {
    {"held and reported, not held", {{"a", true, ""}, {"t", false, "89%", false}}, true},
    {"held and reported, held", {{"a", true, ""}, {"t", true, "99%", false}}, true},
    {"violated and reported", {{"a", false, ""}, {"t", true, "99%", false}}, false},
    {"only reported", {{"t", true, "99%", false}}, false},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    drill_record rec;
    rec.invariants = r.invariants;
    CHECK(rec.passed() == r.passed);
  }
  drill_record rec;
  rec.invariants = {{"a", true, ""}, {"throughput back", false, "89%", false}};
  auto json = nlohmann::json::parse(drill_report_json(rec));
  CHECK(json["passed"] == true);
  CHECK(json["invariants"][0]["judged"] == true);
  CHECK(json["invariants"][1]["judged"] == false);
  CHECK(json["invariants"][1]["held"] == false);
  auto html = drill_report_html(rec);
  CHECK(html.find("reported, not judged") != std::string::npos);
  CHECK(html.find("class=\"violated\"") == std::string::npos);
}

TEST_CASE("drill report: JSON parses and carries the record") {
  auto r = sample();
  r.figures.push_back({"not measured", std::numeric_limits<double>::infinity(), "ms", ""});
  auto t = parse_json(drill_report_json(r));
  CHECK(t.at("name") == "two-engines");
  CHECK(t.at("source") == "topologies/two.yaml");
  CHECK(t.at("passed") == true);
  CHECK(t.at("duration_ms") == 1000);
  CHECK(t.at("engines").size() == 2);
  CHECK(t.at("engines").back() == "e1");

  auto& figures = t.at("figures");
  REQUIRE(figures.size() == 3);
  CHECK(figures.front().at("name") == "detection time");
  CHECK(figures.front().at("value") == 40);
  CHECK(figures.front().at("target") == "< 100 ms");
  CHECK(figures.back().at("value").is_null());

  CHECK(t.at("invariants").size() == 2);
  CHECK(t.at("invariants").front().at("held") == true);
  CHECK(t.at("marks").size() == 4);
  CHECK(t.at("marks").front().at("kind") == "fault");
  CHECK(t.at("throughput").back().at("tokens_per_s") == 1900.5);
  CHECK(t.at("log").size() == 2);

  auto& segments = t.at("segments");
  CHECK(segments.size() == lane_segments(r).size());
  auto dead = std::find_if(segments.begin(), segments.end(), [](auto& s) { return s.at("state") == "dead"; });
  REQUIRE(dead != segments.end());
  CHECK(dead->at("engine") == "e1");
  CHECK(dead->at("begin_ms") == 300);
  CHECK(dead->at("end_ms") == 500);

  r.invariants[1].held = false;
  CHECK(parse_json(drill_report_json(r)).at("passed") == false);
}

TEST_CASE("drill report: JSON escapes quotes, newlines and </script>") {
  drill_record r;
  r.name = "say \"hi\"\n</script><script>alert(1)</script>\\";
  r.log = {"tab\there", std::string("nul\0byte", 8), "not UTF-8: \xff"};
  auto json = drill_report_json(r);
  CHECK(json.find("</script>") == std::string::npos);
  CHECK(json.find("<\\/script>") != std::string::npos);
  auto t = parse_json(json);
  CHECK(t.at("name") == r.name);
  CHECK(t.at("log").front() == "tab\there");
  CHECK(t.at("log").at(1) == r.log[1]);
  CHECK(t.at("log").at(2) == "not UTF-8: \xef\xbf\xbd"); // replaced, so the report stays JSON
  CHECK(t.at("passed") == false);
  CHECK(t.at("segments").empty());
}

TEST_CASE("drill report: HTML has the verdict, tables, lanes, segments and marks") {
  auto r = sample();
  auto html = drill_report_html(r);
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(html.find("<svg") != std::string::npos);
  CHECK(html.find("PASSED") != std::string::npos);
  CHECK(html.find("FAILED") == std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  CHECK(count(html, "://") == 1); // only the SVG namespace: no external resource
  CHECK(count(html, "class=\"lane-label\"") == 2);
  CHECK(count(html, "<rect class=\"seg ") == lane_segments(r).size());
  CHECK(count(html, "<rect class=\"seg dead\"") == 1);
  CHECK(count(html, "<g class=\"mark fault\"><title>") == 1);
  CHECK(count(html, "<g class=\"mark sync\"><title>") == 1);
  CHECK(html.find("restart e1") != std::string::npos);
  CHECK(html.find("<polyline class=\"tput\"") != std::string::npos);
  CHECK(html.find("no request lost") != std::string::npos);
  CHECK(html.find("&lt; 100 ms") != std::string::npos);
  CHECK(html.find("1900.5") != std::string::npos);
  CHECK(html.find("<pre>t=300 kill e1\n") != std::string::npos);

  r.invariants[0].held = false;
  html = drill_report_html(r);
  CHECK(html.find("FAILED") != std::string::npos);
  CHECK(html.find("<td class=\"violated\">violated</td>") != std::string::npos);
}

TEST_CASE("drill report: HTML escapes every string from the record") {
  drill_record r;
  r.name = "<b>x&y";
  r.source = "'q'.yaml";
  r.duration_ms = 100;
  r.engines = {"<b>x&y"};
  r.lanes = {{0, "<b>x&y", S::generating}};
  r.marks = {{50, "<i>fault", "<b>x&y"}};
  r.invariants = {{"<b>x&y", true, "\"<b>x&y\""}};
  r.figures = {{"<b>x&y", 1, "<b>x&y", "<b>x&y"}};
  r.log = {"<b>x&y"};
  auto html = drill_report_html(r);
  CHECK(html.find("<b>") == std::string::npos);
  CHECK(html.find("<i>") == std::string::npos);
  CHECK(html.find("'q'") == std::string::npos);
  CHECK(html.find("&#39;q&#39;.yaml") != std::string::npos);
  CHECK(html.find("&quot;&lt;b&gt;x&amp;y&quot;") != std::string::npos);
  CHECK(count(html, "&lt;b&gt;x&amp;y") >= 9);
  // An unknown kind of mark never becomes a class.
  CHECK(count(html, "<g class=\"mark other\"><title>") == 1);
}

TEST_CASE("drill report: HTML for edge cases: no engines, no samples, duration 0, one engine") {
  drill_record empty;
  auto html = drill_report_html(empty);
  CHECK(html.find("<svg") != std::string::npos);
  CHECK(html.find("no engines") != std::string::npos);
  CHECK(html.find("no throughput samples") != std::string::npos);
  CHECK(html.find("FAILED") != std::string::npos);
  CHECK(html.find("nan") == std::string::npos);
  CHECK(html.find("inf") == std::string::npos);
  CHECK(count(html, "<rect class=\"seg ") == 0);

  drill_record one;
  one.duration_ms = 0;
  one.engines = {"solo"};
  one.lanes = {{0, "solo", S::generating}};
  one.marks = {{0, "fault", "at once"}};
  one.throughput = {{0, 5}};
  html = drill_report_html(one);
  CHECK(count(html, "class=\"lane-label\"") == 1);
  CHECK(html.find("nan") == std::string::npos);
  CHECK(html.find("<circle class=\"tput\"") != std::string::npos);

  one.duration_ms = std::numeric_limits<double>::quiet_NaN();
  one.throughput = {{0, std::numeric_limits<double>::quiet_NaN()}, {0.5, 3}};
  html = drill_report_html(one);
  CHECK(html.find("\"nan") == std::string::npos);
  CHECK(parse_json(drill_report_json(one)).at("duration_ms").is_null());

  // Many marks at one place stay within a bounded number of label rows.
  drill_record crowded = sample();
  for (int i = 0; i < 50; ++i)
    crowded.marks.push_back({500, "sync", "round " + std::to_string(i)});
  html = drill_report_html(crowded);
  CHECK(count(html, "<g class=\"mark sync\"><title>") == 51);
}

TEST_CASE("drill report: write_drill_report writes both files, creating the directory") {
  test::scratch_dir tmp;
  auto dir = tmp / "a/b/drill";
  auto r = sample();
  write_drill_report(r, dir);
  CHECK(slurp(dir + "/report.json") == drill_report_json(r));
  CHECK(slurp(dir + "/report.html") == drill_report_html(r));
  write_drill_report(r, dir); // again, over the old ones
  CHECK(slurp(dir + "/report.json") == drill_report_json(r));
}

TEST_CASE("drill report: write_drill_report names the path it cannot write") {
  test::scratch_dir tmp;
  std::ofstream(tmp / "file") << "x";
  auto dir = tmp / "file/drill";
  try {
    write_drill_report(sample(), dir);
    FAIL("no exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find(dir) != std::string::npos);
  }
}
