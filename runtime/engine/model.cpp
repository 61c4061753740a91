#include "runtime/engine/model.hpp"

#include "runtime/engine/device_gemm.hpp"
#include "runtime/engine/kernels.hpp"
#include "runtime/engine/worker_pool.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

namespace rlsync::engine {

namespace {

// One token of the step: which item it belongs to and its position.
struct token_slot {
  std::size_t item;
  std::int64_t position;
};

// One row of an expert's dispatch: slot t * k + j of data-parallel rank
// `rank`'s step, whose expert input (the normalised token) is at `in`.
struct expert_row {
  int rank;
  std::int64_t slot;
  const float* in;
};

// A worker's private scratch, reused across steps (grown, never shrunk).
struct workspace {
  std::vector<float> x;      // [T, D] residual stream (every worker holds all of it)
  std::vector<float> h;      // [T, D] normalised input; also the all-reduce accumulator
  std::vector<float> qkv;    // [T, qkv_rows]
  std::vector<float> att;    // [T, heads * head_dim]
  std::vector<float> gu;     // [T, 2 * inter]
  std::vector<float> act;    // [T, inter]
  std::vector<float> scores; // [positions]
  std::vector<float> final;  // [logit rows, D]
  std::vector<float> norm;   // [D] the norm weights in use, widened
  std::vector<float> q_norm, k_norm; // [head_dim] Qwen3's head norms, widened
  // Qwen3-MoE: each token's experts (ascending) and their weights, [T, k];
  // router logits [T, experts]; an expert's tokens gathered, and its activations.
  std::vector<std::int32_t> expert_order; // [experts] the router's ranking of one token
  std::vector<std::int32_t> chosen;
  std::vector<float> chosen_weight;
  std::vector<float> router_logits;
  std::vector<expert_row> expert_rows; // the rows gathered for one expert
  std::vector<float> expert_in, expert_gu, expert_act;
  std::vector<float> moe_sum, moe_expert; // [D] the reduction's accumulators
  std::uint64_t expert_rows_run = 0; // (token, expert) rows this worker has computed, ever
};

// At least one element, so that data() is never null (a rank with no
// tokens in a step still passes its buffers around).
template <class T>
void grow(std::vector<T>& v, std::int64_t n) {
  if (static_cast<std::int64_t>(v.size()) < std::max<std::int64_t>(n, 1))
    v.resize(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
}

// HF LlamaRMSNorm: w * (x * rsqrt(mean(x^2) + eps)), fp32.
void rms_norm(const float* x, const float* w, float* out, std::int64_t d, float eps) {
  const float mean = kernels::dot(x, x, d) / static_cast<float>(d);
  const float r = 1.0f / std::sqrt(mean + eps);
  for (std::int64_t i = 0; i < d; ++i)
    out[i] = w[i] * (x[i] * r);
}

// HF rotate-half rotary embedding of one head in place: the first and second
// halves pair up, cos/sin are the same for i and i + d/2.
void rope(float* v, const float* cos, const float* sin, std::int64_t half) {
  for (std::int64_t i = 0; i < half; ++i) {
    const float a = v[i], b = v[i + half];
    v[i] = a * cos[i] - b * sin[i];
    v[i + half] = b * cos[i] + a * sin[i];
  }
}

// out = ((p[0] + p[1]) + p[2]) + ... over `chunks` partials of n floats,
// `stride` floats apart, in chunk order: the tp-independent all-reduce.
void sum_chunks(float* out, const float* partials, std::int64_t chunks, std::int64_t stride, std::int64_t n) {
  std::memcpy(out, partials, static_cast<std::size_t>(n) * sizeof(float));
  for (std::int64_t c = 1; c < chunks; ++c) {
    const float* p = partials + c * stride;
    for (std::int64_t i = 0; i < n; ++i)
      out[i] += p[i];
  }
}

// x += the chunk-ordered sum of `chunks` contiguous partials of n floats.
// `tmp` holds n floats.
void reduce_into(float* x, const float* partials, std::int64_t chunks, std::int64_t n, float* tmp) {
  sum_chunks(tmp, partials, chunks, n, n);
  for (std::int64_t i = 0; i < n; ++i)
    x[i] += tmp[i];
}

// Validates the sharding before anything is started (the pool included);
// returns the pool's size, dp x tp.
int checked_workers(const model_config& c, int tp, bool expert_parallel, int dp) {
  // What this engine does not compute would be run as plain RoPE, SiLU and
  // full attention: outputs that differ from the model's.
  if (!c.not_computed.empty())
    throw std::invalid_argument("config.json: " + c.not_computed.front());
  shard_spec::make(c, tp, 0, expert_parallel);
  // A bound on threads, not a model property: the topology allows 64 x 64.
  if (dp < 1 || std::int64_t(dp) * tp > 4096)
    throw std::invalid_argument("engine: dp must be positive with dp x tp at most 4096 workers, got dp "
                                + std::to_string(dp) + " x tp " + std::to_string(tp));
  if (expert_parallel && dp > 1)
    shard_spec::make(c, tp, 0, expert_parallel, dp, 0); // experts placed over dp x tp: enough of them
  return dp * tp;
}

} // namespace

struct model::impl {
  model_config cfg;
  int tp;
  int dp;
  bool expert_parallel;
  dtype weights_type;
  worker_pool pool; // dp x tp workers: worker g is tp worker g % tp of rank g / tp
  std::int64_t o_chunks;    // all-reduce chunks of o_proj's input (heads)
  std::int64_t down_chunks; // ... of down_proj's input (intermediate)
  std::int64_t moe_chunks;  // ... of each expert's down_proj input (moe_intermediate_size)
  // With expert parallelism: worker g computes experts [compute_begin[g],
  // compute_begin[g] + compute_count[g]) for every rank's tokens (EP rank g
  // of dp x tp, vLLM's linear placement).
  std::vector<std::int64_t> compute_begin, compute_count;

  mutable std::mutex weights_mutex;
  std::shared_ptr<const weight_set> weights;
  std::shared_ptr<device_backend> device;       // null: every product on the CPU
  std::shared_ptr<const device_weights> mirror; // the device's copy of `weights`

  // One data-parallel rank's part of a step, and the scratch its tp workers
  // share (grown, never shrunk).
  struct rank_step {
    const std::vector<forward_item>* batch = nullptr;
    forward_output* out = nullptr;
    std::vector<token_slot> tokens;
    std::vector<std::int32_t> ids;
    std::vector<std::int64_t> logit_tokens; // step-token index of each logits row
    std::vector<float> x0;        // [T, D] embedding gather
    std::vector<float> part_o;    // [o_chunks, T, D]
    std::vector<float> part_down; // [down_chunks, T, D]
    std::vector<float> part_moe;  // [moe_chunks, T * experts_per_tok, D]
    std::int64_t size() const { return static_cast<std::int64_t>(tokens.size()); }
  };

  std::mutex step_mutex; // one step at a time; guards everything below
  std::vector<float> rope_cos, rope_sin; // [positions, head_dim / 2]
  std::vector<float> inv_freq;
  std::vector<rank_step> ranks; // dp
  std::vector<workspace> spaces; // dp x tp
  const device_weights* step_mirror = nullptr; // the device copy this step multiplies by, or null

  // Every product of the forward pass: on the device serving the step's
  // weights, else on the CPU.
  void matmul_nt(const float* a, std::int64_t lda, kernels::typed_ptr w, std::int64_t ldw, float* out,
                 std::int64_t ldo, std::int64_t rows, std::int64_t n, std::int64_t depth) const {
    if (step_mirror)
      step_mirror->matmul_nt(a, lda, w, ldw, out, ldo, rows, n, depth);
    else
      kernels::matmul_nt(a, lda, w, ldw, out, ldo, rows, n, depth);
  }

  impl(const model_config& c, int tp_, dtype type, bool ep, int dp_)
      : cfg(c), tp(tp_), dp(dp_), expert_parallel(ep), weights_type(type), pool(checked_workers(c, tp_, ep, dp_)),
        o_chunks(reduce_chunks(c.num_attention_heads, tp_)),
        down_chunks(reduce_chunks(c.intermediate_size, tp_)),
        // Whole experts: chunked as at tp 1, whatever tp is.
        moe_chunks(c.arch == model_arch::qwen3_moe ? reduce_chunks(c.moe_intermediate_size, ep ? 1 : tp_) : 0),
        ranks(static_cast<std::size_t>(dp_)), spaces(static_cast<std::size_t>(dp_ * tp_)) {
    if (ep)
      for (int g = 0; g < dp * tp; ++g) {
        const auto s = shard_spec::make(c, tp, g % tp, true, dp, g / tp);
        compute_begin.push_back(s.expert_begin);
        compute_count.push_back(s.experts);
      }
    // HF computes inv_freq = 1 / theta^(2i/d) and freqs = position * inv_freq
    // in fp32; so do we.
    const std::int64_t hd = cfg.head_dim();
    for (std::int64_t i = 0; i < hd / 2; ++i)
      inv_freq.push_back(1.0f / std::pow(static_cast<float>(cfg.rope_theta),
                                         static_cast<float>(2 * i) / static_cast<float>(hd)));
  }

  void ensure_rope(std::int64_t positions) {
    const std::int64_t half = cfg.head_dim() / 2;
    std::int64_t have = static_cast<std::int64_t>(rope_cos.size()) / half;
    if (have >= positions)
      return;
    positions = std::max(positions, std::min(cfg.max_position_embeddings, 2 * have));
    rope_cos.resize(static_cast<std::size_t>(positions * half));
    rope_sin.resize(rope_cos.size());
    for (std::int64_t p = have; p < positions; ++p)
      for (std::int64_t i = 0; i < half; ++i) {
        const float f = static_cast<float>(p) * inv_freq[static_cast<std::size_t>(i)];
        rope_cos[static_cast<std::size_t>(p * half + i)] = std::cos(f);
        rope_sin[static_cast<std::size_t>(p * half + i)] = std::sin(f);
      }
  }

  void validate(const std::vector<std::vector<forward_item>>& batches) const {
    std::vector<const kv_sequence*> seqs;
    for (std::size_t d = 0; d < batches.size(); ++d)
      for (std::size_t i = 0; i < batches[d].size(); ++i) {
        const auto& it = batches[d][i];
        auto fail = [&](const std::string& what) {
          throw std::invalid_argument("engine forward: " + (dp > 1 ? "rank " + std::to_string(d) + ", " : "")
                                      + "item " + std::to_string(i) + ": " + what);
        };
        if (!it.seq)
          fail("no sequence");
        if (!it.seq->compatible(cfg, tp))
          fail("KV cache shaped for another model");
        if (it.tokens.empty())
          fail("no tokens");
        if (it.start < 0 || it.start > it.seq->length())
          fail("start " + std::to_string(it.start) + " outside the cache (length "
               + std::to_string(it.seq->length()) + ")");
        const auto end = it.start + static_cast<std::int64_t>(it.tokens.size());
        if (end > cfg.max_position_embeddings)
          fail("positions up to " + std::to_string(end) + " exceed max_position_embeddings ("
               + std::to_string(cfg.max_position_embeddings) + ")");
        for (auto t : it.tokens)
          if (t < 0 || t >= cfg.vocab_size)
            fail("token " + std::to_string(t) + " outside the vocabulary [0, " + std::to_string(cfg.vocab_size)
                 + ")");
        seqs.push_back(it.seq);
      }
    std::sort(seqs.begin(), seqs.end());
    if (std::adjacent_find(seqs.begin(), seqs.end()) != seqs.end())
      throw std::invalid_argument("engine forward: a sequence appears twice in one step");
  }

  void step(const std::vector<std::vector<forward_item>>& batches, std::vector<forward_output>& outs);
  void run_worker(int g, const weight_set& set);
  void moe_mlp(int g, const weight_set& set, std::int64_t l, const layer_weights& L, workspace& ws, float* x,
               const float* h);
  void run_expert(workspace& ws, const parameter& gate_up, const parameter& down, std::int64_t mi,
                  std::int64_t first_chunk, std::int64_t chunks);
};

void model::impl::step(const std::vector<std::vector<forward_item>>& batches, std::vector<forward_output>& outs) {
  if (batches.size() != static_cast<std::size_t>(dp))
    throw std::invalid_argument("engine forward: " + std::to_string(batches.size()) + " batches for "
                                + std::to_string(dp) + " data-parallel ranks");
  std::shared_ptr<const weight_set> ws;
  std::shared_ptr<const device_weights> held; // kept for the step, as `ws` is
  {
    std::lock_guard<std::mutex> lock(weights_mutex);
    ws = weights;
    held = mirror;
  }
  if (!ws)
    throw std::invalid_argument("engine forward: no weights loaded");
  validate(batches);

  outs.resize(batches.size());
  const std::int64_t D = cfg.hidden_size;
  std::int64_t max_position = 0, total = 0;
  for (std::size_t d = 0; d < batches.size(); ++d) {
    rank_step& r = ranks[d];
    forward_output& out = outs[d];
    r.batch = &batches[d];
    r.out = &out;
    r.tokens.clear();
    r.ids.clear();
    r.logit_tokens.clear();
    out.first_row.assign(1, 0);
    for (std::size_t i = 0; i < batches[d].size(); ++i) {
      const auto& it = batches[d][i];
      it.seq->truncate(it.start);
      const auto n = static_cast<std::int64_t>(it.tokens.size());
      for (std::int64_t j = 0; j < n; ++j) {
        if (it.all_logits || j == n - 1)
          r.logit_tokens.push_back(r.size());
        r.tokens.push_back({i, it.start + j});
        r.ids.push_back(it.tokens[static_cast<std::size_t>(j)]);
      }
      max_position = std::max(max_position, it.start + n);
      out.first_row.push_back(static_cast<std::int64_t>(r.logit_tokens.size()));
    }
    const std::int64_t T = r.size();
    total += T;
    out.vocab = cfg.vocab_size;
    out.version = ws->version;
    out.logits.assign(static_cast<std::size_t>(static_cast<std::int64_t>(r.logit_tokens.size()) * cfg.vocab_size),
                      0.0f);
    grow(r.x0, T * D);
    grow(r.part_o, o_chunks * T * D);
    grow(r.part_down, down_chunks * T * D);
    if (moe_chunks > 0)
      grow(r.part_moe, moe_chunks * T * cfg.num_experts_per_tok * D);
  }
  if (total == 0)
    return;
  ensure_rope(max_position);

  step_mirror = held.get();
  struct forget {
    const device_weights*& p;
    ~forget() { p = nullptr; }
  } forget_mirror{step_mirror};
  pool.run([&](int g) { run_worker(g, *ws); });
  for (const auto& batch : batches)
    for (const auto& it : batch)
      it.seq->set_length(it.start + static_cast<std::int64_t>(it.tokens.size()));
}

// Worker g: tp worker t = g % tp of rank d = g / tp, over rank d's tokens.
// Every worker of every rank crosses the same barriers (a rank with no
// tokens runs an empty step), so the ranks move in lockstep.
void model::impl::run_worker(int g, const weight_set& set) {
  const int d = g / tp, w = g % tp;
  rank_step& rs = ranks[static_cast<std::size_t>(d)];
  const std::vector<forward_item>& batch = *rs.batch;
  const std::vector<token_slot>& tokens = rs.tokens;
  const worker_weights& W = set.workers[static_cast<std::size_t>(w)];
  const shard_spec& s = W.shard();
  workspace& ws = spaces[static_cast<std::size_t>(g)];
  const std::int64_t T = rs.size();
  const auto R = static_cast<std::int64_t>(rs.logit_tokens.size());
  const std::int64_t D = cfg.hidden_size, hd = s.head_dim, half = hd / 2;
  const std::int64_t q_width = s.heads * hd, kv_width = s.kv_heads * hd, qkv_rows = s.qkv_rows();
  const std::int64_t group = cfg.num_attention_heads / cfg.num_key_value_heads; // q heads per kv head
  const auto eps = static_cast<float>(cfg.rms_norm_eps);
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd))); // HF: head_dim ** -0.5
  const std::int64_t max_positions = static_cast<std::int64_t>(rope_cos.size()) / half;

  grow(ws.x, T * D);
  grow(ws.h, T * D);
  grow(ws.qkv, T * qkv_rows);
  grow(ws.att, T * q_width);
  grow(ws.gu, T * 2 * s.inter);
  grow(ws.act, T * s.inter);
  grow(ws.scores, max_positions);
  grow(ws.final, R * D);
  grow(ws.norm, D);
  grow(ws.q_norm, hd);
  grow(ws.k_norm, hd);
  for (const auto& it : batch)
    it.seq->reserve(w, it.start + static_cast<std::int64_t>(it.tokens.size()));

  // Embedding: each worker writes the rows of the tokens in its vocab slice.
  float* x0 = rs.x0.data();
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t id = rs.ids[static_cast<std::size_t>(t)];
    if (id >= s.vocab_begin && id < s.vocab_end)
      kernels::widen(W.embed() + (id - s.vocab_begin) * D, x0 + t * D, D);
  }
  pool.barrier();
  std::memcpy(ws.x.data(), x0, static_cast<std::size_t>(T * D) * sizeof(float));

  float* x = ws.x.data();
  float* h = ws.h.data();
  float* part_o = rs.part_o.data();
  float* part_down = rs.part_down.data();
  const std::int64_t o_local = o_chunks / tp, o_width = q_width / o_local;
  const std::int64_t down_local = down_chunks / tp, down_width = s.inter / down_local;

  for (std::int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const layer_weights L = W.layer(l);

    // Attention.
    kernels::widen(L.input_norm, ws.norm.data(), D);
    for (std::int64_t t = 0; t < T; ++t)
      rms_norm(x + t * D, ws.norm.data(), h + t * D, D, eps);
    matmul_nt(h, D, L.qkv, D, ws.qkv.data(), qkv_rows, T, qkv_rows, D);
    const bool qk_norm = L.q_norm.data != nullptr;
    if (qk_norm) {
      kernels::widen(L.q_norm, ws.q_norm.data(), hd);
      kernels::widen(L.k_norm, ws.k_norm.data(), hd);
    }
    for (std::int64_t t = 0; t < T; ++t) {
      const auto& tok = tokens[static_cast<std::size_t>(t)];
      float* row = ws.qkv.data() + t * qkv_rows;
      if (qk_norm) // Qwen3: each q and k head normalised on its own, before the rotary embedding
        for (std::int64_t q = 0; q < s.heads + s.kv_heads; ++q)
          rms_norm(row + q * hd, q < s.heads ? ws.q_norm.data() : ws.k_norm.data(), row + q * hd, hd, eps);
      const float* cs = &rope_cos[static_cast<std::size_t>(tok.position * half)];
      const float* sn = &rope_sin[static_cast<std::size_t>(tok.position * half)];
      for (std::int64_t q = 0; q < s.heads + s.kv_heads; ++q) // q heads, then k heads
        rope(row + q * hd, cs, sn, half);
      kv_sequence& seq = *batch[tok.item].seq;
      const auto at = static_cast<std::size_t>(tok.position * kv_width);
      std::memcpy(seq.keys(w, l) + at, row + q_width, static_cast<std::size_t>(kv_width) * sizeof(float));
      std::memcpy(seq.values(w, l) + at, row + q_width + kv_width,
                  static_cast<std::size_t>(kv_width) * sizeof(float));
    }
    for (std::int64_t t = 0; t < T; ++t) {
      const auto& tok = tokens[static_cast<std::size_t>(t)];
      kv_sequence& seq = *batch[tok.item].seq;
      const float* keys = seq.keys(w, l);
      const float* values = seq.values(w, l);
      const std::int64_t n = tok.position + 1; // causal: positions [0, position]
      for (std::int64_t hq = 0; hq < s.heads; ++hq) {
        const std::int64_t kv = (s.head_begin + hq) / group - s.kv_begin;
        const float* q = ws.qkv.data() + t * qkv_rows + hq * hd;
        float* sc = ws.scores.data();
        float top = -INFINITY;
        for (std::int64_t p = 0; p < n; ++p) {
          sc[p] = kernels::dot(q, keys + p * kv_width + kv * hd, hd) * scale;
          top = std::max(top, sc[p]);
        }
        float sum = 0.0f;
        for (std::int64_t p = 0; p < n; ++p) {
          sc[p] = std::exp(sc[p] - top);
          sum += sc[p];
        }
        float* o = ws.att.data() + t * q_width + hq * hd;
        std::fill(o, o + hd, 0.0f);
        for (std::int64_t p = 0; p < n; ++p) {
          const float pr = sc[p] / sum;
          const float* v = values + p * kv_width + kv * hd;
          for (std::int64_t d2 = 0; d2 < hd; ++d2)
            o[d2] += pr * v[d2];
        }
      }
    }
    // o_proj, row-parallel: one partial per chunk of heads, in global order;
    // the all-reduce is over this rank's tp workers (its own partials).
    for (std::int64_t c = 0; c < o_local; ++c)
      matmul_nt(ws.att.data() + c * o_width, q_width, L.o + c * o_width, q_width,
                         part_o + (w * o_local + c) * T * D, D, T, D, o_width);
    pool.barrier();
    reduce_into(x, part_o, o_chunks, T * D, h);

    // MLP.
    kernels::widen(L.post_norm, ws.norm.data(), D);
    for (std::int64_t t = 0; t < T; ++t)
      rms_norm(x + t * D, ws.norm.data(), h + t * D, D, eps);
    if (L.experts > 0) {
      moe_mlp(g, set, l, L, ws, x, h);
      continue;
    }
    matmul_nt(h, D, L.gate_up, D, ws.gu.data(), 2 * s.inter, T, 2 * s.inter, D);
    for (std::int64_t t = 0; t < T; ++t) {
      const float* gt = ws.gu.data() + t * 2 * s.inter;
      const float* u = gt + s.inter;
      float* a = ws.act.data() + t * s.inter;
      for (std::int64_t i = 0; i < s.inter; ++i)
        a[i] = gt[i] * (1.0f / (1.0f + std::exp(-gt[i]))) * u[i]; // silu(g) * u, as torch
    }
    for (std::int64_t c = 0; c < down_local; ++c)
      matmul_nt(ws.act.data() + c * down_width, s.inter, L.down + c * down_width, s.inter,
                         part_down + (w * down_local + c) * T * D, D, T, D, down_width);
    pool.barrier();
    reduce_into(x, part_down, down_chunks, T * D, h);
  }

  // Final norm and this worker's vocab columns of the logits.
  kernels::widen(W.final_norm(), ws.norm.data(), D);
  for (std::int64_t r = 0; r < R; ++r)
    rms_norm(x + rs.logit_tokens[static_cast<std::size_t>(r)] * D, ws.norm.data(), ws.final.data() + r * D, D,
             eps);
  if (s.vocab() > 0 && R > 0)
    matmul_nt(ws.final.data(), D, W.lm_head(), D, rs.out->logits.data() + s.vocab_begin, cfg.vocab_size,
                       R, s.vocab(), D);
}

// Qwen3-MoE's sparse MLP, as Hugging Face's Qwen3MoeSparseMoeBlock: router
// logits h Wgate^T, softmax over all experts in fp32, the top k (the lowest
// index on a tie), renormalised to sum 1 when norm_topk_prob; each chosen
// expert's SwiGLU output times its weight, summed over the chosen experts in
// ascending expert order, added to the residual.
//
// Every worker routes its rank's tokens (the router is whole everywhere, so
// a rank's tp workers agree). Without expert parallelism each worker then
// computes its slice of every expert's intermediate for its rank's tokens.
// With it (vLLM's EP, EP size dp x tp) worker g computes the whole of its own
// experts for the tokens of every rank routed to them: the dispatch, after a
// barrier that makes every rank's routing visible; the ranks step in
// lockstep, so one pass over an expert's weights serves them all. Either way
// each expert's down output is formed as partials per fixed chunk of its
// intermediate dim, into the token's rank's part_moe at its slot; the
// combine adds them in chunk order, then the experts in ascending order, so
// outputs depend neither on tp, expert parallelism, dp nor on which worker
// computed an expert.
void model::impl::moe_mlp(int g, const weight_set& set, std::int64_t l, const layer_weights& L, workspace& ws,
                          float* x, const float* h) {
  const int d = g / tp, w = g % tp;
  rank_step& rs = ranks[static_cast<std::size_t>(d)];
  const std::int64_t T = rs.size();
  const std::int64_t D = cfg.hidden_size, E = cfg.num_experts, k = cfg.num_experts_per_tok;
  grow(ws.router_logits, T * E);
  grow(ws.chosen, T * k);
  grow(ws.chosen_weight, T * k);
  grow(ws.moe_sum, D);
  grow(ws.moe_expert, D);
  matmul_nt(h, D, L.router, D, ws.router_logits.data(), E, T, E, D);
  grow(ws.expert_order, E);
  auto& order = ws.expert_order;
  for (std::int64_t t = 0; t < T; ++t) {
    float* prob = ws.router_logits.data() + t * E;
    float top = -INFINITY, sum = 0.0f;
    for (std::int64_t e = 0; e < E; ++e)
      top = std::max(top, prob[e]);
    for (std::int64_t e = 0; e < E; ++e)
      sum += (prob[e] = std::exp(prob[e] - top));
    for (std::int64_t e = 0; e < E; ++e) {
      prob[e] /= sum;
      order[static_cast<std::size_t>(e)] = static_cast<std::int32_t>(e);
    }
    std::partial_sort(order.begin(), order.begin() + k, order.begin() + E, [&](std::int32_t a, std::int32_t b) {
      return prob[a] != prob[b] ? prob[a] > prob[b] : a < b;
    });
    float picked = 0.0f;
    for (std::int64_t j = 0; j < k; ++j)
      picked += prob[order[static_cast<std::size_t>(j)]];
    std::sort(order.begin(), order.begin() + k); // summed in ascending expert order, as HF's loop over experts
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int32_t e = order[static_cast<std::size_t>(j)];
      ws.chosen[static_cast<std::size_t>(t * k + j)] = e;
      ws.chosen_weight[static_cast<std::size_t>(t * k + j)] = cfg.norm_topk_prob ? prob[e] / picked : prob[e];
    }
  }

  if (expert_parallel) {
    if (dp > 1)
      pool.barrier(); // the dispatch reads every rank's routing and inputs
    const auto begin = compute_begin[static_cast<std::size_t>(g)];
    for (std::int64_t e = begin; e < begin + compute_count[static_cast<std::size_t>(g)]; ++e) {
      ws.expert_rows.clear();
      for (int r = 0; r < dp; ++r) { // a rank's tp workers agree: its first one stands for the others
        const workspace& routed = r == d ? ws : spaces[static_cast<std::size_t>(r * tp)];
        for (std::int64_t slot = 0; slot < ranks[static_cast<std::size_t>(r)].size() * k; ++slot)
          if (routed.chosen[static_cast<std::size_t>(slot)] == e)
            ws.expert_rows.push_back({r, slot, routed.h.data() + (slot / k) * D});
      }
      // The shared weight set holds each expert once, in the tp worker the
      // dp = 1 placement gives it to; on one host every worker reads it there.
      const layer_weights held = set.workers[static_cast<std::size_t>(expert_owner(e, E, tp))].layer(l);
      const parameter* p = held.expert_params + 2 * (e - held.expert_begin);
      run_expert(ws, p[0], p[1], cfg.moe_intermediate_size, 0, moe_chunks);
    }
  } else {
    const std::int64_t local_chunks = moe_chunks / tp;
    for (std::int64_t e = L.expert_begin; e < L.expert_begin + L.experts; ++e) {
      ws.expert_rows.clear();
      for (std::int64_t slot = 0; slot < T * k; ++slot)
        if (ws.chosen[static_cast<std::size_t>(slot)] == e)
          ws.expert_rows.push_back({d, slot, h + (slot / k) * D});
      const parameter* p = L.expert_params + 2 * (e - L.expert_begin);
      run_expert(ws, p[0], p[1], set.workers[static_cast<std::size_t>(w)].shard().moe_inter, w * local_chunks,
                 local_chunks);
    }
  }
  pool.barrier();
  // x_t += the sum over its experts (ascending) of weight * the expert's
  // down output, whose chunk partials are added in global chunk order.
  float* acc = ws.moe_sum.data();
  float* y = ws.moe_expert.data();
  const float* part_moe = rs.part_moe.data();
  for (std::int64_t t = 0; t < T; ++t) {
    std::fill(acc, acc + D, 0.0f);
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t slot = t * k + j;
      sum_chunks(y, part_moe + slot * D, moe_chunks, T * k * D, D);
      const float weight = ws.chosen_weight[static_cast<std::size_t>(slot)];
      for (std::int64_t i = 0; i < D; ++i)
        acc[i] += y[i] * weight;
    }
    for (std::int64_t i = 0; i < D; ++i)
      x[t * D + i] += acc[i];
  }
  // The next writer of part_moe is a later layer, after o_proj's barrier:
  // every worker has finished reading it by then.
}

// One expert (fused gate/up rows [2 mi, D], down columns [D, mi]) over the
// gathered ws.expert_rows: SwiGLU, then the down partial of each of
// `chunks` chunks of mi (global chunk first_chunk + c) into the row's rank's
// part_moe at its slot.
void model::impl::run_expert(workspace& ws, const parameter& gate_up, const parameter& down, std::int64_t mi,
                             std::int64_t first_chunk, std::int64_t chunks) {
  const std::int64_t D = cfg.hidden_size, k = cfg.num_experts_per_tok;
  const auto n = static_cast<std::int64_t>(ws.expert_rows.size());
  if (n == 0)
    return;
  ws.expert_rows_run += static_cast<std::uint64_t>(n);
  grow(ws.expert_in, n * D);
  grow(ws.expert_gu, n * 2 * mi);
  grow(ws.expert_act, n * mi);
  for (std::int64_t r = 0; r < n; ++r)
    std::memcpy(ws.expert_in.data() + r * D, ws.expert_rows[static_cast<std::size_t>(r)].in,
                static_cast<std::size_t>(D) * sizeof(float));
  matmul_nt(ws.expert_in.data(), D, gate_up.ref(), D, ws.expert_gu.data(), 2 * mi, n, 2 * mi, D);
  for (std::int64_t r = 0; r < n; ++r) {
    const float* gt = ws.expert_gu.data() + r * 2 * mi;
    const float* u = gt + mi;
    float* a = ws.expert_act.data() + r * mi;
    for (std::int64_t i = 0; i < mi; ++i)
      a[i] = gt[i] * (1.0f / (1.0f + std::exp(-gt[i]))) * u[i]; // silu(g) * u, as torch
  }
  const std::int64_t width = mi / chunks;
  for (std::int64_t c = 0; c < chunks; ++c)
    for (std::int64_t r = 0; r < n; ++r) {
      const expert_row& row = ws.expert_rows[static_cast<std::size_t>(r)];
      rank_step& target = ranks[static_cast<std::size_t>(row.rank)];
      float* part = target.part_moe.data() + ((first_chunk + c) * target.size() * k + row.slot) * D;
      matmul_nt(ws.expert_act.data() + r * mi + c * width, mi, down.ref() + c * width, mi, part, D, 1, D,
                         width);
    }
}

model::model(const model_config& c, int tp, dtype weights_type, bool expert_parallel, int dp)
    : impl_(std::make_unique<impl>(c, tp, weights_type, expert_parallel, dp)) {}
model::~model() = default;

const model_config& model::config() const { return impl_->cfg; }
int model::tp() const { return impl_->tp; }
int model::dp() const { return impl_->dp; }
bool model::expert_parallel() const { return impl_->expert_parallel; }
void model::kill_worker(int worker) { impl_->pool.kill(worker); }
int model::dead_worker() const { return impl_->pool.dead(); }
dtype model::weights_type() const { return impl_->weights_type; }

std::shared_ptr<weight_set> model::make_weights() const {
  return weight_set::make(impl_->cfg, impl_->tp, impl_->weights_type, impl_->expert_parallel);
}

void model::set_weights(std::shared_ptr<const weight_set> w) {
  if (!w || w->tp() != impl_->tp)
    throw std::invalid_argument("engine: weight set for another tensor-parallel size");
  if (w->expert_parallel() != impl_->expert_parallel)
    throw std::invalid_argument(std::string("engine: weight set ")
                                + (w->expert_parallel() ? "with" : "without") + " expert parallelism, the engine "
                                + (impl_->expert_parallel ? "places experts whole" : "slices every expert"));
  const auto& c = w->config();
  const auto& m = impl_->cfg;
  if (c.vocab_size != m.vocab_size || c.hidden_size != m.hidden_size
      || c.intermediate_size != m.intermediate_size || c.num_hidden_layers != m.num_hidden_layers
      || c.num_attention_heads != m.num_attention_heads || c.num_key_value_heads != m.num_key_value_heads
      || c.tie_word_embeddings != m.tie_word_embeddings || c.arch != m.arch || c.head_dim() != m.head_dim()
      || c.num_experts != m.num_experts || c.moe_intermediate_size != m.moe_intermediate_size
      || c.decoder_sparse_step != m.decoder_sparse_step || c.mlp_only_layers != m.mlp_only_layers)
    throw std::invalid_argument("engine: weight set shaped for another model");
  for (const auto& ww : w->workers)
    if (!ww.allocated())
      throw std::invalid_argument("engine: weight set without data");
  // The upload runs before the swap, outside the lock: steps go on with
  // the old set meanwhile, and a failed upload leaves it served.
  std::shared_ptr<const device_weights> mirror;
  if (impl_->device)
    mirror = impl_->device->mirror(*w);
  std::lock_guard<std::mutex> lock(impl_->weights_mutex);
  impl_->weights = std::move(w);
  impl_->mirror = std::move(mirror);
}

void model::set_device(std::shared_ptr<device_backend> device) {
  std::lock_guard<std::mutex> lock(impl_->weights_mutex);
  if (impl_->weights)
    throw std::logic_error("engine: the device is chosen before any weights are served");
  impl_->device = std::move(device);
}

const device_backend* model::device() const {
  std::lock_guard<std::mutex> lock(impl_->weights_mutex);
  return impl_->device.get();
}

void model::clear_weights() {
  std::lock_guard<std::mutex> lock(impl_->weights_mutex);
  impl_->weights.reset();
  impl_->mirror.reset();
}

std::shared_ptr<const weight_set> model::weights() const {
  std::lock_guard<std::mutex> lock(impl_->weights_mutex);
  return impl_->weights;
}

kv_sequence model::new_sequence() const { return kv_sequence(impl_->cfg, impl_->tp); }

std::vector<std::uint64_t> model::expert_rows() const {
  std::lock_guard<std::mutex> lock(impl_->step_mutex);
  std::vector<std::uint64_t> rows;
  for (const auto& ws : impl_->spaces)
    rows.push_back(ws.expert_rows_run);
  return rows;
}

void model::forward_ranks(const std::vector<std::vector<forward_item>>& batches, std::vector<forward_output>& outs) {
  std::lock_guard<std::mutex> lock(impl_->step_mutex);
  impl_->step(batches, outs);
}

void model::forward(const std::vector<forward_item>& batch, forward_output& out) {
  std::vector<std::vector<forward_item>> batches(static_cast<std::size_t>(impl_->dp));
  batches.front() = batch;
  std::vector<forward_output> outs;
  forward_ranks(batches, outs);
  out = std::move(outs.front());
}

forward_output model::forward(const std::vector<forward_item>& batch) {
  forward_output out;
  forward(batch, out);
  return out;
}

} // namespace rlsync::engine
