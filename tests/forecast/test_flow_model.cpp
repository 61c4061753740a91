// The fluid model of a fabric: max-min fair rates, recomputed as flows end.
#include "runtime/forecast/flow_model.hpp"

#include <doctest/doctest.h>

#include <stdexcept>

using namespace rlsync::forecast;

TEST_CASE("flow model: rates are max-min fair and recomputed as flows finish") {
  struct row {
    const char* what;
    std::vector<double> capacities;
    std::vector<flow> flows;
    std::vector<double> finish;
    double light;
    std::size_t bottleneck;
  };
  const std::vector<row> table = {
    {"one flow on one link", {10}, {{100, {0}}}, {10}, 10, 0},
    {"two equal flows share a link", {10}, {{100, {0}}, {100, {0}}}, {20, 20}, 20, 0},
    // 5 B/s each until the short one ends at 10 s, then 10 B/s for the rest.
    {"a short flow frees its share", {10}, {{50, {0}}, {100, {0}}}, {10, 15}, 15, 0},
    // A is held to 10 by its first link; B takes the 90 left on the second.
    // (both links take 10 s at full load: the tie goes to the lower index).
    {"a flow limited elsewhere leaves the rest", {10, 100}, {{100, {0, 1}}, {900, {1}}}, {10, 10}, 10, 0},
    {"disjoint links run in parallel", {10, 20}, {{100, {0}}, {100, {1}}}, {10, 5}, 10, 0},
    {"a link named twice counts once", {10}, {{100, {0, 0}}}, {10}, 10, 0},
    {"no links: done at once", {10}, {{100, {}}}, {0}, 0, 1},
    {"no bytes: done at once", {10}, {{0, {0}}}, {0}, 0, 1},
    // Three flows on a 30 B/s link, one also on a 5 B/s link: it gets 5, the
    // other two 12.5 each (done at 8 s); it ends alone at 5 B/s.
    {"water-filling over two levels", {30, 5}, {{100, {0, 1}}, {100, {0}}, {100, {0}}}, {20, 8, 8}, 20, 1},
  };
  for (const auto& r : table) {
    const std::string what = r.what;
    CAPTURE(what);
    std::vector<link> links;
    for (std::size_t i = 0; i < r.capacities.size(); ++i)
      links.push_back({"l" + std::to_string(i), r.capacities[i]});
    const auto out = simulate(links, r.flows);
    REQUIRE(out.finish.size() == r.finish.size());
    double last = 0;
    for (std::size_t f = 0; f < r.finish.size(); ++f) {
      CHECK(out.finish[f] == doctest::Approx(r.finish[f]));
      last = std::max(last, r.finish[f]);
    }
    CHECK(out.seconds == doctest::Approx(last));
    CHECK(out.light_seconds == doctest::Approx(r.light));
    CHECK(out.bottleneck == r.bottleneck);
    CHECK(out.seconds >= out.light_seconds * (1 - 1e-12)); // never faster than light
  }
}

TEST_CASE("flow model: per-link bytes add up every flow crossing the link") {
  const std::vector<link> links = {{"a", 1}, {"b", 1}};
  const auto out = simulate(links, {{3, {0}}, {4, {0, 1}}, {5, {1}}});
  CHECK(out.link_bytes[0] == 7);
  CHECK(out.link_bytes[1] == 9);
  CHECK(out.bottleneck == 1);
  // 0.5 B/s each until flow 0 ends at 6 s; flows 1 and 2 then share b.
  CHECK(out.finish[0] == doctest::Approx(6));
  CHECK(out.finish[1] == doctest::Approx(8));
  CHECK(out.seconds == doctest::Approx(9));
}

TEST_CASE("flow model: refuses bad capacities, bytes and link indices") {
  CHECK_THROWS_AS(simulate({{"z", 0}}, {}), std::invalid_argument);
  CHECK_THROWS_AS(simulate({{"n", -1}}, {}), std::invalid_argument);
  CHECK_THROWS_AS(simulate({{"a", 1}}, {{-1, {0}}}), std::invalid_argument);
  CHECK_THROWS_AS(simulate({{"a", 1}}, {{1, {1}}}), std::invalid_argument);
  CHECK_THROWS_WITH_AS(simulate({{"x nic", 0}}, {}), doctest::Contains("x nic"), std::invalid_argument);
}
