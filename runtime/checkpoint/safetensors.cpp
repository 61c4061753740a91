// safetensors: validating parser over a byte span (used by the mmap reader
// and the fuzzer), the mapped reader, and the streaming writer.
//
// The header is parsed with Boost.PropertyTree, which keeps every JSON value
// as text and every array as children with empty keys. Consequences, checked
// or accepted here:
//  - a number and a string with the same text are indistinguishable (5 vs
//    "5"), so "shape": ["2"] is read as [2] and a metadata value 5 as "5";
//  - an empty array, an empty object and "" are indistinguishable, so
//    "shape": {} reads as a scalar shape [];
//  - objects with duplicate keys keep them all, so duplicates are detected;
//  - the parser recurses and allocates a node per value: the header is
//    pre-scanned to bound nesting depth and value count before parsing, so
//    a hostile header cannot exhaust the stack or memory.
#include "runtime/checkpoint/safetensors.hpp"

// Boost 1.74's property tree pulls in boost/bind.hpp, which otherwise prints a
// deprecation note in every translation unit.
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <unordered_set>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace rlsync {

namespace {

namespace pt = boost::property_tree;

// A safetensors header nests at most 3 deep ({ name: { shape: [ ] } }).
constexpr int max_json_depth = 8;
// Real headers hold about 10 values per tensor; 4M allows 400k tensors while
// bounding the property tree to well under a few GB.
constexpr std::size_t max_json_values = 4'000'000;

std::string errno_text() { return std::strerror(errno); }

std::uint64_t load_le64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

// Nesting depth and an upper bound on the number of values, counting only
// structural characters outside strings. Returns an error or "".
std::string prescan_json(std::string_view s) {
  int depth = 0;
  std::size_t values = 1;
  bool in_string = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i; // skip the escaped character
      else if (c == '"')
        in_string = false;
      continue;
    }
    switch (c) {
    case '"': in_string = true; break;
    case '{':
    case '[':
      if (++depth > max_json_depth)
        return "header: JSON nested deeper than " + std::to_string(max_json_depth)
               + " levels (a safetensors header needs 3)";
      ++values;
      break;
    case '}':
    case ']': --depth; break;
    case ',':
      if (++values > max_json_values)
        return "header: more than " + std::to_string(max_json_values) + " JSON values";
      break;
    default: break;
    }
  }
  return "";
}

enum class int_status { ok, not_integer, too_large };

// A JSON non-negative integer as text: digits only, at most `max`.
int_status parse_uint(const std::string& s, std::uint64_t max, std::uint64_t& out) {
  if (s.empty())
    return int_status::not_integer;
  std::uint64_t v = 0;
  bool overflow = false;
  for (char c : s) {
    if (c < '0' || c > '9')
      return int_status::not_integer;
    if (!overflow && (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, unsigned(c - '0'), &v)))
      overflow = true;
  }
  if (overflow || v > max)
    return int_status::too_large;
  out = v;
  return int_status::ok;
}

// What a property-tree node looks like, for messages.
std::string describe(const pt::ptree& node) {
  if (node.empty())
    return node.data().empty() ? "an empty value" : "'" + node.data() + "'";
  return node.front().first.empty() ? "an array" : "an object";
}

bool is_array(const pt::ptree& node) {
  if (!node.data().empty())
    return false;
  for (auto& kv : node)
    if (!kv.first.empty())
      return false;
  return true; // includes the empty node: [] and {} look alike
}

class header_parser {
public:
  header_parser(const std::string& source, std::uint64_t data_size, const unsigned char* data)
      : source_(source), data_size_(data_size), data_(data) {}

  [[noreturn]] void fail(const std::string& what) const { throw checkpoint_error(source_ + ": " + what); }

  void parse(const pt::ptree& root, safetensors_layout& out) {
    bool seen_metadata = false;
    std::unordered_set<std::string> names;
    for (auto& [key, node] : root) {
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
        fail("duplicate tensor name '" + key + "'");
      out.tensors.push_back(parse_tensor(key, node));
    }
    check_coverage(out.tensors);
  }

private:
  void parse_metadata(const pt::ptree& node, std::map<std::string, std::string>& out) const {
    if (node.empty() && !node.data().empty())
      fail("__metadata__: expected an object of strings, got " + describe(node));
    for (auto& [k, v] : node) {
      if (k.empty())
        fail("__metadata__: expected an object of strings, got an array");
      if (!v.empty())
        fail("__metadata__: '" + k + "': expected a string, got " + describe(v));
      if (!out.emplace(k, v.data()).second)
        fail("__metadata__: duplicate key '" + k + "'");
    }
  }

  tensor_view parse_tensor(const std::string& name, const pt::ptree& node) const {
    std::string where = "tensor '" + name + "'";
    if (node.empty() && !node.data().empty())
      fail(where + ": expected an object, got " + describe(node));
    const pt::ptree* dtype_node = nullptr;
    const pt::ptree* shape_node = nullptr;
    const pt::ptree* offsets_node = nullptr;
    for (auto& [k, v] : node) {
      const pt::ptree** slot = k == "dtype" ? &dtype_node
                               : k == "shape" ? &shape_node
                               : k == "data_offsets" ? &offsets_node
                                                     : nullptr;
      if (k.empty())
        fail(where + ": expected an object, got an array");
      if (!slot)
        fail(where + ": unknown field '" + k + "'");
      if (*slot)
        fail(where + ": duplicate field '" + k + "'");
      *slot = &v;
    }
    for (auto [field, p] : {std::pair{"dtype", dtype_node}, {"shape", shape_node}, {"data_offsets", offsets_node}})
      if (!p)
        fail(where + ": missing field '" + field + "'");

    tensor_view t;
    t.name = name;
    if (!dtype_node->empty())
      fail(where + ": dtype: expected a string, got " + describe(*dtype_node));
    auto dt = parse_safetensors_dtype(dtype_node->data());
    if (!dt)
      fail(where + ": unsupported dtype '" + dtype_node->data() + "' (rlsync reads BF16, F16, F32)");
    t.type = *dt;

    if (!is_array(*shape_node))
      fail(where + ": shape: expected an array of integers, got " + describe(*shape_node));
    std::uint64_t numel = 1;
    bool overflow = false;
    for (auto& [k, v] : *shape_node) {
      std::string field = where + ": shape[" + std::to_string(t.shape.size()) + "]";
      std::uint64_t dim = 0;
      if (!v.empty())
        fail(field + ": expected a non-negative integer, got " + describe(v));
      switch (parse_uint(v.data(), std::uint64_t(INT64_MAX), dim)) {
      case int_status::not_integer: fail(field + ": expected a non-negative integer, got '" + v.data() + "'");
      case int_status::too_large: fail(field + ": " + v.data() + " is too large");
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

    if (!is_array(*offsets_node) || offsets_node->size() != 2)
      fail(where + ": data_offsets: expected two integers [begin, end], got "
           + (is_array(*offsets_node) ? std::to_string(offsets_node->size())
                                                + (offsets_node->size() == 1 ? " value" : " values")
                                      : describe(*offsets_node)));
    std::uint64_t range[2] = {0, 0};
    int i = 0;
    for (auto& [k, v] : *offsets_node) {
      std::string field = where + ": data_offsets[" + std::to_string(i) + "]";
      if (!v.empty())
        fail(field + ": expected a non-negative integer, got " + describe(v));
      switch (parse_uint(v.data(), UINT64_MAX, range[i])) {
      case int_status::not_integer: fail(field + ": expected a non-negative integer, got '" + v.data() + "'");
      case int_status::too_large: fail(field + ": " + v.data() + " is too large");
      case int_status::ok: break;
      }
      ++i;
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
    t.data = reinterpret_cast<const std::byte*>(data_ + begin);
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
        fail("tensors '" + last->name + "' [" + std::to_string(last->offset) + ", "
             + std::to_string(covered) + ") and '" + t.name + "' [" + std::to_string(t.offset) + ", "
             + std::to_string(t.offset + t.size) + ") overlap");
      if (t.offset > covered)
        fail("data bytes [" + std::to_string(covered) + ", " + std::to_string(t.offset)
             + ") belong to no tensor (a hole before '" + t.name + "')");
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

void check_specs(const std::vector<tensor_spec>& tensors, const std::string& source) {
  std::unordered_set<std::string> names;
  for (auto& t : tensors) {
    if (t.name.empty())
      throw checkpoint_error(source + ": tensor with an empty name");
    if (t.name == "__metadata__")
      throw checkpoint_error(source + ": '__metadata__' is reserved, not a tensor name");
    if (!names.insert(t.name).second)
      throw checkpoint_error(source + ": duplicate tensor name '" + t.name + "'");
    std::int64_t n = 1;
    for (auto d : t.shape) {
      if (d < 0)
        throw checkpoint_error(source + ": tensor '" + t.name + "': negative dimension in shape "
                               + shape_string(t.shape));
      if (__builtin_mul_overflow(n, d, &n))
        throw checkpoint_error(source + ": tensor '" + t.name + "': shape " + shape_string(t.shape)
                               + ": element count overflows");
    }
    std::int64_t bytes;
    if (__builtin_mul_overflow(n, std::int64_t(dtype_size(t.type)), &bytes))
      throw checkpoint_error(source + ": tensor '" + t.name + "': shape " + shape_string(t.shape)
                             + ": byte size overflows");
  }
}

} // namespace

std::string json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (char c : s) {
    switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(c));
        out += buf;
      } else {
        out += c;
      }
    }
  }
  out += '"';
  return out;
}

safetensors_layout parse_safetensors(const void* data, std::size_t size, const std::string& source) {
  auto fail = [&](const std::string& what) { throw checkpoint_error(source + ": " + what); };
  const auto* bytes = static_cast<const unsigned char*>(data);
  if (size < 8)
    fail("file is " + std::to_string(size) + " bytes, too short for the 8-byte header length");
  std::uint64_t n = load_le64(bytes);
  if (n > safetensors_max_header)
    fail("header length " + std::to_string(n) + " exceeds the limit of "
         + std::to_string(safetensors_max_header) + " bytes");
  if (n > size - 8)
    fail("header length " + std::to_string(n) + " runs past the end of the file ("
         + std::to_string(size) + " bytes)");
  std::string_view header(reinterpret_cast<const char*>(bytes + 8), static_cast<std::size_t>(n));
  // Hugging Face's reader demands that the header start with '{'; it also
  // tells an object from an array, which the property tree cannot.
  if (header.empty() || header.front() != '{')
    fail("header is not a JSON object (it must start with '{')");
  if (auto err = prescan_json(header); !err.empty())
    fail(err);

  pt::ptree root;
  try {
    std::istringstream in{std::string(header)};
    pt::read_json(in, root);
  } catch (const pt::json_parser_error& e) {
    fail("header: invalid JSON (line " + std::to_string(e.line()) + "): " + e.message());
  }

  safetensors_layout out;
  out.header_size = n;
  std::uint64_t data_size = size - 8 - n;
  header_parser(source, data_size, bytes + 8 + n).parse(root, out);
  return out;
}

// ---- safetensors_file ------------------------------------------------------

safetensors_file safetensors_file::open(const std::string& path) {
  safetensors_file f;
  f.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw checkpoint_error(path + ": cannot open: " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    std::string why = S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file";
    ::close(fd);
    throw checkpoint_error(path + ": " + why);
  }
  f.size_ = static_cast<std::size_t>(st.st_size);
  if (f.size_ > 0) { // mmap of length 0 fails; an empty file is rejected by the parser
    void* m = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      std::string why = errno_text();
      ::close(fd);
      throw checkpoint_error(path + ": cannot map: " + why);
    }
    f.map_ = m;
  }
  ::close(fd); // the mapping keeps the file alive
  // On a parse error f's destructor unmaps.
  f.layout_ = parse_safetensors(f.map_ ? f.map_ : "", f.size_, path);
  for (std::size_t i = 0; i < f.layout_.tensors.size(); ++i)
    f.by_name_.emplace(f.layout_.tensors[i].name, i);
  return f;
}

safetensors_file::safetensors_file(safetensors_file&& other) noexcept { *this = std::move(other); }

safetensors_file& safetensors_file::operator=(safetensors_file&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
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
  if (map_)
    ::munmap(map_, size_);
  map_ = nullptr;
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
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (auto& [k, v] : metadata) {
      json += (first ? "" : ",") + json_quote(k) + ":" + json_quote(v);
      first = false;
    }
    json += "}";
  }
  std::uint64_t offset = 0;
  for (auto& t : tensors) {
    if (json.size() > 1)
      json += ",";
    std::string shape = "[";
    for (std::size_t i = 0; i < t.shape.size(); ++i)
      shape += (i ? "," : "") + std::to_string(t.shape[i]);
    shape += "]";
    std::uint64_t end;
    if (__builtin_add_overflow(offset, t.bytes(), &end))
      throw checkpoint_error(source + ": total data size overflows");
    json += json_quote(t.name) + ":{\"dtype\":\"" + std::string(safetensors_name(t.type)) + "\",\"shape\":"
            + shape + ",\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
  }
  json += "}";
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
