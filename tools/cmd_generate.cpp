// rlsync generate: the built-in engine, standalone, on a checkpoint directory.
#include "runtime/base/printable.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/engine/engine_core.hpp"
#include "runtime/engine/loader.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "gpu/engine_device.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <iostream>

namespace rlsync::tools {

namespace {

const char* description =
  "Runs the built-in engine on a checkpoint (config.json + safetensors) and\n"
  "streams the generated text. Greedy unless --temperature > 0 (seeded, top-p\n"
  "nucleus). Stops at EOS unless --no-stop. --json prints one object instead:\n"
  "prompt_token_ids, token_ids, text, finish_reason, version_spans, timings.";

// The logits of every position of `prompt`, one prefill through a model
// serving the engine's own weight set (its tp, expert placement and format),
// written raw for numerics checks against a reference. False (said on
// stderr) when the file cannot be written.
bool write_prompt_logits(const engine::engine_core& core, const std::vector<std::int32_t>& prompt,
                         const std::string& path) {
  const auto& o = core.options();
  engine::model m(core.config(), o.tp, o.source_dtype, o.expert_parallel);
  m.set_device(o.device); // the products where the engine runs them (a second device copy)
  m.set_weights(core.weights());
  auto seq = m.new_sequence();
  const auto out = m.forward({{&seq, prompt, 0, /*all_logits=*/true}});
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "--logits writes the host's floats as little-endian");
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(out.logits.data()),
          static_cast<std::streamsize>(out.logits.size() * sizeof(float)));
  if (!f.flush()) {
    std::cerr << "rlsync generate: --logits: cannot write " << printable(path) << "\n";
    return false;
  }
  return true;
}

} // namespace

int cmd_generate(const arg_list& argv) {
  CLI::App app(description, "rlsync generate");
  cli::configure(app);
  std::string dir, prompt;
  std::uint64_t max_tokens = 32, tp = 1, seed = 0;
  double temperature = 0.0, top_p = 1.0;
  auto dir_flag = app.add_option("--checkpoint", dir, "checkpoint directory (required)")->type_name("DIR");
  auto prompt_flag = app.add_option("--prompt", prompt, "prompt text (required)")->type_name("TEXT");
  cli::add_count(app, "--max-tokens", max_tokens, "tokens to generate, 1..1048576")->default_val(max_tokens);
  cli::add_count(app, "--tp", tp, "tensor-parallel degree, 1..64")->default_val(tp);
  auto ep_flag = app.add_flag("--expert-parallel", "place whole experts over the tp workers (MoE models)");
  std::string weights_flag = "received";
  app.add_option("--weights", weights_flag, "serve from the weights as received, or int8 computed from them")
    ->default_val(weights_flag)
    ->type_name("received|int8");
  std::string device_flag = "cpu";
  app.add_option("--device", device_flag, "run the matrix products on the CPU, or on CUDA device 0 (cuBLAS)")
    ->default_val(device_flag)
    ->type_name("cpu|cuda");
  cli::add_number(app, "--temperature", temperature, "0 is greedy")->default_val(temperature);
  cli::add_number(app, "--top-p", top_p, "nucleus sampling, in (0, 1]")->default_val(top_p);
  cli::add_count(app, "--seed", seed, "sampling seed")->default_val(seed);
  auto no_stop = app.add_flag("--no-stop", "do not stop at EOS");
  auto json_flag = app.add_flag("--json", "print one JSON object");
  std::string logits_file;
  auto logits_flag =
    app.add_option("--logits", logits_file,
                   "also write the logits of every prompt position to FILE (float32, little-endian, "
                   "[prompt tokens, vocab]), from the engine's own weights")
      ->type_name("FILE");
  if (!cli::parse(app, argv))
    return 0;
  cli::require(dir_flag);
  cli::require(prompt_flag);
  if (max_tokens == 0 || max_tokens > 1u << 20)
    throw cli::usage_error("--max-tokens: must be in 1..1048576");
  if (tp == 0 || tp > 64)
    throw cli::usage_error("--tp: must be in 1..64");
  // Checked as read, before they are narrowed to floats.
  if (!(temperature >= 0 && temperature <= topology_limits::max_temperature))
    throw cli::usage_error("--temperature: must be in [0, 100]");
  if (!(top_p >= topology_limits::min_top_p && top_p <= 1))
    throw cli::usage_error("--top-p: must be in (0, 1] (at least a float's smallest normal value)");
  sampling_params sampling;
  sampling.max_tokens = static_cast<std::uint32_t>(max_tokens);
  sampling.temperature = static_cast<float>(temperature);
  sampling.top_p = static_cast<float>(top_p);
  sampling.seed = seed;
  sampling.stop_at_eos = no_stop->count() == 0;

  auto t0 = std::chrono::steady_clock::now();
  auto ckpt = checkpoint::open(dir);
  const dtype weights_dtype = checkpoint_dtype(ckpt);
  auto problems = check_llama_parameters(ckpt, ckpt.config(), weights_dtype, [&](const std::string& n) {
    return ignored_weight(ckpt.config(), n);
  });
  if (!problems.empty()) {
    for (auto& p : problems)
      std::cerr << "rlsync generate: " << dir << ": " << p << "\n";
    return 1;
  }
  const auto& config = ckpt.config();
  const bool expert_parallel = ep_flag->count() > 0;
  const auto format = engine::weight_format_of(weights_flag);
  if (!format)
    throw cli::usage_error("--weights: expected received or int8, got '" + printable(weights_flag) + "'");
  for (auto& e : validate_tp(config, static_cast<std::int64_t>(tp), expert_parallel))
    throw cli::usage_error((e.rfind("expert parallelism", 0) == 0 ? "--expert-parallel: " : "--tp: ") + e);
  if (device_flag != "cpu" && device_flag != "cuda")
    throw cli::usage_error("--device: expected cpu or cuda, got '" + printable(device_flag) + "'");
  engine::engine_options opts;
  if (device_flag == "cuda") {
    try {
      opts.device = gpu::make_engine_device(0);
    } catch (const std::exception& e) {
      std::cerr << "rlsync generate: --device cuda: " << e.what() << "\n";
      return 1;
    }
  }
  opts.name = "generate";
  opts.tp = static_cast<int>(tp);
  opts.expert_parallel = expert_parallel;
  opts.weights = *format;
  opts.source_dtype = weights_dtype;
  engine::engine_core core(config, opts);
  auto weights = engine::weight_set::make(config, opts.tp, weights_dtype, expert_parallel);
  engine::load_checkpoint(ckpt, *weights);
  core.load(std::move(weights), 0);
  auto t_loaded = std::chrono::steady_clock::now();

  generate_request req;
  req.request_id = 1;
  req.prompt = engine::encode(prompt);
  req.sampling = sampling;
  const bool json = json_flag->count() > 0;
  std::vector<std::int32_t> tokens;
  std::optional<generate_result> result;
  std::optional<std::chrono::steady_clock::time_point> first_token;
  auto failed = core.add(req, {[&](const token_event& e) {
                                 if (!first_token)
                                   first_token = std::chrono::steady_clock::now();
                                 tokens.push_back(e.token);
                                 if (!json && e.token < 256)
                                   std::cout << static_cast<char>(e.token) << std::flush;
                               },
                               [&](generate_result r) { result = std::move(r); }});
  if (failed) {
    std::cerr << "rlsync generate: " << failed->what << "\n";
    return 1;
  }
  // After add(), which refused a prompt the model cannot take.
  if (logits_flag->count() > 0 && !write_prompt_logits(core, req.prompt, logits_file))
    return 1;
  // Bounded: every step produces a token or advances a prefill chunk.
  for (std::uint64_t i = 0; core.has_work() && i < 4 * (max_tokens + req.prompt.size()) + 16; ++i)
    core.step();
  auto t_done = std::chrono::steady_clock::now();
  if (!result) {
    std::cerr << "rlsync generate: the engine stopped without finishing the request\n";
    return 1;
  }
  if (core.nonfinite_logits() > 0) {
    std::cerr << (json ? "" : "\n") << "rlsync generate: error: the model produced NaN or infinite logits after "
              << tokens.size() << " tokens: " << printable(dir) << " holds broken weights\n";
    return 1;
  }
  auto secs = [](auto from, auto to) { return std::chrono::duration<double>(to - from).count(); };
  double decode_s = first_token ? secs(*first_token, t_done) : 0;
  if (json) {
    using nlohmann::ordered_json; // ordered: fields stay in the order listed
    ordered_json spans = ordered_json::array();
    for (auto& span : result->spans)
      spans.push_back({{"version", span.version}, {"start", span.begin}, {"end", span.end}});
    ordered_json out = {{"prompt_token_ids", req.prompt},
                        {"token_ids", tokens},
                        {"text", engine::to_valid_utf8(engine::decode(tokens))},
                        {"finish_reason", to_string(result->reason)},
                        {"version_spans", std::move(spans)},
                        {"tp", tp},
                        {"expert_parallel", expert_parallel},
                        {"weights", engine::to_string(*format)},
                        {"device", opts.device ? opts.device->name() : std::string("cpu")},
                        {"load_seconds", secs(t0, t_loaded)},
                        {"generate_seconds", secs(t_loaded, t_done)}};
    std::cout << out.dump() << "\n"; // one line; text is valid UTF-8 already
  } else {
    std::cout << "\n";
    std::cerr << "[" << tokens.size() << " tokens, " << to_string(result->reason) << ", tp " << tp
              << (expert_parallel ? " (expert-parallel)" : "") << (*format == engine::weight_format::int8 ? ", int8" : "")
              << (opts.device ? ", " + opts.device->name() : std::string())
              << ", load " << secs(t0, t_loaded) << " s, "
              << (decode_s > 0 ? (tokens.size() - 1) / decode_s : 0.0) << " tokens/s]\n";
  }
  return 0;
}

} // namespace rlsync::tools
