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
    auto v = cli::parse_size(item, flag);
    if (v == 0)
      throw cli::usage_error(flag + ": values must be positive, got '" + text + "'");
    out.push_back(v);
  }
  if (out.empty())
    throw cli::usage_error(flag + ": expected a comma-separated list, got '" + text + "'");
  return out;
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
  auto steps = a.get_u64("steps", 32);
  auto prompt_tokens = a.get_u64("prompt", 512);
  if (steps == 0 || prompt_tokens == 0 || prompt_tokens >= 4000)
    throw cli::usage_error("--steps must be positive, --prompt in 1..3999");

  jobs::bench_engine_options o;
  o.model = c;
  o.tps.clear();
  for (auto tp : parse_list(a.get_or("tp", "1,2"), "--tp")) {
    o.tps.push_back(static_cast<int>(std::min<std::uint64_t>(tp, 1024)));
    for (auto& e : validate_tp(c, o.tps.back()))
      throw cli::usage_error("--tp " + std::to_string(tp) + ": " + e);
  }
  o.batches.clear();
  for (auto b : parse_list(a.get_or("batch", "1,8,32"), "--batch"))
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
