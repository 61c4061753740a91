// rlsync bench engine on a tiny model: every figure is measured (positive),
// per tp and batch asked for, and bad shapes are refused before any work.
#include "actors/jobs/bench_engine.hpp"

#include <doctest/doctest.h>

#include <sstream>
#include <stdexcept>

using namespace rlsync;
using namespace rlsync::jobs;

namespace {

bench_engine_options tiny() {
  bench_engine_options o;
  o.model.num_hidden_layers = 2;
  o.model.hidden_size = 64;
  o.model.num_attention_heads = 4;
  o.model.num_key_value_heads = 2;
  o.model.intermediate_size = 96;
  o.model.vocab_size = 320;
  o.model.max_position_embeddings = 256;
  o.tps = {1, 2};
  o.batches = {1, 3};
  o.steps = 2;
  o.prompt_tokens = 8;
  return o;
}

} // namespace

TEST_CASE("bench engine: one case per tp with every figure measured") {
  std::ostringstream progress;
  auto r = run_bench_engine(tiny(), &progress);
  CHECK(r.parameters > 0);
  CHECK(r.bytes == 2 * r.parameters); // bf16
  REQUIRE(r.cases.size() == 2);
  for (auto& k : r.cases) {
    CAPTURE(k.tp);
    CHECK(k.full_update_s > 0);
    CHECK(k.pack_s > 0);
    CHECK(k.sharded_cold_s >= k.allocating_s);
    CHECK(k.sharded_warm_s > 0);
    CHECK(k.prefill_tokens_per_s > 0);
    REQUIRE(k.decode.size() == 2);
    CHECK(k.decode[0].batch == 1);
    CHECK(k.decode[1].batch == 3);
    for (auto& d : k.decode)
      CHECK(d.tokens_per_s > 0);
  }
  // Each worker of tp 2 receives about half of what the single worker does
  // (the embeddings, norms and head split or replicate, so not exactly).
  CHECK(r.cases[1].bytes_per_worker < r.cases[0].bytes_per_worker);
  CHECK(r.cases[0].bytes_per_worker == r.bytes);
  auto text = progress.str();
  CHECK(text.find("model: 2 layers, hidden 64") == 0);
  CHECK(text.find("tp 2  decode batch   3:") != std::string::npos);
}

TEST_CASE("bench engine: a tp the model cannot shard and an empty prompt are refused up front") {
  auto o = tiny();
  o.tps = {3}; // 4 heads
  CHECK_THROWS_AS(run_bench_engine(o), std::invalid_argument);
  o = tiny();
  o.prompt_tokens = 0;
  CHECK_THROWS_AS(run_bench_engine(o), std::invalid_argument);
}
