#pragma once
// What one tensor-parallel worker of an engine holds, as vLLM splits a Llama:
// q heads and the MLP's intermediate dim are split evenly; kv heads are split
// when there are at least tp of them, else each worker holds one replicated
// kv head; the vocabulary (embedding and lm_head rows) is split in
// ceil(vocab / tp) slices, the last one possibly shorter.
//
// A mixture-of-experts layer is sliced the same way by default: every worker
// holds its tp slice of every expert's intermediate dim. With expert
// parallelism (vLLM's --enable-expert-parallel; EP size = tp here) each
// worker instead holds whole experts, placed as vLLM's linear placement
// does: E / tp each, the first E % tp workers one more, in index order.
// With data parallelism as well (vLLM's DP attention + EP experts: EP size =
// tp x dp) the experts are placed the same way over all dp x tp workers of the
// engine, worker w of dp rank d being EP rank d * tp + w; attention, the
// dense MLP and the vocabulary stay split by tp alone. `rlsync plan` records
// such layouts. The built-in engine holds its experts with dp = 1 placement
// (its ranks share one copy in one process) and computes them with this one,
// over all dp x tp workers (model.hpp).
#include "runtime/config/model_config.hpp"

#include <cstdint>

namespace rlsync::engine {

struct shard_spec {
  model_config config;
  int tp = 1;
  int worker = 0;
  bool expert_parallel = false;
  int dp = 1;      ///< data-parallel ranks the experts are placed over (with expert_parallel)
  int dp_rank = 0; ///< this worker's rank among them

  std::int64_t head_dim = 0;
  std::int64_t heads = 0;       ///< local q heads: num_attention_heads / tp
  std::int64_t head_begin = 0;  ///< first global q head
  std::int64_t kv_heads = 0;    ///< local kv heads (1 when replicated)
  std::int64_t kv_begin = 0;    ///< first global kv head
  std::int64_t inter = 0;       ///< local intermediate size
  std::int64_t inter_begin = 0;
  std::int64_t moe_inter = 0;       ///< qwen3_moe: local slice of every local expert's intermediate size
  std::int64_t moe_inter_begin = 0; ///< (the whole of it with expert parallelism)
  std::int64_t expert_begin = 0;    ///< qwen3_moe: local experts [expert_begin, expert_begin + experts)
  std::int64_t experts = 0;         ///< (all of them without expert parallelism)
  std::int64_t vocab_begin = 0; ///< local vocabulary rows [vocab_begin, vocab_end)
  std::int64_t vocab_end = 0;

  /// Throws std::invalid_argument when `c` fails validate() or validate_tp(),
  /// or when worker is outside [0, tp).
  static shard_spec make(const model_config& c, int tp, int worker, bool expert_parallel = false);
  /// The same with experts placed over dp x tp workers (EP rank dp_rank * tp
  /// + worker). Throws std::invalid_argument as above, when dp_rank is outside
  /// [0, dp), when dp > 1 without expert parallelism, or when the experts are
  /// fewer than dp x tp.
  static shard_spec make(const model_config& c, int tp, int worker, bool expert_parallel, int dp, int dp_rank);

  /// Expert-parallel group: size and this worker's rank in it.
  int ep_size() const { return expert_parallel ? tp * dp : 1; }
  int ep_rank() const { return expert_parallel ? dp_rank * tp + worker : 0; }

  std::int64_t vocab() const { return vocab_end - vocab_begin; }
  bool holds_expert(std::int64_t e) const { return e >= expert_begin && e < expert_begin + experts; }
  /// Rows of the fused qkv projection: (heads + 2 * kv_heads) * head_dim.
  std::int64_t qkv_rows() const { return (heads + 2 * kv_heads) * head_dim; }
};

/// The number of fixed-size chunks a row-parallel input dim of `units`
/// (heads for o_proj, intermediate columns for down_proj) is cut into for the
/// deterministic all-reduce: partial sums are formed per chunk and added in
/// global chunk order, so the result does not depend on tp as long as tp
/// divides the count. The count depends on `units` alone (the largest of
/// 8, 4, 2, 1 dividing it) unless tp does not divide that, in which case it
/// is tp itself (still correct, but then not bit-identical to other tp).
std::int64_t reduce_chunks(std::int64_t units, int tp);

/// The worker holding expert `e` of `experts` placed over `ep` workers
/// (shard_spec's placement).
int expert_owner(std::int64_t e, std::int64_t experts, int ep);

} // namespace rlsync::engine
