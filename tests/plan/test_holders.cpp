// Holder choice: which trainer rank serves each entry of a worker's plan,
// row by row over replicas, worker ranks, holders and exclusions.
#include "runtime/plan/holders.hpp"

#include "tests/support/transfer_fixtures.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace rlsync;

namespace {

const std::string embed = "model.embed_tokens.weight";
const std::string l0a = "model.layers.0.mlp.up_proj.weight";
const std::string l0b = "model.layers.0.mlp.down_proj.weight";
const std::string l1 = "model.layers.1.mlp.up_proj.weight";
const std::string l2 = "model.layers.2.mlp.up_proj.weight";
const std::string l3 = "model.layers.3.mlp.up_proj.weight";
const std::string head = "lm_head.weight";

// A plan naming one entry per tensor, in loader order: groups 0 0 0 1 2 3 3.
plan::worker_plan plan_of(int worker) {
  plan::worker_plan p;
  p.tp = 8;
  p.worker = worker;
  for (const auto& name : {embed, l0a, l0b, l1, l2, l3, head}) {
    plan::plan_entry e;
    e.source = name;
    p.entries.push_back(e);
  }
  return p;
}

const std::vector<std::string> all = {embed, l0a, l0b, l1, l2, l3, head};
const std::vector<std::string> first_half = {embed, l0a, l0b, l1};
const std::vector<std::string> second_half = {l2, l3, head};

producer_holding holding(std::uint32_t rank, std::vector<std::string> held) {
  std::sort(held.begin(), held.end());
  return producer_holding{rank, 1, std::move(held)};
}

struct row {
  const char* what;
  std::vector<producer_holding> producers;
  int worker;
  std::vector<std::uint32_t> excluded_ranks;
  // Expected rank per entry: embed, l0a, l0b, l1, l2, l3, head.
  std::vector<std::uint32_t> expected;
};

} // namespace

TEST_CASE("holder choice: the holder of every plan entry, row by row") {
  const model_config c = test::small_model(4);
  const std::vector<row> rows = {
    {"one rank holds everything", {holding(0, all)}, 3, {}, {0, 0, 0, 0, 0, 0, 0}},
    {"pipeline halves, worker 0", {holding(0, first_half), holding(1, second_half)}, 0, {}, {0, 0, 0, 0, 1, 1, 1}},
    {"pipeline halves, worker 5", {holding(0, first_half), holding(1, second_half)}, 5, {}, {0, 0, 0, 0, 1, 1, 1}},
    // Replicas: group g of worker w from holders[(w + g) % 2].
    {"two replicas, worker 0", {holding(0, all), holding(1, all)}, 0, {}, {0, 0, 0, 1, 0, 1, 1}},
    {"two replicas, worker 1", {holding(0, all), holding(1, all)}, 1, {}, {1, 1, 1, 0, 1, 0, 0}},
    {"two replicas, worker 2 (as worker 0)", {holding(0, all), holding(1, all)}, 2, {}, {0, 0, 0, 1, 0, 1, 1}},
    {"two replicas given out of rank order", {holding(1, all), holding(0, all)}, 0, {}, {0, 0, 0, 1, 0, 1, 1}},
    {"three replicas, worker 2", {holding(0, all), holding(1, all), holding(2, all)}, 2, {}, {2, 2, 2, 0, 1, 2, 2}},
    {"ranks 4 and 9 replicate, worker 1", {holding(9, all), holding(4, all)}, 1, {}, {9, 9, 9, 4, 9, 4, 4}},
    // A block's tensors split: l0a only on 0, l0b only on 1; the rest on both.
    {"a group split over holders, worker 0",
     {holding(0, {embed, l0a, l1, l2, l3, head}), holding(1, {embed, l0b, l1, l2, l3, head})}, 0, {},
     {0, 0, 1, 1, 0, 1, 1}},
    {"a group split over holders, worker 1",
     {holding(0, {embed, l0a, l1, l2, l3, head}), holding(1, {embed, l0b, l1, l2, l3, head})}, 1, {},
     {1, 0, 1, 0, 1, 0, 0}},
    // Pipeline halves, each replicated twice: ranks 0,1 hold the first, 2,3 the second.
    {"replicated halves, worker 0",
     {holding(0, first_half), holding(1, first_half), holding(2, second_half), holding(3, second_half)}, 0, {},
     {0, 0, 0, 1, 2, 3, 3}},
    {"replicated halves, worker 1",
     {holding(0, first_half), holding(1, first_half), holding(2, second_half), holding(3, second_half)}, 1, {},
     {1, 1, 1, 0, 3, 2, 2}},
    // Exclusion: the failed producer's entries move to the remaining holders.
    {"two replicas, rank 0 excluded, worker 0", {holding(0, all), holding(1, all)}, 0, {0}, {1, 1, 1, 1, 1, 1, 1}},
    {"three replicas, rank 2 excluded, worker 2", {holding(0, all), holding(1, all), holding(2, all)}, 2, {2},
     {0, 0, 0, 1, 0, 1, 1}},
    {"replicated halves, rank 3 excluded, worker 0",
     {holding(0, first_half), holding(1, first_half), holding(2, second_half), holding(3, second_half)}, 0, {3},
     {0, 0, 0, 1, 2, 2, 2}},
  };
  for (const auto& r : rows) {
    INFO(r.what);
    const plan::holder_index index(r.producers);
    std::vector<bool> excluded(r.producers.size(), false);
    for (auto rank : r.excluded_ranks)
      for (std::size_t i = 0; i < r.producers.size(); ++i)
        if (r.producers[i].rank == rank)
          excluded[i] = true;
    const auto p = plan_of(r.worker);
    const auto choice = plan::choose_holders(c, p, index, excluded);
    REQUIRE(choice.holder.size() == r.expected.size());
    std::vector<std::uint32_t> got;
    for (auto h : choice.holder)
      got.push_back(r.producers.at(h).rank);
    CHECK(got == r.expected);
    // Each producer's sub-plan: its entries, in plan order, and nothing else.
    std::size_t total = 0;
    for (std::size_t h = 0; h < choice.entries.size(); ++h) {
      const auto& mine = choice.entries[h];
      CHECK(std::is_sorted(mine.begin(), mine.end()));
      for (auto i : mine)
        CHECK(choice.holder[i] == h);
      total += mine.size();
      auto sub = plan::sub_plan(p, mine);
      CHECK(sub->worker == p.worker);
      CHECK(sub->tp == p.tp);
      REQUIRE(sub->entries.size() == mine.size());
      for (std::size_t k = 0; k < mine.size(); ++k)
        CHECK(sub->entries[k].source == p.entries[mine[k]].source);
    }
    CHECK(total == p.entries.size());
  }
}

TEST_CASE("holder choice: the same worker rank of every replica engine gets the same sub-plans") {
  const model_config c = test::small_model(4);
  const plan::holder_index index({holding(0, all), holding(1, all), holding(2, all)});
  for (int w = 0; w < 4; ++w) {
    auto a = plan::choose_holders(c, plan_of(w), index);
    auto b = plan::choose_holders(c, plan_of(w), index);
    CHECK(a.entries == b.entries);
  }
  // Different worker ranks spread over the holders: each one serves someone.
  std::vector<int> served(3, 0);
  for (int w = 0; w < 3; ++w)
    for (auto h : plan::choose_holders(c, plan_of(w), index).holder)
      ++served[h];
  CHECK(served[0] > 0);
  CHECK(served[1] > 0);
  CHECK(served[2] > 0);
}

TEST_CASE("holder choice: only some entries, the rest unassigned") {
  const model_config c = test::small_model(4);
  const plan::holder_index index({holding(0, all), holding(1, all)});
  const auto p = plan_of(0);
  auto choice = plan::choose_holders(c, p, index, {3, 4}, {true, false});
  CHECK(choice.holder == std::vector<std::size_t>{2, 2, 2, 1, 1, 2, 2});
  CHECK(choice.entries[0].empty());
  CHECK(choice.entries[1] == std::vector<std::size_t>{3, 4});
  CHECK_THROWS_AS(plan::choose_holders(c, p, index, {4, 3}, {}), std::invalid_argument);
  CHECK_THROWS_AS(plan::choose_holders(c, p, index, {7}, {}), std::invalid_argument);
}

TEST_CASE("holder choice: an unheld tensor, a last holder excluded, a rank named twice") {
  const model_config c = test::small_model(4);
  {
    const plan::holder_index index({holding(0, first_half), holding(1, {l2, l3})}); // nobody holds the head
    CHECK_THROWS_WITH_AS(plan::choose_holders(c, plan_of(0), index),
                         "holder choice: tensor 'lm_head.weight' is held by no producer", std::invalid_argument);
  }
  {
    const plan::holder_index index({holding(0, first_half), holding(1, second_half)});
    CHECK_THROWS_WITH_AS(plan::choose_holders(c, plan_of(0), index, {false, true}),
                         "holder choice: tensor 'model.layers.2.mlp.up_proj.weight' is held by no producer left "
                         "(excluded: rank 1 (incarnation 1))",
                         std::invalid_argument);
    CHECK(index.holders_left(l2) == 1);
    CHECK(index.holders_left(l2, {false, true}) == 0);
    CHECK(index.holders_left("model.layers.9.mlp.up_proj.weight") == 0);
  }
  CHECK_THROWS_AS(plan::holder_index({holding(2, all), holding(2, first_half)}), std::invalid_argument);
  const plan::holder_index index({holding(0, all)});
  CHECK_THROWS_AS(index.choose(l1, 1, 0, {true, false}), std::invalid_argument); // flags for 2 producers, 1 given
}
