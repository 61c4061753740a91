// Checkpoint directories: parameter layout, synthetic make (deterministic,
// sharded or not), perturb, inspect, and the cross-checks on open.
#include "runtime/base/checksum.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "tests/support/checkpoint_fixtures.hpp"
#include "tests/support/scratch_dir.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

using namespace rlsync;
using rlsync::test::scratch_dir;
namespace fs = std::filesystem;

namespace {

model_config tiny_config(bool tie = false) {
  model_config c;
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.tie_word_embeddings = tie;
  return c;
}

std::map<std::string, std::uint64_t> checksums(const std::string& dir) {
  std::map<std::string, std::uint64_t> out;
  for (auto& t : inspect_checkpoint(dir).tensors)
    out[t.name] = t.checksum;
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::vector<std::string> leftovers(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp-") != std::string::npos)
      out.push_back(e.path().string());
  return out;
}

std::vector<float> as_f32(const tensor_view& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  convert_to_f32(t.type, t.data, v.data(), v.size());
  return v;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const checkpoint_error& e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST_CASE("llama_parameter_specs: names, shapes and order") {
  auto c = tiny_config();
  auto specs = llama_parameter_specs(c, dtype::bf16);
  REQUIRE(specs.size() == 1 + 9 * 2 + 2);
  CHECK(specs.front().name == "model.embed_tokens.weight");
  CHECK(specs.front().shape == std::vector<std::int64_t>{300, 64});
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> layer1 = {
    {"model.layers.1.input_layernorm.weight", {64}},
    {"model.layers.1.self_attn.q_proj.weight", {64, 64}},
    {"model.layers.1.self_attn.k_proj.weight", {32, 64}}, // 2 kv heads x head_dim 16
    {"model.layers.1.self_attn.v_proj.weight", {32, 64}},
    {"model.layers.1.self_attn.o_proj.weight", {64, 64}},
    {"model.layers.1.post_attention_layernorm.weight", {64}},
    {"model.layers.1.mlp.gate_proj.weight", {128, 64}},
    {"model.layers.1.mlp.up_proj.weight", {128, 64}},
    {"model.layers.1.mlp.down_proj.weight", {64, 128}},
  };
  for (std::size_t i = 0; i < layer1.size(); ++i) {
    CHECK(specs[10 + i].name == layer1[i].first);
    CHECK(specs[10 + i].shape == layer1[i].second);
    CHECK(specs[10 + i].type == dtype::bf16);
  }
  CHECK(specs[19].name == "model.norm.weight");
  CHECK(specs[20].name == "lm_head.weight");
  CHECK(specs[20].shape == std::vector<std::int64_t>{300, 64});
  auto tied = llama_parameter_specs(tiny_config(true), dtype::f32);
  CHECK(tied.size() == specs.size() - 1);
  CHECK(tied.back().name == "model.norm.weight");
}

TEST_CASE("synthetic values: independent of chunking, sensible statistics") {
  tensor_spec m{"model.layers.0.mlp.down_proj.weight", dtype::bf16, {64, 256}};
  tensor_spec n{"model.norm.weight", dtype::bf16, {4096}};
  for (auto* spec : {&m, &n}) {
    std::size_t count = static_cast<std::size_t>(spec->numel());
    std::vector<float> whole(count), pieces(count);
    synthetic_values(*spec, 42, 0, count, whole.data());
    // Odd-sized pieces starting at odd and even offsets.
    for (std::size_t first = 0, step = 1; first < count; first += step, step = step * 2 + 1)
      synthetic_values(*spec, 42, first, std::min(step, count - first), pieces.data() + first);
    CHECK(whole == pieces);
    double sum = 0, sq = 0;
    for (float v : whole) {
      sum += v;
      sq += double(v) * v;
    }
    double mean = sum / count, sd = std::sqrt(sq / count - mean * mean);
    if (spec == &n) {
      CHECK(mean == doctest::Approx(1.0).epsilon(0.01));
      CHECK(*std::min_element(whole.begin(), whole.end()) >= 0.9f);
      CHECK(*std::max_element(whole.begin(), whole.end()) <= 1.1f);
    } else {
      CHECK(std::abs(mean) < 0.01);
      CHECK(sd == doctest::Approx(1.0 / std::sqrt(256.0)).epsilon(0.05)); // 1/sqrt(fan_in)
    }
  }
  std::vector<float> a(100), b(100);
  synthetic_values(m, 1, 0, 100, a.data());
  synthetic_values(m, 2, 0, 100, b.data());
  CHECK(a != b);
  tensor_spec m2 = m;
  m2.name = "model.layers.1.mlp.down_proj.weight";
  synthetic_values(m2, 1, 0, 100, b.data());
  CHECK(a != b);
}

TEST_CASE("make: readable, matches the layout, deterministic, chunking irrelevant") {
  scratch_dir dir;
  auto c = tiny_config();
  for (dtype t : {dtype::bf16, dtype::f16, dtype::f32}) {
    CAPTURE(short_name(t));
    std::string a = dir / ("a-" + std::string(short_name(t)));
    auto w = make_synthetic_checkpoint(a, c, t, 7);
    CHECK(w.files == std::vector<std::string>{"model.safetensors"});
    CHECK(w.tensors == 21);
    auto ck = checkpoint::open(a);
    CHECK(!ck.sharded());
    CHECK(ck.config().hidden_size == 64);
    CHECK(ck.config().num_key_value_heads == 2);
    CHECK(check_llama_parameters(ck).empty());
    CHECK(ck.total_bytes() == w.bytes);
    CHECK(ck.files().front().metadata().at("format") == "pt");
    for (auto& spec : llama_parameter_specs(c, t))
      CHECK(ck.at(spec.name).bytes() == spec.bytes());
    std::string b = dir / ("b-" + std::string(short_name(t)));
    make_synthetic_checkpoint(b, c, t, 7, default_shard_bytes, 333); // odd chunk size
    CHECK(checksums(a) == checksums(b));
    CHECK(read_file(a + "/model.safetensors") == read_file(b + "/model.safetensors"));
  }
  // Another seed changes every tensor.
  make_synthetic_checkpoint(dir / "c", c, dtype::bf16, 8);
  auto x = checksums(dir / "a-bf16"), y = checksums(dir / "c");
  for (auto& kv : x) // (no structured bindings: clang cannot capture them in doctest's lambdas)
    CHECK_MESSAGE(y.at(kv.first) != kv.second, kv.first);
  CHECK(leftovers(dir.path()).empty());
}

TEST_CASE("make: sharded with an index when larger than shard_bytes, same tensors as unsharded") {
  scratch_dir dir;
  auto c = tiny_config(true);
  make_synthetic_checkpoint(dir / "one", c, dtype::bf16, 3);
  auto w = make_synthetic_checkpoint(dir / "many", c, dtype::bf16, 3, 40000);
  REQUIRE(w.files.size() > 2);
  CHECK(w.files.front() == "model-00001-of-0000" + std::to_string(w.files.size()) + ".safetensors");
  CHECK(!fs::exists(dir / "many/model.safetensors"));
  std::string index = read_file(dir / "many/model.safetensors.index.json");
  CHECK(index.find("\"total_size\": " + std::to_string(w.bytes)) != std::string::npos);
  CHECK(index.find("\"model.embed_tokens.weight\": \"model-00001-of-") != std::string::npos);
  auto ck = checkpoint::open(dir / "many");
  CHECK(ck.sharded());
  CHECK(ck.files().size() == w.files.size());
  CHECK(check_llama_parameters(ck).empty());
  for (auto& f : ck.files()) // no shard over the limit unless one tensor is
    CHECK((f.tensors().size() == 1 || f.file_size() < 40000 + 4096));
  CHECK(checksums(dir / "one") == checksums(dir / "many"));
}

TEST_CASE("checkpoint_dtype_from_headers says what checkpoint_dtype says, from the headers alone") {
  scratch_dir dir;
  auto c = tiny_config(true);
  for (dtype t : {dtype::bf16, dtype::f16, dtype::f32}) {
    CAPTURE(safetensors_name(t));
    const std::string one = dir / ("one-" + std::string(safetensors_name(t)));
    const std::string many = dir / ("many-" + std::string(safetensors_name(t)));
    make_synthetic_checkpoint(one, c, t, 3);
    make_synthetic_checkpoint(many, c, t, 3, 40000);
    CHECK(checkpoint_dtype_from_headers(one) == t);
    CHECK(checkpoint_dtype_from_headers(many) == t);
    CHECK(checkpoint_dtype(checkpoint::open(many)) == t);
  }
  // An index that maps the embedding to a shard without it is refused, as open refuses it.
  {
    const std::string many = dir / "many-BF16";
    auto index = read_file(many + "/model.safetensors.index.json");
    const std::string mapped = "\"model.embed_tokens.weight\": \"model-00001-of-";
    const auto at = index.find(mapped);
    REQUIRE(at != std::string::npos);
    index.replace(at + mapped.size() - std::string("00001-of-").size(), 5, "00002"); // now the second shard
    write_file(many + "/model.safetensors.index.json", index);
    const std::string message = "model.safetensors.index.json: tensor 'model.embed_tokens.weight' is mapped to "
                                "model-00002-of-";
    CHECK_THROWS_WITH_AS(checkpoint_dtype_from_headers(many), doctest::Contains(message.c_str()), checkpoint_error);
  }
  // An f32 extra first in data order does not decide it: the embedding does.
  test::write_with_leading_f32_extra(dir / "one-BF16", dir / "extra");
  CHECK(checkpoint_dtype_from_headers(dir / "extra") == dtype::bf16);
  CHECK(checkpoint_dtype(checkpoint::open(dir / "extra")) == dtype::bf16);

  // The header's layout is open's, without the data.
  auto layout = read_safetensors_header(dir / "extra/model.safetensors");
  auto file = safetensors_file::open(dir / "extra/model.safetensors");
  REQUIRE(layout.tensors.size() == file.tensors().size());
  for (std::size_t i = 0; i < layout.tensors.size(); ++i) {
    CAPTURE(file.tensors()[i].name);
    CHECK(layout.tensors[i].name == file.tensors()[i].name);
    CHECK(layout.tensors[i].type == file.tensors()[i].type);
    CHECK(layout.tensors[i].shape == file.tensors()[i].shape);
    CHECK(layout.tensors[i].offset == file.tensors()[i].offset);
    CHECK(layout.tensors[i].data == nullptr);
  }
  // A file its header does not describe is refused from the header, as open refuses it.
  const std::string whole = read_file(dir / "extra/model.safetensors");
  write_file(dir / "extra/model.safetensors", whole.substr(0, whole.size() - 1));
  CHECK_THROWS_WITH_AS(checkpoint_dtype_from_headers(dir / "extra"), doctest::Contains("beyond the data section"),
                       checkpoint_error);
  CHECK_THROWS_WITH_AS(checkpoint_dtype_from_headers(dir / "nothing"),
                       doctest::Contains("no model.safetensors or model.safetensors.index.json"), checkpoint_error);
}

TEST_CASE("make refuses to overwrite and leaves nothing behind on failure") {
  scratch_dir dir;
  auto c = tiny_config();
  make_synthetic_checkpoint(dir / "x", c, dtype::bf16, 1);
  auto before = read_file(dir / "x/model.safetensors");
  CHECK(error_of([&] { make_synthetic_checkpoint(dir / "x", c, dtype::bf16, 2); }).find("already exists")
        != std::string::npos);
  CHECK(read_file(dir / "x/model.safetensors") == before);
  fs::create_directory(dir / "empty");
  make_synthetic_checkpoint(dir / "empty/", c, dtype::bf16, 1); // an empty directory is fine
  CHECK(checksums(dir / "empty") == checksums(dir / "x"));
  c.num_key_value_heads = 3;
  CHECK(error_of([&] { make_synthetic_checkpoint(dir / "bad", c, dtype::bf16, 1); }).find("num_key_value_heads")
        != std::string::npos);
  CHECK(!fs::exists(dir / "bad"));
  CHECK(error_of([&] { perturb_checkpoint(dir / "nothing", dir / "p", 0.1, 1); }).find("config.json")
        != std::string::npos);
  CHECK(!fs::exists(dir / "p"));
  // A scale whose weights the dtype cannot hold: refused, nothing written.
  c.num_key_value_heads = 4;
  make_synthetic_checkpoint(dir / "half", c, dtype::f16, 1);
  auto overflow = error_of([&] { perturb_checkpoint(dir / "half", dir / "p", 1e6, 1); });
  CHECK_MESSAGE(overflow.find("which F16 cannot hold: lower --perturb") != std::string::npos, overflow);
  CHECK(overflow.find("tensor '") != std::string::npos);
  CHECK(error_of([&] { perturb_checkpoint(dir / "x", dir / "p", 1e39, 1); }).find("must be a finite float")
        != std::string::npos);
  CHECK(!fs::exists(dir / "p"));
  CHECK(leftovers(dir.path()).empty());
}

TEST_CASE("perturb: every tensor changes by at most scale, shapes, layout and config kept") {
  scratch_dir dir;
  for (bool sharded : {false, true}) {
    CAPTURE(sharded);
    std::string base = dir / (sharded ? "s" : "u"), next = base + "-next";
    make_synthetic_checkpoint(base, tiny_config(), dtype::bf16, 5, sharded ? 50000 : default_shard_bytes);
    const double scale = 0.05;
    auto w = perturb_checkpoint(base, next, scale, 9, 1000);
    auto a = checkpoint::open(base), b = checkpoint::open(next);
    CHECK(b.sharded() == sharded);
    CHECK(read_file(base + "/config.json") == read_file(next + "/config.json"));
    if (sharded)
      CHECK(read_file(base + "/model.safetensors.index.json") == read_file(next + "/model.safetensors.index.json"));
    REQUIRE(a.files().size() == b.files().size());
    CHECK(w.files.size() == a.files().size());
    CHECK(w.bytes == a.total_bytes());
    REQUIRE(a.tensors().size() == b.tensors().size());
    for (std::size_t i = 0; i < a.tensors().size(); ++i) {
      const tensor_view &x = *a.tensors()[i].tensor, &y = *b.tensors()[i].tensor;
      CAPTURE(x.name);
      CHECK(y.name == x.name);
      CHECK(y.shape == x.shape);
      CHECK(y.type == x.type);
      CHECK(y.offset == x.offset);
      CHECK(a.tensors()[i].file == b.tensors()[i].file);
      auto u = as_f32(x), v = as_f32(y);
      std::size_t changed = 0;
      for (std::size_t k = 0; k < u.size(); ++k) {
        changed += u[k] != v[k];
        // bf16 keeps 8 significant bits: rounding adds at most 2^-8 relative.
        REQUIRE(std::abs(v[k] - u[k]) <= scale + std::abs(v[k]) / 256 + 1e-6);
      }
      CHECK(changed > u.size() * 3 / 4);
    }
    auto ca = checksums(base), cb = checksums(next);
    for (auto& kv : ca)
      CHECK_MESSAGE(cb.at(kv.first) != kv.second, kv.first);
    // Same seed, same result; another chunking, same bytes.
    perturb_checkpoint(base, next + "2", scale, 9);
    CHECK(checksums(next + "2") == cb);
  }
  CHECK(leftovers(dir.path()).empty());
}

TEST_CASE("inspect: checksums are checksum64 of each tensor's bytes") {
  scratch_dir dir;
  make_synthetic_checkpoint(dir / "m", tiny_config(), dtype::f16, 11, 60000);
  auto s = inspect_checkpoint(dir / "m");
  auto ck = checkpoint::open(dir / "m");
  REQUIRE(s.tensors.size() == ck.tensors().size());
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < s.tensors.size(); ++i) {
    auto& t = *ck.tensors()[i].tensor;
    CHECK(s.tensors[i].name == t.name);
    CHECK(s.tensors[i].checksum == checksum64(t.data, t.size));
    CHECK(s.tensors[i].bytes == t.size);
    CHECK(s.tensors[i].file == s.files[ck.tensors()[i].file]);
    total += t.size;
  }
  CHECK(s.total_bytes == total);
  CHECK(s.layout_problems.empty());
}

TEST_CASE("checkpoint::open cross-checks shards against the index") {
  scratch_dir dir;
  auto c = tiny_config();
  std::vector<float> four(4, 1.0f);
  auto shard = [&](const std::string& d, const std::string& file, std::vector<std::string> names) {
    std::vector<tensor_bytes> ts;
    for (auto& n : names)
      ts.push_back({tensor_spec{n, dtype::f32, {4}}, four.data()});
    write_safetensors(d + "/" + file, ts);
  };
  auto setup = [&](const std::string& name, const std::string& weight_map) {
    std::string d = dir / name;
    fs::create_directory(d);
    write_config_json(d + "/config.json", c);
    shard(d, "model-00001-of-00002.safetensors", {"a", "b"});
    shard(d, "model-00002-of-00002.safetensors", {"c"});
    write_file(d + "/model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 48}, \"weight_map\": {" + weight_map + "}}");
    return d;
  };
  const std::string f1 = "\"model-00001-of-00002.safetensors\"", f2 = "\"model-00002-of-00002.safetensors\"";
  std::string good = setup("good", "\"a\": " + f1 + ", \"b\": " + f1 + ", \"c\": " + f2);
  auto ck = checkpoint::open(good);
  CHECK(ck.tensors().size() == 3);
  CHECK(ck.find("c") != nullptr);
  CHECK(ck.find("d") == nullptr);
  CHECK(error_of([&] { ck.at("d"); }).find("no tensor 'd'") != std::string::npos);
  CHECK(check_llama_parameters(ck).size() > 3); // not a Llama layout: reported, not fatal

  auto open_error = [&](const std::string& name, const std::string& weight_map) {
    std::string d = setup(name, weight_map);
    return error_of([&] { checkpoint::open(d); });
  };
  CHECK(open_error("missing", "\"a\": " + f1 + ", \"b\": " + f1 + ", \"c\": " + f2 + ", \"d\": " + f2)
            .find("tensor 'd' is mapped to model-00002-of-00002.safetensors, which does not contain it")
        != std::string::npos);
  CHECK(open_error("unlisted", "\"a\": " + f1 + ", \"c\": " + f2).find("tensor 'b' is not listed")
        != std::string::npos);
  CHECK(open_error("wrong_file", "\"a\": " + f1 + ", \"b\": " + f2 + ", \"c\": " + f2)
            .find("tensor 'b' is here but model.safetensors.index.json maps it to model-00002")
        != std::string::npos);
  CHECK(open_error("traversal", "\"a\": \"../good/model-00001-of-00002.safetensors\"")
            .find("not a plain file name")
        != std::string::npos);
  CHECK(open_error("absent_file", "\"a\": \"model-00009.safetensors\"").find("model-00009.safetensors: cannot open")
        != std::string::npos);
  CHECK(open_error("dup_key", "\"a\": " + f1 + ", \"a\": " + f1).find("listed twice") != std::string::npos);
  CHECK(open_error("empty_map", "").find("weight_map") != std::string::npos);

  // The same tensor in two shards.
  std::string twice = setup("twice", "\"a\": " + f1 + ", \"b\": " + f1 + ", \"c\": " + f2);
  shard(twice, "model-00002-of-00002.safetensors", {"c", "a"});
  CHECK(error_of([&] { checkpoint::open(twice); }).find("tensor 'a' is in two files") != std::string::npos);

  std::string bad_json = setup("bad_json", "");
  write_file(bad_json + "/model.safetensors.index.json", "{\"weight_map\": ");
  CHECK(error_of([&] { checkpoint::open(bad_json); }).find("invalid JSON") != std::string::npos);

  // The index itself: strict JSON with exact types.
  struct index_row {
    const char* what;
    std::string text;
    const char* expect;
  };
  const index_row index_rows[] = {
    {"weight_map twice", R"({"weight_map": {"a": "x"}, "weight_map": {"a": "x"}})", "weight_map appears twice"},
    {"duplicate elsewhere", R"({"metadata": {"total_size": 1, "total_size": 1}, "weight_map": {"a": "x"}})",
     "metadata: duplicate key 'total_size'"},
    {"too deep", R"({"metadata": {"x": [[[[[[[[1]]]]]]]]}, "weight_map": {"a": "x"}})",
     "JSON nested deeper than 8 levels"},
    {"not an object", "[1]", "expected a JSON object, got an array"},
    {"no weight_map", R"({"metadata": {}})", "missing field 'weight_map'"},
    {"weight_map an array", R"({"weight_map": ["a"]})",
     "weight_map: expected a non-empty object of tensor name -> file name, got an array"},
    {"weight_map empty", R"({"weight_map": {}})",
     "weight_map: expected a non-empty object of tensor name -> file name, got an empty object"},
    {"empty tensor name", R"({"weight_map": {"": "x"}})", "weight_map: a tensor with an empty name"},
    {"file not a string", R"({"weight_map": {"a": 1}})", "weight_map: 'a': expected a file name, got '1'"},
    {"metadata not an object", R"({"metadata": 48, "weight_map": {"a": "x"}})",
     "metadata: expected an object, got '48'"},
    {"total_size a string", R"({"metadata": {"total_size": "48"}, "weight_map": {"a": "x"}})",
     "metadata: total_size: expected a non-negative integer, got the string '48'"},
    {"total_size negative", R"({"metadata": {"total_size": -1}, "weight_map": {"a": "x"}})",
     "metadata: total_size: expected a non-negative integer, got '-1'"},
  };
  std::string index_dir = setup("index_rows", "");
  for (auto& r : index_rows) {
    CAPTURE(r.what);
    write_file(index_dir + "/model.safetensors.index.json", r.text);
    std::string error = error_of([&] { checkpoint::open(index_dir); });
    CHECK_MESSAGE(error.find("model.safetensors.index.json: " + std::string(r.expect)) != std::string::npos, error);
  }

  std::string no_config = setup("no_config", "\"a\": " + f1);
  fs::remove(no_config + "/config.json");
  CHECK(error_of([&] { checkpoint::open(no_config); }).find("config.json") != std::string::npos);

  fs::create_directory(dir / "nothing");
  write_config_json(dir / "nothing/config.json", c);
  CHECK(error_of([&] { checkpoint::open(dir / "nothing"); })
            .find("no model.safetensors or model.safetensors.index.json")
        != std::string::npos);
}

TEST_CASE("hostile checkpoints: each is refused with its own message, never a crash or a hang") {
  scratch_dir dir;
  const auto c = tiny_config();
  // A valid checkpoint, then one file replaced by something hostile.
  auto setup = [&](const std::string& name) {
    std::string d = dir / name;
    make_synthetic_checkpoint(d, c, dtype::bf16, 1);
    return d;
  };
  auto replace = [](const std::string& path, const std::function<void(const std::string&)>& make) {
    fs::remove(path);
    make(path);
  };
  auto fifo = [](const std::string& p) { REQUIRE(::mkfifo(p.c_str(), 0600) == 0); };
  auto text = [](std::string content) { return [content](const std::string& p) { write_file(p, content); }; };
  auto nested = [](std::size_t depth) {
    return std::string(depth, '[') + std::string(depth, ']');
  };
  // tiny_config()'s config.json with one field's value replaced.
  auto config_with = [](const std::string& field, const std::string& value) {
    std::map<std::string, std::string> fields = {
      {"vocab_size", "300"},         {"hidden_size", "64"},         {"intermediate_size", "128"},
      {"num_hidden_layers", "2"},    {"num_attention_heads", "4"},  {"num_key_value_heads", "2"}};
    fields[field] = value;
    std::string json;
    for (auto& [k, v] : fields)
      json += (json.empty() ? "{\"" : ", \"") + k + "\": " + v;
    return json + "}";
  };
  struct row {
    const char* what;
    const char* file; // replaced in a fresh valid checkpoint
    std::function<void(const std::string&)> make;
    std::string expected;
  };
  const std::vector<row> rows = {
    {"config.json nested 100,000 deep (overflowed the stack)", "config.json",
     text("{\"a\": " + nested(100000) + "}"), "JSON nested deeper than 32 levels"},
    {"config.json is a FIFO (hung forever)", "config.json", fifo,
     "config.json: config.json: is a FIFO, not a regular file"},
    {"config.json is a directory", "config.json", [](const std::string& p) { fs::create_directory(p); },
     "config.json: config.json: is a directory, not a regular file"},
    {"config.json larger than 16 MiB", "config.json", text(std::string((16 << 20) + 1, ' ')),
     "larger than the limit of 16777216 bytes"},
    {"intermediate_size that wraps the parameter count", "config.json",
     text(config_with("intermediate_size", "9223372036854775800")),
     "intermediate_size: must be at most 1048576, got 9223372036854775800"},
    {"vocab_size INT64_MAX", "config.json", text(config_with("vocab_size", "9223372036854775807")),
     "vocab_size: must be at most 16777216, got 9223372036854775807"},
    {"num_hidden_layers 100000000", "config.json", text(config_with("num_hidden_layers", "100000000")),
     "num_hidden_layers: must be at most 1024, got 100000000"},
    {"a size beyond int64", "config.json", text(config_with("hidden_size", "18446744073709551615")),
     "hidden_size: 18446744073709551615 is too large"},
    {"model.safetensors is a FIFO", "model.safetensors", fifo,
     "model.safetensors: is a FIFO, not a regular file"},
    {"model.safetensors is a directory", "model.safetensors", [](const std::string& p) { fs::create_directory(p); },
     "model.safetensors: is a directory, not a regular file"},
    {"model.safetensors is empty", "model.safetensors", text(""), "model.safetensors"},
  };
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    CAPTURE(r.what);
    std::string d = setup("c" + std::to_string(i));
    replace(d + "/" + r.file, r.make);
    std::string error = error_of([&] { checkpoint::open(d); });
    CAPTURE(error);
    CHECK(error.find(r.expected) != std::string::npos);
  }

  // A sharded checkpoint whose index is a FIFO or nested too deep.
  const auto sharded = [&](const std::string& name) {
    std::string d = dir / name;
    make_synthetic_checkpoint(d, c, dtype::bf16, 1, /*shard_bytes*/ 16 << 10);
    REQUIRE(fs::exists(d + "/model.safetensors.index.json"));
    return d;
  };
  std::string index_fifo = sharded("index_fifo");
  replace(index_fifo + "/model.safetensors.index.json", fifo);
  CHECK(error_of([&] { checkpoint::open(index_fifo); }).find("is a FIFO, not a regular file") != std::string::npos);
  std::string index_deep = sharded("index_deep");
  replace(index_deep + "/model.safetensors.index.json", text("{\"weight_map\": " + nested(100000) + "}"));
  CHECK(error_of([&] { checkpoint::open(index_deep); }).find("nested deeper") != std::string::npos);
}

TEST_CASE("an open checkpoint owns its bytes: truncating or rewriting its files cannot hurt it") {
  // Mapped files ended the process with SIGBUS when a writer truncated them in place.
  scratch_dir dir;
  std::string d = dir / "ck";
  make_synthetic_checkpoint(d, tiny_config(), dtype::bf16, 5);
  auto before = checksums(d);
  auto ck = checkpoint::open(d);
  ::truncate((d + "/model.safetensors").c_str(), 0);
  std::map<std::string, std::uint64_t> after;
  for (const auto& e : ck.tensors())
    after[e.tensor->name] = checksum64(e.tensor->data, e.tensor->size);
  CHECK(after == before);
  CHECK_FALSE(error_of([&] { checkpoint::open(d); }).empty()); // the truncated file is refused
}
