#include "runtime/engine/model.hpp"

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
  std::vector<std::int64_t> expert_slots; // slot t * k + j of each gathered row
  std::vector<float> expert_in, expert_gu, expert_act;
  std::vector<float> moe_sum, moe_expert; // [D] the reduction's accumulators
};

template <class T>
void grow(std::vector<T>& v, std::int64_t n) {
  if (static_cast<std::int64_t>(v.size()) < n)
    v.resize(static_cast<std::size_t>(n));
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

// Validates the sharding before anything is started (the pool included).
int checked_tp(const model_config& c, int tp, bool expert_parallel) {
  shard_spec::make(c, tp, 0, expert_parallel);
  return tp;
}

} // namespace

struct model::impl {
  model_config cfg;
  int tp;
  bool expert_parallel;
  dtype weights_type;
  worker_pool pool;
  std::int64_t o_chunks;    // all-reduce chunks of o_proj's input (heads)
  std::int64_t down_chunks; // ... of down_proj's input (intermediate)
  std::int64_t moe_chunks;  // ... of each expert's down_proj input (moe_intermediate_size)

  mutable std::mutex weights_mutex;
  std::shared_ptr<const weight_set> weights;

  std::mutex step_mutex; // one step at a time; guards everything below
  std::vector<float> rope_cos, rope_sin; // [positions, head_dim / 2]
  std::vector<float> inv_freq;
  std::vector<float> x0;        // [T, D] embedding gather
  std::vector<float> part_o;    // [o_chunks, T, D]
  std::vector<float> part_down; // [down_chunks, T, D]
  std::vector<float> part_moe;  // [moe_chunks, T * experts_per_tok, D]
  std::vector<workspace> spaces;

  impl(const model_config& c, int tp_, dtype type, bool ep)
      : cfg(c), tp(tp_), expert_parallel(ep), weights_type(type), pool(checked_tp(c, tp_, ep)),
        o_chunks(reduce_chunks(c.num_attention_heads, tp_)),
        down_chunks(reduce_chunks(c.intermediate_size, tp_)),
        // Whole experts: chunked as at tp 1, whatever tp is.
        moe_chunks(c.arch == model_arch::qwen3_moe ? reduce_chunks(c.moe_intermediate_size, ep ? 1 : tp_) : 0),
        spaces(static_cast<std::size_t>(tp_)) {
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

  void validate(const std::vector<forward_item>& batch) const {
    std::vector<const kv_sequence*> seqs;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const auto& it = batch[i];
      auto fail = [&](const std::string& what) {
        throw std::invalid_argument("engine forward: item " + std::to_string(i) + ": " + what);
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
      throw std::invalid_argument("engine forward: a sequence appears twice in one batch");
  }

  void step(const std::vector<forward_item>& batch, forward_output& out);
  void moe_mlp(int w, const layer_weights& L, const shard_spec& s, workspace& ws, std::int64_t T, float* x,
               const float* h);
  void run_worker(int w, const weight_set& ws, const std::vector<forward_item>& batch,
                  const std::vector<token_slot>& tokens, const std::vector<std::int32_t>& ids,
                  const std::vector<std::int64_t>& logit_tokens, forward_output& out);
};

void model::impl::step(const std::vector<forward_item>& batch, forward_output& out) {
  std::shared_ptr<const weight_set> ws;
  {
    std::lock_guard<std::mutex> lock(weights_mutex);
    ws = weights;
  }
  if (!ws)
    throw std::invalid_argument("engine forward: no weights loaded");
  validate(batch);

  std::vector<token_slot> tokens;
  std::vector<std::int32_t> ids;
  std::vector<std::int64_t> logit_tokens; // step-token index of each logits row
  out.first_row.assign(1, 0);
  std::int64_t max_position = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const auto& it = batch[i];
    it.seq->truncate(it.start);
    const auto n = static_cast<std::int64_t>(it.tokens.size());
    for (std::int64_t j = 0; j < n; ++j) {
      if (it.all_logits || j == n - 1)
        logit_tokens.push_back(static_cast<std::int64_t>(tokens.size()));
      tokens.push_back({i, it.start + j});
      ids.push_back(it.tokens[static_cast<std::size_t>(j)]);
    }
    max_position = std::max(max_position, it.start + n);
    out.first_row.push_back(static_cast<std::int64_t>(logit_tokens.size()));
  }
  const auto T = static_cast<std::int64_t>(tokens.size());
  const std::int64_t D = cfg.hidden_size;
  out.vocab = cfg.vocab_size;
  out.version = ws->version;
  if (T == 0) {
    out.logits.clear();
    return;
  }
  ensure_rope(max_position);
  grow(x0, T * D);
  grow(part_o, o_chunks * T * D);
  grow(part_down, down_chunks * T * D);
  if (moe_chunks > 0)
    grow(part_moe, moe_chunks * T * cfg.num_experts_per_tok * D);
  out.logits.assign(static_cast<std::size_t>(static_cast<std::int64_t>(logit_tokens.size()) * cfg.vocab_size),
                    0.0f);

  pool.run([&](int w) { run_worker(w, *ws, batch, tokens, ids, logit_tokens, out); });
  for (const auto& it : batch)
    it.seq->set_length(it.start + static_cast<std::int64_t>(it.tokens.size()));
}

void model::impl::run_worker(int w, const weight_set& set, const std::vector<forward_item>& batch,
                             const std::vector<token_slot>& tokens, const std::vector<std::int32_t>& ids,
                             const std::vector<std::int64_t>& logit_tokens, forward_output& out) {
  const worker_weights& W = set.workers[static_cast<std::size_t>(w)];
  const shard_spec& s = W.shard();
  workspace& ws = spaces[static_cast<std::size_t>(w)];
  const auto T = static_cast<std::int64_t>(tokens.size());
  const auto R = static_cast<std::int64_t>(logit_tokens.size());
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
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t id = ids[static_cast<std::size_t>(t)];
    if (id >= s.vocab_begin && id < s.vocab_end)
      kernels::widen(W.embed() + (id - s.vocab_begin) * D, &x0[static_cast<std::size_t>(t * D)], D);
  }
  pool.barrier();
  std::memcpy(ws.x.data(), x0.data(), static_cast<std::size_t>(T * D) * sizeof(float));

  float* x = ws.x.data();
  float* h = ws.h.data();
  const std::int64_t o_local = o_chunks / tp, o_width = q_width / o_local;
  const std::int64_t down_local = down_chunks / tp, down_width = s.inter / down_local;

  for (std::int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const layer_weights L = W.layer(l);

    // Attention.
    kernels::widen(L.input_norm, ws.norm.data(), D);
    for (std::int64_t t = 0; t < T; ++t)
      rms_norm(x + t * D, ws.norm.data(), h + t * D, D, eps);
    kernels::matmul_nt(h, D, L.qkv, D, ws.qkv.data(), qkv_rows, T, qkv_rows, D);
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
          for (std::int64_t d = 0; d < hd; ++d)
            o[d] += pr * v[d];
        }
      }
    }
    // o_proj, row-parallel: one partial per chunk of heads, in global order.
    for (std::int64_t c = 0; c < o_local; ++c)
      kernels::matmul_nt(ws.att.data() + c * o_width, q_width, L.o + c * o_width, q_width,
                         &part_o[static_cast<std::size_t>((w * o_local + c) * T * D)], D, T, D, o_width);
    pool.barrier();
    reduce_into(x, part_o.data(), o_chunks, T * D, h);

    // MLP.
    kernels::widen(L.post_norm, ws.norm.data(), D);
    for (std::int64_t t = 0; t < T; ++t)
      rms_norm(x + t * D, ws.norm.data(), h + t * D, D, eps);
    if (L.experts > 0) {
      moe_mlp(w, L, s, ws, T, x, h);
      continue;
    }
    kernels::matmul_nt(h, D, L.gate_up, D, ws.gu.data(), 2 * s.inter, T, 2 * s.inter, D);
    for (std::int64_t t = 0; t < T; ++t) {
      const float* g = ws.gu.data() + t * 2 * s.inter;
      const float* u = g + s.inter;
      float* a = ws.act.data() + t * s.inter;
      for (std::int64_t i = 0; i < s.inter; ++i)
        a[i] = g[i] * (1.0f / (1.0f + std::exp(-g[i]))) * u[i]; // silu(g) * u, as torch
    }
    for (std::int64_t c = 0; c < down_local; ++c)
      kernels::matmul_nt(ws.act.data() + c * down_width, s.inter, L.down + c * down_width, s.inter,
                         &part_down[static_cast<std::size_t>((w * down_local + c) * T * D)], D, T, D,
                         down_width);
    pool.barrier();
    reduce_into(x, part_down.data(), down_chunks, T * D, h);
  }

  // Final norm and this worker's vocab columns of the logits.
  kernels::widen(W.final_norm(), ws.norm.data(), D);
  for (std::int64_t r = 0; r < R; ++r)
    rms_norm(x + logit_tokens[static_cast<std::size_t>(r)] * D, ws.norm.data(), ws.final.data() + r * D, D,
             eps);
  if (s.vocab() > 0 && R > 0)
    kernels::matmul_nt(ws.final.data(), D, W.lm_head(), D, out.logits.data() + s.vocab_begin, cfg.vocab_size,
                       R, s.vocab(), D);
}

// Qwen3-MoE's sparse MLP, as Hugging Face's Qwen3MoeSparseMoeBlock: router
// logits h Wgate^T, softmax over all experts in fp32, the top k (the lowest
// index on a tie), renormalised to sum 1 when norm_topk_prob; each chosen
// expert's SwiGLU output times its weight, summed over the chosen experts in
// ascending expert order, added to the residual. Every worker routes every
// token (the router is whole everywhere, so all agree) and computes its
// slice of each expert's intermediate, or with expert parallelism the whole
// of the experts it holds, for the tokens routed to them (the dispatch).
// Either way each expert's down output is formed as partials per fixed
// chunk of its intermediate dim, into part_moe at the token's slot; the
// combine adds them in chunk order, then the experts in ascending order,
// so outputs do not depend on tp nor on expert parallelism.
void model::impl::moe_mlp(int w, const layer_weights& L, const shard_spec& s, workspace& ws, std::int64_t T,
                          float* x, const float* h) {
  const std::int64_t D = cfg.hidden_size, E = cfg.num_experts, k = cfg.num_experts_per_tok, mi = s.moe_inter;
  grow(ws.router_logits, T * E);
  grow(ws.chosen, T * k);
  grow(ws.chosen_weight, T * k);
  grow(ws.moe_sum, D);
  grow(ws.moe_expert, D);
  kernels::matmul_nt(h, D, L.router, D, ws.router_logits.data(), E, T, E, D);
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
  // Each local expert over the tokens that chose it: this worker's
  // intermediate slice (its chunks of every expert) or the whole expert (all
  // chunks of its own experts), each chunk's down partial into part_moe.
  const std::int64_t local_chunks = s.expert_parallel ? moe_chunks : moe_chunks / tp;
  const std::int64_t first_chunk = s.expert_parallel ? 0 : w * local_chunks, width = mi / local_chunks;
  for (std::int64_t e = L.expert_begin; e < L.expert_begin + L.experts; ++e) {
    ws.expert_slots.clear();
    for (std::int64_t slot = 0; slot < T * k; ++slot)
      if (ws.chosen[static_cast<std::size_t>(slot)] == e)
        ws.expert_slots.push_back(slot);
    const auto n = static_cast<std::int64_t>(ws.expert_slots.size());
    if (n == 0)
      continue;
    grow(ws.expert_in, n * D);
    grow(ws.expert_gu, n * 2 * mi);
    grow(ws.expert_act, n * mi);
    for (std::int64_t r = 0; r < n; ++r)
      std::memcpy(ws.expert_in.data() + r * D, h + (ws.expert_slots[static_cast<std::size_t>(r)] / k) * D,
                  static_cast<std::size_t>(D) * sizeof(float));
    const parameter& gate_up = L.expert_params[2 * (e - L.expert_begin)];
    const parameter& down = L.expert_params[2 * (e - L.expert_begin) + 1];
    kernels::matmul_nt(ws.expert_in.data(), D, gate_up.ref(), D, ws.expert_gu.data(), 2 * mi, n, 2 * mi, D);
    for (std::int64_t r = 0; r < n; ++r) {
      const float* g = ws.expert_gu.data() + r * 2 * mi;
      const float* u = g + mi;
      float* a = ws.expert_act.data() + r * mi;
      for (std::int64_t i = 0; i < mi; ++i)
        a[i] = g[i] * (1.0f / (1.0f + std::exp(-g[i]))) * u[i]; // silu(g) * u, as torch
    }
    for (std::int64_t c = 0; c < local_chunks; ++c)
      for (std::int64_t r = 0; r < n; ++r) {
        const std::int64_t slot = ws.expert_slots[static_cast<std::size_t>(r)];
        kernels::matmul_nt(ws.expert_act.data() + r * mi + c * width, mi, down.ref() + c * width, mi,
                           &part_moe[static_cast<std::size_t>(((first_chunk + c) * T * k + slot) * D)], D, 1,
                           D, width);
      }
  }
  pool.barrier();
  // x_t += the sum over its experts (ascending) of weight * the expert's
  // down output, whose chunk partials are added in global chunk order.
  float* acc = ws.moe_sum.data();
  float* y = ws.moe_expert.data();
  for (std::int64_t t = 0; t < T; ++t) {
    std::fill(acc, acc + D, 0.0f);
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t slot = t * k + j;
      sum_chunks(y, &part_moe[static_cast<std::size_t>(slot * D)], moe_chunks, T * k * D, D);
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

model::model(const model_config& c, int tp, dtype weights_type, bool expert_parallel)
    : impl_(std::make_unique<impl>(c, tp, weights_type, expert_parallel)) {}
model::~model() = default;

const model_config& model::config() const { return impl_->cfg; }
int model::tp() const { return impl_->tp; }
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
  std::lock_guard<std::mutex> lock(impl_->weights_mutex);
  impl_->weights = std::move(w);
}

void model::clear_weights() {
  std::lock_guard<std::mutex> lock(impl_->weights_mutex);
  impl_->weights.reset();
}

std::shared_ptr<const weight_set> model::weights() const {
  std::lock_guard<std::mutex> lock(impl_->weights_mutex);
  return impl_->weights;
}

kv_sequence model::new_sequence() const { return kv_sequence(impl_->cfg, impl_->tp); }

void model::forward(const std::vector<forward_item>& batch, forward_output& out) {
  std::lock_guard<std::mutex> lock(impl_->step_mutex);
  impl_->step(batch, out);
}

forward_output model::forward(const std::vector<forward_item>& batch) {
  forward_output out;
  forward(batch, out);
  return out;
}

} // namespace rlsync::engine
