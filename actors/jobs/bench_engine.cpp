#include "actors/jobs/bench_engine.hpp"

#include "runtime/base/format.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/engine_core.hpp"
#include "runtime/engine/kernels.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "runtime/plan/plan.hpp"

#include <chrono>
#include <cstdio>
#include <map>
#include <ostream>
#include <set>
#include <stdexcept>
#include <string>

namespace rlsync::jobs {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// A checkpoint's tensors in memory (the trainer's side of an update).
struct source_tensors {
  std::vector<tensor_spec> specs;
  std::map<std::string, std::vector<std::uint8_t>> bytes;

  std::vector<tensor_view> views() const {
    std::vector<tensor_view> out;
    for (const auto& s : specs) {
      tensor_view v;
      static_cast<tensor_spec&>(v) = s;
      v.data = reinterpret_cast<const std::byte*>(bytes.at(s.name).data());
      v.size = bytes.at(s.name).size();
      out.push_back(v);
    }
    return out;
  }
};

source_tensors make_source(const model_config& c, std::uint64_t seed) {
  source_tensors s;
  s.specs = llama_parameter_specs(c, dtype::bf16);
  std::vector<float> values;
  for (const auto& spec : s.specs) {
    values.resize(static_cast<std::size_t>(spec.numel()));
    synthetic_values(spec, seed, 0, values.size(), values.data());
    auto& b = s.bytes[spec.name];
    b.resize(static_cast<std::size_t>(spec.bytes()));
    convert_from_f32(dtype::bf16, values.data(), b.data(), values.size());
  }
  return s;
}

void run_until_idle(engine::engine_core& core) {
  for (int i = 0; i < 1000000 && core.has_work(); ++i) // bounded: a bug must not hang the bench
    core.step();
}

void say(std::ostream* progress, const std::string& text) {
  if (progress)
    *progress << text << "\n" << std::flush;
}

/// Updates through the session: full tensors, then plan-packed shards twice.
void measure_updates(engine::engine_core& core, int tp, const source_tensors& source, bench_engine_case& out) {
  core.pause({pause_mode::keep, false});
  auto t0 = clock_type::now();
  core.start_update(1);
  for (auto& t : source.views())
    core.apply_tensor(t);
  if (auto e = core.finish_update(1))
    throw std::runtime_error("full update: " + e->what);
  out.full_update_s = seconds_since(t0);

  // The trainer packs each worker's plan (timed apart); the engine applies
  // the packed bytes.
  std::vector<std::vector<std::uint8_t>> packed(static_cast<std::size_t>(tp));
  std::set<std::string> all_names;
  for (auto& s : source.specs)
    all_names.insert(s.name);
  t0 = clock_type::now();
  for (int w = 0; w < tp; ++w) {
    auto& buf = packed[static_cast<std::size_t>(w)];
    buf.resize(plan::bytes_per_worker(core.worker_plan(w)));
    std::uint8_t* at = buf.data();
    for (const auto& e : core.worker_plan(w).entries) {
      plan::replay_into(e, source.bytes.at(e.source).data(), e.source_type, at);
      at += e.bytes();
    }
  }
  out.pack_s = seconds_since(t0);
  out.bytes_per_worker = packed[0].size();
  // One sharded session: seconds to open it (allocating staging) and in all.
  auto sharded_session = [&](std::uint64_t version) {
    core.pause({pause_mode::keep, false});
    auto start = clock_type::now();
    core.start_update(version);
    double opened = seconds_since(start);
    for (int w = 0; w < tp; ++w)
      core.apply_packed(w, all_names, packed[static_cast<std::size_t>(w)].data(),
                        packed[static_cast<std::size_t>(w)].size());
    if (auto e = core.finish_update(version))
      throw std::runtime_error("sharded update: " + e->what);
    return std::make_pair(opened, seconds_since(start));
  };
  auto cold = sharded_session(2);
  auto warm = sharded_session(3); // fills the set it replaced: no fresh pages
  out.allocating_s = cold.first;
  out.sharded_cold_s = cold.second;
  out.sharded_warm_s = warm.second;
  core.resume();
}

} // namespace

void print_model_line(std::ostream& out, const bench_engine_options& o, const bench_engine_result& r) {
  const auto& c = o.model;
  out << format("model: %lld layers, hidden %lld, heads %lld (kv %lld), intermediate %lld, vocab %lld: "
              "%.1fM parameters, %.1f MB bf16; kernels: %s",
              (long long)c.num_hidden_layers, (long long)c.hidden_size, (long long)c.num_attention_heads,
              (long long)c.num_key_value_heads, (long long)c.intermediate_size, (long long)c.vocab_size,
              r.parameters / 1e6, r.bytes / 1e6, r.kernels)
      << "\n";
}

bench_engine_result run_bench_engine(const bench_engine_options& o, std::ostream* progress) {
  const model_config& c = o.model;
  for (auto& e : validate(c))
    throw std::invalid_argument("model shape: " + e);
  if (o.steps == 0 || o.prompt_tokens == 0 || o.prompt_tokens >= c.max_position_embeddings)
    throw std::invalid_argument("steps must be positive and prompt tokens within the model's positions");
  for (int tp : o.tps)
    for (auto& e : validate_tp(c, tp))
      throw std::invalid_argument("tp " + std::to_string(tp) + ": " + e);

  auto source = make_source(c, 1);
  bench_engine_result r;
  for (auto& s : source.specs) {
    r.parameters += static_cast<std::uint64_t>(s.numel());
    r.bytes += s.bytes();
  }
  r.kernels = engine::kernels::variant();
  if (progress)
    print_model_line(*progress, o, r);

  for (int tp : o.tps) {
    bench_engine_case k;
    k.tp = tp;
    engine::engine_options opts;
    opts.tp = tp;
    opts.max_batch = 64;
    engine::engine_core core(c, opts);
    measure_updates(core, tp, source, k);
    say(progress, format("tp %d  update: full tensors %.3f s (%.2f GB/s, cold); sharded: pack %.3f s, apply %.3f s "
                       "(%.3f s allocating), again %.3f s (%.2f GB/s, warm) (%.1f MB per worker)",
                       tp, k.full_update_s, r.bytes / k.full_update_s / 1e9, k.pack_s, k.sharded_cold_s,
                       k.allocating_s, k.sharded_warm_s, r.bytes / k.sharded_warm_s / 1e9,
                       k.bytes_per_worker / 1e6));

    // Prefill: four long prompts, timed to their first tokens.
    std::uint64_t next_id = 1;
    std::size_t first_tokens = 0;
    auto t0 = clock_type::now();
    for (int i = 0; i < 4; ++i) {
      generate_request req;
      req.request_id = next_id++;
      req.prompt.assign(o.prompt_tokens, 65 + i);
      req.sampling.max_tokens = 1;
      core.add(req, {[&](const token_event&) { ++first_tokens; }, {}});
    }
    run_until_idle(core);
    k.prefill_tokens_per_s = 4.0 * o.prompt_tokens / seconds_since(t0);
    say(progress, format("tp %d  prefill: %.0f tokens/s (4 prompts of %u tokens)", tp, k.prefill_tokens_per_s,
                       o.prompt_tokens));

    for (auto batch : o.batches) {
      std::size_t produced = 0;
      for (std::uint32_t b = 0; b < batch; ++b) {
        generate_request req;
        req.request_id = next_id++;
        req.prompt = engine::encode("request " + std::to_string(b) + " of the decode benchmark");
        req.sampling.max_tokens = o.steps + 1;
        req.sampling.stop_at_eos = false;
        core.add(req, {[&](const token_event&) { ++produced; }, {}});
      }
      core.step(); // prefill and first token, not timed
      std::size_t before = produced;
      t0 = clock_type::now();
      run_until_idle(core);
      double decode_s = seconds_since(t0);
      bench_engine_decode d{batch, (produced - before) / decode_s, decode_s / o.steps * 1e3};
      k.decode.push_back(d);
      say(progress, format("tp %d  decode batch %3u: %8.1f tokens/s (%.2f ms/step)", tp, batch, d.tokens_per_s,
                         d.ms_per_step));
    }
    r.cases.push_back(std::move(k));
  }
  return r;
}

} // namespace rlsync::jobs
