// The loader, the view geometry it relies on, and sharding plans recorded
// from it: replaying a plan must give exactly what the real loader writes.
#include "runtime/engine/apply_packed.hpp"
#include "tests/support/engine_fixtures.hpp"
#include "tests/support/scratch_dir.hpp"

#include "runtime/engine/loader.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/engine/weight_view.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <numeric>

using namespace rlsync;
using namespace rlsync::engine;
using namespace rlsync::plan;
using rlsync::test::make_source;
using rlsync::test::tiny_config;

namespace {

// A small f32 tensor 0, 1, 2, ... for geometry checks.
std::vector<float> iota_tensor(std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

std::vector<float> packed(const strided& g, const std::vector<float>& src) {
  std::vector<float> out(static_cast<std::size_t>(g.numel()));
  gather(g, src.data(), sizeof(float), out.data());
  return out;
}

} // namespace

TEST_CASE("view geometry: narrow, transpose, reshape as torch does") {
  auto src = iota_tensor(24);
  auto base = strided::dense({2, 3, 4});
  CHECK(base.strides == std::vector<std::int64_t>{12, 4, 1});

  auto n = narrow(base, 2, 1, 2); // [2, 3, 2]
  CHECK(packed(n, src) == std::vector<float>{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22});
  CHECK_FALSE(n.contiguous());

  auto t = transpose(strided::dense({2, 3}), 0, 1);
  CHECK(packed(t, src) == std::vector<float>{0, 3, 1, 4, 2, 5});

  // Merging dims that are evenly strided works even when not contiguous.
  auto heads = narrow(base, 0, 1, 1); // [1, 3, 4] from offset 12
  auto merged = reshape(heads, {3, 4});
  REQUIRE(merged);
  CHECK(packed(*merged, src) == packed(heads, src));
  auto rows = narrow(strided::dense({4, 3, 2}), 0, 1, 2); // [2, 3, 2]: contiguous block
  REQUIRE(reshape(rows, {-1, 2}));
  CHECK(reshape(rows, {-1, 2})->shape == std::vector<std::int64_t>{6, 2});

  // Not expressible: merging a narrowed inner dim with its outer one.
  CHECK_FALSE(reshape(n, {12}));
  CHECK_FALSE(reshape(t, {6}));
  CHECK_THROWS_AS(reshape(base, {5, 5}), std::invalid_argument);
  CHECK_THROWS_AS(narrow(base, 1, 2, 2), std::out_of_range);
  CHECK_THROWS_AS(narrow(base, 3, 0, 1), std::out_of_range);
}

TEST_CASE("view runs: contiguous runs back to back are the packed bytes, as few as the view allows") {
  struct row {
    const char* what;
    strided view;
    std::size_t runs;
  };
  const auto base = strided::dense({2, 3, 4});
  const row rows[] = {
      {"whole tensor: one run", base, 1},
      {"rows narrowed: one run", narrow(base, 0, 1, 1), 1},
      {"last dim narrowed: a run per row", narrow(base, 2, 1, 2), 6},
      {"transposed: a run per element", transpose(strided::dense({2, 3}), 0, 1), 6},
      {"last dim narrowed to one: a run per row", narrow(base, 2, 1, 1), 6},
      {"transposed, last dim of one: a run per element", narrow(transpose(base, 1, 2), 2, 0, 1), 8},
      {"empty: no run", narrow(base, 1, 0, 0), 0},
      // A peer's plan may give a dim of one element any stride: it never
      // moves the view, so rows 1-2 and 4-5 (adding it would overflow, which
      // only a sanitizer build sees).
      {"a dim of one with an absurd stride: a run per row", strided{1, {1, 2, 2}, {INT64_MAX, 3, 1}}, 2},
  };
  const auto src = iota_tensor(24);
  for (const auto& r : rows) {
    CAPTURE(r.what);
    std::vector<float> joined;
    std::size_t runs = 0;
    for_each_run(r.view, sizeof(float), [&](std::int64_t at, std::size_t bytes) {
      ++runs;
      CHECK(at % static_cast<std::int64_t>(sizeof(float)) == 0);
      const auto* from = src.data() + at / static_cast<std::int64_t>(sizeof(float));
      joined.insert(joined.end(), from, from + bytes / sizeof(float));
    });
    CHECK(runs == r.runs);
    CHECK(joined == packed(r.view, src));
    if (r.view.shape == std::vector<std::int64_t>{1, 2, 2})
      CHECK(joined == std::vector<float>{1, 2, 4, 5});
    // Every run is run_bytes long: the view's bytes over its runs.
    CHECK(run_bytes(r.view, sizeof(float)) * r.runs == joined.size() * sizeof(float));
  }
}

TEST_CASE("real views materialise a reshape strides cannot express, recording views refuse it") {
  auto src = iota_tensor(6);
  model_config c = tiny_config();
  worker_weights dst(shard_spec::make(c, 1, 0), dtype::f32);
  auto& target = dst.at("model.norm.weight"); // 64 floats
  auto real = real_weight("t", dtype::f32, {2, 3}, src.data());
  real->transpose(0, 1)->view({6})->copy_into(target, 10);
  std::vector<float> got(6);
  std::memcpy(got.data(), target.bytes.data() + 10 * sizeof(float), sizeof(float) * 6);
  CHECK(got == std::vector<float>{0, 3, 1, 4, 2, 5});

  auto sink = std::make_shared<std::vector<plan_entry>>();
  auto rec = recording_weight("model.layers.0.mlp.up_proj.weight", dtype::bf16, {2, 3}, sink);
  CHECK_THROWS_WITH_AS(rec->transpose(0, 1)->view({6}),
                       doctest::Contains("cannot record model.layers.0.mlp.up_proj.weight.transpose(0, 1).view([6])"),
                       std::logic_error);
  CHECK(sink->empty());
  // What it can express is recorded with its op chain and strided form.
  rec->transpose(0, 1)->narrow(0, 1, 2)->copy_into(target, 4);
  REQUIRE(sink->size() == 1);
  const auto& e = sink->front();
  CHECK(e.ops == std::vector<std::string>{"transpose(0, 1)", "narrow(0, 1, 2)"});
  CHECK(e.view.offset == 1);
  CHECK(e.view.shape == std::vector<std::int64_t>{2, 2});
  CHECK(e.view.strides == std::vector<std::int64_t>{1, 3});
  CHECK(e.param == "model.norm.weight");
  CHECK(e.dst_offset == 4);
  CHECK(e.bytes() == 8);
  CHECK(e.describe()
        == "model.layers.0.mlp.up_proj.weight.transpose(0, 1).narrow(0, 1, 2) -> model.norm.weight[4 +4]");
  CHECK_THROWS_AS(rec->copy_into(target, 60), std::out_of_range);
}

TEST_CASE("replaying each worker's plan gives exactly what the loader writes, tp 1, 2, 4, Llama and Qwen3") {
  struct row {
    const char* what;
    model_config config;
    dtype type;
    bool expert_parallel = false;
  };
  const row rows[] = {
      {"kv split", tiny_config(4, 4), dtype::bf16},
      {"kv 2 < tp 4", tiny_config(4, 2, true), dtype::bf16},
      {"kv 1, f32", tiny_config(4, 1), dtype::f32},
      {"Qwen3, kv 2 < tp 4, head_dim 24", test::tiny_qwen3_config(4, 2, true), dtype::bf16},
      {"Qwen3-MoE, 8 experts sliced by tp", test::tiny_moe_config(2), dtype::bf16},
      {"Qwen3-MoE, fused experts: selected, transposed, split", test::tiny_moe_config(2, true, true), dtype::bf16},
      {"Qwen3-MoE, expert parallelism: whole experts", test::tiny_moe_config(2), dtype::bf16, true},
      {"Qwen3-MoE, expert parallelism, 6 experts placed unevenly", test::tiny_moe_config_with(6), dtype::bf16, true},
      {"Qwen3-MoE, expert parallelism, fused experts", test::tiny_moe_config_with(6, true), dtype::bf16, true},
  };
  for (const auto& r : rows) {
    auto src = make_source(r.config, r.type, 21);
    const std::uint64_t total = [&] {
      std::uint64_t n = 0;
      for (auto& s : src.specs)
        n += s.bytes();
      return n;
    }();
    for (int tp : {1, 2, 4}) {
      CAPTURE(r.what);
      CAPTURE(tp);
      CAPTURE(r.expert_parallel);
      auto loaded = src.load(tp, r.expert_parallel);
      std::uint64_t sum = 0;
      for (int w = 0; w < tp; ++w) {
        CAPTURE(w);
        auto p = make_plan(r.config, tp, w, r.type, r.expert_parallel);
        CHECK(check_coverage(p, r.config, r.expert_parallel).empty());
        if (r.expert_parallel) // a whole expert's tensors, and only its holder's
          for (const auto& e : p.entries)
            if (e.source.find(".mlp.experts.") != std::string::npos)
              CHECK(e.numel() == r.config.moe_intermediate_size * r.config.hidden_size);
        worker_weights replayed(shard_spec::make(r.config, tp, w, r.expert_parallel), r.type);
        for (const auto& e : p.entries) {
          auto bytes = replay(e, src.data(e.source), r.type);
          REQUIRE(bytes.size() == e.bytes());
          apply_packed(e, bytes.data(), r.type, replayed);
        }
        const auto& real = loaded->workers[static_cast<std::size_t>(w)];
        REQUIRE(real.params().size() == replayed.params().size());
        for (std::size_t i = 0; i < real.params().size(); ++i) {
          const auto& a = real.params()[i];
          const auto& b = replayed.params()[i];
          CAPTURE(a.name);
          REQUIRE(a.bytes.size() == b.bytes.size());
          CHECK(std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()) == 0);
        }
        sum += bytes_per_worker(p);
      }
      // Everything arrives once, except what every worker keeps whole (the
      // norms) and kv heads replicated when there are fewer than tp: so with
      // expert parallelism no worker receives an expert it does not hold.
      const auto& c = r.config;
      const auto es = static_cast<std::int64_t>(dtype_size(r.type));
      const auto head_norms = c.qk_norm() ? 2 * c.num_hidden_layers * c.head_dim() : 0; // Qwen3's q/k norms
      std::int64_t routers = 0; // Qwen3-MoE: every worker holds each sparse layer's router whole
      for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
        routers += c.sparse_layer(l) ? c.num_experts * c.hidden_size : 0;
      const auto norms = static_cast<std::uint64_t>(
        (c.hidden_size * (2 * c.num_hidden_layers + 1) + head_norms + routers) * es);
      const auto kv_bytes = static_cast<std::uint64_t>(2 * c.num_hidden_layers * c.num_key_value_heads
                                                       * c.head_dim() * c.hidden_size * es);
      const std::uint64_t kv_copies = tp > c.num_key_value_heads ? tp / c.num_key_value_heads : 1;
      CHECK(sum == total + (tp - 1) * norms + (kv_copies - 1) * kv_bytes);
    }
  }
}

TEST_CASE("a plan entry shards the way vLLM does") {
  auto c = tiny_config(4, 2);
  auto p = make_plan(c, 4, 3, dtype::bf16);
  auto find = [&](const std::string& source) -> const plan_entry& {
    for (const auto& e : p.entries)
      if (e.source == source)
        return e;
    FAIL("no entry for " << source);
    throw 0;
  };
  // Worker 3 of 4: q head 3; kv head 3 * 2 / 4 = 1 (replicated); v after k.
  const auto& k = find("model.layers.1.self_attn.k_proj.weight");
  CHECK(k.ops == std::vector<std::string>{"view([2, 16, 64])", "narrow(0, 1, 1)", "view([16, 64])"});
  CHECK(k.view.offset == 16 * 64);
  CHECK(k.param == "model.layers.1.self_attn.qkv_proj.weight");
  CHECK(k.dst_offset == 16 * 64);
  CHECK(find("model.layers.1.self_attn.v_proj.weight").dst_offset == 2 * 16 * 64);
  const auto& o = find("model.layers.0.self_attn.o_proj.weight");
  CHECK(o.view.offset == 48);
  CHECK(o.view.strides == std::vector<std::int64_t>{64, 1});
  const auto& up = find("model.layers.0.mlp.up_proj.weight");
  CHECK(up.param == "model.layers.0.mlp.gate_up_proj.weight");
  CHECK(up.dst_offset == 32 * 64);
  // Vocab-parallel: ceil(301 / 4) = 76 rows each, the last worker 73.
  CHECK(find("lm_head.weight").view.offset == 228 * 64);
  CHECK(find("lm_head.weight").view.shape == std::vector<std::int64_t>{73, 64});
  // A trainer rank holding only some tensors gets only their entries.
  auto part = make_plan(c, 4, 3, {tensor_spec{"model.norm.weight", dtype::bf16, {64}}});
  REQUIRE(part.entries.size() == 1);
  CHECK(bytes_per_worker(part) == 128);
  CHECK_FALSE(check_coverage(part, c).empty());
}

TEST_CASE("the loader rejects unknown, missing and misshapen tensors") {
  auto c = tiny_config(4, 2);
  auto src = make_source(c, dtype::bf16, 1);
  auto set = weight_set::make(c, 2, dtype::bf16);

  auto views = src.views();
  views.back().shape = {301, 32}; // lm_head
  CHECK_THROWS_WITH_AS(load_weights(views, *set),
                       doctest::Contains("'lm_head.weight': shape [301, 32], the model config implies [301, 64]"),
                       std::invalid_argument);

  views = src.views();
  views.erase(views.begin() + 3); // model.layers.0.self_attn.k_proj.weight
  CHECK_THROWS_WITH_AS(load_weights(views, *set),
                       doctest::Contains("missing tensors: model.layers.0.self_attn.k_proj.weight"),
                       std::invalid_argument);

  views = src.views();
  views.push_back(views[1]);
  views.back().name = "model.layers.7.input_layernorm.weight";
  CHECK_THROWS_WITH_AS(load_weights(views, *set), doctest::Contains("not a parameter of this model"),
                       std::invalid_argument);

  // What the engine ignores: rotary buffers, and lm_head when tied.
  CHECK(ignored_weight(c, "model.layers.0.self_attn.rotary_emb.inv_freq"));
  CHECK_FALSE(ignored_weight(c, "lm_head.weight"));
  CHECK(ignored_weight(tiny_config(4, 2, true), "lm_head.weight"));
}

TEST_CASE("load_checkpoint reads a checkpoint directory") {
  auto c = tiny_config(4, 2);
  test::scratch_dir dir;
  const std::string path = dir / "ckpt";
  make_synthetic_checkpoint(path, c, dtype::bf16, 5);
  auto set = load_checkpoint(path, 2);
  auto ckpt = checkpoint::open(path);
  // Compare with loading the same bytes through load_weights.
  std::vector<rlsync::tensor_view> views;
  for (const auto& e : ckpt.tensors())
    views.push_back(*e.tensor);
  CHECK(set->type() == dtype::bf16); // stored as the checkpoint holds them
  auto again = weight_set::make(c, 2, dtype::bf16);
  load_weights(views, *again);
  for (int w = 0; w < 2; ++w)
    for (std::size_t i = 0; i < set->workers[w].params().size(); ++i)
      CHECK(set->workers[w].params()[i].bytes == again->workers[w].params()[i].bytes);
}
