// The local backend: a sharded pull applied with the engine's plan gives
// exactly what engine::load_weights gives, with each worker receiving only
// the bytes it keeps; broadcast moves the full model to every worker; bytes
// are checksummed, packing is shared across replicas, memory is bounded and
// every wait has a deadline.
#include "runtime/engine/loader.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/transfer/local/local_transfer.hpp"
#include "runtime/transfer/packing.hpp"

#include "tests/support/transfer_fixtures.hpp"

#include <doctest/doctest.h>

#include <future>
#include <mutex>

using namespace rlsync;
using namespace rlsync::transfer;
using namespace std::chrono_literals;
using rlsync::test::in;
using rlsync::test::plan_bytes;
using rlsync::test::test_engine;

TEST_CASE("sharded pull applied with the plan equals load_weights, each worker getting only its bytes") {
  for (bool in_place : {false, true})
  for (bool tied : {false, true})
    for (int tp : {1, 2, 4}) { // tp 4 > 2 kv heads: kv heads are replicated
      INFO("tp " << tp << (tied ? ", tied embeddings" : "") << (in_place ? ", stored in place" : ""));
      const model_config c = test::small_model(3, tied);
      auto src = test::small_source(c);
      auto v1 = src->produce_next();
      local_transfer xfer(src);
      test_engine e("rollout-0", c, tp, xfer);
      e.in_place = in_place;

      auto report = e.pull(xfer, 1);
      test::check_identical(*e.weights, *test::loaded(*v1, tp));
      CHECK(report.engine == "rollout-0");
      CHECK(report.version == 1);
      CHECK(report.groups == 3);
      CHECK(report.bytes == plan_bytes(e));
      CHECK(report.duration_ns > 0);
      // Where its slowest worker's pull went: some storing, within the pull.
      CHECK(report.store_ns > 0);
      CHECK(report.wait_ns + report.store_ns <= report.duration_ns);
      CHECK(report.ran_ns > 0); // its thread copied: it ran on a core

      // Per worker: exactly bytes_per_worker(plan), about total / tp.
      for (int w = 0; w < tp; ++w) {
        auto r = xfer.pull({e.name, w, 1, transfer_mode::sharded, in(10s)}, e.sink());
        const auto& plan = e.plans[static_cast<std::size_t>(w)].plan();
        CHECK(r.bytes == plan::bytes_per_worker(plan));
        CHECK(r.groups == 3);
        CHECK(r.worker == w);
        CHECK(static_cast<double>(r.bytes) < 1.5 * static_cast<double>(v1->total_bytes()) / tp);
      }
      if (tp == 1)
        CHECK(report.bytes == v1->total_bytes());

      // The next version lands on top of the previous one.
      auto v2 = src->produce_next();
      e.pull(xfer, 2);
      test::check_identical(*e.weights, *test::loaded(*v2, tp));
    }
}

TEST_CASE("broadcast pull: every worker receives the whole model and slices it with its loader") {
  for (int tp : {1, 2, 4}) {
    INFO("tp " << tp);
    const model_config c = test::small_model(3);
    auto src = test::small_source(c);
    auto v1 = src->produce_next();
    local_transfer xfer(src);
    test_engine stores("rollout-1", c, tp, xfer);
    stores.in_place = true; // the whole group checksummed as the kept pieces are stored
    stores.pull(xfer, 1, transfer_mode::broadcast);
    test::check_identical(*stores.weights, *test::loaded(*v1, tp));
    CHECK(stores.full_groups == 0);
    test_engine e("rollout-0", c, tp, xfer);
    auto report = e.pull(xfer, 1, transfer_mode::broadcast);
    test::check_identical(*e.weights, *test::loaded(*v1, tp));
    CHECK(e.full_groups == 3 * tp);
    CHECK(report.bytes == v1->total_bytes() * static_cast<std::uint64_t>(tp));
    CHECK(report.groups == 3);
    CHECK(report.store_ns > 0);
    CHECK(report.wait_ns + report.store_ns <= report.duration_ns);
    auto r = xfer.pull({e.name, 0, 1, transfer_mode::broadcast, in(10s)}, e.sink());
    CHECK(r.bytes == v1->total_bytes());
    // Broadcast bytes exceed sharded ones by about tp.
    if (tp > 1)
      CHECK(r.bytes > plan::bytes_per_worker(e.plans[0].plan()));
  }
}

TEST_CASE("groups are lent where the version lies, packed only where their runs are too short") {
  // small_model at tp 2 reads half rows of 64 bytes (o_proj): lent, nothing
  // copied by the producer. At tp 4 a quarter row is 32 bytes, under
  // min_lent_run_bytes: those groups are packed once into buffers.
  const model_config c = test::small_model(3);
  for (auto mode : {transfer_mode::sharded, transfer_mode::broadcast})
    for (int tp : {2, 4})
      for (bool in_place : {false, true}) {
        CAPTURE(mode);
        CAPTURE(tp);
        CAPTURE(in_place);
        auto src = test::small_source(c);
        auto v1 = src->produce_next();
        local_transfer xfer(src);
        test_engine e("rollout-0", c, tp, xfer);
        e.in_place = in_place;
        e.pull(xfer, 1, mode);
        test::check_identical(*e.weights, *test::loaded(*v1, tp));
        const auto s = xfer.stats();
        CHECK(s.packs == static_cast<std::uint64_t>(mode == transfer_mode::broadcast ? 3 : 3 * tp));
        if (mode == transfer_mode::broadcast || tp == 2) {
          CHECK(s.lent == s.packs);
          CHECK(s.peak_buffers == 0);
          // Nothing packed; a sharded sink of packed bytes gets each group
          // gathered into a buffer of its worker's, from the spare pool.
          const bool gathers = mode == transfer_mode::sharded && !in_place;
          CHECK((s.buffers_made > 0) == gathers);
          // One worker at a time, the next versions reuse those buffers:
          // none made anew after the first of them.
          std::uint64_t made = 0;
          for (std::uint64_t v = 2; v <= 3; ++v) {
            auto next = src->produce_next();
            for (int w = 0; w < tp; ++w)
              xfer.pull({e.name, w, v, mode, in(10s)}, e.sink());
            test::check_identical(*e.weights, *test::loaded(*next, tp));
            if (v == 3)
              CHECK(xfer.stats().buffers_made == made);
            made = xfer.stats().buffers_made;
          }
        } else {
          CHECK(s.lent < s.packs);
          CHECK(s.peak_buffers >= 1);
          CHECK(s.peak_buffers <= xfer.options().groups_in_flight);
        }
      }
}

TEST_CASE("groups arrive in order, each verified before the sink sees it") {
  const model_config c = test::small_model(4);
  auto src = test::small_source(c);
  src->produce_next();
  local_transfer xfer(src);
  test_engine e("e", c, 2, xfer);
  e.pull(xfer, 1);
  std::vector<std::uint32_t> w0, w1;
  for (auto [w, g] : e.received)
    (w == 0 ? w0 : w1).push_back(g);
  CHECK(w0 == std::vector<std::uint32_t>{0, 1, 2, 3});
  CHECK(w1 == std::vector<std::uint32_t>{0, 1, 2, 3});
}

TEST_CASE("a finished pass lets go of its version: one the source drops is freed before the next pull") {
  for (auto mode : {transfer_mode::sharded, transfer_mode::broadcast}) {
    CAPTURE(to_string(mode));
    const model_config c = test::small_model(2);
    auto src = test::small_source(c);
    auto first = src->produce_next();
    std::weak_ptr<const typename decltype(first)::element_type> v1 = first;
    first.reset();
    local_transfer xfer(src);
    test_engine e("e", c, 2, xfer);
    e.pull(xfer, 1, mode);
    for (std::size_t i = 0; i < src->keep_versions(); ++i)
      src->produce_next(); // version 1 leaves the source
    CHECK(v1.expired());
  }
}

TEST_CASE("the same worker rank of two replicas shares one packing pass") {
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  local_transfer_options o;
  o.join_grace = 10s; // both replicas are registered: the pass waits for both, not for the grace
  local_transfer xfer(src, o);
  test_engine a("rollout-0", c, 2, xfer);
  test_engine b("rollout-1", c, 2, xfer);

  auto fa = std::async(std::launch::async, [&] { return a.pull(xfer, 1); });
  auto fb = std::async(std::launch::async, [&] { return b.pull(xfer, 1); });
  auto ra = fa.get();
  auto rb = fb.get();
  auto ref = test::loaded(*v1, 2);
  test::check_identical(*a.weights, *ref);
  test::check_identical(*b.weights, *ref);
  CHECK(ra.bytes == rb.bytes);

  auto s = xfer.stats();
  CHECK(s.passes == 2);     // one per (tp, worker) stream, not one per replica
  CHECK(s.packs == 2 * 3);  // 2 workers x 3 groups, packed once for both replicas
  CHECK(s.packed_bytes == plan_bytes(a));

  // A replica that comes later gets a pass of its own.
  test_engine late("rollout-2", c, 2, xfer);
  late.pull(xfer, 1);
  test::check_identical(*late.weights, *ref);
  CHECK(xfer.stats().packs == 2 * 2 * 3);
}

TEST_CASE("lent groups hold no window slot: a fast replica is not held back by a slow one") {
  // tp 1 lends every group. The slow replica stays on group 0 until the
  // fast one has all three, more than the window of two would let through
  // were they packed.
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  local_transfer_options o;
  o.join_grace = 10s;
  o.groups_in_flight = 2;
  local_transfer xfer(src, o);
  test_engine slow("rollout-0", c, 1, xfer);
  test_engine fast("rollout-1", c, 1, xfer);
  std::promise<void> fast_done;
  auto fast_finished = fast_done.get_future().share();
  bool overtaken = false;
  slow.in_place = true; // stored into its slot's targets: the slot is held until the sink returns
  auto sink = slow.sink();
  auto stored = sink.on_stored;
  sink.on_stored = [&](int w, std::uint32_t g) {
    if (g == 0)
      overtaken = fast_finished.wait_for(10s) == std::future_status::ready;
    stored(w, g);
  };
  auto f = std::async(std::launch::async, [&] { return xfer.pull({slow.name, 0, 1, transfer_mode::sharded, in(20s)}, sink); });
  fast.pull(xfer, 1, transfer_mode::sharded, 20s);
  fast_done.set_value();
  f.get();
  CHECK(overtaken);
  CHECK(xfer.stats().passes == 1); // one pass served both
  CHECK(xfer.stats().peak_buffers == 0);
  test::check_identical(*slow.weights, *test::loaded(*v1, 1));
  test::check_identical(*fast.weights, *test::loaded(*v1, 1));
}

TEST_CASE("an unregistered replica does not hold back the others beyond the join grace") {
  const model_config c = test::small_model(2);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  local_transfer_options o;
  o.join_grace = 20ms;
  local_transfer xfer(src, o);
  test_engine a("rollout-0", c, 1, xfer);
  test_engine absent("rollout-1", c, 1, xfer); // registered, never pulls
  const auto t0 = clock::now();
  a.pull(xfer, 1, transfer_mode::sharded, 10s);
  CHECK(clock::now() - t0 < 5s);
  test::check_identical(*a.weights, *test::loaded(*v1, 1));
}

TEST_CASE("memory is bounded by groups_in_flight packed groups per stream, and packing runs ahead") {
  // tp 4: every group holds quarter rows too short to lend (above), so each
  // is packed. A sink that takes the packed group reads it in its slot: the
  // producer fills the rest of the window meanwhile. A window of one is
  // copied out of its slot instead, so that the producer still packs ahead.
  for (std::size_t in_flight : {1, 2}) {
    INFO("groups_in_flight " << in_flight);
    const model_config c = test::small_model(4);
    auto src = test::small_source(c);
    auto v1 = src->produce_next();
    local_transfer_options o;
    o.groups_in_flight = in_flight;
    local_transfer xfer(src, o);
    test_engine e("e", c, 4, xfer);
    auto sink = e.sink();
    bool ran_ahead = false;
    auto apply = sink.on_group;
    sink.on_group = [&](int w, std::uint32_t g, const std::uint8_t* bytes, std::size_t size) {
      if (g == 0) // while the engine applies group 0, the producer fills the rest of the window
        ran_ahead = xfer.wait_for_packs(in_flight == 1 ? 2 : in_flight, in(10s));
      apply(w, g, bytes, size);
    };
    auto r = xfer.pull({"e", 0, 1, transfer_mode::sharded, in(10s)}, sink);
    CHECK(r.groups == 4);
    CHECK(ran_ahead);
    const auto s = xfer.stats();
    CHECK(s.lent == 0);
    CHECK(s.peak_buffers == in_flight);
    std::uint64_t largest = 0;
    for (std::uint32_t g = 0; g < e.plans[0].group_count(); ++g)
      largest = std::max(largest, e.plans[0].bytes(g));
    CHECK(s.peak_buffer_bytes > 0);
    CHECK(s.peak_buffer_bytes <= in_flight * largest);
    for (int w = 1; w < 4; ++w)
      xfer.pull({"e", w, 1, transfer_mode::sharded, in(10s)}, e.sink());
    test::check_identical(*e.weights, *test::loaded(*v1, 4));
  }
}

TEST_CASE("a corrupted group fails that worker's pull with a checksum error, a healthy peer completes") {
  // tp 2 lends every group, tp 4 packs them (short runs): the drill fails
  // both, with a window of one (a packed group copied out of its slot) or two.
  for (auto mode : {transfer_mode::sharded, transfer_mode::broadcast})
  for (bool in_place : {false, true})
  for (int tp : {2, 4})
  for (std::size_t in_flight : {1, 2}) {
  INFO((in_place ? "stored in place" : "through the sink"));
  CAPTURE(mode);
  CAPTURE(tp);
  CAPTURE(in_flight);
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  local_transfer_options o;
  o.groups_in_flight = in_flight;
  local_transfer xfer(src, o);
  test_engine bad("rollout-0", c, tp, xfer);
  test_engine good("rollout-1", c, tp, xfer);
  bad.in_place = good.in_place = in_place;
  xfer.corrupt({"rollout-0", 1, 0, /*group*/ 1});
  try {
    bad.pull(xfer, 1, mode);
    FAIL("the corrupted pull succeeded");
  } catch (const transfer_error& e) {
    CHECK(e.failure == transfer_failure::checksum_mismatch);
    CHECK(std::string(e.what()).find("engine 'rollout-0' worker 1: group 1 of version 1 failed its checksum")
          != std::string::npos);
  }
  // The sink never saw group 1 of worker 1 (nor anything after it).
  for (auto [w, g] : bad.received)
    CHECK_FALSE((w == 1 && g >= 1));
  CHECK(xfer.stats().corruptions == 1);

  good.pull(xfer, 1, mode);
  test::check_identical(*good.weights, *test::loaded(*v1, tp));
  bad.pull(xfer, 1, mode); // the fault fired once: a retry is clean
  test::check_identical(*bad.weights, *test::loaded(*v1, tp));
  }
}

TEST_CASE("a group that never comes times out with an error naming it") {
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  local_transfer xfer(src);
  test_engine e("rollout-0", c, 2, xfer);
  xfer.withhold(2);
  const auto t0 = clock::now();
  try {
    e.pull(xfer, 1, transfer_mode::sharded, 200ms);
    FAIL("the pull succeeded without group 2");
  } catch (const transfer_error& err) {
    CHECK(err.failure == transfer_failure::timeout);
    CHECK(std::string(err.what()).find("group 2 of version 1") != std::string::npos);
    CHECK(std::string(err.what()).find("2 of 3 groups received") != std::string::npos);
  }
  CHECK(clock::now() - t0 >= 200ms);
  CHECK(clock::now() - t0 < 5s);

  xfer.clear_faults();
  e.pull(xfer, 1);
  test::check_identical(*e.weights, *test::loaded(*v1, 2));
}

TEST_CASE("ending the passes fails a waiting pull at once and the next pull starts afresh") {
  // A restarted trainer: what its old incarnation was serving never comes.
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  local_transfer xfer(src);
  test_engine e("rollout-0", c, 1, xfer);
  xfer.withhold(2);
  const auto t0 = clock::now();
  auto waiting = std::async(std::launch::async, [&] { return e.pull(xfer, 1, transfer_mode::sharded, 60s); });
  // The pull is waiting once groups 0 and 1 are packed and group 2 is withheld.
  REQUIRE(xfer.wait_for_packs(2, in(10s)));
  xfer.end_passes();
  try {
    waiting.get();
    FAIL("the pull succeeded without group 2");
  } catch (const transfer_error& err) {
    CAPTURE(std::string(err.what()));
    CHECK(err.failure == transfer_failure::cancelled);
    // Waiting for group 2, or for group 1's checksum, which the producer
    // takes after offering it.
    const std::string what = err.what();
    CHECK((what.find("stopped before group 2 of version 1") != std::string::npos
           || what.find("stopped before checksumming group 1 of version 1") != std::string::npos));
  }
  CHECK(clock::now() - t0 < 30s); // not its 60 s deadline

  xfer.clear_faults();
  e.pull(xfer, 1);
  test::check_identical(*e.weights, *test::loaded(*v1, 1));
}

TEST_CASE("pull errors: unknown version, unregistered worker, missing sink") {
  const model_config c = test::small_model(2);
  auto src = test::small_source(c);
  src->produce_next();
  src->produce_next();
  src->produce_next(); // holds 2 and 3
  local_transfer xfer(src);
  test_engine e("e", c, 1, xfer);
  auto expect = [&](const pull_request& r, const group_sink& s, transfer_failure f, const char* text) {
    try {
      xfer.pull(r, s);
      FAIL("no error");
    } catch (const transfer_error& err) {
      CHECK(err.failure == f);
      CHECK(std::string(err.what()).find(text) != std::string::npos);
    }
  };
  expect({"e", 0, 1, transfer_mode::sharded, in(1s)}, e.sink(), transfer_failure::version_unavailable,
         "version 1 is not held (held: 2, 3)");
  expect({"other", 0, 3, transfer_mode::sharded, in(1s)}, e.sink(), transfer_failure::not_registered,
         "engine 'other' worker 0 has not registered");
  xfer.unregister_engine("e");
  expect({"e", 0, 3, transfer_mode::sharded, in(1s)}, e.sink(), transfer_failure::not_registered, "engine 'e'");
  CHECK_THROWS_AS(xfer.pull({"e", 0, 3, transfer_mode::broadcast, in(1s)}, group_sink{}), std::invalid_argument);
  CHECK(to_string(transfer_failure::checksum_mismatch) == "checksum_mismatch");
}

TEST_CASE("a version under transfer stays intact while the trainer produces the next ones") {
  const model_config c = test::small_model(3);
  auto src = test::small_source(c, /*keep*/ 2);
  auto v1 = src->produce_next();
  local_transfer xfer(src);
  test_engine e("e", c, 1, xfer);
  auto sink = e.sink();
  auto apply = sink.on_group;
  sink.on_group = [&](int w, std::uint32_t g, const std::uint8_t* bytes, std::size_t size) {
    if (g == 0) { // the trainer moves on mid-transfer; version 1 leaves the source
      src->produce_next();
      src->produce_next();
    }
    apply(w, g, bytes, size);
  };
  xfer.pull({"e", 0, 1, transfer_mode::sharded, in(10s)}, sink);
  CHECK(src->find(1).get() == nullptr);
  test::check_identical(*e.weights, *test::loaded(*v1, 1));
}

TEST_CASE("a rank holding some layers serves exactly those groups") {
  const model_config c = test::small_model(4);
  synthetic_options o;
  o.config = c;
  o.model_seed = 3;
  o.held_layers = std::vector<std::int64_t>{1, 2};
  auto rank = std::make_shared<synthetic_source>(o);
  rank->produce_next();
  local_transfer xfer(rank);
  test_engine e("e", c, 2, xfer);
  auto r = e.pull(xfer, 1);
  CHECK(r.groups == 2);
  std::uint64_t want = 0;
  for (const auto& p : e.plans)
    want += p.bytes(1) + p.bytes(2);
  CHECK(r.bytes == want);
  for (auto [w, g] : e.received)
    CHECK((g == 1 || g == 2));
}

TEST_CASE("a plan recorded for another dtype fails the pull with the producer's reason") {
  const model_config c = test::small_model(2);
  auto src = test::small_source(c);
  src->produce_next(); // bf16
  local_transfer xfer(src);
  auto plan = std::make_shared<const plan::worker_plan>(engine::make_plan(c, 1, 0, dtype::f32));
  xfer.register_worker("e", plan);
  group_sink sink;
  sink.on_group = [](int, std::uint32_t, const std::uint8_t*, std::size_t) {};
  try {
    xfer.pull({"e", 0, 1, transfer_mode::sharded, in(10s)}, sink);
    FAIL("no error");
  } catch (const transfer_error& err) {
    CHECK(err.failure == transfer_failure::producer_failed);
    CHECK(std::string(err.what()).find("the plan was recorded for F32") != std::string::npos);
  }
}

TEST_CASE("an engine's report sums its workers' bytes and takes the slowest worker's wait and store") {
  using namespace std::chrono_literals;
  struct worker {
    std::uint64_t bytes;
    std::chrono::milliseconds duration, waited, stored;
  };
  struct row {
    std::vector<worker> workers;
    std::uint64_t bytes, wait_ms, store_ms;
  };
  const std::vector<row> rows = {
    {{{10, 5ms, 1ms, 2ms}}, 10, 1, 2},
    {{{10, 5ms, 4ms, 1ms}, {20, 9ms, 2ms, 6ms}}, 30, 2, 6}, // the second took longest
    {{{10, 9ms, 4ms, 1ms}, {20, 5ms, 2ms, 6ms}}, 30, 4, 1},
    {{{10, 5ms, 0ms, 0ms}, {20, 5ms, 0ms, 0ms}}, 30, 0, 0}, // a data plane that does not measure
    {{}, 0, 0, 0},
  };
  for (const auto& r : rows) {
    CAPTURE(r.workers.size());
    std::vector<transfer::pull_report> reports;
    for (const auto& w : r.workers) {
      transfer::pull_report p;
      p.bytes = w.bytes;
      p.groups = 3;
      p.duration = w.duration;
      p.waited = w.waited;
      p.stored = w.stored;
      p.ran = w.waited + w.stored; // any figures of its own, to see which worker's are carried
      p.queued = w.waited;
      reports.push_back(p);
    }
    const auto out = transfer::engine_report("e", 7, reports, 12ms);
    CHECK(out.engine == "e");
    CHECK(out.version == 7);
    CHECK(out.bytes == r.bytes);
    CHECK(out.groups == (r.workers.empty() ? 0u : 3u));
    CHECK(out.duration_ns == 12'000'000);
    CHECK(out.wait_ns == r.wait_ms * 1'000'000);
    CHECK(out.store_ns == r.store_ms * 1'000'000);
    CHECK(out.ran_ns == (r.wait_ms + r.store_ms) * 1'000'000);
    CHECK(out.queued_ns == r.wait_ms * 1'000'000);
  }
}
