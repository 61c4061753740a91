// Echoing outside text: control characters escaped, long text cut; the
// rate-limited log passes a burst per window and counts the rest.
#include "runtime/base/printable.hpp"
#include "runtime/base/rate_limited_log.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace rlsync;

TEST_CASE("printable escapes what a terminal would act on") {
  struct row {
    std::string in;
    std::string out;
  };
  const std::vector<row> table = {
    {"layers.0.weight", "layers.0.weight"},
    {"a\x1b[2Jb", "a\\x1b[2Jb"},
    {std::string("nul\0x", 5), "nul\\x00x"},
    {"line\nforged: admitted", "line\\x0aforged: admitted"},
    {"back\\slash", "back\\\\slash"},
    {"\x7f\xff", "\\x7f\\xff"},
  };
  for (const auto& r : table) {
    CAPTURE(r.in);
    CHECK(printable(r.in) == r.out);
  }
  CHECK(printable(std::string(300, 'a'), 4) == "aaaa...");
}

TEST_CASE("rate_limited_log passes a burst per window and reports what it dropped") {
  using clock = rate_limited_log::clock;
  clock::time_point t{};
  std::vector<std::string> lines;
  rate_limited_log log([&](const std::string& s) { lines.push_back(s); }, 2, std::chrono::seconds(1),
                       [&] { return t; });
  t += std::chrono::seconds(5);
  CHECK(log("one"));
  CHECK(log("two"));
  CHECK_FALSE(log("three"));
  CHECK_FALSE(log("four"));
  CHECK(lines.size() == 2);
  t += std::chrono::seconds(1);
  CHECK(log("five"));
  REQUIRE(lines.size() == 3);
  CHECK(lines[2] == "five (2 similar lines suppressed)");
  CHECK(log.suppressed_total() == 2);
}
