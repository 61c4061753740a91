#pragma once
// A decoder-only transformer with the numerics of Hugging Face's
// LlamaForCausalLM, Qwen3ForCausalLM and Qwen3MoeForCausalLM (fp32 arithmetic; weights stored in the dtype they arrive
// in and widened exactly inside the kernels), run by `tp` tensor-parallel workers that each hold
// only their shard, as vLLM shards it:
//
//   embed (vocab-parallel rows, gathered)
//   per layer:  h = rmsnorm(x)            replicated
//               qkv = h Wqkv^T            column-parallel: local q/k/v heads
//               (Qwen3: rmsnorm each q and k head, replicated head norms)
//               rope(q, k); cache k, v; causal GQA attention per local head
//               x += all_reduce(att Wo^T) row-parallel
//               h = rmsnorm(x)
//               gu = h Wgate_up^T         column-parallel
//               x += all_reduce(silu(g) * u Wdown^T)   row-parallel
//               (Qwen3-MoE sparse layers: route each token to its top-k
//               experts, each sliced as this MLP or, with expert
//               parallelism, held whole by one worker; weighted sum, fixed order)
//   logits = rmsnorm(x) Wlm^T             vocab-parallel columns, gathered
//
// The all-reduce forms partial sums per fixed chunk of the reduced dim
// (shard.hpp's reduce_chunks) and adds them in global chunk order, and every
// dot product runs the same operations whichever worker computes it
// (kernels.hpp): so greedy outputs are bit-identical for tp 1, 2 and 4.
//
// One forward() call is one scheduler step over a batch of sequences, each
// contributing any number of new tokens (a prefill chunk or one decode
// token). Weights are a weight_set swapped atomically between steps.
//
// Data parallelism (vLLM's DP attention): `dp` ranks of tp workers each, in
// one pool, step in lockstep over one batch per rank (forward_ranks). Each
// rank's attention, dense MLP and vocabulary run on its own tp workers over
// its own tokens; the ranks share one weight set. With expert parallelism
// the experts are computed by all dp x tp workers (EP size dp x tp, vLLM's
// linear placement): worker (d, t) runs its experts over the tokens of every
// rank routed to them. Outputs do not depend on dp nor on the rank.
#include "runtime/config/model_config.hpp"
#include "runtime/engine/kv_cache.hpp"
#include "runtime/engine/weights.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace rlsync::engine {

class device_backend;

/// One sequence's part of a step.
struct forward_item {
  kv_sequence* seq = nullptr;
  std::vector<std::int32_t> tokens; ///< new tokens, at positions start, start + 1, ...
  /// Position of tokens[0]. The cache is first cut to `start` positions
  /// (start <= seq->length()), so a recompute is start = 0.
  std::int64_t start = 0;
  bool all_logits = false; ///< logits of every new position, else the last only
};

/// What a step produced.
struct forward_output {
  std::int64_t vocab = 0;
  std::vector<float> logits;           ///< rows x vocab
  std::vector<std::int64_t> first_row; ///< per item, plus one past the end
  std::uint64_t version = 0;           ///< the weight version that produced them

  /// Logits of row i of item `item` (i = 0 is its first returned position).
  const float* row(std::size_t item, std::int64_t i) const {
    return logits.data() + (first_row[item] + i) * vocab;
  }
  /// Logits of the item's last position.
  const float* last(std::size_t item) const { return logits.data() + (first_row[item + 1] - 1) * vocab; }
};

class model {
public:
  /// Throws std::invalid_argument when `c` cannot be sharded `tp` ways.
  /// make_weights() allocates `weights_type` (what the checkpoint or the
  /// trainer sends); set_weights() accepts any dtype.
  /// `expert_parallel`: experts placed whole over the workers (shard.hpp).
  /// `dp` data-parallel ranks (dp x tp workers); with expert parallelism the
  /// experts must number at least dp x tp (std::invalid_argument).
  model(const model_config& c, int tp, dtype weights_type, bool expert_parallel = false, int dp = 1);
  ~model();
  model(const model&) = delete;
  model& operator=(const model&) = delete;

  const model_config& config() const;
  int tp() const;
  int dp() const;
  bool expert_parallel() const;
  dtype weights_type() const;

  /// A zeroed weight set shaped for this model: fill it (loader.hpp), then
  /// set_weights(). Several may exist at once (serving + staging).
  std::shared_ptr<weight_set> make_weights() const;
  /// Serves `w` from the next step on (a step in flight keeps its set).
  /// Throws std::invalid_argument when `w` is shaped for another model.
  void set_weights(std::shared_ptr<const weight_set> w);
  /// The set served now; nullptr before the first set_weights() and after
  /// clear_weights().
  std::shared_ptr<const weight_set> weights() const;
  /// Serves no weights (their memory goes with the last holder).
  void clear_weights();
  /// Runs every matrix product on `device` (device_gemm.hpp) from the next
  /// set_weights() on, which then also copies the set there; null: the
  /// CPU. std::logic_error once weights are served.
  void set_device(std::shared_ptr<device_backend> device);
  /// The device products run on, or null.
  const device_backend* device() const;

  /// Fault injection (drills): worker `worker` (tp worker worker % tp of
  /// rank worker / tp) dies (its thread ends); every later forward() throws
  /// worker_died.
  void kill_worker(int worker);
  /// The worker that died (rank * tp + tp worker), or -1.
  int dead_worker() const;

  /// An empty KV cache for this model.
  kv_sequence new_sequence() const;

  /// Runs one step. Validates everything first (std::invalid_argument: no
  /// weights, a bad token, a start past the cache, a position beyond
  /// max_position_embeddings, a sequence twice in the batch, a cache of
  /// another shape), then cuts each cache to its start and appends the new
  /// positions. Steps are serialised: concurrent calls wait for each other.
  /// Scratch memory grows with the step's token count T (about
  /// (8 + 8) * T * hidden shared floats for the all-reduce partials, plus
  /// each worker's activations), so the scheduler bounds T by chunking
  /// long prefills.
  void forward(const std::vector<forward_item>& batch, forward_output& out);
  forward_output forward(const std::vector<forward_item>& batch);
  /// One lockstep step of every data-parallel rank: batches[d] is rank d's
  /// batch (possibly empty), outs[d] its output. Validated as forward()
  /// (a sequence may appear once in the whole step); std::invalid_argument
  /// when there are not dp batches. forward() is this with `batch` on rank 0.
  void forward_ranks(const std::vector<std::vector<forward_item>>& batches, std::vector<forward_output>& outs);
  /// Per worker (rank * tp + tp worker): the (token, expert) rows it has
  /// run through experts since construction — where experts are computed.
  std::vector<std::uint64_t> expert_rows() const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace rlsync::engine
