// The planned layout is the runtime's own code applied to the cluster: the
// engine's recorded plans, the data plane's holder rule.
#include "runtime/engine/recording.hpp"
#include "runtime/engine/shard.hpp"
#include "runtime/forecast/layout.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "tests/forecast/forecast_fixtures.hpp"

#include <doctest/doctest.h>

#include <set>

using namespace rlsync;
using namespace rlsync::forecast;

namespace {

std::uint64_t bytes_of(const std::vector<plan_share>& shares) {
  std::uint64_t n = 0;
  for (const auto& s : shares)
    n += s.bytes;
  return n;
}

} // namespace

TEST_CASE("layout: each engine worker takes what the engine's own plan records") {
  test::cluster_files files;
  const auto c = files.load(test::small_cluster("  - {name: e, replicas: 2, tp: 2, expert_parallel: true}\n"));
  const auto l = build_layout(c);
  REQUIRE(l.plans.size() == 2);     // replicas share their workers' plans
  REQUIRE(l.consumers.size() == 4); // 2 replicas x tp 2
  for (const auto& x : l.consumers) {
    CAPTURE(x.replica);
    CAPTURE(x.worker);
    const auto p = engine::make_plan(c.model, 2, static_cast<int>(x.worker), dtype::bf16, true);
    CHECK(bytes_of(l.plans[x.plan].shares) == plan::bytes_per_worker(p));
    CHECK(l.plans[x.plan].entries == p.entries.size());
    // Every share comes from a rank of the stage holding its group.
    for (const auto& s : l.plans[x.plan].shares)
      CHECK(l.producers[s.producer].stage == l.group_stage[s.group]);
  }
  CHECK(place_name(c, l.consumers[3].place) == "e1.gpu1");
  CHECK(place_name(c, l.producers[2].place) == "t1.gpu0");
  CHECK(l.producers[2].stage == 1);
  CHECK(l.group_stage == std::vector<std::int64_t>{0, 1}); // pp 2 over 2 layers
}

TEST_CASE("layout: broadcast gives every worker the whole checkpoint") {
  test::cluster_files files;
  const auto c = files.load(test::small_cluster("  - {name: e, tp: 2}\n"));
  const auto l = build_layout(c);
  for (const auto& p : l.plans)
    CHECK(bytes_of(p.broadcast) == l.model_bytes);
  std::uint64_t groups = 0;
  for (auto b : l.group_bytes)
    groups += b;
  CHECK(groups == l.model_bytes);
}

TEST_CASE("layout: experts placed over dp x tp workers, attention split by tp alone") {
  const auto m = test::tiny_moe_config();
  for (int d = 0; d < 2; ++d)
    for (int w = 0; w < 2; ++w) {
      const auto s = engine::shard_spec::make(m, 2, w, true, 2, d);
      CHECK(s.ep_size() == 4);
      CHECK(s.ep_rank() == d * 2 + w);
      CHECK(s.expert_begin == 2 * (d * 2 + w));
      CHECK(s.experts == 2);
      CHECK(s.heads == 2); // 4 heads over tp 2, whatever the dp rank
    }
  CHECK_THROWS_WITH_AS(engine::shard_spec::make(m, 2, 0, false, 2, 0), doctest::Contains("needs expert parallelism"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(engine::shard_spec::make(m, 2, 0, true, 2, 2), doctest::Contains("dp_rank"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(engine::shard_spec::make(m, 2, 0, true, 8, 0), doctest::Contains("exceed the model's 8 experts"),
                       std::invalid_argument);

  // Recorded through the cluster: worker (d, w) takes experts 2(2d + w), +1 only.
  test::cluster_files files;
  const auto c = files.load(test::small_cluster("  - {name: e, tp: 2, dp: 2, expert_parallel: true}\n"));
  const auto l = build_layout(c);
  REQUIRE(l.plans.size() == 4);
  for (const auto& p : l.plans) {
    const auto shard = engine::shard_spec::make(c.model, 2, static_cast<int>(p.worker), true, 2,
                                                static_cast<int>(p.dp_rank));
    const auto recorded = engine::make_plan(shard, llama_parameter_specs(c.model, dtype::bf16), true);
    CHECK(bytes_of(p.shares) == plan::bytes_per_worker(recorded));
    for (const auto& e : recorded.entries)
      if (auto x = plan::expert_of(e.source))
        CHECK(shard.holds_expert(*x));
  }
}

TEST_CASE("layout: data-parallel ranks spread over the holders of a group") {
  test::cluster_files files;
  const auto c = files.load(test::small_cluster("  - {name: e, tp: 1, dp: 2}\n"));
  const auto l = build_layout(c);
  REQUIRE(l.plans.size() == 2);
  // Group 0's dense tensors are held by both ranks of stage 0 (after their tp
  // gather): the two dp ranks take them from different ones.
  std::set<std::size_t> from;
  for (const auto& p : l.plans)
    for (const auto& s : p.shares)
      if (s.group == 0)
        from.insert(s.producer);
  CHECK(from.size() == 2);
}
