// The coordinator's state file: round trips, a first start, every way a file
// can be malformed (row by row, each pinned to its line, column and field),
// and the atomic write leaving either the old file or the new one.
#include "runtime/control/coordinator_state_file.hpp"
#include "tests/support/scratch_dir.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

using namespace rlsync;
using rlsync::test::scratch_dir;
namespace fs = std::filesystem;

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  REQUIRE(out.good());
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  for (auto& e : fs::directory_iterator(dir))
    out.insert(e.path().filename().string());
  return out;
}

// The message read_coordinator_state throws for `text`, or "" if none.
std::string read_error(const std::string& path, const std::string& text) {
  write_text(path, text);
  try {
    read_coordinator_state(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

persisted_coordinator sample() {
  persisted_coordinator s;
  s.synced_version = 12;
  s.newest_version = 13;
  s.rounds = 14;
  s.members = {
    {"rollout-0", 2, 1, false, 12, true},
    {"rollout-1", 1, 0, false, 11, false},
    {"rollout-2", 7, 5, true, 9, false}, // retired
  };
  return s;
}

// A valid file, one field per line, that rows below break one thing in.
const char* const valid_text = R"(format: 1
synced_version: 12
newest_version: 13
rounds: 14
members:
  - {name: a, incarnation: 2, restarts: 1, retired: false, version: 12, routable: true}
  - {name: b, incarnation: 1, restarts: 0, retired: true, version: 3, routable: false}
)";

} // namespace

TEST_CASE("coordinator state file: round trip") {
  scratch_dir dir;
  const std::string path = dir / "state.yaml";

  SUBCASE("several members, one retired") {
    auto s = sample();
    write_coordinator_state(path, s);
    auto back = read_coordinator_state(path);
    REQUIRE(back.has_value());
    CAPTURE(to_yaml(*back));
    CHECK(*back == s);
  }
  SUBCASE("no members, zero versions") {
    persisted_coordinator s;
    write_coordinator_state(path, s);
    auto back = read_coordinator_state(path);
    REQUIRE(back.has_value());
    CHECK(*back == s);
  }
  SUBCASE("the whole uint64 range and the whole uint32 restart count") {
    auto s = sample();
    constexpr auto max = std::numeric_limits<std::uint64_t>::max();
    s.newest_version = max;
    s.synced_version = max;
    s.rounds = max;
    s.members[0].incarnation = max;
    s.members[0].version = max;
    s.members[0].restarts = std::numeric_limits<std::uint32_t>::max();
    write_coordinator_state(path, s);
    auto back = read_coordinator_state(path);
    REQUIRE(back.has_value());
    CAPTURE(to_yaml(*back));
    CHECK(*back == s);
  }
  SUBCASE("names YAML would otherwise read as something else") {
    persisted_coordinator s;
    s.newest_version = 1;
    for (const char* name : {"null", "~", "true", "123", "-1", "a: b", "#x", "x # y", "[a]", "{b}",
                             "'q'", "\"dq\"", " padded ", "tab\there", "line\nbreak", ""})
      s.members.push_back({name, 1, 0, false, 1, true});
    std::sort(s.members.begin(), s.members.end(),
              [](auto& a, auto& b) { return a.name < b.name; });
    write_coordinator_state(path, s);
    auto back = read_coordinator_state(path);
    REQUIRE(back.has_value());
    CAPTURE(read_text(path));
    CHECK(*back == s);
  }
  SUBCASE("members come back sorted by name") {
    auto s = sample();
    std::swap(s.members[0], s.members[2]);
    write_coordinator_state(path, s);
    auto back = read_coordinator_state(path);
    REQUIRE(back.has_value());
    CHECK(*back == sample());
  }
}

TEST_CASE("coordinator state file: the format on disk") {
  persisted_coordinator s;
  s.synced_version = 12;
  s.newest_version = 13;
  s.rounds = 14;
  s.members = {{"rollout-0", 2, 1, false, 12, true}};
  CHECK(to_yaml(s) == R"(# rlsync coordinator state; written by the coordinator, do not edit while it runs
format: 1
synced_version: 12
newest_version: 13
rounds: 14
members:
  - {name: rollout-0, incarnation: 2, restarts: 1, retired: false, version: 12, routable: true}
)");
}

TEST_CASE("coordinator state file: a missing file is a first start") {
  scratch_dir dir;
  CHECK_FALSE(read_coordinator_state(dir / "state.yaml").has_value());
  CHECK_FALSE(read_coordinator_state(dir / "no-such-dir/state.yaml").has_value());
  // Anything else that stops the read is an error, not a first start.
  CHECK_THROWS_WITH_AS(read_coordinator_state(dir.path()),
                       doctest::Contains((dir.path() + ": coordinator state: is a directory, not a regular file").c_str()),
                       std::runtime_error);
}

TEST_CASE("coordinator state file: malformed files name the file, line, column and field") {
  scratch_dir dir;
  const std::string path = dir / "state.yaml";
  REQUIRE(read_error(path, valid_text).empty());

  struct row {
    std::string title;
    std::string text;
    std::string expect; // after "<path>:"
  };
  auto with = [](std::string from, const std::string& to) {
    std::string text = valid_text;
    auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
  };
  const row rows[] = {
    {"not YAML", "format: 1\nmembers: [{name: a,\n", "3:1: not valid YAML: "},
    {"not YAML either", "format: 1\nsynced_version: 12: 13\n", "2:19: not valid YAML: "},
    {"empty", "", "1:1: the file is empty"},
    {"two documents", std::string(valid_text) + "---\nformat: 1\n", "9:1: expected one YAML document, got 2"},
    {"not a map", "- format: 1\n", "1:1: expected a map of coordinator state fields, got a list"},
    {"format 2", with("format: 1", "format: 2"), "1:9: format: unsupported format 2"},
    {"format missing", with("format: 1\n", ""), "1:1: format: missing required key"},
    {"format not a number", with("format: 1", "format: one"), "1:9: format: expected an integer"},
    {"synced_version missing", with("synced_version: 12\n", ""), "1:1: synced_version: missing required key"},
    {"negative number", with("rounds: 14", "rounds: -14"), "4:9: rounds: must not be negative, got -14"},
    {"string where number", with("newest_version: 13", "newest_version: thirteen"),
     "3:17: newest_version: expected a non-negative integer, got 'thirteen'"},
    {"non-integer", with("rounds: 14", "rounds: 1.5"), "4:9: rounds: expected a non-negative integer, got '1.5'"},
    {"hex", with("rounds: 14", "rounds: 0x10"), "4:9: rounds: expected a non-negative integer"},
    {"number out of range", with("rounds: 14", "rounds: 18446744073709551616"), "4:9: rounds: integer out of range"},
    {"list where number", with("rounds: 14", "rounds: [14]"), "4:9: rounds: expected a non-negative integer, got a list"},
    {"empty value", with("rounds: 14", "rounds:"), "4:1: rounds: expected a non-negative integer, got nothing"},
    {"duplicate member", with("{name: b,", "{name: a,"), "7:12: members[1].name: duplicate member 'a' (first at line 6)"},
    {"synced > newest", with("synced_version: 12", "synced_version: 14"),
     "2:17: synced_version: 14 is newer than newest_version 13"},
    {"member version > newest", with("version: 3,", "version: 30,"),
     "7:68: members[1].version: 30 is newer than newest_version 13"},
    {"unknown key", with("rounds: 14\n", "rounds: 14\nepoch: 3\n"), "5:1: epoch: unknown key"},
    {"unknown member key", with("routable: false}", "routable: false, shard: 1}"),
     "7:88: members[1].shard: unknown key"},
    {"duplicate key", with("rounds: 14\n", "rounds: 14\nrounds: 15\n"), "5:1: rounds: duplicate key (first at line 4)"},
    {"members not a list", "format: 1\nsynced_version: 1\nnewest_version: 1\nrounds: 1\nmembers: {name: a}\n",
     "5:10: members: expected a list, got a map"},
    {"members missing", "format: 1\nsynced_version: 1\nnewest_version: 1\nrounds: 1\n",
     "1:1: members: missing required key"},
    {"member not a map", with("  - {name: b,", "  - b\n  - {name: b,"), "7:5: members[1]: expected a map, got 'b'"},
    {"empty member", with("  - {name: b,", "  -\n  - {name: b,"), "6:3: members[1]: expected a map, got nothing"},
    {"member field missing", with("incarnation: 1, ", ""), "7:5: members[1].incarnation: missing required key"},
    {"member name not a string", with("{name: b,", "{name: [b],"), "7:12: members[1].name: expected a string, got a list"},
    {"retired not a bool", with("retired: true", "retired: yes"), "7:53: members[1].retired: expected true or false, got 'yes'"},
    {"restarts past uint32", with("restarts: 0", "restarts: 4294967296"), "7:41: members[1].restarts: integer out of range"},
    {"negative incarnation", with("incarnation: 1", "incarnation: -1"), "7:28: members[1].incarnation: must not be negative"},
  };
  for (auto& r : rows) {
    CAPTURE(r.title);
    CAPTURE(r.text);
    std::string error = read_error(path, r.text);
    CAPTURE(error);
    CHECK(error.find(path + ":" + r.expect) != std::string::npos);
  }

  SUBCASE("a newer format reports only that, not its unfamiliar fields") {
    std::string error = read_error(path, with("format: 1\n", "format: 2\nshards: 4\n"));
    CHECK(error == path + ":1:9: format: unsupported format 2 (this build reads format 1)");
  }
  SUBCASE("every problem in one pass, in file order") {
    std::string error = read_error(path, with("rounds: 14", "rounds: -1\nepoch: 3"));
    CHECK(error == path + ":4:9: rounds: must not be negative, got -1\n" + path
                     + ":5:1: epoch: unknown key (expected one of: format, synced_version, "
                       "newest_version, rounds, members)");
  }
}

TEST_CASE("coordinator state file: the write replaces the file and leaves no temporary") {
  scratch_dir dir;
  const std::string path = dir / "state.yaml";
  auto first = sample();
  write_coordinator_state(path, first);
  CHECK(entries(dir.path()) == std::set<std::string>{"state.yaml"});

  auto second = sample();
  second.newest_version = 20;
  second.synced_version = 20;
  second.rounds = 15;
  second.members.pop_back();
  write_coordinator_state(path, second);
  CHECK(entries(dir.path()) == std::set<std::string>{"state.yaml"});
  CHECK(read_text(path) == to_yaml(second));
  auto back = read_coordinator_state(path);
  REQUIRE(back.has_value());
  CHECK(*back == second);
}

TEST_CASE("coordinator state file: a failed write leaves everything as it was") {
  scratch_dir dir;

  SUBCASE("the directory does not exist") {
    const std::string path = dir / "missing/state.yaml";
    CHECK_THROWS_WITH_AS(write_coordinator_state(path, sample()),
                         doctest::Contains(("cannot write coordinator state " + path).c_str()),
                         std::runtime_error);
    try {
      write_coordinator_state(path, sample());
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()).find("No such file or directory") != std::string::npos);
    }
    CHECK(entries(dir.path()).empty());
  }
  SUBCASE("the rename fails: the old entry and the directory are untouched") {
    // A directory where the file should be: the temporary is written, the
    // rename over it fails, and the temporary must go.
    const std::string path = dir / "state.yaml";
    fs::create_directory(path);
    write_text(path + "/keep", "x");
    CHECK_THROWS_WITH_AS(write_coordinator_state(path, sample()),
                         doctest::Contains(("cannot write coordinator state " + path).c_str()),
                         std::runtime_error);
    CHECK(entries(dir.path()) == std::set<std::string>{"state.yaml"});
    CHECK(entries(path) == std::set<std::string>{"keep"});
  }
  SUBCASE("a state the reader would reject is not written") {
    const std::string path = dir / "state.yaml";
    write_coordinator_state(path, sample());
    const std::string before = read_text(path);
    auto dup = sample();
    dup.members.push_back(dup.members[0]);
    CHECK_THROWS_AS(write_coordinator_state(path, dup), std::invalid_argument);
    auto backwards = sample();
    backwards.synced_version = backwards.newest_version + 1;
    CHECK_THROWS_AS(write_coordinator_state(path, backwards), std::invalid_argument);
    auto ahead = sample();
    ahead.members[1].version = ahead.newest_version + 1;
    CHECK_THROWS_AS(write_coordinator_state(path, ahead), std::invalid_argument);
    CHECK(read_text(path) == before);
    CHECK(entries(dir.path()) == std::set<std::string>{"state.yaml"});
  }
}
