// rlsync bench: figures, never pass/fail. `engine` measures the built-in
// engine: decode and prefill throughput and the time to apply a full update.
#include "actors/jobs/bench_engine.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <algorithm>
#include <iostream>
#include <sstream>

namespace rlsync::tools {

namespace {

std::vector<std::uint64_t> parse_list(const std::string& text, const std::string& flag) {
  std::vector<std::uint64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    auto v = cli::parse_count(item, flag);
    if (v == 0)
      throw cli::usage_error(flag + ": values must be positive, got '" + text + "'");
    out.push_back(v);
  }
  if (out.empty())
    throw cli::usage_error(flag + ": expected a comma-separated list, got '" + text + "'");
  return out;
}

int bench_engine(const arg_list& argv) {
  CLI::App app("Decode tokens/s at each batch size, prefill tokens/s, and the time to apply a full\n"
               "weight update (full tensors through the loader, and plan-packed shards), on seeded\n"
               "random bf16 weights (default: a ~50M-parameter Llama).",
               "rlsync bench engine");
  cli::configure(app);
  std::uint64_t layers = 16, hidden = 512, heads = 8, kv_heads = 4, intermediate = 1536, vocab = 320;
  std::uint64_t steps = 32, prompt_tokens = 512;
  std::string tps = "1,2", batches = "1,8,32";
  cli::add_count(app, "--layers", layers, "num_hidden_layers")->default_val(layers);
  cli::add_count(app, "--hidden", hidden, "hidden_size")->default_val(hidden);
  cli::add_count(app, "--heads", heads, "num_attention_heads")->default_val(heads);
  cli::add_count(app, "--kv-heads", kv_heads, "num_key_value_heads")->default_val(kv_heads);
  cli::add_count(app, "--intermediate", intermediate, "intermediate_size")->default_val(intermediate);
  cli::add_count(app, "--vocab", vocab, "vocab_size")->default_val(vocab);
  app.add_option("--tp", tps, "tensor-parallel degrees, comma-separated")->capture_default_str();
  app.add_option("--batch", batches, "decode batch sizes, comma-separated")->capture_default_str();
  cli::add_count(app, "--steps", steps, "decode steps per batch size")->default_val(steps);
  cli::add_count(app, "--prompt", prompt_tokens, "prefill prompt tokens, 1..3999")->default_val(prompt_tokens);
  if (!cli::parse(app, argv))
    return 0;
  model_config c;
  c.num_hidden_layers = static_cast<std::int64_t>(layers);
  c.hidden_size = static_cast<std::int64_t>(hidden);
  c.num_attention_heads = static_cast<std::int64_t>(heads);
  c.num_key_value_heads = static_cast<std::int64_t>(kv_heads);
  c.intermediate_size = static_cast<std::int64_t>(intermediate);
  c.vocab_size = static_cast<std::int64_t>(vocab);
  c.max_position_embeddings = 4096;
  for (auto& e : validate(c))
    throw cli::usage_error("model shape: " + e);
  if (steps == 0 || steps > 1'000'000 || prompt_tokens == 0 || prompt_tokens >= 4000)
    throw cli::usage_error("--steps must be in 1..1000000, --prompt in 1..3999");

  jobs::bench_engine_options o;
  o.model = c;
  o.tps.clear();
  for (auto tp : parse_list(tps, "--tp")) {
    o.tps.push_back(static_cast<int>(std::min<std::uint64_t>(tp, 1024)));
    for (auto& e : validate_tp(c, o.tps.back()))
      throw cli::usage_error("--tp " + std::to_string(tp) + ": " + e);
  }
  o.batches.clear();
  for (auto b : parse_list(batches, "--batch"))
    o.batches.push_back(static_cast<std::uint32_t>(std::min<std::uint64_t>(b, 4096)));
  o.steps = static_cast<std::uint32_t>(steps);
  o.prompt_tokens = static_cast<std::uint32_t>(prompt_tokens);
  try {
    jobs::run_bench_engine(o, &std::cout);
  } catch (const std::invalid_argument& e) {
    throw cli::usage_error(e.what());
  } catch (const std::runtime_error& e) {
    std::cerr << "rlsync bench engine: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

} // namespace

int cmd_bench(const arg_list& argv) {
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h") {
    std::cout << "usage: rlsync bench engine|sync|control|http [options]   (rlsync bench NAME --help)\n"
                 "  engine   the built-in engine: decode, prefill, applying an update\n"
                 "  sync     weight syncs of a topology, sharded and broadcast, against the speed of light\n"
                 "  control  the control plane alone: zero-byte rounds across N engine processes\n"
                 "  http     streaming throughput through the fleet's HTTP endpoint vs the direct path\n";
    return argv.empty() ? 2 : 0;
  }
  arg_list rest(argv.begin() + 1, argv.end());
  if (argv[0] == "engine")
    return bench_engine(rest);
  if (argv[0] == "sync")
    return bench_sync(rest);
  if (argv[0] == "control")
    return bench_control(rest);
  if (argv[0] == "http")
    return bench_http(rest);
  throw cli::usage_error("unknown benchmark '" + argv[0] + "' (available: engine, sync, control, http)");
}

} // namespace rlsync::tools
