// Storing in place: a group's packed bytes land in the engine's weights in
// one pass, checksummed as they land, through each backend; a corrupted
// group still fails the pull before anything is reported stored.
#include "runtime/base/checksum.hpp"
#include "runtime/transfer/local/local_transfer.hpp"
#include "runtime/transfer/store_in_place.hpp"
#include "runtime/transfer/ucx/ucx_transfer.hpp"

#include "tests/support/transfer_fixtures.hpp"

#include <doctest/doctest.h>

#include <numeric>

using namespace rlsync;
using namespace rlsync::transfer;
using namespace std::chrono_literals;
using rlsync::test::test_engine;

TEST_CASE("store_group copies into each target in order and checksums what landed") {
  // Pieces of several store_piece_bytes, a short one and an empty one.
  std::vector<std::uint8_t> packed(2 * store_piece_bytes + 100);
  std::iota(packed.begin(), packed.end(), std::uint8_t{3});
  std::vector<std::uint8_t> a(store_piece_bytes + 50), b(0), c(packed.size() - a.size());
  std::vector<store_target> targets{{a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}};
  CHECK(store_group(packed.data(), targets) == checksum64(packed.data(), packed.size()));
  CHECK(std::equal(a.begin(), a.end(), packed.begin()));
  CHECK(std::equal(c.begin(), c.end(), packed.begin() + static_cast<std::ptrdiff_t>(a.size())));

  // The drill's flip happens after landing, before the checksum sees it.
  std::fill(a.begin(), a.end(), 0);
  const auto corrupted = store_group(packed.data(), targets, /*corrupt=*/true);
  CHECK(corrupted != checksum64(packed.data(), packed.size()));
  CHECK(corrupted == [&] {
    std::vector<std::uint8_t> landed(a.begin(), a.end());
    landed.insert(landed.end(), c.begin(), c.end());
    return checksum64(landed.data(), landed.size());
  }());
  CHECK(a[0] == (packed[0] ^ 0x5a));
}

TEST_CASE("group_targets: none without a sink that stores in place, and sizes must add up to the group") {
  group_sink sink;
  CHECK(group_targets(sink, 0, 0, 10).empty());
  std::uint8_t buf[8];
  sink.targets = [&](int, std::uint32_t) { return std::vector<store_target>{{buf, 4}, {buf + 4, 4}}; };
  CHECK(group_targets(sink, 0, 0, 8).empty()); // no on_stored: not a sink that stores in place
  sink.on_stored = [](int, std::uint32_t) {};
  CHECK(group_targets(sink, 0, 0, 8).size() == 2);
  CHECK_THROWS_WITH_AS(group_targets(sink, 1, 3, 9), doctest::Contains("group 3 of worker 1: 9 packed bytes for targets of 8"),
                       std::invalid_argument);
  sink.targets = [&](int, std::uint32_t) { return std::vector<store_target>{{nullptr, 8}}; };
  CHECK_THROWS_AS(group_targets(sink, 0, 0, 8), std::invalid_argument);
}

TEST_CASE("the engine's places for a group: byte ranges of its parameters, none when it converts") {
  const model_config c = test::small_model(3);
  for (int tp : {1, 2}) {
    CAPTURE(tp);
    auto set = engine::weight_set::make(c, tp, dtype::bf16);
    for (int w = 0; w < tp; ++w) {
      auto p = std::make_shared<const plan::worker_plan>(engine::make_plan(c, tp, w, dtype::bf16));
      plan::grouped_plan grouped(c, p);
      auto& dst = set->workers[static_cast<std::size_t>(w)];
      for (std::uint32_t g = 0; g < grouped.group_count(); ++g) {
        auto ranges = engine::group_destinations(grouped, g, dst);
        REQUIRE(ranges.size() == grouped.entries(g).size());
        std::uint64_t total = 0;
        for (std::size_t i = 0; i < ranges.size(); ++i) {
          const auto* e = grouped.entries(g)[i];
          const auto& param = dst.at(e->param);
          CHECK(ranges[i].at == param.bytes.data() + e->dst_offset * 2);
          CHECK(ranges[i].bytes == e->bytes());
          total += ranges[i].bytes;
        }
        CHECK(total == grouped.bytes(g));
      }
    }
    // An engine that stores f32 converts bf16: it takes the bytes through on_group.
    auto wide = engine::weight_set::make(c, tp, dtype::f32);
    plan::grouped_plan grouped(c, std::make_shared<const plan::worker_plan>(engine::make_plan(c, tp, 0, dtype::bf16)));
    CHECK(engine::group_destinations(grouped, 0, wide->workers[0]).empty());
  }
}

TEST_CASE("ucx: stored in place, a pull equals load_weights and a corrupted group fails it naming the group") {
  std::string why;
  if (!ucx_available(&why)) {
    MESSAGE("skipped: UCX is not usable here: " << why);
    return;
  }
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  ucx_producer_options po;
  po.net_devices = "lo";
  ucx_producer producer(src, po);
  ucx_puller_options uo;
  uo.net_devices = "lo";
  uo.credentials = [&](const std::string& engine, int worker, clock::time_point) { return producer.issue(engine, worker); };
  ucx_puller puller(uo);
  test_engine good("rollout-0", c, 2, puller), bad("rollout-1", c, 2, puller);
  good.in_place = bad.in_place = true;
  good.pull(puller, 1);
  test::check_identical(*good.weights, *test::loaded(*v1, 2));
  CHECK(good.received.size() == 2 * 3); // on_stored once per worker and group

  producer.corrupt({"rollout-1", 1, 0, /*group*/ 1});
  try {
    bad.pull(puller, 1);
    FAIL("the corrupted pull succeeded");
  } catch (const transfer_error& e) {
    CHECK(e.failure == transfer_failure::checksum_mismatch);
    CHECK(std::string(e.what()).find("engine 'rollout-1' worker 1: group 1 of version 1 failed its checksum")
          != std::string::npos);
  }
  for (auto [w, g] : bad.received)
    CHECK_FALSE((w == 1 && g >= 1)); // never reported stored
  bad.pull(puller, 1);
  test::check_identical(*bad.weights, *test::loaded(*v1, 2));
}
