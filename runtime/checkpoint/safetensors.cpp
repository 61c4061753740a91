// safetensors: validating parser over a byte span (used by the file reader
// and the fuzzer), the file reader (into owned memory), and the streaming writer.
//
// The header is parsed with nlohmann-json's SAX interface into header_value,
// a small tree that keeps what nlohmann's own DOM would lose:
//  - every member of an object, in order, duplicates included, so that a
//    duplicate tensor name, field or metadata key is refused (nlohmann's DOM
//    parser silently keeps the last one);
//  - numbers as written ("8e0", "99999999999999999999"), for messages.
// Types are exact: shape and data_offsets take JSON integers only (not "5",
// not 5.0), metadata values strings only. The handler refuses nesting deeper
// than a header needs and more values than a header can sensibly hold, as
// they arrive, so a hostile header can exhaust neither stack nor memory
// (nlohmann's parser itself does not recurse).
#include "runtime/checkpoint/safetensors.hpp"

#include "runtime/base/json.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/base/regular_file.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <unordered_set>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace rlsync {

namespace {

// A safetensors header nests at most 3 deep ({ name: { shape: [ ] } }).
constexpr int max_json_depth = 8;
// Real headers hold about 10 values per tensor; 4M allows 400k tensors while
// bounding the tree to well under a few GB.
constexpr std::size_t max_json_values = 4'000'000;

std::string errno_text() { return std::strerror(errno); }

std::uint64_t load_le64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

// One JSON value of the header.
struct header_value {
  enum class kind { null, boolean, negative_integer, unsigned_integer, other_number, string, array, object };
  kind type = kind::null;
  std::string text;        // a string's contents; a number or literal as written
  std::uint64_t uint = 0;  // the value of an unsigned_integer
  std::vector<std::pair<std::string, header_value>> items; // object members in order (duplicates
                                                           // kept) or array elements (empty keys)
};

// Builds the header_value tree from nlohmann's SAX events.
class header_sax : public nlohmann::json_sax<nlohmann::json> {
public:
  bool null() override { return scalar(header_value::kind::null, "null"); }
  bool boolean(bool v) override { return scalar(header_value::kind::boolean, v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override {
    // nlohmann reports every number written with a minus sign here, -0 too.
    return scalar(header_value::kind::negative_integer, v == 0 ? "-0" : std::to_string(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    return place({header_value::kind::unsigned_integer, std::to_string(v), v, {}}) != nullptr;
  }
  // Fractions, exponents, and integers beyond 64 bits.
  bool number_float(number_float_t, const string_t& written) override {
    return scalar(header_value::kind::other_number, written);
  }
  bool string(string_t& v) override { return scalar(header_value::kind::string, std::move(v)); }
  bool binary(binary_t&) override { return refuse("header: binary value"); } // only binary formats have them

  bool start_object(std::size_t) override { return open(header_value::kind::object); }
  bool start_array(std::size_t) override { return open(header_value::kind::array); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return refuse("header: " + json_syntax_message(e));
  }

  header_value root;
  std::string error; // why parsing stopped

private:
  bool refuse(std::string why) {
    error = std::move(why);
    return false;
  }

  bool scalar(header_value::kind type, std::string text) { return place({type, std::move(text), 0, {}}) != nullptr; }

  header_value* place(header_value&& v) {
    if (++values_ > max_json_values) {
      refuse("header: more than " + std::to_string(max_json_values) + " JSON values");
      return nullptr;
    }
    if (open_.empty()) {
      root = std::move(v);
      return &root;
    }
    auto& items = open_.back()->items; // grows only while no child of it is open
    items.emplace_back(open_.back()->type == header_value::kind::object ? std::move(key_) : std::string(),
                       std::move(v));
    return &items.back().second;
  }

  bool open(header_value::kind type) {
    if (static_cast<int>(open_.size()) >= max_json_depth)
      return refuse("header: JSON nested deeper than " + std::to_string(max_json_depth)
                    + " levels (a safetensors header needs 3)");
    header_value* placed = place({type, {}, 0, {}});
    if (!placed)
      return false;
    open_.push_back(placed);
    return true;
  }

  bool close() {
    open_.pop_back();
    return true;
  }

  std::vector<header_value*> open_; // the containers being filled, outermost first
  std::string key_;                 // the key whose value comes next
  std::size_t values_ = 0;
};

enum class int_status { ok, not_integer, too_large };

// A JSON non-negative integer, at most `max`.
int_status read_uint(const header_value& v, std::uint64_t max, std::uint64_t& out) {
  // nlohmann reads an integer too large for 64 bits as a floating-point
  // number; its text is then still all digits.
  bool digits_only = !v.text.empty() && v.text.find_first_not_of("0123456789") == std::string::npos;
  if (v.type == header_value::kind::other_number && digits_only)
    return int_status::too_large;
  if (v.type != header_value::kind::unsigned_integer)
    return int_status::not_integer;
  if (v.uint > max)
    return int_status::too_large;
  out = v.uint;
  return int_status::ok;
}

// What a value looks like, for messages.
std::string describe(const header_value& v) {
  switch (v.type) {
  case header_value::kind::object: return "an object";
  case header_value::kind::array: return "an array";
  case header_value::kind::string:
    if (v.text.empty())
      return "an empty string";
    [[fallthrough]];
  default: return "'" + printable(v.text) + "'";
  }
}

// The value where an integer belongs: a string of digits is named as one.
std::string describe_as_integer(const header_value& v) {
  return v.type == header_value::kind::string && !v.text.empty() ? "the string '" + printable(v.text) + "'" : describe(v);
}

class header_parser {
public:
  header_parser(const std::string& source, std::uint64_t data_size, const unsigned char* data)
      : source_(source), data_size_(data_size), data_(data) {}

  [[noreturn]] void fail(const std::string& what) const { throw checkpoint_error(source_ + ": " + what); }

  // `root` is an object: the caller checked that the header starts with '{'.
  void parse(const header_value& root, safetensors_layout& out) {
    bool seen_metadata = false;
    std::unordered_set<std::string> names;
    for (auto& [key, node] : root.items) {
      if (key == "__metadata__") {
        if (seen_metadata)
          fail("__metadata__ appears twice");
        seen_metadata = true;
        parse_metadata(node, out.metadata);
        continue;
      }
      if (key.empty())
        fail("tensor with an empty name");
      if (!names.insert(key).second)
        fail("duplicate tensor name '" + printable(key) + "'");
      out.tensors.push_back(parse_tensor(key, node));
    }
    check_coverage(out.tensors);
  }

private:
  void parse_metadata(const header_value& node, std::map<std::string, std::string>& out) const {
    if (node.type != header_value::kind::object)
      fail("__metadata__: expected an object of strings, got " + describe(node));
    for (auto& [k, v] : node.items) {
      if (v.type != header_value::kind::string)
        fail("__metadata__: '" + printable(k) + "': expected a string, got " + describe(v));
      if (!out.emplace(k, v.text).second)
        fail("__metadata__: duplicate key '" + printable(k) + "'");
    }
  }

  tensor_view parse_tensor(const std::string& name, const header_value& node) const {
    std::string where = "tensor '" + printable(name) + "'";
    if (node.type != header_value::kind::object)
      fail(where + ": expected an object, got " + describe(node));
    const header_value* dtype_node = nullptr;
    const header_value* shape_node = nullptr;
    const header_value* offsets_node = nullptr;
    for (auto& [k, v] : node.items) {
      const header_value** slot = k == "dtype" ? &dtype_node
                                  : k == "shape" ? &shape_node
                                  : k == "data_offsets" ? &offsets_node
                                                        : nullptr;
      if (!slot)
        fail(where + ": unknown field '" + printable(k) + "'");
      if (*slot)
        fail(where + ": duplicate field '" + printable(k) + "'");
      *slot = &v;
    }
    for (auto [field, p] : {std::pair{"dtype", dtype_node}, {"shape", shape_node}, {"data_offsets", offsets_node}})
      if (!p)
        fail(where + ": missing field '" + field + "'");

    tensor_view t;
    t.name = name;
    if (dtype_node->type != header_value::kind::string)
      fail(where + ": dtype: expected a string, got " + describe(*dtype_node));
    auto dt = parse_safetensors_dtype(dtype_node->text);
    if (!dt)
      fail(where + ": unsupported dtype '" + printable(dtype_node->text) + "' (rlsync reads BF16, F16, F32)");
    t.type = *dt;

    if (shape_node->type != header_value::kind::array)
      fail(where + ": shape: expected an array of integers, got " + describe(*shape_node));
    std::uint64_t numel = 1;
    bool overflow = false;
    for (auto& [unused, v] : shape_node->items) {
      std::string field = where + ": shape[" + std::to_string(t.shape.size()) + "]";
      std::uint64_t dim = 0;
      switch (read_uint(v, std::uint64_t(INT64_MAX), dim)) {
      case int_status::not_integer: fail(field + ": expected a non-negative integer, got " + describe_as_integer(v));
      case int_status::too_large: fail(field + ": " + v.text + " is too large");
      case int_status::ok: break;
      }
      t.shape.push_back(static_cast<std::int64_t>(dim));
      // Overflow only matters when no dimension is zero; keep scanning.
      if (__builtin_mul_overflow(numel, dim, &numel))
        overflow = true;
    }
    bool has_zero = std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end();
    // Sizes must fit in int64 bytes, so numel() and bytes() never overflow.
    if (has_zero)
      numel = 0;
    else if (overflow || numel > std::uint64_t(INT64_MAX) / dtype_size(t.type))
      fail(where + ": shape " + shape_string(t.shape) + ": element count overflows");
    std::uint64_t bytes = numel * dtype_size(t.type);

    bool offsets_array = offsets_node->type == header_value::kind::array;
    std::size_t offsets_count = offsets_node->items.size();
    if (!offsets_array || offsets_count != 2)
      fail(where + ": data_offsets: expected two integers [begin, end], got "
           + (offsets_array ? std::to_string(offsets_count) + (offsets_count == 1 ? " value" : " values")
                            : describe(*offsets_node)));
    std::uint64_t range[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      const header_value& v = offsets_node->items[i].second;
      std::string field = where + ": data_offsets[" + std::to_string(i) + "]";
      switch (read_uint(v, UINT64_MAX, range[i])) {
      case int_status::not_integer: fail(field + ": expected a non-negative integer, got " + describe_as_integer(v));
      case int_status::too_large: fail(field + ": " + v.text + " is too large");
      case int_status::ok: break;
      }
    }
    auto [begin, end] = range;
    std::string span = "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
    if (begin > end)
      fail(where + ": data_offsets " + span + ": begin is after end");
    if (end - begin != bytes)
      fail(where + ": data_offsets " + span + " hold " + std::to_string(end - begin) + " bytes but "
           + std::string(safetensors_name(t.type)) + " " + shape_string(t.shape) + " needs "
           + std::to_string(bytes));
    if (end > data_size_)
      fail(where + ": data_offsets " + span + ": end is beyond the data section ("
           + std::to_string(data_size_) + " bytes)");
    t.offset = begin;
    t.size = static_cast<std::size_t>(bytes);
    t.data = data_ ? reinterpret_cast<const std::byte*>(data_ + begin) : nullptr;
    return t;
  }

  // Tensors must tile the data section exactly, as Hugging Face's reader
  // demands: no overlap, no byte that belongs to no tensor.
  void check_coverage(std::vector<tensor_view>& tensors) const {
    std::stable_sort(tensors.begin(), tensors.end(), [](const tensor_view& a, const tensor_view& b) {
      return a.offset != b.offset ? a.offset < b.offset : a.size < b.size;
    });
    std::uint64_t covered = 0;
    const tensor_view* last = nullptr; // the tensor that ends at `covered`
    for (auto& t : tensors) {
      if (t.offset < covered)
        fail("tensors '" + printable(last->name) + "' [" + std::to_string(last->offset) + ", "
             + std::to_string(covered) + ") and '" + printable(t.name) + "' [" + std::to_string(t.offset) + ", "
             + std::to_string(t.offset + t.size) + ") overlap");
      if (t.offset > covered)
        fail("data bytes [" + std::to_string(covered) + ", " + std::to_string(t.offset)
             + ") belong to no tensor (a hole before '" + printable(t.name) + "')");
      covered = t.offset + t.size;
      last = &t;
    }
    if (covered != data_size_)
      fail("data bytes [" + std::to_string(covered) + ", " + std::to_string(data_size_)
           + ") at the end of the file belong to no tensor (incomplete metadata)");
  }

  const std::string& source_;
  std::uint64_t data_size_;
  const unsigned char* data_;
};

// JSON text is UTF-8, and nlohmann refuses to write a string that is not.
bool is_utf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

void check_specs(const std::vector<tensor_spec>& tensors, const std::string& source) {
  std::unordered_set<std::string> names;
  for (auto& t : tensors) {
    if (t.name.empty())
      throw checkpoint_error(source + ": tensor with an empty name");
    if (!is_utf8(t.name))
      throw checkpoint_error(source + ": tensor name " + json_quote(t.name) + " is not valid UTF-8");
    if (t.name == "__metadata__")
      throw checkpoint_error(source + ": '__metadata__' is reserved, not a tensor name");
    if (!names.insert(t.name).second)
      throw checkpoint_error(source + ": duplicate tensor name '" + printable(t.name) + "'");
    std::int64_t n = 1;
    for (auto d : t.shape) {
      if (d < 0)
        throw checkpoint_error(source + ": tensor '" + printable(t.name) + "': negative dimension in shape "
                               + shape_string(t.shape));
      if (__builtin_mul_overflow(n, d, &n))
        throw checkpoint_error(source + ": tensor '" + printable(t.name) + "': shape " + shape_string(t.shape)
                               + ": element count overflows");
    }
    std::int64_t bytes;
    if (__builtin_mul_overflow(n, std::int64_t(dtype_size(t.type)), &bytes))
      throw checkpoint_error(source + ": tensor '" + printable(t.name) + "': shape " + shape_string(t.shape)
                             + ": byte size overflows");
  }
}

/// The header's length, checked against the file's size.
std::uint64_t header_length(const unsigned char* bytes, std::size_t available, std::uint64_t size,
                            const std::string& source) {
  auto fail = [&](const std::string& what) { throw checkpoint_error(source + ": " + what); };
  if (size < 8)
    fail("file is " + std::to_string(size) + " bytes, too short for the 8-byte header length");
  if (available < 8)
    throw std::logic_error("safetensors: the 8-byte header length was not read");
  std::uint64_t n = load_le64(bytes);
  if (n > safetensors_max_header)
    fail("header length " + std::to_string(n) + " exceeds the limit of "
         + std::to_string(safetensors_max_header) + " bytes");
  if (n > size - 8)
    fail("header length " + std::to_string(n) + " runs past the end of the file ("
         + std::to_string(size) + " bytes)");
  return n;
}

/// Parses an image of `size` bytes whose first `available` bytes are at
/// `bytes`; the views point into it when `with_data`, else they are null.
safetensors_layout parse_image(const unsigned char* bytes, std::size_t available, std::uint64_t size, bool with_data,
                               const std::string& source) {
  auto fail = [&](const std::string& what) { throw checkpoint_error(source + ": " + what); };
  const std::uint64_t n = header_length(bytes, available, size, source);
  if (available - 8 < n)
    throw std::logic_error("safetensors: the header was not read whole");
  std::string_view header(reinterpret_cast<const char*>(bytes + 8), static_cast<std::size_t>(n));
  // Hugging Face's reader demands that the header start with '{'.
  if (header.empty() || header.front() != '{')
    fail("header is not a JSON object (it must start with '{')");

  if (auto nul = json_nul_byte_message(header); !nul.empty())
    fail("header: " + nul);
  header_sax sax;
  if (!nlohmann::json::sax_parse(header.begin(), header.end(), &sax))
    fail(sax.error.empty() ? "header: invalid JSON" : sax.error);

  safetensors_layout out;
  out.header_size = n;
  std::uint64_t data_size = size - 8 - n;
  header_parser(source, data_size, with_data ? bytes + 8 + n : nullptr).parse(sax.root, out);
  return out;
}

/// Reads exactly `bytes` at `offset`; false when the file ends first.
bool read_at(int fd, unsigned char* into, std::size_t bytes, std::uint64_t offset, const std::string& path) {
  std::size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::pread(fd, into + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      throw checkpoint_error(printable(path) + ": cannot read: " + errno_text());
    if (n == 0)
      return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

} // namespace

safetensors_layout parse_safetensors(const void* data, std::size_t size, const std::string& source) {
  return parse_image(static_cast<const unsigned char*>(data), size, size, true, source);
}

safetensors_layout parse_safetensors_header(const void* head, std::size_t head_size, std::uint64_t file_size,
                                            const std::string& source) {
  return parse_image(static_cast<const unsigned char*>(head), head_size, file_size, false, source);
}

// ---- safetensors_file ------------------------------------------------------

namespace {

/// An open regular file, closed on destruction.
struct open_file {
  regular_file file;
  explicit open_file(const std::string& path) {
    try {
      file = open_regular_file(path);
    } catch (const file_error& e) {
      throw checkpoint_error(e.what());
    }
  }
  ~open_file() { ::close(file.fd); }
  open_file(const open_file&) = delete;
  open_file& operator=(const open_file&) = delete;
};

/// The file's first bytes, its length and header (where the length is
/// plausible), and their layout, validated against the file's size: a file
/// that is not a checkpoint is refused before anything of its size is read.
safetensors_layout read_head(int fd, std::size_t size, const std::string& path, std::vector<unsigned char>& head) {
  head.assign(std::min<std::size_t>(size, 8), 0);
  if (!read_at(fd, head.data(), head.size(), 0, path))
    throw checkpoint_error(printable(path) + ": changed while being read (shrank below 8 bytes)");
  if (size >= 8) {
    std::uint64_t n = load_le64(head.data());
    if (n <= safetensors_max_header && n <= size - 8) {
      head.resize(static_cast<std::size_t>(8 + n));
      if (!read_at(fd, head.data() + 8, static_cast<std::size_t>(n), 8, path))
        throw checkpoint_error(printable(path) + ": changed while being read (shrank within its header)");
    }
  }
  return parse_safetensors_header(head.data(), head.size(), size, printable(path, path.size()));
}

} // namespace

safetensors_layout read_safetensors_header(const std::string& path) {
  open_file f(path);
  std::vector<unsigned char> head;
  return read_head(f.file.fd, f.file.size, path, head);
}

safetensors_file safetensors_file::open(const std::string& path, const file_memory& memory) {
  safetensors_file f;
  f.path_ = path;
  // Read into memory this process owns rather than mapped: a writer that
  // truncates or rewrites the file in place while a mapping is in use would
  // end this process with SIGBUS. A file that changes while it is read is
  // refused here instead.
  open_file opened(path);
  const auto& file = opened.file;
  f.size_ = file.size;
  std::vector<unsigned char> head;
  f.layout_ = read_head(file.fd, f.size_, path, head);
  if (f.size_ > 0) {
    try { // not zero-filled: every byte is read below
      f.data_ = memory ? memory(f.size_) : std::shared_ptr<std::byte>(new std::byte[f.size_], std::default_delete<std::byte[]>());
    } catch (const std::bad_alloc&) {
    }
    if (!f.data_)
      throw checkpoint_error(printable(path) + ": cannot allocate " + std::to_string(f.size_)
                             + " bytes to read the file into memory");
  }
  auto* base = reinterpret_cast<unsigned char*>(f.data_.get());
  if (!read_at(file.fd, base, f.size_, 0, path))
    throw checkpoint_error(printable(path) + ": changed while being read (shrank below "
                           + std::to_string(f.size_) + " bytes)");
  struct stat after {};
  if (::fstat(file.fd, &after) != 0 || static_cast<std::size_t>(after.st_size) != f.size_)
    throw checkpoint_error(printable(path) + ": changed while being read (was " + std::to_string(f.size_)
                           + " bytes, now " + std::to_string(after.st_size) + ")");
  if (std::memcmp(base, head.data(), head.size()) != 0)
    throw checkpoint_error(printable(path) + ": changed while being read (its header is not the one checked)");
  // The views, validated above, now point into the file's memory.
  const unsigned char* data = base + 8 + f.layout_.header_size;
  for (auto& t : f.layout_.tensors)
    t.data = reinterpret_cast<const std::byte*>(data + t.offset);
  for (std::size_t i = 0; i < f.layout_.tensors.size(); ++i)
    f.by_name_.emplace(f.layout_.tensors[i].name, i);
  return f;
}

safetensors_file::safetensors_file(safetensors_file&& other) noexcept { *this = std::move(other); }

safetensors_file& safetensors_file::operator=(safetensors_file&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_);
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
    layout_ = std::move(other.layout_);
    by_name_ = std::move(other.by_name_);
    other.layout_ = {};
    other.by_name_.clear();
  }
  return *this;
}

safetensors_file::~safetensors_file() { close(); }

void safetensors_file::close() {
  data_.reset();
  size_ = 0;
}

const tensor_view* safetensors_file::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &layout_.tensors[it->second];
}

// ---- writing ---------------------------------------------------------------

std::string safetensors_header(const std::vector<tensor_spec>& tensors,
                               const std::map<std::string, std::string>& metadata,
                               const std::string& source) {
  check_specs(tensors, source);
  // Compact, metadata first, as Hugging Face's serializer writes it.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  for (auto& [k, v] : metadata)
    for (auto* text : {&k, &v})
      if (!is_utf8(*text))
        throw checkpoint_error(source + ": __metadata__: " + json_quote(*text) + " is not valid UTF-8");
  if (!metadata.empty())
    header["__metadata__"] = metadata;
  // Names are unique (check_specs), so members are appended directly: the
  // ordered map's own insert searches the keys linearly each time.
  auto& members = header.get_ref<nlohmann::ordered_json::object_t&>();
  members.reserve(members.size() + tensors.size());
  std::uint64_t offset = 0;
  for (auto& t : tensors) {
    std::uint64_t end;
    if (__builtin_add_overflow(offset, t.bytes(), &end))
      throw checkpoint_error(source + ": total data size overflows");
    members.emplace_back(t.name, nlohmann::ordered_json{{"dtype", safetensors_name(t.type)},
                                                        {"shape", t.shape},
                                                        {"data_offsets", {offset, end}}});
    offset = end;
  }
  std::string json = header.dump(); // check_specs and the loop above let only UTF-8 in
  json.resize((json.size() + 7) / 8 * 8, ' '); // data start 8-aligned
  if (json.size() > safetensors_max_header)
    throw checkpoint_error(source + ": header of " + std::to_string(json.size())
                           + " bytes exceeds the limit of " + std::to_string(safetensors_max_header));
  std::string out(8, '\0');
  std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

namespace {
constexpr std::size_t writer_buffer_bytes = 1 << 20;
}

safetensors_writer::safetensors_writer(std::string path, std::vector<tensor_spec> tensors,
                                       std::map<std::string, std::string> metadata)
    : path_(std::move(path)), tensors_(std::move(tensors)) {
  std::string header = safetensors_header(tensors_, metadata, path_);
  header_bytes_ = header.size();
  for (auto& t : tensors_)
    data_bytes_ += t.bytes();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw checkpoint_error(path_ + ": cannot create: " + errno_text());
  try {
    write_fully(header.data(), header.size());
  } catch (...) {
    ::close(fd_);
    ::unlink(path_.c_str());
    fd_ = -1;
    throw;
  }
}

safetensors_writer::~safetensors_writer() {
  if (fd_ >= 0) { // never finished: do not leave a file that looks complete
    ::close(fd_);
    ::unlink(path_.c_str());
  }
}

void safetensors_writer::write_fully(const void* data, std::size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, std::min<std::size_t>(size, 1u << 30));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      throw checkpoint_error(path_ + ": write failed: " + (n < 0 ? errno_text() : "no progress"));
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void safetensors_writer::flush_buffer() {
  if (buffered_ > 0)
    write_fully(buffer_.data(), buffered_);
  buffered_ = 0;
}

void safetensors_writer::write(const void* data, std::size_t size) {
  if (fd_ < 0)
    throw checkpoint_error(path_ + ": write after finish");
  if (size > data_bytes_ - written_)
    throw checkpoint_error(path_ + ": " + std::to_string(written_ + size) + " data bytes written but the "
                           + std::to_string(tensors_.size()) + " tensors hold only "
                           + std::to_string(data_bytes_));
  if (size == 0) // data may be null then
    return;
  written_ += size;
  if (size >= writer_buffer_bytes) { // large chunks go straight to the file
    flush_buffer();
    write_fully(data, size);
    return;
  }
  if (buffer_.empty())
    buffer_.resize(writer_buffer_bytes);
  if (buffered_ + size > buffer_.size())
    flush_buffer();
  std::memcpy(buffer_.data() + buffered_, data, size);
  buffered_ += size;
}

void safetensors_writer::finish(bool durable) {
  if (fd_ < 0)
    throw checkpoint_error(path_ + ": finish called twice");
  if (written_ != data_bytes_)
    throw checkpoint_error(path_ + ": finished after " + std::to_string(written_) + " of "
                           + std::to_string(data_bytes_) + " data bytes");
  flush_buffer();
  if (durable && ::fsync(fd_) != 0)
    throw checkpoint_error(path_ + ": fsync failed: " + errno_text());
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    ::unlink(path_.c_str());
    throw checkpoint_error(path_ + ": close failed: " + errno_text());
  }
}

void write_safetensors(const std::string& path, const std::vector<tensor_bytes>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<tensor_spec> specs;
  for (auto& t : tensors)
    specs.push_back(t.spec);
  safetensors_writer w(path, specs, metadata);
  for (auto& t : tensors)
    if (t.spec.bytes() > 0)
      w.write(t.data, t.spec.bytes());
  w.finish(false);
}

} // namespace rlsync
