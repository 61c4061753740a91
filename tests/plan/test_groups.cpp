// Parameter groups: one transformer block each; the embedding joins the
// first, the final norm and lm_head the last.
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/plan/grouped_plan.hpp"
#include "runtime/plan/groups.hpp"

#include "tests/support/transfer_fixtures.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>

using namespace rlsync;
using namespace rlsync::transfer;

TEST_CASE("group_of: every name of a 4-layer model, and names that are not parameters") {
  const model_config c = test::small_model(4);
  struct row {
    const char* name;
    int group; // -1: throws
  };
  const row rows[] = {
      {"model.embed_tokens.weight", 0},
      {"model.layers.0.input_layernorm.weight", 0},
      {"model.layers.0.self_attn.q_proj.weight", 0},
      {"model.layers.1.self_attn.k_proj.weight", 1},
      {"model.layers.2.mlp.down_proj.weight", 2},
      {"model.layers.3.post_attention_layernorm.weight", 3},
      {"model.layers.3.self_attn.rotary_emb.inv_freq", 3}, // every model.layers.N.* is in group N
      {"model.norm.weight", 3},
      {"lm_head.weight", 3},
      {"model.layers.4.mlp.up_proj.weight", -1}, // beyond the model
      {"model.layers.01.mlp.up_proj.weight", -1}, // not how layers are spelled
      {"model.layers.x.mlp.up_proj.weight", -1},
      {"model.layers.1", -1},
      {"model.layers.1.", -1},
      {"model.embed_tokens.bias", -1},
      {"", -1},
  };
  for (const auto& r : rows) {
    INFO(r.name);
    if (r.group < 0)
      CHECK_THROWS_AS(plan::group_of(c, r.name), std::invalid_argument);
    else
      CHECK(plan::group_of(c, r.name) == static_cast<std::uint32_t>(r.group));
  }
  CHECK_THROWS_WITH(plan::group_of(c, "model.layers.9.mlp.up_proj.weight"), doctest::Contains("layer 9"));
}

TEST_CASE("group_count is the number of layers, one-layer models put everything in group 0") {
  CHECK(plan::group_count(test::small_model(3)) == 3);
  const model_config one = test::small_model(1);
  CHECK(plan::group_count(one) == 1);
  for (const auto& s : llama_parameter_specs(one, dtype::bf16))
    CHECK(plan::group_of(one, s.name) == 0);
}

TEST_CASE("group_members: every parameter in exactly one group, in parameter order") {
  for (bool tied : {false, true}) {
    const model_config c = test::small_model(3, tied);
    const auto specs = llama_parameter_specs(c, dtype::bf16);
    std::size_t total = 0;
    for (std::uint32_t g = 0; g < plan::group_count(c); ++g) {
      auto m = plan::group_members(c, specs, g);
      total += m.size();
      // 9 per layer, plus the embedding in the first and norm (+ head) in the last.
      std::size_t want = 9 + (g == 0 ? 1 : 0) + (g == 2 ? (tied ? 1 : 2) : 0);
      CHECK(m.size() == want);
      for (std::size_t i = 1; i < m.size(); ++i) {
        auto pos = [&](const std::string& n) {
          for (std::size_t k = 0; k < specs.size(); ++k)
            if (specs[k].name == n)
              return k;
          return specs.size();
        };
        CHECK(pos(m[i - 1].name) < pos(m[i].name));
      }
    }
    CHECK(total == specs.size());
    CHECK_THROWS_AS(plan::group_members(c, specs, 3), std::out_of_range);
  }
}

TEST_CASE("groups_of_layers: a pipeline rank's layers are its groups") {
  const model_config c = test::small_model(4);
  CHECK(plan::groups_of_layers(c, {3, 1, 1}) == std::vector<std::uint32_t>{1, 3});
  CHECK(plan::groups_of_layers(c, {}).empty());
  CHECK_THROWS_AS(plan::groups_of_layers(c, {4}), std::out_of_range);
  CHECK_THROWS_AS(plan::groups_of_layers(c, {-1}), std::out_of_range);
}

TEST_CASE("largest_group_bytes: the heaviest block at the element width asked, overflow refused") {
  const model_config c = test::small_model(3, /*tied=*/false);
  const auto specs = llama_parameter_specs(c, dtype::bf16);
  std::vector<std::uint64_t> per_group(3, 0);
  for (const auto& s : specs)
    per_group[plan::group_of(c, s.name)] += static_cast<std::uint64_t>(s.numel());
  const auto heaviest = *std::max_element(per_group.begin(), per_group.end());
  CHECK(heaviest == per_group[2]); // the last group carries the untied LM head and the final norm
  CHECK(plan::largest_group_bytes(c, specs, dtype::bf16) == heaviest * 2);
  CHECK(plan::largest_group_bytes(c, specs, dtype::f32) == heaviest * 4); // the element asked, not the specs'
  CHECK(plan::largest_group_bytes(c, {}, dtype::f32) == 0);

  std::vector<tensor_spec> huge{{"model.layers.0.mlp.up_proj.weight", dtype::f32, {std::int64_t{1} << 40, std::int64_t{1} << 22}}};
  CHECK_THROWS_AS(plan::largest_group_bytes(c, huge, dtype::f32), std::overflow_error);
  huge.push_back(huge[0]);
  huge[0].shape = {std::int64_t{1} << 40, std::int64_t{1} << 21}; // 2^63 bytes each: the sum overflows
  huge[1] = huge[0];
  CHECK_THROWS_WITH_AS(plan::largest_group_bytes(c, huge, dtype::f32), doctest::Contains("up_proj"), std::overflow_error);
}

TEST_CASE("grouped plan: entries whose bytes add up past 2^64 are refused, not wrapped") {
  const model_config c = test::small_model(2);
  plan::worker_plan p;
  for (int i = 0; i < 3; ++i) { // each 2^61 f32 elements: 2^63 bytes
    plan::plan_entry e;
    e.source = "model.layers.0.made_up";
    e.source_type = dtype::f32;
    e.source_shape = {std::int64_t(1) << 61};
    e.view = plan::strided::dense(e.source_shape);
    e.param = "x";
    p.entries.push_back(e);
  }
  CHECK_THROWS_WITH_AS(plan::grouped_plan(c, std::make_shared<const plan::worker_plan>(p)),
                       doctest::Contains("add up to more than 2^64 bytes"), std::invalid_argument);
  p.entries.resize(1); // one alone fits
  CHECK(plan::grouped_plan(c, std::make_shared<const plan::worker_plan>(p)).total_bytes() == std::uint64_t(1) << 63);
}
