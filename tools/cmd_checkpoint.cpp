// rlsync checkpoint make | inspect: synthetic checkpoints, next versions,
// and per-tensor checksums.
#include "runtime/base/checksum.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/config/model_config.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <iostream>

namespace rlsync::tools {

namespace {

const char* checkpoint_usage =
    "usage: rlsync checkpoint make ...      write a synthetic or perturbed checkpoint\n"
    "       rlsync checkpoint inspect DIR   list tensors with checksums\n"
    "\nRun 'rlsync checkpoint make --help' or 'rlsync checkpoint inspect --help' for options.\n";

const char* make_description =
    "Two forms:\n"
    "  rlsync checkpoint make --out DIR --layers L --hidden H --heads A --kv-heads K --seed S [...]\n"
    "  rlsync checkpoint make --from DIR --perturb SCALE --seed S --out DIR2\n"
    "\n"
    "The first writes a seeded synthetic checkpoint (config.json and safetensors, sharded\n"
    "with an index above --shard-bytes) of a Llama (--arch llama, the default), a Qwen3\n"
    "(--arch qwen3: per-head q/k norms, --head-dim D, by default H/A) or a Qwen3-MoE\n"
    "(--arch qwen3_moe: as qwen3, every layer's MLP --experts E SwiGLU experts of\n"
    "--moe-intermediate M, --experts-per-tok K chosen per token). The second writes the next\n"
    "version of DIR: every element becomes old + SCALE * noise(seed, tensor, index), with\n"
    "noise uniform in [-1, 1), rounded to the tensor's dtype (changes below half a unit in\n"
    "the last place are lost: a bf16 1.0 needs SCALE > 0.004). DIR2 must not exist (or be\n"
    "empty); it appears only once complete.";

const char* inspect_description =
    "Lists every tensor of checkpoint DIR: name, dtype, shape, bytes and the xxh3\n"
    "checksum of its bytes (XXH3 64-bit, seed 0, 16 hex digits: what xxhsum -H3\n"
    "prints for the same bytes), then the total. Warns when the tensors do not match\n"
    "the layout config.json implies (its model_type: llama or qwen3).";

// Flag for each config.json field validate() may name.
const std::pair<const char*, const char*> field_flags[] = {
  {"vocab_size", "--vocab"},           {"hidden_size", "--hidden"},
  {"intermediate_size", "--intermediate"}, {"num_hidden_layers", "--layers"},
  {"num_attention_heads", "--heads"},  {"num_key_value_heads", "--kv-heads"},
  {"max_position_embeddings", "--max-positions"}, {"head_dim", "--head-dim"},
  {"num_experts", "--experts"}, {"num_experts_per_tok", "--experts-per-tok"},
  {"moe_intermediate_size", "--moe-intermediate"},
};

// "num_key_value_heads: must divide ..." -> "--kv-heads: must divide ..."
std::string name_flag(const std::string& message) {
  for (auto& [field, flag] : field_flags) {
    std::string prefix = std::string(field) + ":";
    if (message.compare(0, prefix.size(), prefix) == 0)
      return flag + message.substr(std::string(field).size());
  }
  return message;
}

// A model dimension flag: its value, `fallback` when not given (required
// when there is none).
std::int64_t dimension(const CLI::Option* flag, std::uint64_t value, std::optional<std::int64_t> fallback) {
  if (flag->count() == 0) {
    if (!fallback)
      cli::require(flag);
    return *fallback;
  }
  if (value > (1u << 31)) // beyond any real model; keeps every size product far from overflow
    throw cli::usage_error(flag->get_name() + ": too large, got " + std::to_string(value));
  return static_cast<std::int64_t>(value);
}

void print_written(const checkpoint_written& w) {
  double gbps = w.seconds > 0 ? static_cast<double>(w.bytes) / w.seconds / 1e9 : 0.0;
  char line[256];
  std::snprintf(line, sizeof line, "%zu file%s, %zu tensors, %" PRIu64 " bytes in %.2f s (%.2f GB/s)",
                w.files.size(), w.files.size() == 1 ? "" : "s", w.tensors, w.bytes, w.seconds, gbps);
  std::cout << "wrote " << w.dir << ": " << line << "\n";
  for (auto& f : w.files)
    std::cout << "  " << f << "\n";
}

int make(const arg_list& argv) {
  CLI::App app(make_description, "rlsync checkpoint make");
  cli::configure(app);
  std::string out, from, dtype = "bf16", arch = "llama", expert_layout = "separate";
  std::uint64_t seed = 0, shard_bytes = default_shard_bytes;
  std::uint64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, intermediate = 0, vocab = 0, max_positions = 0;
  std::uint64_t head_dim = 0, experts = 0, experts_per_tok = 0, moe_intermediate = 0;
  double scale = 0.0;
  auto out_flag = app.add_option("--out", out, "output directory")->type_name("DIR");
  auto layers_flag = cli::add_count(app, "--layers", layers, "num_hidden_layers");
  auto hidden_flag = cli::add_count(app, "--hidden", hidden, "hidden_size");
  auto heads_flag = cli::add_count(app, "--heads", heads, "num_attention_heads (must divide H; H/A even)");
  auto kv_heads_flag = cli::add_count(app, "--kv-heads", kv_heads, "num_key_value_heads (must divide A)");
  auto intermediate_flag = cli::add_count(app, "--intermediate", intermediate,
                                         "intermediate_size (default 8/3*H rounded up to a multiple of 64)");
  auto vocab_flag = cli::add_count(app, "--vocab", vocab, "vocab_size, at least 258")->default_str("320");
  auto dtype_flag = app.add_option("--dtype", dtype, "bf16, f16 or f32")->capture_default_str();
  auto arch_flag = app.add_option("--arch", arch, "llama, qwen3 or qwen3_moe")->capture_default_str();
  auto head_dim_flag = cli::add_count(app, "--head-dim", head_dim, "head_dim (qwen3 only; default H/A)");
  auto experts_flag = cli::add_count(app, "--experts", experts, "num_experts (qwen3_moe)");
  auto experts_per_tok_flag = cli::add_count(app, "--experts-per-tok", experts_per_tok,
                                            "num_experts_per_tok (qwen3_moe, default 2)");
  auto moe_intermediate_flag = cli::add_count(app, "--moe-intermediate", moe_intermediate,
                                             "moe_intermediate_size (qwen3_moe, default I/4)");
  auto expert_layout_flag =
    app.add_option("--expert-layout", expert_layout,
                   "qwen3_moe: separate (mlp.experts.{e}.*_proj.weight) or fused (mlp.experts.gate_up_proj and "
                   "down_proj, every expert in one tensor, as Llama-4)")
      ->capture_default_str();
  model_config c;
  auto max_positions_flag = cli::add_count(app, "--max-positions", max_positions, "max_position_embeddings")
                              ->default_val(c.max_position_embeddings);
  auto tie_flag = app.add_flag("--tie", "tie_word_embeddings: no lm_head.weight");
  auto shard_bytes_flag =
    cli::add_size(app, "--shard-bytes", shard_bytes, "largest shard, e.g. 512MiB")->default_str("4GiB");
  auto seed_flag = cli::add_count(app, "--seed", seed, "seed; same seed and shape, same bytes");
  auto from_flag = app.add_option("--from", from, "checkpoint to perturb (with --perturb)")->type_name("DIR");
  auto perturb_flag = cli::add_number(app, "--perturb", scale, "perturbation scale (with --from)")->type_name("SCALE");
  if (!cli::parse(app, argv))
    return 0;
  cli::require(out_flag);
  if (out.empty())
    throw cli::usage_error("--out: expected a directory, got ''");
  cli::require(seed_flag);

  if (from_flag->count() > 0 || perturb_flag->count() > 0) {
    cli::require(from_flag);
    if (perturb_flag->count() == 0)
      throw cli::usage_error("missing required flag --perturb (with --from)");
    for (const CLI::Option* shape_flag : {layers_flag, hidden_flag, heads_flag, kv_heads_flag, intermediate_flag,
                                          vocab_flag, dtype_flag, max_positions_flag, tie_flag, shard_bytes_flag,
                                          arch_flag, head_dim_flag, experts_flag, experts_per_tok_flag,
                                          moe_intermediate_flag, expert_layout_flag})
      if (shape_flag->count() > 0)
        throw cli::usage_error(shape_flag->get_name() + " cannot be combined with --from (the shape comes from "
                               + from + ")");
    print_written(perturb_checkpoint(from, out, scale, seed));
    return 0;
  }

  auto parsed_arch = arch_of_model_type(arch);
  if (!parsed_arch)
    throw cli::usage_error("--arch: expected llama, qwen3 or qwen3_moe, got '" + printable(arch) + "'");
  c.arch = *parsed_arch;
  if (head_dim_flag->count() > 0 && !c.qk_norm())
    throw cli::usage_error("--head-dim: only with --arch qwen3 or qwen3_moe (a llama's head_dim is H/A)");
  for (const CLI::Option* moe_flag : {experts_flag, experts_per_tok_flag, moe_intermediate_flag, expert_layout_flag})
    if (moe_flag->count() > 0 && c.arch != model_arch::qwen3_moe)
      throw cli::usage_error(moe_flag->get_name() + ": only with --arch qwen3_moe");
  if (head_dim_flag->count() > 0)
    c.explicit_head_dim = dimension(head_dim_flag, head_dim, std::nullopt);
  c.num_hidden_layers = dimension(layers_flag, layers, std::nullopt);
  c.hidden_size = dimension(hidden_flag, hidden, std::nullopt);
  c.num_attention_heads = dimension(heads_flag, heads, std::nullopt);
  c.num_key_value_heads = dimension(kv_heads_flag, kv_heads, std::nullopt);
  // SwiGLU's usual 8/3 * hidden, rounded up to a multiple of 64 so that
  // tensor parallelism up to 64 can split it.
  std::int64_t default_inter = (c.hidden_size * 8 / 3 + 63) / 64 * 64;
  c.intermediate_size = dimension(intermediate_flag, intermediate, std::max<std::int64_t>(default_inter, 64));
  c.vocab_size = dimension(vocab_flag, vocab, 320);
  c.max_position_embeddings = dimension(max_positions_flag, max_positions, c.max_position_embeddings);
  c.tie_word_embeddings = tie_flag->count() > 0;
  if (c.arch == model_arch::qwen3_moe) {
    c.num_experts = dimension(experts_flag, experts, std::nullopt);
    c.num_experts_per_tok = dimension(experts_per_tok_flag, experts_per_tok, 2);
    c.moe_intermediate_size =
      dimension(moe_intermediate_flag, moe_intermediate, std::max<std::int64_t>(c.intermediate_size / 4, 1));
    if (expert_layout != "separate" && expert_layout != "fused")
      throw cli::usage_error("--expert-layout: expected separate or fused, got '" + printable(expert_layout) + "'");
    c.fused_experts = expert_layout == "fused";
  }
  auto type = parse_short_dtype(dtype);
  if (!type)
    throw cli::usage_error("--dtype: expected bf16, f16 or f32, got '" + dtype + "'");
  if (shard_bytes == 0)
    throw cli::usage_error("--shard-bytes: must be positive");
  if (auto errs = validate(c); !errs.empty())
    throw cli::usage_error(name_flag(errs.front()));
  print_written(make_synthetic_checkpoint(out, c, *type, seed, shard_bytes));
  return 0;
}

void print_json(const checkpoint_summary& s) {
  using nlohmann::ordered_json; // ordered: fields stay in the order listed
  ordered_json tensors = ordered_json::array();
  for (auto& t : s.tensors)
    tensors.push_back({{"name", t.name},
                       {"dtype", safetensors_name(t.type)},
                       {"shape", t.shape},
                       {"bytes", t.bytes},
                       {checksum_algorithm, checksum_hex(t.checksum)},
                       {"file", t.file}});
  ordered_json summary = {{"dir", s.dir},
                          {"files", s.files},
                          {"tensors", std::move(tensors)},
                          {"total_bytes", s.total_bytes},
                          {"layout_problems", s.layout_problems}};
  // One line; a path that is not UTF-8 gets U+FFFD rather than failing.
  std::cout << summary.dump(-1, ' ', false, ordered_json::error_handler_t::replace) << "\n";
}

void print_table(const checkpoint_summary& s) {
  auto& c = s.config;
  std::cout << "checkpoint " << printable(s.dir) << ": arch=" << to_string(c.arch)
            << " layers=" << c.num_hidden_layers << " hidden=" << c.hidden_size
            << " heads=" << c.num_attention_heads << " kv_heads=" << c.num_key_value_heads
            << " head_dim=" << c.head_dim()
            << (c.arch == model_arch::qwen3_moe ? " experts=" + std::to_string(c.num_experts) + " per_tok="
                                                    + std::to_string(c.num_experts_per_tok) + " moe_intermediate="
                                                    + std::to_string(c.moe_intermediate_size)
                                                : std::string{})
            << " intermediate=" << c.intermediate_size << " vocab=" << c.vocab_size
            << " tie=" << (c.tie_word_embeddings ? "true" : "false") << "\n";
  std::size_t name_w = 4, shape_w = 5;
  // Tensor names come from the file: control characters are escaped.
  std::vector<std::string> names;
  for (auto& t : s.tensors) {
    names.push_back(printable(t.name));
    name_w = std::max(name_w, names.back().size());
    shape_w = std::max(shape_w, shape_string(t.shape).size());
  }
  auto pad = [](std::string x, std::size_t w) {
    x.resize(std::max(w, x.size()), ' ');
    return x;
  };
  std::cout << pad("name", name_w) << "  dtype  " << pad("shape", shape_w) << "  " << pad("bytes", 12)
            << "  " << checksum_algorithm << "\n";
  for (std::size_t i = 0; i < s.tensors.size(); ++i) {
    const auto& t = s.tensors[i];
    std::cout << pad(names[i], name_w) << "  " << pad(std::string(safetensors_name(t.type)), 5) << "  "
              << pad(shape_string(t.shape), shape_w) << "  " << pad(std::to_string(t.bytes), 12) << "  "
              << checksum_hex(t.checksum) << "\n";
  }
  std::cout << "total: " << s.tensors.size() << " tensors, " << s.total_bytes << " bytes in " << s.files.size()
            << (s.files.size() == 1 ? " file" : " files") << "\n";
  for (auto& p : s.layout_problems)
    std::cout << "warning: not the " << (c.arch == model_arch::llama ? "Llama" : c.qk_norm() && c.num_experts == 0 ? "Qwen3" : "Qwen3-MoE")
              << " layout config.json implies: " << printable(p, 1024) << "\n";
}

int inspect(const arg_list& argv) {
  CLI::App app(inspect_description, "rlsync checkpoint inspect");
  cli::configure(app);
  std::vector<std::string> dirs;
  app.add_option("DIR", dirs, "the checkpoint directory");
  auto json = app.add_flag("--json", "one JSON object instead of the table");
  if (!cli::parse(app, argv))
    return 0;
  if (dirs.size() != 1)
    throw cli::usage_error(dirs.empty() ? "inspect: missing checkpoint directory DIR"
                                        : "inspect: unexpected argument '" + printable(dirs[1]) + "'");
  auto summary = inspect_checkpoint(dirs.front());
  if (json->count() > 0)
    print_json(summary);
  else
    print_table(summary);
  return 0;
}

} // namespace

int cmd_checkpoint(const arg_list& argv) {
  if (argv.empty())
    throw cli::usage_error("expected 'make' or 'inspect'\n" + std::string(checkpoint_usage));
  const std::string& sub = argv.front();
  arg_list rest(argv.begin() + 1, argv.end());
  if (sub == "--help" || sub == "-h" || sub == "help") {
    std::cout << checkpoint_usage;
    return 0;
  }
  if (sub == "make")
    return make(rest);
  if (sub == "inspect")
    return inspect(rest);
  throw cli::usage_error("unknown checkpoint subcommand '" + printable(sub) + "' (expected make or inspect)");
}

} // namespace rlsync::tools
