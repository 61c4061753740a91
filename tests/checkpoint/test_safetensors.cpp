// safetensors: byte-exact round trips, Hugging Face's header format, the
// streaming writer, and every malformed file in tests/data/bad_safetensors.
#include "runtime/checkpoint/safetensors.hpp"
#include "tests/support/scratch_dir.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace rlsync;
using rlsync::test::scratch_dir;

namespace {

std::vector<unsigned char> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v)
    b = static_cast<unsigned char>(rng());
  return v;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// A whole image in memory: 8-byte length, the header as given, data.
std::string image(const std::string& header, std::size_t data_bytes) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return s + header + std::string(data_bytes, '\x01');
}

std::string parse_error(const std::string& bytes) {
  try {
    parse_safetensors(bytes.data(), bytes.size(), "mem");
  } catch (const checkpoint_error& e) {
    return e.what();
  }
  return "";
}

struct sample {
  std::vector<tensor_spec> specs;
  std::vector<std::vector<unsigned char>> data;
  std::vector<tensor_bytes> tensors() const {
    std::vector<tensor_bytes> out;
    for (std::size_t i = 0; i < specs.size(); ++i)
      out.push_back({specs[i], data[i].data()});
    return out;
  }
};

sample make_sample(dtype t) {
  sample s;
  s.specs = {{"model.embed_tokens.weight", t, {4, 3}},
             {"scalar", t, {}},
             {"empty", t, {0, 5}},
             {"odd \"name\" \\ \xc3\xa9", t, {7}}};
  unsigned seed = 1;
  for (auto& spec : s.specs)
    s.data.push_back(random_bytes(spec.bytes(), seed++));
  return s;
}

} // namespace

TEST_CASE("round trip: every dtype, with and without metadata, bytes identical") {
  scratch_dir dir;
  for (dtype t : {dtype::bf16, dtype::f16, dtype::f32}) {
    for (bool with_metadata : {false, true}) {
      CAPTURE(short_name(t));
      CAPTURE(with_metadata);
      auto s = make_sample(t);
      std::map<std::string, std::string> metadata;
      if (with_metadata)
        metadata = {{"format", "pt"}, {"note", "line\nbreak \"quoted\""}};
      std::string path = dir / "rt.safetensors";
      write_safetensors(path, s.tensors(), metadata);

      auto f = safetensors_file::open(path);
      CHECK(f.metadata() == metadata);
      REQUIRE(f.tensors().size() == s.specs.size());
      for (std::size_t i = 0; i < s.specs.size(); ++i) {
        const tensor_view& v = f.tensors()[i]; // data order = write order
        CHECK(v.name == s.specs[i].name);
        CHECK(v.type == t);
        CHECK(v.shape == s.specs[i].shape);
        REQUIRE(v.size == s.data[i].size());
        CHECK(std::equal(s.data[i].begin(), s.data[i].end(), reinterpret_cast<const unsigned char*>(v.data)));
        CHECK(f.find(s.specs[i].name) == &v);
      }
      CHECK(f.find("absent") == nullptr);
      CHECK(f.tensors()[1].numel() == 1); // scalar
      CHECK(f.tensors()[2].size == 0);    // zero-size tensor
      // Data start at a multiple of 8, as Hugging Face pads.
      std::string raw = read_file(path);
      std::uint64_t n = 0;
      for (int i = 7; i >= 0; --i)
        n = (n << 8) | static_cast<unsigned char>(raw[i]);
      CHECK(n % 8 == 0);
      CHECK(raw.size() == 8 + n + 12 * dtype_size(t) + dtype_size(t) + 7 * dtype_size(t));
    }
  }
}

TEST_CASE("header is byte for byte what Hugging Face writes") {
  std::vector<tensor_spec> specs = {{"a", dtype::bf16, {2, 2}}, {"b", dtype::f32, {1}}};
  std::string h = safetensors_header(specs, {{"format", "pt"}}, "x");
  std::string json = R"({"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  REQUIRE(h.size() == 8 + padded.size());
  CHECK(h.substr(8) == padded);
  CHECK(static_cast<unsigned char>(h[0]) == padded.size());
  CHECK(h.substr(1, 7) == std::string(7, '\0'));
}

TEST_CASE("reader accepts any whitespace padding, spaced JSON and header order != data order") {
  std::string header = "{\n  \"b\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [8, 12]},\n"
                       "  \"__metadata__\": {},\n"
                       "  \"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}\n}   \n\t ";
  std::string bytes = image(header, 12);
  auto layout = parse_safetensors(bytes.data(), bytes.size(), "mem");
  REQUIRE(layout.tensors.size() == 2);
  CHECK(layout.tensors[0].name == "a"); // data order
  CHECK(layout.tensors[1].name == "b");
  CHECK(layout.tensors[1].offset == 8);
  CHECK(reinterpret_cast<const char*>(layout.tensors[1].data) == bytes.data() + 8 + header.size() + 8);
  CHECK(layout.metadata.empty());
  CHECK(layout.header_size == header.size());
  // An empty object with no data: a valid, empty file.
  std::string empty = image("{}", 0);
  CHECK(parse_safetensors(empty.data(), empty.size(), "mem").tensors.empty());
}

TEST_CASE("reader rejects in-memory variants with messages naming source, tensor and field") {
  auto entry = [](const std::string& body) { return image("{\"w\": {" + body + "}}", 8); };
  CHECK(parse_error(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,8])")).empty());
  CHECK(parse_error(entry(R"("dtype":"F64","shape":[1],"data_offsets":[0,8])"))
        == "mem: tensor 'w': unsupported dtype 'F64' (rlsync reads BF16, F16, F32)");
  CHECK(parse_error(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,4])"))
        == "mem: tensor 'w': data_offsets [0, 4] hold 4 bytes but F32 [2] needs 8");
  CHECK(parse_error(entry(R"("dtype":"F32","shape":[2,true],"data_offsets":[0,8])"))
        == "mem: tensor 'w': shape[1]: expected a non-negative integer, got 'true'");
  CHECK(parse_error(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,null])"))
        == "mem: tensor 'w': data_offsets[1]: expected a non-negative integer, got 'null'");
  CHECK(parse_error(entry(R"("dtype":"F32","shape":[1],"data_offsets":[4,8])")).find("a hole before 'w'")
        != std::string::npos);
  // Overflow of shape x dtype size alone (numel fits, bytes do not).
  CHECK(parse_error(entry(R"("dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8])"))
            .find("element count overflows")
        != std::string::npos);
  // JSON types are exact; numbers are quoted as written.
  CHECK(parse_error(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,"8"])"))
        == "mem: tensor 'w': data_offsets[1]: expected a non-negative integer, got the string '8'");
  CHECK(parse_error(entry(R"("dtype":"F32","shape":[2e0],"data_offsets":[0,8])"))
        == "mem: tensor 'w': shape[0]: expected a non-negative integer, got '2e0'");
  CHECK(parse_error(entry(R"("dtype":"F32","shape":[-0],"data_offsets":[0,8])"))
        == "mem: tensor 'w': shape[0]: expected a non-negative integer, got '-0'");
  CHECK(parse_error(entry(R"("dtype":"F32","shape":[2],"data_offsets":[-99999999999999999999,8])"))
        == "mem: tensor 'w': data_offsets[0]: expected a non-negative integer, got '-99999999999999999999'");
  CHECK(parse_error(entry(R"("dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8])"))
        == "mem: tensor 'w': shape[0]: 9223372036854775808 is too large");
  CHECK(parse_error(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551616])"))
        == "mem: tensor 'w': data_offsets[1]: 18446744073709551616 is too large");
  CHECK(parse_error(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,8],"":1)"))
        == "mem: tensor 'w': unknown field ''");
  CHECK(parse_error(entry(R"("dtype":5,"shape":[2],"data_offsets":[0,8])"))
        == "mem: tensor 'w': dtype: expected a string, got '5'");
  CHECK(parse_error(image(R"({"__metadata__":{"k":null},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8))
        == "mem: __metadata__: 'k': expected a string, got 'null'");
  // A zero dimension makes the product 0 even when others are huge.
  std::string zero = image(R"({"z":{"dtype":"F32","shape":[0,9223372036854775807],"data_offsets":[0,0]}})", 0);
  CHECK(parse_error(zero).empty());
  // Also when the zero comes last, after dimensions whose product alone
  // overflows: the tensor is empty, and its element count says so (without
  // the signed overflow that only a sanitizer build sees).
  std::string zero_last =
    image(R"({"z":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", 0);
  const auto empty = parse_safetensors(zero_last.data(), zero_last.size(), "mem");
  REQUIRE(empty.tensors.size() == 1);
  CHECK(numel(empty.tensors[0].shape) == 0);
  CHECK(empty.tensors[0].bytes() == 0);
}

TEST_CASE("reader: JSON syntax, nesting and value count are checked as the header is read") {
  struct row {
    const char* what;
    std::string header;
    const char* expect;
  };
  const std::string deep = "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  const row rows[] = {
    {"trailing comma", R"({"a":1,})", "mem: header: invalid JSON at line 1, column 8: syntax error"},
    {"comment", "{} // note", "mem: header: invalid JSON at line 1, column 4: syntax error"},
    {"NUL after the object", std::string("{}\0{\"a\":1}", 10), "mem: header: invalid JSON at line 1, column 3: a NUL byte"},
    {"second value", "{} {}", "mem: header: invalid JSON at line 1, column 4: syntax error"},
    {"string not UTF-8", "{\"\xff\":1}", "mem: header: invalid JSON at line 1, column 3: syntax error"},
    {"line and column", "{\n\"a\": tru}", "mem: header: invalid JSON at line 2, column 9: syntax error"},
    {"deep nesting refused when it opens, not after",
     deep, "mem: header: JSON nested deeper than 8 levels (a safetensors header needs 3)"},
    {"nesting before a syntax error",
     "{\"a\":[[[[[[[[[1,,", "mem: header: JSON nested deeper than 8 levels"},
    {"depth 8 is fine for the parser (the walk then refuses the entry)",
     "{\"a\":[[[[[[[1]]]]]]]}", "mem: tensor 'a': expected an object, got an array"},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    std::string message = parse_error(image(r.header, 0));
    CHECK_MESSAGE(message.rfind(r.expect, 0) == 0, message);
  }
}

TEST_CASE("streaming writer: chunks may cross tensors, size is enforced") {
  scratch_dir dir;
  auto s = make_sample(dtype::bf16);
  std::vector<unsigned char> all;
  for (auto& d : s.data)
    all.insert(all.end(), d.begin(), d.end());
  std::string path = dir / "stream.safetensors";
  {
    safetensors_writer w(path, s.specs);
    CHECK(w.data_bytes() == all.size());
    for (std::size_t i = 0; i < all.size(); i += 3) // odd chunks straddle every tensor edge
      w.write(all.data() + i, std::min<std::size_t>(3, all.size() - i));
    CHECK_THROWS_WITH_AS(w.write(all.data(), 1), doctest::Contains("hold only"), checkpoint_error);
    w.finish(false);
    CHECK(std::filesystem::file_size(path) == w.file_bytes());
  }
  auto f = safetensors_file::open(path);
  for (std::size_t i = 0; i < s.specs.size(); ++i)
    CHECK(std::equal(s.data[i].begin(), s.data[i].end(), reinterpret_cast<const unsigned char*>(f.tensors()[i].data)));

  std::string partial = dir / "partial.safetensors";
  {
    safetensors_writer w(partial, s.specs);
    w.write(all.data(), 4);
    CHECK_THROWS_WITH_AS(w.finish(), doctest::Contains("finished after 4 of"), checkpoint_error);
  }
  CHECK(!std::filesystem::exists(partial)); // unfinished files are removed
  {
    safetensors_writer w(partial, s.specs);
    w.write(all.data(), 4);
  }
  CHECK(!std::filesystem::exists(partial));
}

TEST_CASE("writer rejects bad tensor lists") {
  scratch_dir dir;
  auto err = [&](std::vector<tensor_spec> specs) -> std::string {
    try {
      safetensors_writer w(dir / "w.safetensors", std::move(specs));
    } catch (const checkpoint_error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(err({{"a", dtype::f32, {1}}, {"a", dtype::f32, {1}}}).find("duplicate tensor name 'a'") != std::string::npos);
  CHECK(err({{"", dtype::f32, {1}}}).find("empty name") != std::string::npos);
  CHECK(err({{"__metadata__", dtype::f32, {1}}}).find("reserved") != std::string::npos);
  CHECK(err({{"n", dtype::f32, {2, -1}}}).find("tensor 'n': negative dimension") != std::string::npos);
  CHECK(err({{"o", dtype::f32, {1ll << 40, 1ll << 40}}}).find("tensor 'o'") != std::string::npos);
  CHECK(err({{"bad \xff utf-8", dtype::f32, {1}}}) == dir / "w.safetensors" + ": tensor name \"bad \xef\xbf\xbd utf-8\" is not valid UTF-8");
  CHECK(err({{"ok", dtype::f32, {1}}}).empty());
  try {
    safetensors_writer w(dir / "m.safetensors", {{"t", dtype::f32, {1}}}, {{"format", "p\xfft"}});
    FAIL("no exception");
  } catch (const checkpoint_error& e) {
    CHECK(std::string(e.what()) == dir / "m.safetensors" + ": __metadata__: \"p\xef\xbf\xbdt\" is not valid UTF-8");
  }
  CHECK(!std::filesystem::exists(dir / "w.safetensors") ); // the ok writer was never finished
}

TEST_CASE("safetensors_file: open errors name the path, a moved file stays valid") {
  scratch_dir dir;
  CHECK_THROWS_WITH_AS(safetensors_file::open(dir / "missing"), doctest::Contains("/missing: cannot open"),
                       checkpoint_error);
  CHECK_THROWS_WITH_AS(safetensors_file::open(dir.path()), doctest::Contains("is a directory"), checkpoint_error);
  write_file(dir / "empty.safetensors", "");
  CHECK_THROWS_WITH_AS(safetensors_file::open(dir / "empty.safetensors"), doctest::Contains("too short"),
                       checkpoint_error);

  auto s = make_sample(dtype::f32);
  write_safetensors(dir / "m.safetensors", s.tensors());
  auto a = safetensors_file::open(dir / "m.safetensors");
  const std::byte* p = a.tensors()[0].data;
  safetensors_file b = std::move(a);
  CHECK(b.tensors()[0].data == p);
  CHECK(b.find("scalar") != nullptr);
  CHECK(a.tensors().empty());
  std::vector<safetensors_file> v;
  v.push_back(std::move(b));
  v.emplace_back(safetensors_file::open(dir / "m.safetensors"));
  CHECK(std::equal(s.data[0].begin(), s.data[0].end(), reinterpret_cast<const unsigned char*>(v[0].tensors()[0].data)));
}

TEST_CASE("safetensors_file: memory larger than the file is read only as far as the file goes") {
  scratch_dir dir;
  auto s = make_sample(dtype::f32);
  write_safetensors(dir / "m.safetensors", s.tensors());
  const std::string whole = read_file(dir / "m.safetensors");
  // A recycled block is larger than the file; what lies past the file is
  // here the rest of a valid file, so only a bound by the file's size refuses it.
  std::size_t asked = 0;
  const file_memory larger = [&](std::size_t bytes) {
    asked = bytes;
    std::shared_ptr<std::byte> block(new std::byte[2 * whole.size()], std::default_delete<std::byte[]>());
    std::memcpy(block.get(), whole.data(), whole.size());
    std::memset(block.get() + whole.size(), '}', whole.size());
    return block;
  };
  auto f = safetensors_file::open(dir / "m.safetensors", larger);
  CHECK(asked == whole.size());
  CHECK(f.tensors().size() == s.tensors().size());
  CHECK(std::equal(s.data[0].begin(), s.data[0].end(), reinterpret_cast<const unsigned char*>(f.tensors()[0].data)));
  write_file(dir / "cut.safetensors", whole.substr(0, whole.size() - 1)); // the last data byte missing
  asked = 0;
  CHECK_THROWS_AS(safetensors_file::open(dir / "cut.safetensors", larger), checkpoint_error);
  CHECK(asked == 0); // refused from its header, before any memory
}

TEST_CASE("safetensors_file: a file its header does not describe is refused before its size is allocated") {
  scratch_dir dir;
  std::size_t asked = 0;
  const file_memory counting = [&](std::size_t bytes) {
    asked = bytes;
    return std::shared_ptr<std::byte>(new std::byte[bytes], std::default_delete<std::byte[]>());
  };
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  struct row {
    const char* what;
    std::string bytes;
    const char* message;
  };
  const std::vector<row> rows = {
      {"not a checkpoint", "GARBAGE!" + std::string(1 << 20, 'x'), "exceeds the limit of 100000000 bytes"},
      {"a plausible length, no JSON", image("xxxx", 1 << 20), "header is not a JSON object"},
      {"more data than the header describes", image(header, 1 << 20), "belong to no tensor (incomplete metadata)"},
      {"less data than the header describes", image(header, 4), "end is beyond the data section (4 bytes)"},
      {"a header longer than the file", image(header, 0).substr(0, 20), "runs past the end of the file"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.what);
    write_file(dir / "f.safetensors", r.bytes);
    asked = 0;
    CHECK_THROWS_WITH_AS(safetensors_file::open(dir / "f.safetensors", counting), doctest::Contains(r.message),
                         checkpoint_error);
    CHECK(asked == 0);
  }
  write_file(dir / "f.safetensors", image(header, 8));
  auto f = safetensors_file::open(dir / "f.safetensors", counting);
  CHECK(asked == 8 + header.size() + 8);
  REQUIRE(f.find("w") != nullptr);
  CHECK(std::to_integer<int>(f.find("w")->data[7]) == 1); // the views point into the file's memory
}

TEST_CASE("reader: names and values from the file are echoed printable, and cut") {
  // A JSON escape decodes to a control character that must not reach a terminal.
  CHECK(parse_error(image(R"({"a\u001b[2J\nFORGED":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8))
        == "mem: tensor 'a\\x1b[2J\\x0aFORGED': unsupported dtype 'F64' (rlsync reads BF16, F16, F32)");
  const std::string long_name(1000, 'n');
  auto message = parse_error(image("{\"" + long_name + R"(":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8));
  CHECK(message.find(std::string(256, 'n') + "...'") != std::string::npos);
  CHECK(message.find(std::string(257, 'n')) == std::string::npos);
  CHECK(parse_error(image(R"({"__metadata__":{"k\u0007":null},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8))
        == "mem: __metadata__: 'k\\x07': expected a string, got 'null'");
}

TEST_CASE("every file in tests/data/bad_safetensors is rejected with the right message") {
  // The cases make_corpus.py writes and a fragment their message must hold.
  // Other files there (inputs the fuzzer found) must merely be rejected.
  const std::map<std::string, std::string> expected = {
    {"empty_file", "too short"},
    {"too_short", "too short"},
    {"header_too_large", "exceeds the limit"},
    {"header_past_eof", "runs past the end of the file"},
    {"header_empty", "not a JSON object"},
    {"header_not_object", "not a JSON object"},
    {"header_string", "not a JSON object"},
    {"header_leading_space", "not a JSON object"},
    {"header_nul_padding", "invalid JSON"},
    {"invalid_json", "invalid JSON"},
    {"deep_nesting", "nested deeper than"},
    {"entry_not_object", "tensor 't': expected an object, got '5'"},
    {"entry_array", "tensor 't': expected an object, got an array"},
    {"empty_name", "tensor with an empty name"},
    {"duplicate_name", "duplicate tensor name 't'"},
    {"missing_dtype", "tensor 't': missing field 'dtype'"},
    {"missing_shape", "tensor 't': missing field 'shape'"},
    {"missing_data_offsets", "tensor 't': missing field 'data_offsets'"},
    {"unknown_field", "tensor 't': unknown field 'extra'"},
    {"duplicate_field", "tensor 't': duplicate field 'dtype'"},
    {"dtype_not_string", "tensor 't': dtype: expected a string"},
    {"unsupported_dtype", "tensor 't': unsupported dtype 'I8'"},
    {"shape_not_array", "tensor 't': shape: expected an array of integers, got '2'"},
    {"shape_object", "tensor 't': shape: expected an array of integers, got an object"},
    {"shape_negative", "tensor 't': shape[0]: expected a non-negative integer, got '-2'"},
    {"shape_not_integer", "tensor 't': shape[0]: expected a non-negative integer, got '2.0'"},
    {"shape_nested", "tensor 't': shape[0]: expected a non-negative integer, got an array"},
    {"shape_overflow", "tensor 't': shape [4294967296, 4294967296, 4]: element count overflows"},
    {"shape_too_large", "tensor 't': shape[0]: 99999999999999999999 is too large"},
    {"offsets_one_value", "tensor 't': data_offsets: expected two integers [begin, end], got 1 value"},
    {"offsets_three_values", "tensor 't': data_offsets: expected two integers [begin, end], got 3 values"},
    {"offsets_not_array", "tensor 't': data_offsets: expected two integers [begin, end], got '0,8'"},
    {"offsets_negative", "tensor 't': data_offsets[0]: expected a non-negative integer, got '-8'"},
    {"offsets_not_integer", "tensor 't': data_offsets[1]: expected a non-negative integer, got '8e0'"},
    {"offsets_too_large", "tensor 't': data_offsets[1]: 99999999999999999999 is too large"},
    {"offsets_begin_after_end", "tensor 't': data_offsets [8, 0]: begin is after end"},
    {"size_mismatch", "tensor 't': data_offsets [0, 8] hold 8 bytes but F32 [3] needs 12"},
    {"offsets_beyond_data", "tensor 't': data_offsets [0, 8]: end is beyond the data section (4 bytes)"},
    {"overlap", "tensors 'a' [0, 8) and 'b' [4, 12) overlap"},
    {"hole", "data bytes [4, 8) belong to no tensor (a hole before 'b')"},
    {"leading_hole", "data bytes [0, 4) belong to no tensor (a hole before 'a')"},
    {"incomplete_metadata", "data bytes [4, 8) at the end of the file belong to no tensor (incomplete metadata)"},
    {"metadata_not_object", "__metadata__: expected an object of strings, got 'x'"},
    {"metadata_array", "__metadata__: expected an object of strings, got an array"},
    {"metadata_value_object", "__metadata__: 'k': expected a string, got an object"},
    {"metadata_duplicate_key", "__metadata__: duplicate key 'k'"},
    {"metadata_twice", "__metadata__ appears twice"},
    {"shape_string", "tensor 't': shape[0]: expected a non-negative integer, got the string '2'"},
    {"shape_empty_object", "tensor 't': shape: expected an array of integers, got an object"},
    {"shape_empty_string", "tensor 't': shape: expected an array of integers, got an empty string"},
    {"offsets_string", "tensor 't': data_offsets[1]: expected a non-negative integer, got the string '8'"},
    {"offsets_float", "tensor 't': data_offsets[1]: expected a non-negative integer, got '8.0'"},
    {"entry_empty_array", "tensor 't': expected an object, got an array"},
    {"metadata_value_number", "__metadata__: 'k': expected a string, got '5'"},
  };
  namespace fs = std::filesystem;
  const fs::path corpus = fs::path(RLSYNC_TEST_DATA) / "bad_safetensors";
  std::set<std::string> seen;
  for (auto& entry : fs::directory_iterator(corpus)) {
    if (!entry.is_regular_file() || entry.path().extension() == ".py" || entry.path().extension() == ".md")
      continue;
    std::string path = entry.path().string(), stem = entry.path().stem().string();
    CAPTURE(path);
    std::string message;
    try {
      safetensors_file::open(path);
    } catch (const checkpoint_error& e) {
      message = e.what();
    }
    // Rejected, with the path first and a reason after it.
    REQUIRE(message.size() > path.size() + 2);
    CHECK(message.compare(0, path.size() + 2, path + ": ") == 0);
    // The in-memory parser agrees with the file reader.
    std::string bytes = read_file(path);
    CHECK(parse_error(bytes) == "mem" + message.substr(path.size()));
    if (auto it = expected.find(stem); it != expected.end()) {
      CHECK_MESSAGE(message.find(it->second) != std::string::npos, message);
      seen.insert(stem);
    }
  }
  for (auto& kv : expected) {
    CAPTURE(kv.first);
    CHECK(seen.count(kv.first) == 1); // the corpus must not lose a case
  }
}
