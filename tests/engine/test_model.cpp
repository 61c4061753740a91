// The engine's forward pass: against an independent reference, incremental
// against full recompute, batched against alone, and across tp sizes.
#include "tests/support/engine_fixtures.hpp"

#include "runtime/engine/model.hpp"
#include "runtime/engine/process.hpp"
#include "runtime/engine/tokenizer.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

using namespace rlsync;
using namespace rlsync::engine;
using rlsync::test::make_source;
using rlsync::test::tiny_config;
using rlsync::test::tiny_qwen3_config;

namespace {

std::vector<std::int32_t> argmax_tokens(const forward_output& out, std::size_t items) {
  std::vector<std::int32_t> next;
  for (std::size_t i = 0; i < items; ++i) {
    const float* row = out.last(i);
    next.push_back(static_cast<std::int32_t>(std::max_element(row, row + out.vocab) - row));
  }
  return next;
}

bool same_bits(const float* a, const float* b, std::int64_t n) {
  return std::memcmp(a, b, static_cast<std::size_t>(n) * sizeof(float)) == 0;
}

/// Greedy generation of `steps` tokens for every prompt, batched: one prefill
/// step for all, then one decode step per token. Records every logits row.
struct generation {
  std::vector<std::vector<std::int32_t>> tokens;
  std::vector<float> logits; // every step's last-position logits, concatenated
};

generation generate(model& m, const std::vector<std::vector<std::int32_t>>& prompts, int steps) {
  generation g;
  std::vector<kv_sequence> seqs;
  for (std::size_t i = 0; i < prompts.size(); ++i)
    seqs.push_back(m.new_sequence());
  g.tokens.resize(prompts.size());
  std::vector<forward_item> batch;
  for (std::size_t i = 0; i < prompts.size(); ++i)
    batch.push_back({&seqs[i], prompts[i], 0, false});
  for (int s = 0; s < steps; ++s) {
    auto out = m.forward(batch);
    g.logits.insert(g.logits.end(), out.logits.begin(), out.logits.end());
    auto next = argmax_tokens(out, prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      g.tokens[i].push_back(next[i]);
      batch[i] = {&seqs[i], {next[i]}, seqs[i].length(), false};
    }
  }
  return g;
}

const std::vector<std::vector<std::int32_t>> prompts = {
    encode("Hello, world"), encode("a"), encode("The quick brown fox jumps over the lazy dog."),
    {256, 299, 0, 255, 257, 42}};

// Greedy generation at tp 1 (sliced experts), checked not degenerate: the
// baseline the other shardings must reproduce bit for bit.
generation tp1_baseline(const model_config& cfg, const test::source_weights& src) {
  model m1(cfg, 1, dtype::bf16);
  m1.set_weights(src.load(1));
  auto base = generate(m1, prompts, 24);
  std::set<std::int32_t> distinct;
  for (auto& t : base.tokens)
    distinct.insert(t.begin(), t.end());
  CHECK(distinct.size() > 4); // not a degenerate model repeating one token
  return base;
}

/// generate() over `dp` data-parallel ranks stepping in lockstep: prompt i on
/// rank i % dp. Same layout as generate()'s logits (per step, prompt order).
generation generate_ranks(model& m, const std::vector<std::vector<std::int32_t>>& prompts, int steps) {
  const auto dp = static_cast<std::size_t>(m.dp());
  generation g;
  std::vector<kv_sequence> seqs;
  for (std::size_t i = 0; i < prompts.size(); ++i)
    seqs.push_back(m.new_sequence());
  g.tokens.resize(prompts.size());
  std::vector<std::int32_t> next(prompts.size());
  for (int s = 0; s < steps; ++s) {
    std::vector<std::vector<forward_item>> batches(dp);
    for (std::size_t i = 0; i < prompts.size(); ++i)
      batches[i % dp].push_back(s == 0 ? forward_item{&seqs[i], prompts[i], 0, false}
                                       : forward_item{&seqs[i], {next[i]}, seqs[i].length(), false});
    std::vector<forward_output> outs;
    m.forward_ranks(batches, outs);
    REQUIRE(outs.size() == dp);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      const float* row = outs[i % dp].last(i / dp);
      g.logits.insert(g.logits.end(), row, row + outs[i % dp].vocab);
      next[i] = static_cast<std::int32_t>(std::max_element(row, row + outs[i % dp].vocab) - row);
      g.tokens[i].push_back(next[i]);
    }
  }
  return g;
}

} // namespace

TEST_CASE("forward matches an independent reference: MHA, GQA, tied embeddings, bf16 and f32, Llama and Qwen3") {
  struct row {
    const char* what;
    model_config config;
    dtype type;
    int tp;
    bool expert_parallel = false;
  };
  const row rows[] = {
      {"MHA f32 tp1", tiny_config(4, 4), dtype::f32, 1},
      {"GQA bf16 tp1", tiny_config(4, 2), dtype::bf16, 1},
      {"GQA tied f16 tp2", tiny_config(4, 2, true), dtype::f16, 2},
      {"MQA tied bf16 tp4", tiny_config(4, 1, true), dtype::bf16, 4},
      {"Qwen3 GQA bf16 tp1", tiny_qwen3_config(4, 2), dtype::bf16, 1},
      {"Qwen3 GQA tied bf16 tp2", tiny_qwen3_config(4, 2, true), dtype::bf16, 2},
      {"Qwen3 MQA f32 tp4, head_dim 16 = hidden / heads", tiny_qwen3_config(4, 1, false, 16), dtype::f32, 4},
      {"Qwen3-MoE bf16 tp1", test::tiny_moe_config(2), dtype::bf16, 1},
      {"Qwen3-MoE bf16 tp2, top-k not renormalised", test::tiny_moe_config(2, false), dtype::bf16, 2},
      {"Qwen3-MoE f32 tp4, kv replicated", test::tiny_moe_config(1), dtype::f32, 4},
      {"Qwen3-MoE fused experts bf16 tp2", test::tiny_moe_config(2, true, true), dtype::bf16, 2},
      {"Qwen3-MoE expert-parallel bf16 tp2", test::tiny_moe_config(2), dtype::bf16, 2, true},
      {"Qwen3-MoE expert-parallel fused f32 tp4, 6 experts", test::tiny_moe_config_with(6, true), dtype::f32, 4, true},
  };
  for (const auto& r : rows) {
    CAPTURE(r.what);
    auto src = make_source(r.config, r.type, 7);
    model m(r.config, r.tp, r.type, r.expert_parallel);
    m.set_weights(src.load(r.tp, r.expert_parallel));
    for (const auto& prompt : prompts) {
      auto seq = m.new_sequence();
      auto out = m.forward({{&seq, prompt, 0, /*all_logits=*/true}});
      auto ref = test::reference_logits(src, prompt);
      REQUIRE(out.first_row.back() == static_cast<std::int64_t>(prompt.size()));
      double worst = 0, spread = 0;
      for (std::size_t t = 0; t < prompt.size(); ++t)
        for (std::int64_t v = 0; v < out.vocab; ++v) {
          worst = std::max(worst, std::abs(double(out.row(0, t)[v]) - ref[t][v]));
          spread = std::max(spread, std::abs(double(ref[t][v])));
        }
      CAPTURE(spread);
      CHECK(spread > 1.0); // the logits are not all near zero
      CHECK(worst < 2e-5 * spread);
    }
  }
}

TEST_CASE("a model with settings the engine does not compute is refused, naming them") {
  auto c = tiny_config(4, 2);
  c.not_computed = {"rope_scaling: {\"rope_type\":\"llama3\"}: the built-in engine runs unscaled RoPE only"};
  CHECK_THROWS_WITH_AS(model(c, 1, dtype::bf16), "config.json: rope_scaling: {\"rope_type\":\"llama3\"}: the built-in "
                                                 "engine runs unscaled RoPE only",
                       std::invalid_argument);
}

TEST_CASE("incremental decoding equals a full recompute, bit for bit") {
  auto cfg = tiny_config(4, 2);
  auto src = make_source(cfg, dtype::bf16, 11);
  for (int tp : {1, 2}) {
    CAPTURE(tp);
    model m(cfg, tp, dtype::bf16);
    m.set_weights(src.load(tp));
    auto seq = m.new_sequence();
    std::vector<std::int32_t> all = encode("incremental");
    auto out = m.forward({{&seq, all, 0, false}});
    for (int step = 0; step < 12; ++step) {
      // The full sequence from scratch, in one prefill, every position.
      auto fresh = m.new_sequence();
      auto full = m.forward({{&fresh, all, 0, true}});
      REQUIRE(same_bits(out.last(0), full.last(0), out.vocab));
      const std::int32_t next = argmax_tokens(out, 1)[0];
      all.push_back(next);
      out = m.forward({{&seq, {next}, seq.length(), false}});
      CHECK(seq.length() == static_cast<std::int64_t>(all.size()));
    }
  }
}

TEST_CASE("a batched step computes each sequence exactly as alone") {
  auto cfg = tiny_config(4, 2, true);
  auto src = make_source(cfg, dtype::bf16, 3);
  model m(cfg, 2, dtype::bf16);
  m.set_weights(src.load(2));
  // Prefill chunks and single decode tokens mixed in one step.
  std::vector<kv_sequence> together, alone;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    together.push_back(m.new_sequence());
    alone.push_back(m.new_sequence());
  }
  std::vector<forward_item> batch;
  for (std::size_t i = 0; i < prompts.size(); ++i)
    batch.push_back({&together[i], prompts[i], 0, i % 2 == 0});
  auto out = m.forward(batch);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    auto one = m.forward({{&alone[i], prompts[i], 0, i % 2 == 0}});
    const std::int64_t rows = out.first_row[i + 1] - out.first_row[i];
    REQUIRE(rows == one.first_row[1]);
    CHECK(same_bits(out.row(i, 0), one.row(0, 0), rows * out.vocab));
  }
}

TEST_CASE("greedy generation is bit-identical for tp 1, 2 and 4, kv heads split or replicated, Llama and Qwen3") {
  for (auto [kv, arch] : {std::pair{4, model_arch::llama}, {2, model_arch::llama}, {1, model_arch::llama},
                          {2, model_arch::qwen3}, {1, model_arch::qwen3}, {2, model_arch::qwen3_moe}}) {
    CAPTURE(kv);
    CAPTURE(to_string(arch));
    auto cfg = arch == model_arch::qwen3_moe ? test::tiny_moe_config(kv)
               : arch == model_arch::qwen3   ? tiny_qwen3_config(4, kv)
                                             : tiny_config(4, kv);
    auto src = make_source(cfg, dtype::bf16, 5);
    auto base = tp1_baseline(cfg, src);
    for (int tp : {2, 4}) {
      CAPTURE(tp);
      model m(cfg, tp, dtype::bf16);
      m.set_weights(src.load(tp));
      auto g = generate(m, prompts, 24);
      CHECK(g.tokens == base.tokens);
      REQUIRE(g.logits.size() == base.logits.size());
      CHECK(same_bits(g.logits.data(), base.logits.data(), static_cast<std::int64_t>(g.logits.size())));
    }
  }
}

TEST_CASE("expert parallelism: greedy generation is bit-identical to sliced experts, tp 1, 2 and 4") {
  // Whole experts on one worker each (8 experts: 4, 2 per worker; 6: 3,
  // 2 + 2 + 1 + 1), separate and fused checkpoints, against tp 1.
  for (auto [experts, fused] : {std::pair{8, false}, {6, false}, {6, true}}) {
    CAPTURE(experts);
    CAPTURE(fused);
    auto cfg = test::tiny_moe_config_with(experts, fused);
    auto src = make_source(cfg, dtype::bf16, 9);
    auto base = tp1_baseline(cfg, src);
    for (int tp : {1, 2, 4}) {
      CAPTURE(tp);
      model m(cfg, tp, dtype::bf16, /*expert_parallel=*/true);
      CHECK(m.expert_parallel());
      auto set = src.load(tp, true);
      std::int64_t held = 0;
      for (const auto& w : set->workers) {
        CHECK(w.shard().moe_inter == cfg.moe_intermediate_size); // whole experts
        CHECK(w.shard().expert_begin == held);                   // contiguous, in worker order
        CHECK(w.shard().experts >= experts / tp);
        held += w.shard().experts;
      }
      CHECK(held == experts);
      m.set_weights(set);
      auto g = generate(m, prompts, 24);
      CHECK(g.tokens == base.tokens);
      REQUIRE(g.logits.size() == base.logits.size());
      CHECK(same_bits(g.logits.data(), base.logits.data(), static_cast<std::int64_t>(g.logits.size())));
    }
  }
}

TEST_CASE("expert parallelism: placement, validation and mismatched weight sets") {
  // vLLM's linear placement: E / ep each, the first E % ep one more.
  struct row {
    std::int64_t experts;
    int ep;
    std::vector<std::int64_t> first, count;
  };
  const row rows[] = {
      {8, 1, {0}, {8}},
      {8, 4, {0, 2, 4, 6}, {2, 2, 2, 2}},
      {6, 4, {0, 2, 4, 5}, {2, 2, 1, 1}},
      {7, 2, {0, 4}, {4, 3}},
  };
  for (const auto& r : rows) {
    CAPTURE(r.experts);
    CAPTURE(r.ep);
    auto cfg = test::tiny_moe_config_with(r.experts);
    for (int w = 0; w < r.ep; ++w) {
      auto s = shard_spec::make(cfg, r.ep, w, true);
      CHECK(s.expert_begin == r.first[static_cast<std::size_t>(w)]);
      CHECK(s.experts == r.count[static_cast<std::size_t>(w)]);
      for (std::int64_t e = s.expert_begin; e < s.expert_begin + s.experts; ++e)
        CHECK(expert_owner(e, r.experts, r.ep) == w);
    }
  }
  // Expert parallelism needs experts, at least one per worker; it lifts
  // the need for tp to divide moe_intermediate_size.
  CHECK_THROWS_WITH_AS(model(tiny_qwen3_config(4, 2), 2, dtype::bf16, true),
                       doctest::Contains("needs a mixture-of-experts model"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(model(test::tiny_moe_config_with(3), 4, dtype::bf16, true),
                       doctest::Contains("at most num_experts (3)"), std::invalid_argument);
  auto odd = test::tiny_moe_config_with(8);
  odd.moe_intermediate_size = 30; // 30 % 4 != 0: sliced experts cannot, whole ones can
  CHECK_THROWS_AS(model(odd, 4, dtype::bf16), std::invalid_argument);
  auto odd_src = make_source(odd, dtype::bf16, 1);
  model whole(odd, 4, dtype::bf16, true), one(odd, 1, dtype::bf16);
  whole.set_weights(odd_src.load(4, true));
  one.set_weights(odd_src.load(1));
  auto a = generate(whole, prompts, 8), b = generate(one, prompts, 8);
  CHECK(a.tokens == b.tokens);
  CHECK(same_bits(a.logits.data(), b.logits.data(), static_cast<std::int64_t>(a.logits.size())));
  // A set with the other placement is refused, naming it.
  auto cfg = test::tiny_moe_config(2);
  model sliced(cfg, 2, dtype::bf16);
  CHECK_THROWS_WITH_AS(sliced.set_weights(make_source(cfg, dtype::bf16, 1).load(2, true)),
                       doctest::Contains("with expert parallelism"), std::invalid_argument);
  model ep(cfg, 2, dtype::bf16, true);
  CHECK_THROWS_WITH_AS(ep.set_weights(make_source(cfg, dtype::bf16, 1).load(2)),
                       doctest::Contains("without expert parallelism"), std::invalid_argument);
}

TEST_CASE("data parallelism: ranks in lockstep equal tp 1, and experts are computed by all dp x tp workers") {
  auto cfg = test::tiny_moe_config_with(8);
  auto src = make_source(cfg, dtype::bf16, 9);
  auto base = tp1_baseline(cfg, src);
  std::int64_t sparse = 0;
  for (std::int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    sparse += cfg.sparse_layer(l) ? 1 : 0;
  REQUIRE(sparse > 0);
  struct shape {
    int dp, tp;
    bool ep;
  };
  for (auto [dp, tp, ep] : {shape{2, 1, false}, {2, 2, false}, {3, 1, false}, {2, 1, true}, {2, 2, true}, {4, 2, true}}) {
    CAPTURE(dp);
    CAPTURE(tp);
    CAPTURE(ep);
    model m(cfg, tp, dtype::bf16, ep, dp);
    CHECK(m.dp() == dp);
    m.set_weights(src.load(tp, ep));
    // Every prompt on its own rank gives tp 1's tokens and logits, bit for bit.
    auto g = generate_ranks(m, prompts, 24);
    CHECK(g.tokens == base.tokens);
    REQUIRE(g.logits.size() == base.logits.size());
    CHECK(same_bits(g.logits.data(), base.logits.data(), static_cast<std::int64_t>(g.logits.size())));

    // One step with tokens on rank 0 only: every (token, chosen expert) row
    // is computed once engine-wide (sliced: once per tp slice). With expert
    // parallelism the workers of the idle ranks compute their experts for
    // rank 0's tokens; without it they compute nothing.
    auto before = m.expert_rows();
    REQUIRE(before.size() == static_cast<std::size_t>(dp * tp));
    auto seq = m.new_sequence();
    const auto& prompt = prompts[2];
    std::vector<std::vector<forward_item>> batches(static_cast<std::size_t>(dp));
    batches[0].push_back({&seq, prompt, 0, false});
    std::vector<forward_output> outs;
    m.forward_ranks(batches, outs);
    CHECK(outs[1].logits.empty());
    CHECK(outs[1].first_row == std::vector<std::int64_t>{0});
    auto after = m.expert_rows();
    std::uint64_t total = 0, idle_ranks = 0;
    for (int w = 0; w < dp * tp; ++w) {
      const auto rows = after[static_cast<std::size_t>(w)] - before[static_cast<std::size_t>(w)];
      total += rows;
      if (w >= tp)
        idle_ranks += rows;
    }
    const auto pairs = static_cast<std::uint64_t>(prompt.size()) * static_cast<std::uint64_t>(cfg.num_experts_per_tok)
                       * static_cast<std::uint64_t>(sparse);
    CHECK(total == pairs * static_cast<std::uint64_t>(ep ? 1 : tp));
    if (ep)
      CHECK(idle_ranks > 0);
    else
      CHECK(idle_ranks == 0);
    // The same prompt served by the last rank instead gives the same logits.
    auto again = m.new_sequence();
    std::vector<std::vector<forward_item>> moved(static_cast<std::size_t>(dp));
    moved.back().push_back({&again, prompt, 0, false});
    std::vector<forward_output> outs2;
    m.forward_ranks(moved, outs2);
    CHECK(same_bits(outs2.back().last(0), outs[0].last(0), cfg.vocab_size));
  }

  // vLLM's EP size is dp x tp: every worker must compute an expert.
  CHECK_THROWS_WITH_AS(model(cfg, 2, dtype::bf16, true, 8), doctest::Contains("exceed the model's 8 experts"),
                       std::invalid_argument);
  CHECK_THROWS_AS(model(cfg, 1, dtype::bf16, false, 0), std::invalid_argument);
  CHECK_THROWS_WITH_AS(model(cfg, 1, dtype::bf16, false, 5000), doctest::Contains("at most 4096 workers"),
                       std::invalid_argument); // refused before any thread starts
  model m(cfg, 1, dtype::bf16, true, 2);
  m.set_weights(src.load(1, true));
  auto seq = m.new_sequence();
  std::vector<forward_output> outs;
  CHECK_THROWS_WITH_AS(m.forward_ranks({{{&seq, {1, 2}, 0, false}}}, outs), doctest::Contains("1 batches for 2"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(m.forward_ranks({{{&seq, {1, 2}, 0, false}}, {{&seq, {3}, 0, false}}}, outs),
                       doctest::Contains("twice"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(m.forward_ranks({{}, {{&seq, {1, 999999}, 0, false}}}, outs),
                       doctest::Contains("rank 1, item 0: token 999999"), std::invalid_argument);
  CHECK(seq.length() == 0); // refused before touching any cache
}

TEST_CASE("int8 process step: per-output-channel symmetric int8 within tolerance of bf16, Llama, Qwen3, Qwen3-MoE") {
  struct row {
    const char* what;
    model_config config;
    int tp;
    bool expert_parallel;
  };
  const row rows[] = {
      {"Llama GQA tp1", tiny_config(4, 2), 1, false},
      {"Llama tp2", tiny_config(4, 2, true), 2, false},
      {"Qwen3 tp2", tiny_qwen3_config(4, 2), 2, false},
      {"Qwen3-MoE tp2", test::tiny_moe_config(2), 2, false},
      {"Qwen3-MoE tp4 expert-parallel, fused", test::tiny_moe_config_with(6, true), 4, true},
  };
  double worst_all = 0, sum = 0;
  int runs = 0;
  for (const auto& r : rows) {
    CAPTURE(r.what);
    auto src = make_source(r.config, dtype::bf16, 13);
    model exact(r.config, r.tp, dtype::bf16, r.expert_parallel), quantized(r.config, r.tp, dtype::bf16, r.expert_parallel);
    exact.set_weights(src.load(r.tp, r.expert_parallel));
    auto set = src.load(r.tp, r.expert_parallel);
    process_weights(*set, weight_format::int8);
    // Every matrix of every worker quantized per output channel, the rest as received.
    for (const auto& w : set->workers)
      for (const auto& p : w.params()) {
        CAPTURE(p.name);
        REQUIRE(p.q.empty() == !quantized_parameter(p.name));
        if (p.q.empty())
          continue;
        const std::int64_t rows_n = p.shape[0], cols = p.shape[1];
        std::vector<float> orig(static_cast<std::size_t>(p.numel()));
        convert_to_f32(p.type, p.bytes.data(), orig.data(), orig.size());
        for (std::int64_t j = 0; j < rows_n; ++j) {
          int biggest = 0;
          const float s = p.scales[static_cast<std::size_t>(j)];
          for (std::int64_t k = 0; k < cols; ++k) {
            const auto i = static_cast<std::size_t>(j * cols + k);
            biggest = std::max(biggest, std::abs(int(p.q[i])));
            CHECK(std::abs(p.q[i] * s - orig[i]) <= 0.5f * s * 1.0001f);
          }
          CHECK(biggest == 127); // symmetric: the row's largest magnitude maps to 127
        }
      }
    quantized.set_weights(set);
    for (const auto& prompt : prompts) {
      auto a = exact.new_sequence(), b = quantized.new_sequence();
      auto x = exact.forward({{&a, prompt, 0, true}});
      auto y = quantized.forward({{&b, prompt, 0, true}});
      double worst = 0, spread = 0;
      for (std::size_t i = 0; i < x.logits.size(); ++i) {
        worst = std::max(worst, std::abs(double(x.logits[i]) - y.logits[i]));
        spread = std::max(spread, std::abs(double(x.logits[i])));
      }
      CAPTURE(worst / spread);
      CHECK(worst > 0);                // the int8 weights are what runs
      CHECK(worst < 0.08 * spread);    // and they stay close to bf16: 0.4-1% typically, 5.7% the worst seen
      worst_all = std::max(worst_all, worst / spread);
      sum += worst / spread;
      ++runs;
    }
  }
  CHECK(sum / runs < 0.015); // on average within 1.5% of the largest logit
  MESSAGE("int8 against bf16, max |dlogit| / max |logit|: mean " << sum / runs << ", worst " << worst_all);
  // Back to the weights as received: the int8 form is dropped, its memory freed.
  auto src = make_source(tiny_config(4, 2), dtype::bf16, 13);
  auto set = src.load(1);
  const auto received_bytes = set->workers[0].bytes();
  process_weights(*set, weight_format::int8);
  CHECK(set->processed);
  CHECK(set->workers[0].bytes() > received_bytes); // the int8 form is counted
  process_weights(*set, weight_format::received);
  CHECK_FALSE(set->processed);
  CHECK(set->workers[0].bytes() == received_bytes);
  for (const auto& p : set->workers[0].params())
    CHECK((p.q.empty() && p.q.capacity() == 0));
  // A row holding NaN keeps it: its scale is NaN (so are its outputs), never a silent zero.
  auto& qkv = set->workers[0].at("model.layers.0.self_attn.qkv_proj.weight");
  const std::uint16_t nan_bits = 0x7FC0; // bf16 quiet NaN
  std::memcpy(qkv.bytes.data() + 2 * qkv.shape[1] * 2, &nan_bits, 2); // row 2, column 0
  process_weights(*set, weight_format::int8);
  CHECK(std::isnan(qkv.scales[2]));
  CHECK(std::isfinite(qkv.scales[1]));
  CHECK(weight_format_of("int8") == weight_format::int8);
  CHECK(weight_format_of("received") == weight_format::received);
  CHECK_FALSE(weight_format_of("fp8"));
}

TEST_CASE("truncate, copy_prefix and clear keep decoding exact") {
  auto cfg = tiny_config(4, 2);
  auto src = make_source(cfg, dtype::f32, 9);
  model m(cfg, 2, dtype::f32);
  m.set_weights(src.load(2));
  const auto prompt = encode("shared prefix, then more");
  auto a = m.new_sequence();
  auto ref = m.forward({{&a, prompt, 0, true}});

  // A prefix-cache hit: copy 10 positions, compute the rest.
  auto b = m.new_sequence();
  b.copy_prefix(a, 10);
  CHECK(b.length() == 10);
  std::vector<std::int32_t> rest(prompt.begin() + 10, prompt.end());
  auto out = m.forward({{&b, rest, 10, false}});
  CHECK(same_bits(out.last(0), ref.last(0), out.vocab));

  // Recompute from position 5 over a cache that holds more (start cuts it).
  std::vector<std::int32_t> tail(prompt.begin() + 5, prompt.end());
  out = m.forward({{&a, tail, 5, false}});
  CHECK(same_bits(out.last(0), ref.last(0), out.vocab));

  a.truncate(3);
  CHECK(a.length() == 3);
  a.clear();
  CHECK(a.length() == 0);
  CHECK(a.bytes() == 0);
  out = m.forward({{&a, prompt, 0, false}});
  CHECK(same_bits(out.last(0), ref.last(0), out.vocab));
}

TEST_CASE("weights swap between steps and outputs carry their version") {
  auto cfg = tiny_config(4, 2);
  auto v1 = make_source(cfg, dtype::bf16, 1), v2 = make_source(cfg, dtype::bf16, 2);
  model m(cfg, 2, dtype::bf16);
  auto seq = m.new_sequence();
  CHECK_THROWS_WITH_AS(m.forward({{&seq, {1, 2}, 0, false}}), doctest::Contains("no weights"),
                       std::invalid_argument);
  auto serving = v1.load(2);
  serving->version = 1;
  m.set_weights(serving);
  auto out1 = m.forward({{&seq, {1, 2}, 0, false}});
  CHECK(out1.version == 1);

  // The staging copy is filled while version 1 serves, then swapped in.
  auto staging = m.make_weights();
  load_weights(v2.views(), *staging);
  staging->version = 2;
  auto out_still1 = m.forward({{&seq, {1, 2}, 0, false}});
  CHECK(out_still1.version == 1);
  CHECK(same_bits(out_still1.last(0), out1.last(0), out1.vocab));
  m.set_weights(staging);
  auto out2 = m.forward({{&seq, {1, 2}, 0, false}});
  CHECK(out2.version == 2);
  CHECK_FALSE(same_bits(out2.last(0), out1.last(0), out1.vocab));

  CHECK_THROWS_AS(m.set_weights(weight_set::make(cfg, 4, dtype::bf16)), std::invalid_argument);

  // A set shaped for another architecture or another set of experts is refused.
  auto moe = test::tiny_moe_config(2);
  model mm(moe, 1, dtype::bf16);
  auto fewer = moe;
  fewer.num_experts = 4;
  CHECK_THROWS_WITH_AS(mm.set_weights(weight_set::make(fewer, 1, dtype::bf16)),
                       doctest::Contains("shaped for another model"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(mm.set_weights(weight_set::make(tiny_qwen3_config(4, 2), 1, dtype::bf16)),
                       doctest::Contains("shaped for another model"), std::invalid_argument);
  mm.set_weights(test::make_source(moe, dtype::bf16, 1).load(1)); // its own shape is taken
}

TEST_CASE("forward rejects bad batches before touching any cache") {
  auto cfg = tiny_config(4, 2);
  model m(cfg, 1, dtype::bf16);
  m.set_weights(make_source(cfg, dtype::bf16, 1).load(1));
  auto seq = m.new_sequence();
  m.forward({{&seq, {1, 2, 3}, 0, false}});
  model other(tiny_config(4, 4), 1, dtype::bf16);
  auto foreign = other.new_sequence();
  struct row {
    const char* what;
    std::vector<forward_item> batch;
    const char* expect;
  };
  const row rows[] = {
      {"bad token", {{&seq, {1, 301}, 3, false}}, "outside the vocabulary"},
      {"negative token", {{&seq, {-1}, 3, false}}, "outside the vocabulary"},
      {"start past the cache", {{&seq, {1}, 4, false}}, "outside the cache"},
      {"no tokens", {{&seq, {}, 3, false}}, "no tokens"},
      {"too long", {{&seq, std::vector<std::int32_t>(254, 1), 3, false}}, "max_position_embeddings"},
      {"twice", {{&seq, {1}, 3, false}, {&seq, {1}, 3, false}}, "twice"},
      {"foreign cache", {{&foreign, {1}, 0, false}}, "another model"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.what);
    CHECK_THROWS_WITH_AS(m.forward(r.batch), doctest::Contains(r.expect), std::invalid_argument);
    CHECK(seq.length() == 3);
  }
  CHECK_THROWS_AS(model(tiny_config(4, 2), 3, dtype::bf16), std::invalid_argument);
}

TEST_CASE("weights stored as they arrive serve bit for bit what their fp32 copy serves") {
  auto cfg = tiny_config(4, 2);
  for (dtype type : {dtype::bf16, dtype::f16})
    for (int tp : {1, 2}) {
      CAPTURE(short_name(type));
      CAPTURE(tp);
      auto src = make_source(cfg, type, 17);
      model narrow(cfg, tp, type), wide(cfg, tp, dtype::f32);
      auto stored = narrow.make_weights();
      auto widened = wide.make_weights();
      load_weights(src.views(), *stored);
      load_weights(src.views(), *widened);
      CHECK(stored->type() == type);
      CHECK(widened->type() == dtype::f32);
      CHECK(2 * stored->workers[0].bytes() == widened->workers[0].bytes()); // half the memory
      narrow.set_weights(stored);
      wide.set_weights(widened);
      auto a = generate(narrow, prompts, 12), b = generate(wide, prompts, 12);
      CHECK(a.tokens == b.tokens);
      REQUIRE(a.logits.size() == b.logits.size());
      CHECK(same_bits(a.logits.data(), b.logits.data(), static_cast<std::int64_t>(a.logits.size())));
    }
}

TEST_CASE("the engine never rounds a weight: narrowing stores are refused") {
  auto cfg = tiny_config(4, 2);
  auto f32_src = make_source(cfg, dtype::f32, 1), f16_src = make_source(cfg, dtype::f16, 1);
  auto bf16_set = weight_set::make(cfg, 1, dtype::bf16);
  CHECK_THROWS_WITH_AS(load_weights(f32_src.views(), *bf16_set), doctest::Contains("would round"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(load_weights(f16_src.views(), *bf16_set), doctest::Contains("f16 elements into a parameter stored as bf16"),
                       std::invalid_argument);
}

TEST_CASE("a strided slice is gathered straight into the parameter, bounds checked") {
  // A [2, 4] bf16 tensor; its column slice [:, 1:3] is strided.
  std::vector<std::uint16_t> source{10, 11, 12, 13, 20, 21, 22, 23};
  auto columns = real_weight("w", dtype::bf16, {2, 4}, source.data())->narrow(1, 1, 2);
  parameter p{"p", {3, 2}, dtype::bf16, std::vector<unsigned char>(12, 0), {}, {}};
  columns->copy_into(p, 2); // rows 1 and 2 of p
  std::vector<std::uint16_t> got(6);
  std::memcpy(got.data(), p.bytes.data(), 12);
  CHECK(got == std::vector<std::uint16_t>{0, 0, 11, 12, 21, 22});
  CHECK_THROWS_AS(columns->copy_into(p, 3), std::out_of_range); // elements [3, 7) of 6
  parameter shape_only{"s", {2, 2}, dtype::bf16, {}, {}, {}};
  CHECK_THROWS_AS(columns->copy_into(shape_only, 0), std::logic_error);
  parameter wide{"f", {2, 2}, dtype::f32, std::vector<unsigned char>(16, 0), {}, {}};
  columns->copy_into(wide, 0); // converted through the thread's staging instead
  float f[4];
  std::memcpy(f, wide.bytes.data(), 16);
  CHECK(f[0] == bf16_to_f32(11));
  CHECK(f[3] == bf16_to_f32(22));
}
