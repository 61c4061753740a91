#include "runtime/engine/shard.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace rlsync::engine {

namespace {

// vLLM's linear expert placement: E / ep experts per worker, the first
// E % ep workers one more.
std::int64_t first_expert(std::int64_t experts, int ep, int worker) {
  const std::int64_t base = experts / ep, extra = experts % ep;
  return worker * base + std::min<std::int64_t>(worker, extra);
}

} // namespace

shard_spec shard_spec::make(const model_config& c, int tp, int worker, bool expert_parallel) {
  return make(c, tp, worker, expert_parallel, 1, 0);
}

shard_spec shard_spec::make(const model_config& c, int tp, int worker, bool expert_parallel, int dp, int dp_rank) {
  std::string problems;
  for (auto& e : validate(c))
    problems += "\n  " + e;
  for (auto& e : validate_tp(c, tp, expert_parallel))
    problems += "\n  tp: " + e;
  if (problems.empty() && (worker < 0 || worker >= tp))
    problems = "\n  worker: must be in [0, " + std::to_string(tp) + "), got " + std::to_string(worker);
  if (problems.empty() && dp < 1)
    problems = "\n  dp: must be positive, got " + std::to_string(dp);
  if (problems.empty() && (dp_rank < 0 || dp_rank >= dp))
    problems = "\n  dp_rank: must be in [0, " + std::to_string(dp) + "), got " + std::to_string(dp_rank);
  if (problems.empty() && dp > 1 && !expert_parallel)
    problems = "\n  dp: expert placement over data-parallel ranks needs expert parallelism";
  if (problems.empty())
    for (auto& e : validate_dp(c, tp, dp, expert_parallel))
      problems += "\n  dp: " + e;
  if (!problems.empty())
    throw std::invalid_argument("engine shard: model cannot be sharded:" + problems);

  shard_spec s;
  s.config = c;
  s.tp = tp;
  s.worker = worker;
  s.expert_parallel = expert_parallel;
  s.dp = dp;
  s.dp_rank = dp_rank;
  s.head_dim = c.head_dim();
  s.heads = c.num_attention_heads / tp;
  s.head_begin = worker * s.heads;
  if (c.num_key_value_heads >= tp) {
    s.kv_heads = c.num_key_value_heads / tp;
    s.kv_begin = worker * s.kv_heads;
  } else {
    // Replicated: tp is a multiple of kv, and worker w's q heads all map to
    // kv head w * kv / tp (vLLM's rule).
    s.kv_heads = 1;
    s.kv_begin = std::int64_t(worker) * c.num_key_value_heads / tp;
  }
  s.inter = c.intermediate_size / tp;
  s.inter_begin = worker * s.inter;
  if (expert_parallel) {
    s.moe_inter = c.moe_intermediate_size;
    const int ep = s.ep_size(), rank = s.ep_rank();
    s.expert_begin = first_expert(c.num_experts, ep, rank);
    s.experts = first_expert(c.num_experts, ep, rank + 1) - s.expert_begin;
  } else {
    s.moe_inter = c.moe_intermediate_size / tp;
    s.moe_inter_begin = worker * s.moe_inter;
    s.experts = c.num_experts;
  }
  std::int64_t per = (c.vocab_size + tp - 1) / tp;
  s.vocab_begin = std::min<std::int64_t>(c.vocab_size, worker * per);
  s.vocab_end = std::min<std::int64_t>(c.vocab_size, (worker + 1) * per);
  return s;
}

int expert_owner(std::int64_t e, std::int64_t experts, int ep) {
  int w = 0;
  while (w + 1 < ep && first_expert(experts, ep, w + 1) <= e)
    ++w;
  return w;
}

std::int64_t reduce_chunks(std::int64_t units, int tp) {
  std::int64_t c = 8;
  while (units % c != 0)
    c /= 2;
  return c % tp == 0 ? c : tp;
}

} // namespace rlsync::engine
