// Storing in place: a group's packed bytes land in the engine's weights in
// one pass, checksummed as they land, through each backend; a corrupted
// group still fails the pull before anything is reported stored.
#include "runtime/base/checksum.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/transfer/local/local_transfer.hpp"
#include "runtime/transfer/store_in_place.hpp"
#include "runtime/transfer/ucx/ucx_transfer.hpp"

#include "tests/support/transfer_fixtures.hpp"

#include <doctest/doctest.h>

#include <functional>
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

TEST_CASE("store_pieces gathers pieces into targets that split them anywhere, checksumming what landed") {
  std::vector<std::uint8_t> memory(3 * store_piece_bytes);
  std::iota(memory.begin(), memory.end(), std::uint8_t{7});
  // Pieces out of order, one empty, one across several store pieces.
  const std::vector<source_piece> pieces{{memory.data() + 1000, 10},
                                         {memory.data(), 0},
                                         {memory.data() + 5, 2 * store_piece_bytes + 3},
                                         {memory.data() + 2 * store_piece_bytes + 500, 77}};
  std::vector<std::uint8_t> want;
  for (const auto& p : pieces)
    want.insert(want.end(), p.at, p.at + p.bytes);
  std::vector<std::uint8_t> a(4), b(0), c(want.size() - 4);
  CHECK(store_pieces(pieces, {{a.data(), a.size()}, {b.data(), 0}, {c.data(), c.size()}})
        == checksum64(want.data(), want.size()));
  a.insert(a.end(), c.begin(), c.end());
  CHECK(a == want);
  CHECK(checksum_pieces(pieces) == checksum64(want.data(), want.size()));
  std::vector<std::uint8_t> short_target(want.size() - 1);
  CHECK_THROWS_WITH_AS(store_pieces(pieces, {{short_target.data(), short_target.size()}}),
                       doctest::Contains("for targets of"), std::invalid_argument);
}

TEST_CASE("store_kept checksums the whole group and stores the kept pieces, wherever windows split them") {
  // Two tensors of a group, laid out in memory in the other order; the
  // group is read tensor A, then tensor B.
  std::vector<std::uint8_t> memory(4 * store_piece_bytes);
  std::iota(memory.begin(), memory.end(), std::uint8_t{3});
  const source_piece a{memory.data() + 2 * store_piece_bytes, store_piece_bytes + 100};
  const source_piece b{memory.data() + 10, store_piece_bytes + 50};
  const std::vector<source_piece> whole{a, b};
  std::vector<std::uint8_t> group(a.at, a.at + a.bytes);
  group.insert(group.end(), b.at, b.at + b.bytes);
  // Kept, in packed order: across A's first window, B's start, a piece
  // read twice (overlapping an earlier one), A's tail, nothing.
  const std::vector<source_piece> kept{{a.at + store_piece_bytes - 20, 40},
                                       {b.at, 7},
                                       {a.at + store_piece_bytes - 10, 5},
                                       {a.at + a.bytes - 3, 3},
                                       {b.at, 0}};
  std::vector<std::uint8_t> want;
  for (const auto& k : kept)
    want.insert(want.end(), k.at, k.at + k.bytes);
  std::vector<std::uint8_t> x(30), y(want.size() - 30);
  CHECK(store_kept(whole, kept, {{x.data(), x.size()}, {y.data(), y.size()}})
        == checksum64(group.data(), group.size()));
  x.insert(x.end(), y.begin(), y.end());
  CHECK(x == want);
  // The drill: the checksum sees a flipped byte, nothing else changes.
  std::vector<std::uint8_t> z(want.size());
  CHECK(store_kept(whole, kept, {{z.data(), z.size()}}, true) != checksum64(group.data(), group.size()));
  CHECK(z == want);
  // Nothing kept: the checksum alone.
  CHECK(store_kept(whole, {}, {}) == checksum_pieces(whole));

  std::vector<std::uint8_t> short_target(want.size() - 1);
  CHECK_THROWS_WITH_AS(store_kept(whole, kept, {{short_target.data(), short_target.size()}}),
                       doctest::Contains("for targets of"), std::invalid_argument);
  // A kept piece not inside one piece of the group: between them, or
  // running off the end of one.
  std::vector<std::uint8_t> one(1), two(2);
  CHECK_THROWS_WITH_AS(store_kept(whole, {{memory.data() + store_piece_bytes + 60, 1}}, {{one.data(), 1}}),
                       doctest::Contains("outside the group sent"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(store_kept(whole, {{b.at + b.bytes - 1, 2}}, {{two.data(), 2}}),
                       doctest::Contains("outside the group sent"), std::invalid_argument);

  // Tensors back to back, an empty one sharing its address with the next:
  // a kept piece may run across two of them.
  const source_piece c{memory.data() + 100, 50}, empty{memory.data() + 150, 0}, d{memory.data() + 150, 70};
  const std::vector<source_piece> back_to_back{c, empty, d};
  std::vector<std::uint8_t> across(30);
  CHECK(store_kept(back_to_back, {{c.at + 40, 30}}, {{across.data(), across.size()}})
        == checksum64(memory.data() + 100, 120));
  CHECK(std::equal(across.begin(), across.end(), memory.data() + 140));
}

TEST_CASE("broadcast_targets: none without a sink that stores in place, and the kept bytes must fill them") {
  const model_config c = test::small_model(2);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  local_transfer xfer(src);
  test_engine e("e", c, 2, xfer);
  const auto& plan = e.plans[1].plan();
  const auto& views = v1->group(1);
  std::vector<source_piece> kept{{nullptr, 1}};
  CHECK(broadcast_targets(e.sink(), plan, 1, 1, views, kept).empty()); // no targets offered
  CHECK(kept.size() == 1);                                              // untouched
  e.in_place = true;
  const auto targets = broadcast_targets(e.sink(), plan, 1, 1, views, kept);
  REQUIRE(!targets.empty());
  std::size_t kept_bytes = 0, target_bytes = 0;
  for (const auto& k : kept)
    kept_bytes += k.bytes;
  for (const auto& t : targets)
    target_bytes += t.bytes;
  CHECK(kept_bytes == target_bytes);
  CHECK(kept_bytes == e.plans[1].bytes(1));
  // A tensor missing from the group sent.
  const std::vector<tensor_view> fewer(views.begin() + 1, views.end());
  CHECK_THROWS_WITH_AS(broadcast_targets(e.sink(), plan, 1, 1, fewer, kept),
                       doctest::Contains("bytes kept of the tensors sent for targets of"), std::invalid_argument);
}

TEST_CASE("lent_pieces: a plan's bytes gathered from where a manifest places the tensors, and its lies refused") {
  const model_config c = test::small_model(1);
  auto src = test::small_source(c);
  auto s = src->produce_next();
  const auto g = s->groups().front();
  const auto& held = s->group(g);
  // The group's tensors placed in a memory of their own, back to back after 64 bytes.
  std::vector<tensor_spec> tensors;
  std::vector<std::uint64_t> offsets;
  std::vector<std::uint8_t> memory(64);
  for (const auto& t : held) {
    tensors.push_back(t);
    offsets.push_back(memory.size());
    memory.insert(memory.end(), reinterpret_cast<const std::uint8_t*>(t.data),
                  reinterpret_cast<const std::uint8_t*>(t.data) + t.size);
  }
  for (int w = 0; w < 2; ++w) {
    plan::grouped_plan p(c, std::make_shared<const plan::worker_plan>(engine::make_plan(c, 2, w, dtype::bf16)));
    std::vector<std::uint8_t> packed(p.bytes(g));
    pack_group(p, g, *s, packed.data());
    const auto pieces = lent_pieces(p.plan(), tensors, offsets, memory.data(), memory.size(), false, p.bytes(g));
    std::vector<std::uint8_t> gathered;
    for (const auto& piece : pieces)
      gathered.insert(gathered.end(), piece.at, piece.at + piece.bytes);
    CHECK(gathered == packed);
    std::uint64_t whole = 0;
    for (const auto& t : held)
      whole += t.size;
    CHECK(lent_pieces(p.plan(), tensors, offsets, memory.data(), memory.size(), true, whole).size() == held.size());

    struct lie {
      const char* what;
      std::function<void(std::vector<tensor_spec>&, std::vector<std::uint64_t>&, std::uint64_t&)> tell;
      const char* says;
    };
    const lie lies[] = {
        {"a tensor past the memory's end", [&](auto&, auto& o, auto&) { o.back() = memory.size() - 1; }, "not inside the"},
        {"an offset that wraps", [](auto&, auto& o, auto&) { o.front() = ~std::uint64_t{0} - 1; }, "not inside the"},
        {"a tensor named twice", [](auto& t, auto&, auto&) { t.back().name = t.front().name; }, "twice"},
        {"another dtype than the plan's", [](auto& t, auto&, auto&) { t.front().type = dtype::f32; }, "the plan was recorded for"},
        {"another shape than the plan's", [](auto& t, auto&, auto&) { t.front().shape.back() -= 1; }, "the plan was recorded for"},
        {"a shape whose size overflows", [](auto& t, auto&, auto&) { t.front().shape = {INT64_MAX, 4}; }, "of shape"},
        {"more bytes announced than gathered", [](auto&, auto&, auto& n) { ++n; }, "announced"},
        {"fewer offsets than tensors", [](auto&, auto& o, auto&) { o.pop_back(); }, "offsets for"},
    };
    for (const auto& l : lies) {
      CAPTURE(l.what);
      auto t = tensors;
      auto o = offsets;
      std::uint64_t announced = p.bytes(g);
      l.tell(t, o, announced);
      CHECK_THROWS_WITH_AS(lent_pieces(p.plan(), t, o, memory.data(), memory.size(), false, announced),
                           doctest::Contains(l.says), std::invalid_argument);
    }
  }
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
