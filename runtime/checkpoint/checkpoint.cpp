// Checkpoint directories: open (read into memory, cross-checked against the index),
// synthetic make, perturb, inspect.
#include "runtime/checkpoint/checkpoint.hpp"

#include "runtime/base/checksum.hpp"

#include "runtime/base/json.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/base/regular_file.hpp"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <set>

#include <fcntl.h>
#include <unistd.h>

namespace rlsync {

namespace {

namespace fs = std::filesystem;

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

const std::string embed_tensor_name = "model.embed_tokens.weight";

// A checkpoint's dtype is its embedding's; where it has none, its first tensor's. Other tensors
// (an f32 rotary inv_freq beside bf16 weights) do not decide it.
template <class Range, class Name, class Type>
dtype dtype_by_embedding(const Range& tensors, Name name_of, Type type_of) {
  for (const auto& t : tensors)
    if (name_of(t) == embed_tensor_name)
      return type_of(t);
  return type_of(*std::begin(tensors));
}

std::string errno_text() { return std::strerror(errno); }

std::string read_small_file(const std::string& path, std::uint64_t limit) {
  try {
    return read_regular_file(path, static_cast<std::size_t>(limit));
  } catch (const file_error& e) {
    throw checkpoint_error(e.what());
  }
}

bool is_plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos
         && s.find('\0') == std::string::npos;
}

// model.safetensors.index.json -> tensor name -> file name.
std::map<std::string, std::string> read_index(const std::string& path) {
  using nlohmann::json;
  auto fail = [&](const std::string& what) -> void { throw checkpoint_error(path + ": " + what); };
  std::string text = read_small_file(path, safetensors_max_header);
  // An index nests 3 deep; each weight_map entry is one value.
  const json_read_limits limits{8, 4'000'000};
  auto duplicate = [](const std::vector<std::string>& at, const std::string& key) -> std::string {
    if (at.empty() && key == "weight_map")
      return "weight_map appears twice";
    if (at.size() == 1 && at[0] == "weight_map")
      return "weight_map: tensor '" + printable(key) + "' listed twice";
    return "";
  };
  json root;
  try {
    root = read_json_strict(text, limits, duplicate);
  } catch (const json_read_error& e) {
    fail(e.what());
  }
  if (!root.is_object())
    fail("expected a JSON object, got " + json_describe(root));
  if (auto metadata = root.find("metadata"); metadata != root.end()) {
    // Hugging Face writes {"total_size": N}; checked for type only, as
    // writers disagree on what it counts (tied and shared storage).
    if (!metadata->is_object())
      fail("metadata: expected an object, got " + json_describe(*metadata));
    if (auto total = metadata->find("total_size"); total != metadata->end() && !total->is_number_unsigned())
      fail("metadata: total_size: expected a non-negative integer, got " + json_describe(*total));
  }
  auto weight_map = root.find("weight_map");
  if (weight_map == root.end())
    fail("missing field 'weight_map'");
  if (!weight_map->is_object() || weight_map->empty())
    fail("weight_map: expected a non-empty object of tensor name -> file name, got "
         + (weight_map->is_object() ? std::string("an empty object") : json_describe(*weight_map)));
  std::map<std::string, std::string> out;
  for (auto& [name, file] : weight_map->items()) {
    if (name.empty())
      fail("weight_map: a tensor with an empty name");
    if (!file.is_string())
      fail("weight_map: '" + printable(name) + "': expected a file name, got " + json_describe(file));
    const auto& file_name = file.get_ref<const std::string&>();
    if (!is_plain_file_name(file_name))
      fail("weight_map: '" + printable(name) + "': '" + printable(file_name) + "' is not a plain file name in the checkpoint directory");
    out.emplace(name, file_name); // read_json_strict refused duplicate names
  }
  return out;
}

// ---- deterministic values -------------------------------------------------

// splitmix64's output function: a bijective 64-bit mixer.
inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr std::uint64_t golden = 0x9E3779B97F4A7C15ull;
constexpr std::uint64_t perturb_domain = 0x7065727475726221ull; // "perturb!": noise differs from make

inline float unit_from(std::uint32_t bits) { // [-1, 1)
  return static_cast<float>(static_cast<std::int32_t>(bits)) * 0x1p-31f;
}

// Uniform [-1, 1) for elements [first, first + count) of the stream `key`.
// Element i takes one half of mix64(key + (i/2 + 1) * golden): one mix per two
// elements, and the value of i does not depend on where a chunk starts.
void uniform_stream(std::uint64_t key, std::uint64_t first, std::size_t count, float* out) {
  std::uint64_t i = first;
  std::size_t n = count;
  if (n > 0 && (i & 1)) {
    *out++ = unit_from(static_cast<std::uint32_t>(mix64(key + ((i >> 1) + 1) * golden) >> 32));
    ++i;
    --n;
  }
  for (; n >= 2; n -= 2, i += 2, out += 2) {
    std::uint64_t r = mix64(key + ((i >> 1) + 1) * golden);
    out[0] = unit_from(static_cast<std::uint32_t>(r));
    out[1] = unit_from(static_cast<std::uint32_t>(r >> 32));
  }
  if (n > 0)
    *out = unit_from(static_cast<std::uint32_t>(mix64(key + ((i >> 1) + 1) * golden)));
}

std::uint64_t tensor_key(const std::string& name, std::uint64_t seed) {
  return checksum64(name.data(), name.size(), seed);
}

// ---- writing directories --------------------------------------------------

// A temporary sibling of the output directory, renamed into place by
// commit() and removed otherwise: readers never see a partial checkpoint.
class staged_dir {
public:
  explicit staged_dir(std::string out) : out_(std::move(out)) {
    while (out_.size() > 1 && out_.back() == '/')
      out_.pop_back();
    if (out_.empty())
      throw checkpoint_error("output directory: empty path");
    std::error_code ec;
    if (fs::exists(out_, ec) && !(fs::is_directory(out_, ec) && fs::is_empty(out_, ec)))
      throw checkpoint_error(out_ + ": already exists (write a new checkpoint to a new directory)");
    fs::path parent = fs::path(out_).parent_path();
    if (!parent.empty()) {
      fs::create_directories(parent, ec);
      if (ec)
        throw checkpoint_error(parent.string() + ": cannot create directory: " + ec.message());
    }
    static std::atomic<unsigned> counter{0};
    tmp_ = out_ + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    fs::remove_all(tmp_, ec);
    if (!fs::create_directory(tmp_, ec) || ec)
      throw checkpoint_error(tmp_ + ": cannot create directory: " + ec.message());
  }
  staged_dir(const staged_dir&) = delete;
  staged_dir& operator=(const staged_dir&) = delete;
  ~staged_dir() {
    if (!committed_) {
      std::error_code ec;
      fs::remove_all(tmp_, ec);
    }
  }

  const std::string& path() const { return tmp_; }
  const std::string& final_path() const { return out_; }

  void commit() {
    sync_dir(tmp_);
    // rename(2) replaces an empty directory atomically and fails on a full one.
    if (::rename(tmp_.c_str(), out_.c_str()) != 0)
      throw checkpoint_error(out_ + ": cannot move " + tmp_ + " into place: " + errno_text());
    committed_ = true;
    fs::path parent = fs::path(out_).parent_path();
    sync_dir(parent.empty() ? "." : parent.string());
  }

private:
  static void sync_dir(const std::string& dir) {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
      ::fsync(fd); // best effort: some filesystems refuse fsync on directories
      ::close(fd);
    }
  }

  std::string out_;
  std::string tmp_;
  bool committed_ = false;
};

// Streams one tensor into `w`. fill(first, count, values, scratch) produces
// elements [first, first + count) as f32 in `values` (`scratch`: as many
// floats, its own to use); they are converted to spec.type and written.
// The next chunk is produced on another thread while this one is written, so
// generation and I/O overlap; memory stays at two chunks.
using fill_fn = std::function<void(std::uint64_t, std::size_t, float*, float*)>;

struct chunk_slot {
  std::vector<float> values, scratch;
  std::vector<unsigned char> bytes;
};

void stream_tensor(safetensors_writer& w, const tensor_spec& spec, std::size_t chunk, const fill_fn& fill,
                   chunk_slot (&slots)[2]) {
  const std::size_t esize = dtype_size(spec.type);
  for (auto& s : slots) {
    s.values.resize(chunk);
    s.scratch.resize(chunk);
    s.bytes.resize(chunk * esize);
  }
  const std::uint64_t total = static_cast<std::uint64_t>(spec.numel());
  auto size_at = [&](std::uint64_t first) {
    return static_cast<std::size_t>(std::min<std::uint64_t>(chunk, total - first));
  };
  auto produce = [&](chunk_slot& s, std::uint64_t first) {
    std::size_t n = size_at(first);
    fill(first, n, s.values.data(), s.scratch.data());
    convert_from_f32(spec.type, s.values.data(), s.bytes.data(), n);
  };
  if (total == 0)
    return;
  produce(slots[0], 0);
  int cur = 0;
  for (std::uint64_t first = 0; first < total;) {
    std::uint64_t next = first + size_at(first);
    // Declared after `slots` and joined by its destructor even if write()
    // throws, so the producer never outlives what it writes to.
    std::future<void> ahead;
    if (next < total)
      ahead = std::async(std::launch::async, produce, std::ref(slots[cur ^ 1]), next);
    w.write(slots[cur].bytes.data(), size_at(first) * esize);
    if (ahead.valid())
      ahead.get(); // rethrows what the producer threw
    cur ^= 1;
    first = next;
  }
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out)
    throw checkpoint_error(path + ": cannot write file");
}

std::string index_json(const std::map<std::string, std::string>& weight_map, std::uint64_t total) {
  // As transformers writes it: indent 2, keys sorted (nlohmann::json keeps
  // object keys sorted).
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return index.dump(2) + "\n";
}

std::string shard_name(std::size_t i, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

// ---- parameter layout -----------------------------------------------------

bool ignored_weight(const model_config& c, const std::string& name) {
  static const std::string inv_freq = ".self_attn.rotary_emb.inv_freq";
  if (name.size() > inv_freq.size() && name.compare(name.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0)
    return true;
  return c.tie_word_embeddings && name == "lm_head.weight";
}

std::vector<tensor_spec> ignored_weight_specs(const model_config& c, dtype type) {
  std::vector<tensor_spec> specs;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    specs.push_back({"model.layers." + std::to_string(l) + ".self_attn.rotary_emb.inv_freq", type,
                     {std::max<std::int64_t>(c.head_dim() / 2, 1)}});
  if (c.tie_word_embeddings)
    specs.push_back({"lm_head.weight", type, {c.vocab_size, c.hidden_size}});
  return specs;
}

std::vector<tensor_spec> llama_parameter_specs(const model_config& c, dtype type) {
  const std::int64_t h = c.hidden_size, hd = c.head_dim(), inter = c.intermediate_size;
  const std::int64_t q = c.num_attention_heads * hd, kv = c.num_key_value_heads * hd;
  std::vector<tensor_spec> specs;
  specs.reserve(static_cast<std::size_t>(11 * std::max<std::int64_t>(c.num_hidden_layers, 0) + 3));
  auto add = [&](std::string name, std::vector<std::int64_t> shape) {
    specs.push_back(tensor_spec{std::move(name), type, std::move(shape)});
  };
  add(embed_tensor_name, {c.vocab_size, h});
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {h});
    add(p + "self_attn.q_proj.weight", {q, h});
    add(p + "self_attn.k_proj.weight", {kv, h});
    add(p + "self_attn.v_proj.weight", {kv, h});
    add(p + "self_attn.o_proj.weight", {h, q});
    if (c.qk_norm()) {
      add(p + "self_attn.q_norm.weight", {hd});
      add(p + "self_attn.k_norm.weight", {hd});
    }
    add(p + "post_attention_layernorm.weight", {h});
    if (c.sparse_layer(l)) {
      add(p + "mlp.gate.weight", {c.num_experts, h}); // the router
      if (c.fused_experts) {
        add(p + "mlp.experts.gate_up_proj", {c.num_experts, h, 2 * c.moe_intermediate_size});
        add(p + "mlp.experts.down_proj", {c.num_experts, c.moe_intermediate_size, h});
        continue;
      }
      for (std::int64_t e = 0; e < c.num_experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(x + "gate_proj.weight", {c.moe_intermediate_size, h});
        add(x + "up_proj.weight", {c.moe_intermediate_size, h});
        add(x + "down_proj.weight", {h, c.moe_intermediate_size});
      }
      continue;
    }
    add(p + "mlp.gate_proj.weight", {inter, h});
    add(p + "mlp.up_proj.weight", {inter, h});
    add(p + "mlp.down_proj.weight", {h, inter});
  }
  add("model.norm.weight", {h});
  if (!c.tie_word_embeddings)
    add("lm_head.weight", {c.vocab_size, h});
  return specs;
}

// ---- checkpoint -----------------------------------------------------------

checkpoint checkpoint::open(const std::string& dir, const file_memory& memory) {
  checkpoint ck;
  ck.dir_ = dir;
  try {
    ck.config_ = read_config_json(join(dir, config_file_name));
  } catch (const std::runtime_error& e) {
    throw checkpoint_error(e.what());
  }
  std::string single = join(dir, single_file_name);
  std::string index_path = join(dir, index_file_name);
  std::error_code ec;
  if (fs::exists(single, ec)) {
    // Like transformers: a single model.safetensors wins over an index.
    ck.files_.push_back(safetensors_file::open(single, memory));
  } else if (fs::exists(index_path, ec)) {
    ck.sharded_ = true;
    auto weight_map = read_index(index_path);
    std::set<std::string> names;
    for (auto& [tensor, file] : weight_map)
      names.insert(file);
    for (auto& file : names)
      ck.files_.push_back(safetensors_file::open(join(dir, file), memory));
    // Every tensor of every shard must be where the index says, once.
    std::unordered_map<std::string, std::string> seen; // tensor -> file
    for (auto& f : ck.files_) {
      std::string file = fs::path(f.path()).filename().string();
      for (auto& t : f.tensors()) {
        if (auto it = seen.find(t.name); it != seen.end())
          throw checkpoint_error(dir + ": tensor '" + printable(t.name) + "' is in two files: " + printable(it->second) + " and "
                                 + printable(file));
        seen.emplace(t.name, file);
        auto wm = weight_map.find(t.name);
        if (wm == weight_map.end())
          throw checkpoint_error(f.path() + ": tensor '" + printable(t.name) + "' is not listed in " + index_file_name);
        if (wm->second != file)
          throw checkpoint_error(f.path() + ": tensor '" + printable(t.name) + "' is here but " + index_file_name
                                 + " maps it to " + printable(wm->second));
      }
    }
    for (auto& [tensor, file] : weight_map)
      if (!seen.count(tensor))
        throw checkpoint_error(index_path + ": tensor '" + printable(tensor) + "' is mapped to " + printable(file)
                               + ", which does not contain it");
  } else {
    throw checkpoint_error(dir + ": no " + single_file_name + " or " + index_file_name);
  }
  for (std::size_t fi = 0; fi < ck.files_.size(); ++fi)
    for (auto& t : ck.files_[fi].tensors()) {
      ck.by_name_.emplace(t.name, ck.tensors_.size());
      ck.tensors_.push_back(entry{&t, fi});
      ck.total_bytes_ += t.size;
    }
  // A Qwen3-MoE's expert layout is in its tensors, not in config.json: the
  // first sparse layer's fused gate_up_proj says fused.
  if (ck.config_.arch == model_arch::qwen3_moe)
    for (std::int64_t l = 0; l < ck.config_.num_hidden_layers; ++l)
      if (ck.config_.sparse_layer(l)) {
        ck.config_.fused_experts = ck.find("model.layers." + std::to_string(l) + ".mlp.experts.gate_up_proj") != nullptr;
        break;
      }
  return ck;
}

const tensor_view* checkpoint::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : tensors_[it->second].tensor;
}

const tensor_view& checkpoint::at(const std::string& name) const {
  if (auto* t = find(name))
    return *t;
  throw checkpoint_error(dir_ + ": no tensor '" + printable(name) + "'");
}

dtype checkpoint_dtype(const checkpoint& ckpt) {
  if (ckpt.tensors().empty())
    throw checkpoint_error(ckpt.dir() + ": no tensors");
  return dtype_by_embedding(
      ckpt.tensors(), [](const auto& e) -> const std::string& { return e.tensor->name; },
      [](const auto& e) { return e.tensor->type; });
}

dtype checkpoint_dtype_from_headers(const std::string& dir) {
  const std::string& embed = embed_tensor_name;
  std::string single = join(dir, single_file_name);
  std::string index_path = join(dir, index_file_name);
  std::error_code ec;
  safetensors_layout layout;
  if (fs::exists(single, ec)) {
    layout = read_safetensors_header(single); // a single file wins over an index, as in checkpoint::open
  } else if (fs::exists(index_path, ec)) {
    auto weight_map = read_index(index_path);
    std::set<std::string> files;
    for (auto& [tensor, file] : weight_map)
      files.insert(file);
    auto it = weight_map.find(embed);
    const std::string file = it != weight_map.end() ? it->second : *files.begin();
    layout = read_safetensors_header(join(dir, file));
    if (it != weight_map.end()
        && std::none_of(layout.tensors.begin(), layout.tensors.end(), [&](const auto& t) { return t.name == embed; }))
      throw checkpoint_error(index_path + ": tensor '" + embed + "' is mapped to " + printable(file)
                             + ", which does not contain it");
  } else {
    throw checkpoint_error(dir + ": no " + single_file_name + " or " + index_file_name);
  }
  if (layout.tensors.empty())
    throw checkpoint_error(dir + ": no tensors");
  return dtype_by_embedding(
      layout.tensors, [](const auto& t) -> const std::string& { return t.name; }, [](const auto& t) { return t.type; });
}

std::vector<std::string> check_llama_parameters(const checkpoint& ckpt) {
  if (ckpt.tensors().empty())
    return {"no tensors"};
  return check_llama_parameters(ckpt, ckpt.config(), checkpoint_dtype(ckpt));
}

std::vector<std::string> check_llama_parameters(const checkpoint& ckpt, const model_config& c, dtype type,
                                                const std::function<bool(const std::string&)>& ignorable) {
  std::vector<std::string> problems;
  if (ckpt.tensors().empty())
    return {"no tensors"};
  std::set<std::string> expected;
  for (auto& spec : llama_parameter_specs(c, type)) {
    expected.insert(spec.name);
    const tensor_view* t = ckpt.find(spec.name);
    if (!t)
      problems.push_back("missing tensor '" + spec.name + "'");
    else if (t->shape != spec.shape)
      problems.push_back("tensor '" + spec.name + "': shape " + shape_string(t->shape) + ", the model implies "
                         + shape_string(spec.shape));
  }
  for (auto& e : ckpt.tensors()) {
    const tensor_view& t = *e.tensor;
    if (!expected.count(t.name)) {
      if (!ignorable || !ignorable(t.name))
        problems.push_back("unexpected tensor '" + printable(t.name) + "'");
    } else if (t.type != type) {
      problems.push_back("tensor '" + printable(t.name) + "': dtype " + std::string(safetensors_name(t.type)) + ", others are "
                         + std::string(safetensors_name(type)));
    }
  }
  return problems;
}

// ---- synthetic values -----------------------------------------------------

void synthetic_values(const tensor_spec& spec, std::uint64_t seed, std::uint64_t first, std::size_t count,
                      float* out) {
  uniform_stream(tensor_key(spec.name, seed), first, count, out);
  float base = 1.0f, amp = 0.1f; // norms: 1 +- 0.1
  if (spec.shape.size() >= 2) {
    // Uniform on [-a, a] has standard deviation a / sqrt(3).
    double fan_in = static_cast<double>(std::max<std::int64_t>(spec.shape.back(), 1));
    base = 0.0f;
    amp = static_cast<float>(std::sqrt(3.0 / fan_in));
  }
  for (std::size_t i = 0; i < count; ++i)
    out[i] = base + amp * out[i];
}

void perturbation_noise(const std::string& name, std::uint64_t seed, std::uint64_t first, std::size_t count,
                        float* out) {
  uniform_stream(tensor_key(name, seed) ^ perturb_domain, first, count, out);
}

checkpoint_written make_synthetic_checkpoint(const std::string& out_dir, const model_config& c, dtype type,
                                             std::uint64_t seed, std::uint64_t shard_bytes,
                                             std::size_t chunk_elements) {
  auto t0 = std::chrono::steady_clock::now();
  if (auto errs = validate(c); !errs.empty())
    throw checkpoint_error(out_dir + ": invalid model shape: " + errs.front());
  if (chunk_elements == 0)
    throw checkpoint_error(out_dir + ": chunk size must be positive");
  if (shard_bytes == 0)
    throw checkpoint_error(out_dir + ": shard size must be positive");
  auto specs = llama_parameter_specs(c, type);

  // Greedy sharding in parameter order; a tensor larger than shard_bytes gets
  // a shard of its own.
  std::vector<std::vector<tensor_spec>> shards(1);
  std::uint64_t in_shard = 0, total = 0;
  for (auto& s : specs) {
    if (!shards.back().empty() && in_shard + s.bytes() > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(s);
    in_shard += s.bytes();
    total += s.bytes();
  }

  staged_dir stage(out_dir);
  write_config_json(join(stage.path(), config_file_name), c);
  checkpoint_written out;
  out.dir = stage.final_path();
  std::map<std::string, std::string> weight_map;
  chunk_slot slots[2];
  for (std::size_t i = 0; i < shards.size(); ++i) {
    std::string file = shards.size() == 1 ? single_file_name : shard_name(i, shards.size());
    safetensors_writer w(join(stage.path(), file), shards[i], {{"format", "pt"}});
    for (auto& spec : shards[i]) {
      stream_tensor(
          w, spec, chunk_elements,
          [&](std::uint64_t first, std::size_t n, float* v, float*) { synthetic_values(spec, seed, first, n, v); },
          slots);
      weight_map.emplace(spec.name, file);
    }
    w.finish();
    out.files.push_back(file);
  }
  if (shards.size() > 1)
    write_text_file(join(stage.path(), index_file_name), index_json(weight_map, total));
  stage.commit();
  out.tensors = specs.size();
  out.bytes = total;
  out.seconds = seconds_since(t0);
  return out;
}

namespace {

/// Whether `v` stays finite once rounded to `type` (to nearest even: a value
/// halfway past the largest finite one rounds to infinity).
bool rounds_to_finite(dtype type, float v) {
  const float magnitude = std::fabs(v);
  switch (type) {
  case dtype::f16: return magnitude < 65520.0f;
  case dtype::bf16: return magnitude < 0x1.ffp127f;
  default: return std::isfinite(v);
  }
}

} // namespace

checkpoint_written perturb_checkpoint(const std::string& from_dir, const std::string& out_dir, double scale,
                                      std::uint64_t seed, std::size_t chunk_elements) {
  auto t0 = std::chrono::steady_clock::now();
  if (!std::isfinite(scale) || std::fabs(scale) > std::numeric_limits<float>::max())
    throw checkpoint_error(out_dir + ": perturbation scale must be a finite float, got " + std::to_string(scale));
  if (chunk_elements == 0)
    throw checkpoint_error(out_dir + ": chunk size must be positive");
  checkpoint from = checkpoint::open(from_dir);
  staged_dir stage(out_dir);
  // Copied byte for byte: same shape, same shard layout.
  write_text_file(join(stage.path(), config_file_name),
                  read_small_file(join(from_dir, config_file_name), safetensors_max_header));
  if (from.sharded())
    write_text_file(join(stage.path(), index_file_name),
                    read_small_file(join(from_dir, index_file_name), safetensors_max_header));

  checkpoint_written out;
  out.dir = stage.final_path();
  chunk_slot slots[2];
  const float s = static_cast<float>(scale);
  for (auto& f : from.files()) {
    std::string file = fs::path(f.path()).filename().string();
    std::vector<tensor_spec> specs(f.tensors().begin(), f.tensors().end()); // data order
    safetensors_writer w(join(stage.path(), file), specs, f.metadata());
    for (auto& t : f.tensors()) {
      stream_tensor(w, t, chunk_elements,
                    [&](std::uint64_t first, std::size_t n, float* v, float* noise) {
                      convert_to_f32(t.type, t.data + first * dtype_size(t.type), v, n);
                      perturbation_noise(t.name, seed, first, n, noise);
                      for (std::size_t i = 0; i < n; ++i) {
                        v[i] += s * noise[i];
                        // A weight its dtype cannot hold would be written as infinity.
                        if (!rounds_to_finite(t.type, v[i]))
                          throw checkpoint_error(out_dir + ": tensor '" + t.name + "' element "
                                                 + std::to_string(first + i) + " would be "
                                                 + std::to_string(v[i]) + ", which " + std::string(safetensors_name(t.type))
                                                 + " cannot hold: lower --perturb");
                      }
                    },
                    slots);
      ++out.tensors;
      out.bytes += t.size;
    }
    w.finish();
    out.files.push_back(file);
  }
  stage.commit();
  out.seconds = seconds_since(t0);
  return out;
}

checkpoint_summary inspect_checkpoint(const std::string& dir) {
  checkpoint ck = checkpoint::open(dir);
  checkpoint_summary s;
  s.dir = dir;
  s.config = ck.config();
  for (auto& f : ck.files())
    s.files.push_back(fs::path(f.path()).filename().string());
  for (auto& e : ck.tensors()) {
    const tensor_view& t = *e.tensor;
    s.tensors.push_back(tensor_summary{t.name, t.type, t.shape, t.size, checksum64(t.data, t.size), s.files[e.file]});
  }
  s.total_bytes = ck.total_bytes();
  s.layout_problems = check_llama_parameters(ck);
  return s;
}

} // namespace rlsync
