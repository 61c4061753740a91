// rlsync checkpoint make | inspect: synthetic checkpoints, next versions,
// and per-tensor checksums.
#include "runtime/base/checksum.hpp"
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

const char* make_usage =
    "usage: rlsync checkpoint make --out DIR --layers L --hidden H --heads A --kv-heads K --seed S\n"
    "                              [--intermediate I] [--vocab V] [--dtype bf16|f16|f32]\n"
    "                              [--max-positions N] [--tie] [--shard-bytes SIZE]\n"
    "       rlsync checkpoint make --from DIR --perturb SCALE --seed S --out DIR2\n"
    "\n"
    "The first form writes a seeded synthetic Llama-style checkpoint (config.json and\n"
    "safetensors, sharded with an index above --shard-bytes). The second writes the next\n"
    "version of DIR: every element becomes old + SCALE * noise(seed, tensor, index), with\n"
    "noise uniform in [-1, 1), rounded to the tensor's dtype (changes below half a unit in\n"
    "the last place are lost: a bf16 1.0 needs SCALE > 0.004). DIR2 must not exist (or be\n"
    "empty); it appears only once complete.\n"
    "\n"
    "  --out DIR            output directory\n"
    "  --layers L           num_hidden_layers\n"
    "  --hidden H           hidden_size\n"
    "  --heads A            num_attention_heads (must divide H; H/A even)\n"
    "  --kv-heads K         num_key_value_heads (must divide A)\n"
    "  --intermediate I     intermediate_size (default 8/3*H rounded up to a multiple of 64)\n"
    "  --vocab V            vocab_size, at least 258 (default 320)\n"
    "  --dtype T            bf16, f16 or f32 (default bf16)\n"
    "  --max-positions N    max_position_embeddings (default 2048)\n"
    "  --tie                tie_word_embeddings: no lm_head.weight\n"
    "  --shard-bytes SIZE   largest shard, e.g. 512MiB (default 4GiB)\n"
    "  --seed S             seed; same seed and shape, same bytes\n"
    "  --from DIR           checkpoint to perturb (with --perturb)\n"
    "  --perturb SCALE      perturbation scale (with --from)\n";

const char* inspect_usage =
    "usage: rlsync checkpoint inspect DIR [--json]\n"
    "\n"
    "Lists every tensor of checkpoint DIR: name, dtype, shape, bytes and the xxh3\n"
    "checksum of its bytes (XXH3 64-bit, seed 0, 16 hex digits: what xxhsum -H3\n"
    "prints for the same bytes), then the total. Warns when the tensors do not match\n"
    "the Llama layout config.json implies.\n"
    "\n"
    "  --json               one JSON object instead of the table\n";

// Flag for each config.json field validate() may name.
const std::pair<const char*, const char*> field_flags[] = {
  {"vocab_size", "--vocab"},           {"hidden_size", "--hidden"},
  {"intermediate_size", "--intermediate"}, {"num_hidden_layers", "--layers"},
  {"num_attention_heads", "--heads"},  {"num_key_value_heads", "--kv-heads"},
  {"max_position_embeddings", "--max-positions"},
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

std::int64_t dimension(const cli::args& a, const std::string& flag, std::optional<std::int64_t> fallback) {
  std::uint64_t v = fallback ? a.get_u64(flag, static_cast<std::uint64_t>(*fallback)) : a.required_u64(flag);
  if (v > (1u << 31)) // beyond any real model; keeps every size product far from overflow
    throw cli::usage_error("--" + flag + ": too large, got " + std::to_string(v));
  return static_cast<std::int64_t>(v);
}

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
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
  cli::args a(argv,
              {"out", "layers", "hidden", "heads", "kv-heads", "intermediate", "vocab", "dtype", "max-positions",
               "shard-bytes", "seed", "from", "perturb"},
              {"tie", "help"});
  if (a.has("help")) {
    std::cout << make_usage;
    return 0;
  }
  if (!a.positional().empty())
    throw cli::usage_error("make: unexpected argument '" + a.positional().front() + "'");
  std::string out = a.required("out");
  if (out.empty())
    throw cli::usage_error("--out: expected a directory, got ''");
  std::uint64_t seed = a.required_u64("seed");

  if (a.has("from") || a.has("perturb")) {
    std::string from = a.required("from");
    if (!a.has("perturb"))
      throw cli::usage_error("missing required flag --perturb (with --from)");
    double scale = a.get_double("perturb", 0.0);
    for (const char* flag : {"layers", "hidden", "heads", "kv-heads", "intermediate", "vocab", "dtype",
                             "max-positions", "tie", "shard-bytes"})
      if (a.has(flag))
        throw cli::usage_error(std::string("--") + flag + " cannot be combined with --from (the shape comes from "
                               + from + ")");
    print_written(perturb_checkpoint(from, out, scale, seed));
    return 0;
  }

  model_config c;
  c.num_hidden_layers = dimension(a, "layers", std::nullopt);
  c.hidden_size = dimension(a, "hidden", std::nullopt);
  c.num_attention_heads = dimension(a, "heads", std::nullopt);
  c.num_key_value_heads = dimension(a, "kv-heads", std::nullopt);
  // SwiGLU's usual 8/3 * hidden, rounded up to a multiple of 64 so that
  // tensor parallelism up to 64 can split it.
  std::int64_t default_inter = (c.hidden_size * 8 / 3 + 63) / 64 * 64;
  c.intermediate_size = dimension(a, "intermediate", std::max<std::int64_t>(default_inter, 64));
  c.vocab_size = dimension(a, "vocab", 320);
  c.max_position_embeddings = dimension(a, "max-positions", c.max_position_embeddings);
  c.tie_word_embeddings = a.has("tie");
  auto type = parse_short_dtype(a.get_or("dtype", "bf16"));
  if (!type)
    throw cli::usage_error("--dtype: expected bf16, f16 or f32, got '" + a.get_or("dtype", "") + "'");
  std::uint64_t shard_bytes = a.get_u64("shard-bytes", default_shard_bytes);
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
                       {checksum_algorithm, hex64(t.checksum)},
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
  std::cout << "checkpoint " << s.dir << ": layers=" << c.num_hidden_layers << " hidden=" << c.hidden_size
            << " heads=" << c.num_attention_heads << " kv_heads=" << c.num_key_value_heads
            << " intermediate=" << c.intermediate_size << " vocab=" << c.vocab_size
            << " tie=" << (c.tie_word_embeddings ? "true" : "false") << "\n";
  std::size_t name_w = 4, shape_w = 5;
  for (auto& t : s.tensors) {
    name_w = std::max(name_w, t.name.size());
    shape_w = std::max(shape_w, shape_string(t.shape).size());
  }
  auto pad = [](std::string x, std::size_t w) {
    x.resize(std::max(w, x.size()), ' ');
    return x;
  };
  std::cout << pad("name", name_w) << "  dtype  " << pad("shape", shape_w) << "  " << pad("bytes", 12)
            << "  " << checksum_algorithm << "\n";
  for (auto& t : s.tensors)
    std::cout << pad(t.name, name_w) << "  " << pad(std::string(safetensors_name(t.type)), 5) << "  "
              << pad(shape_string(t.shape), shape_w) << "  " << pad(std::to_string(t.bytes), 12) << "  "
              << hex64(t.checksum) << "\n";
  std::cout << "total: " << s.tensors.size() << " tensors, " << s.total_bytes << " bytes in " << s.files.size()
            << (s.files.size() == 1 ? " file" : " files") << "\n";
  for (auto& p : s.layout_problems)
    std::cout << "warning: not the Llama layout config.json implies: " << p << "\n";
}

int inspect(const arg_list& argv) {
  cli::args a(argv, {}, {"json", "help"});
  if (a.has("help")) {
    std::cout << inspect_usage;
    return 0;
  }
  if (a.positional().size() != 1)
    throw cli::usage_error(a.positional().empty() ? "inspect: missing checkpoint directory DIR"
                                                  : "inspect: unexpected argument '" + a.positional()[1] + "'");
  auto summary = inspect_checkpoint(a.positional().front());
  if (a.has("json"))
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
  throw cli::usage_error("unknown checkpoint subcommand '" + sub + "' (expected make or inspect)");
}

} // namespace rlsync::tools
