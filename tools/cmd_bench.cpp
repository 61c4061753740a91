// rlsync bench: figures, never pass/fail. `engine` measures the built-in
// engine: decode and prefill throughput and the time to apply a full update.
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/apply_packed.hpp"
#include "runtime/engine/engine_core.hpp"
#include "runtime/engine/kernels.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "runtime/plan/plan.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>

namespace rlsync::tools {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

std::vector<std::uint64_t> parse_list(const std::string& text, const std::string& flag) {
  std::vector<std::uint64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    auto v = cli::parse_size(item, flag);
    if (v == 0)
      throw cli::usage_error(flag + ": values must be positive, got '" + text + "'");
    out.push_back(v);
  }
  if (out.empty())
    throw cli::usage_error(flag + ": expected a comma-separated list, got '" + text + "'");
  return out;
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
  for (int i = 0; i < 1000000 && core.has_work(); ++i)
    core.step();
}

int bench_engine(const arg_list& argv) {
  cli::args a(argv, {"layers", "hidden", "heads", "kv-heads", "intermediate", "vocab", "tp", "batch", "steps",
                     "prompt"},
              {"help"});
  if (a.has("help")) {
    std::cout << "usage: rlsync bench engine [--layers 16] [--hidden 512] [--heads 8] [--kv-heads 4]\n"
                 "                           [--intermediate 1536] [--vocab 320] [--tp 1,2] [--batch 1,8,32]\n"
                 "                           [--steps 32] [--prompt 512]\n"
                 "Decode tokens/s at each batch size, prefill tokens/s, and the time to apply a full\n"
                 "weight update (full tensors through the loader, and plan-packed shards), on seeded\n"
                 "random bf16 weights (default: a ~50M-parameter Llama).\n";
    return 0;
  }
  model_config c;
  c.num_hidden_layers = static_cast<std::int64_t>(a.get_u64("layers", 16));
  c.hidden_size = static_cast<std::int64_t>(a.get_u64("hidden", 512));
  c.num_attention_heads = static_cast<std::int64_t>(a.get_u64("heads", 8));
  c.num_key_value_heads = static_cast<std::int64_t>(a.get_u64("kv-heads", 4));
  c.intermediate_size = static_cast<std::int64_t>(a.get_u64("intermediate", 1536));
  c.vocab_size = static_cast<std::int64_t>(a.get_u64("vocab", 320));
  c.max_position_embeddings = 4096;
  for (auto& e : validate(c))
    throw cli::usage_error("model shape: " + e);
  auto tps = parse_list(a.get_or("tp", "1,2"), "--tp");
  auto batches = parse_list(a.get_or("batch", "1,8,32"), "--batch");
  auto steps = a.get_u64("steps", 32);
  auto prompt_tokens = a.get_u64("prompt", 512);
  if (steps == 0 || prompt_tokens == 0 || prompt_tokens >= 4000)
    throw cli::usage_error("--steps must be positive, --prompt in 1..3999");

  auto source = make_source(c, 1);
  std::uint64_t params = 0, bytes = 0;
  for (auto& s : source.specs) {
    params += static_cast<std::uint64_t>(s.numel());
    bytes += s.bytes();
  }
  std::printf("model: %lld layers, hidden %lld, heads %lld (kv %lld), intermediate %lld, vocab %lld: "
              "%.1fM parameters, %.1f MB bf16; kernels: %s\n",
              (long long)c.num_hidden_layers, (long long)c.hidden_size, (long long)c.num_attention_heads,
              (long long)c.num_key_value_heads, (long long)c.intermediate_size, (long long)c.vocab_size,
              params / 1e6, bytes / 1e6, engine::kernels::variant());

  for (auto tp64 : tps) {
    int tp = static_cast<int>(tp64);
    for (auto& e : validate_tp(c, tp))
      throw cli::usage_error("--tp " + std::to_string(tp) + ": " + e);
    engine::engine_options opts;
    opts.tp = tp;
    opts.max_batch = 64;
    engine::engine_core core(c, opts);

    // Full update through the session, as the broadcast path applies it.
    core.pause({pause_mode::keep, false});
    auto t0 = clock_type::now();
    core.start_update(1);
    for (auto& t : source.views())
      core.apply_tensor(t);
    if (auto e = core.finish_update(1)) {
      std::cerr << "rlsync bench engine: " << e->what << "\n";
      return 1;
    }
    double full_s = seconds_since(t0);

    // Sharded update: the trainer packs each worker's plan (timed apart), the
    // engine applies the packed bytes.
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
    double pack_s = seconds_since(t0);
    // One sharded session: seconds to open it (allocating staging) and in all.
    auto sharded_session = [&](std::uint64_t version) -> std::optional<std::pair<double, double>> {
      core.pause({pause_mode::keep, false});
      auto start = clock_type::now();
      core.start_update(version);
      double opened = seconds_since(start);
      for (int w = 0; w < tp; ++w)
        core.apply_packed(w, all_names, packed[static_cast<std::size_t>(w)].data(),
                          packed[static_cast<std::size_t>(w)].size());
      if (auto e = core.finish_update(version)) {
        std::cerr << "rlsync bench engine: " << e->what << "\n";
        return std::nullopt;
      }
      return std::make_pair(opened, seconds_since(start));
    };
    auto cold = sharded_session(2);
    auto warm = sharded_session(3); // fills the set it replaced: no fresh pages
    if (!cold || !warm)
      return 1;
    double start_s = cold->first, sharded_s = cold->second, warm_s = warm->second;
    core.resume();
    std::printf("tp %d  update: full tensors %.3f s (%.2f GB/s, cold); sharded: pack %.3f s, apply %.3f s "
                "(%.3f s allocating), again %.3f s (%.2f GB/s, warm) (%.1f MB per worker)\n",
                tp, full_s, bytes / full_s / 1e9, pack_s, sharded_s, start_s, warm_s, bytes / warm_s / 1e9,
                packed[0].size() / 1e6);

    // Prefill: four long prompts, timed to their first tokens.
    std::uint64_t next_id = 1;
    std::size_t first_tokens = 0;
    t0 = clock_type::now();
    for (int i = 0; i < 4; ++i) {
      generate_request r;
      r.request_id = next_id++;
      r.prompt.assign(prompt_tokens, 65 + i);
      r.sampling.max_tokens = 1;
      core.add(r, {[&](const token_event&) { ++first_tokens; }, {}});
    }
    run_until_idle(core);
    double prefill_s = seconds_since(t0);
    std::printf("tp %d  prefill: %.0f tokens/s (4 prompts of %llu tokens)\n", tp, 4.0 * prompt_tokens / prefill_s,
                (unsigned long long)prompt_tokens);

    for (auto batch : batches) {
      std::size_t produced = 0;
      for (std::uint64_t b = 0; b < batch; ++b) {
        generate_request r;
        r.request_id = next_id++;
        r.prompt = engine::encode("request " + std::to_string(b) + " of the decode benchmark");
        r.sampling.max_tokens = static_cast<std::uint32_t>(steps + 1);
        r.sampling.stop_at_eos = false;
        core.add(r, {[&](const token_event&) { ++produced; }, {}});
      }
      core.step(); // prefill and first token, not timed
      std::size_t before = produced;
      t0 = clock_type::now();
      run_until_idle(core);
      double decode_s = seconds_since(t0);
      std::printf("tp %d  decode batch %3llu: %8.1f tokens/s (%.2f ms/step)\n", tp, (unsigned long long)batch,
                  (produced - before) / decode_s, decode_s / steps * 1e3);
      std::fflush(stdout);
    }
  }
  return 0;
}

} // namespace

int cmd_bench(const arg_list& argv) {
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h") {
    std::cout << "usage: rlsync bench engine|sync|control [options]   (rlsync bench NAME --help)\n"
                 "  engine   the built-in engine: decode, prefill, applying an update\n"
                 "  sync     weight syncs of a topology, sharded and broadcast, against the speed of light\n"
                 "  control  the control plane alone: zero-byte rounds across N engine processes\n";
    return argv.empty() ? 2 : 0;
  }
  arg_list rest(argv.begin() + 1, argv.end());
  if (argv[0] == "engine")
    return bench_engine(rest);
  if (argv[0] == "sync")
    return bench_sync(rest);
  if (argv[0] == "control")
    return bench_control(rest);
  throw cli::usage_error("unknown benchmark '" + argv[0] + "' (available: engine, sync, control)");
}

} // namespace rlsync::tools
