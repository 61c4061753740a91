#include "runtime/config/yaml_fields.hpp"

#include "runtime/base/printable.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace rlsync::yaml_fields {

void diagnostics::add(const YAML::Mark& at, const std::string& path, const std::string& message) {
  // yaml-cpp counts lines and columns from 0; editors and compilers from 1.
  int line = at.is_null() ? 1 : at.line + 1;
  int column = at.is_null() ? 1 : at.column + 1;
  std::string text = file_ + ":" + std::to_string(line) + ":" + std::to_string(column) + ": ";
  if (!path.empty())
    text += path + ": ";
  entries_.push_back({line, column, text + message});
}

std::vector<std::string> diagnostics::lines() const {
  auto sorted = entries_;
  std::stable_sort(sorted.begin(), sorted.end(), [](const entry& a, const entry& b) {
    return a.line != b.line ? a.line < b.line : a.column < b.column;
  });
  std::vector<std::string> out;
  for (auto& e : sorted)
    out.push_back(e.text);
  return out;
}

std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

std::string index_path(const std::string& parent, std::size_t index) {
  return parent + "[" + std::to_string(index) + "]";
}

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
  case YAML::NodeType::Map:
    return "a map";
  case YAML::NodeType::Sequence:
    return "a list";
  case YAML::NodeType::Scalar:
    return "'" + printable(node.Scalar()) + "'";
  default:
    return "nothing";
  }
}

namespace {

// Edit distance counting an adjacent transposition as one edit ("polciy").
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i)
    d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j)
    d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::string lower(std::string s) {
  for (auto& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string range_message(const int_range& r, std::int64_t v) {
  constexpr auto lo = std::numeric_limits<std::int64_t>::min();
  constexpr auto hi = std::numeric_limits<std::int64_t>::max();
  std::string got = ", got " + std::to_string(v);
  // Below the least value: say what the lower bound is, as for an unbounded
  // range ("must be positive, got 0"); above the greatest: name the range.
  if (r.max == hi || v < r.min) {
    if (r.min == 1)
      return "must be positive" + got;
    if (r.min == 0)
      return "must not be negative" + got;
    return "must be at least " + std::to_string(r.min) + got;
  }
  if (r.min == lo)
    return "must be at most " + std::to_string(r.max) + got;
  return "must be between " + std::to_string(r.min) + " and " + std::to_string(r.max) + got;
}

bool check_range(diagnostics& d, const YAML::Mark& at, const std::string& path, const int_range& r,
                 std::int64_t v) {
  if (v >= r.min && v <= r.max)
    return true;
  d.add(at, path, range_message(r, v));
  return false;
}

// Parses an optionally signed decimal integer filling all of `text`.
std::optional<std::int64_t> parse_decimal(const std::string& text, bool& overflow) {
  overflow = false;
  std::size_t i = (!text.empty() && (text[0] == '-' || text[0] == '+')) ? 1 : 0;
  if (i == text.size())
    return std::nullopt;
  for (std::size_t j = i; j < text.size(); ++j)
    if (!std::isdigit(static_cast<unsigned char>(text[j])))
      return std::nullopt;
  errno = 0;
  long long v = std::strtoll(text.c_str(), nullptr, 10);
  if (errno == ERANGE) {
    overflow = true;
    return std::nullopt;
  }
  return static_cast<std::int64_t>(v);
}

const char* const size_units_help = "B, KiB, MiB, GiB, TiB, KB, MB, GB, TB";

} // namespace

std::string closest(const std::string& key, const std::vector<std::string>& candidates) {
  // Short keys tolerate one edit, longer ones two: "tpp" -> "tp", but "x" is
  // not a typo of "tp".
  std::size_t limit = key.size() <= 4 ? 1 : 2;
  std::string best;
  std::size_t best_distance = limit + 1;
  for (auto& c : candidates) {
    std::size_t dist = edit_distance(lower(key), c);
    if (dist < best_distance) {
      best = c;
      best_distance = dist;
    }
  }
  return best;
}

std::optional<std::string> read_string(diagnostics& d, const YAML::Node& n, const YAML::Mark& at,
                                       const std::string& path) {
  if (n.IsScalar())
    return n.Scalar();
  d.add(at, path, "expected a string, got " + describe(n));
  return std::nullopt;
}

std::optional<std::int64_t> read_int(diagnostics& d, const YAML::Node& n, const YAML::Mark& at,
                                     const std::string& path, int_range range) {
  if (!n.IsScalar()) {
    d.add(at, path, "expected an integer, got " + describe(n));
    return std::nullopt;
  }
  bool overflow = false;
  auto v = parse_decimal(n.Scalar(), overflow);
  if (!v) {
    d.add(at, path, overflow ? "integer out of range: " + describe(n)
                             : "expected an integer, got " + describe(n));
    return std::nullopt;
  }
  if (!check_range(d, at, path, range, *v))
    return std::nullopt;
  return v;
}

std::optional<std::int64_t> read_size(diagnostics& d, const YAML::Node& n, const YAML::Mark& at,
                                      const std::string& path, int_range range) {
  auto bad = [&](const std::string& why) -> std::optional<std::int64_t> {
    d.add(at, path, why);
    return std::nullopt;
  };
  if (!n.IsScalar())
    return bad("expected a size (bytes, or e.g. 64MiB), got " + describe(n));
  const std::string& text = n.Scalar();
  // Split "<sign><digits><space?><unit>".
  std::size_t i = (!text.empty() && (text[0] == '-' || text[0] == '+')) ? 1 : 0;
  std::size_t digits_end = i;
  while (digits_end < text.size() && std::isdigit(static_cast<unsigned char>(text[digits_end])))
    ++digits_end;
  // "1.5GiB": sizes are whole numbers of their unit.
  if (digits_end == i || (digits_end < text.size() && text[digits_end] == '.'))
    return bad("expected a size (bytes, or e.g. 64MiB), got " + describe(n));
  bool overflow = false;
  auto number = parse_decimal(text.substr(0, digits_end), overflow);
  if (!number)
    return bad("size out of range: " + describe(n));
  std::size_t unit_begin = digits_end;
  if (unit_begin < text.size() && text[unit_begin] == ' ')
    ++unit_begin;
  std::string unit = text.substr(unit_begin);
  static const std::pair<const char*, std::int64_t> units[] = {
    {"", 1},
    {"B", 1},
    {"KiB", std::int64_t(1) << 10},
    {"MiB", std::int64_t(1) << 20},
    {"GiB", std::int64_t(1) << 30},
    {"TiB", std::int64_t(1) << 40},
    {"KB", 1000},
    {"MB", 1000 * 1000},
    {"GB", 1000 * 1000 * 1000},
    {"TB", std::int64_t(1000) * 1000 * 1000 * 1000},
  };
  for (auto& [name, multiplier] : units) {
    if (unit != name)
      continue;
    if (*number < 0)
      return bad("must not be negative, got " + describe(n));
    if (*number > std::numeric_limits<std::int64_t>::max() / multiplier)
      return bad("size out of range: " + describe(n));
    std::int64_t bytes = *number * multiplier;
    if (!check_range(d, at, path, range, bytes))
      return std::nullopt;
    return bytes;
  }
  return bad("unknown size unit '" + printable(unit) + "' in " + describe(n) + " (use " + size_units_help + ")");
}

std::optional<double> read_double(diagnostics& d, const YAML::Node& n, const YAML::Mark& at,
                                  const std::string& path) {
  if (n.IsScalar()) {
    const std::string& text = n.Scalar();
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(text.c_str(), &end);
    if (!text.empty() && !std::isspace(static_cast<unsigned char>(text[0])) && *end == '\0'
        && errno != ERANGE && std::isfinite(v))
      return v;
  }
  d.add(at, path, "expected a number, got " + describe(n));
  return std::nullopt;
}

std::optional<bool> read_bool(diagnostics& d, const YAML::Node& n, const YAML::Mark& at,
                              const std::string& path) {
  if (n.IsScalar() && n.Scalar() == "true")
    return true;
  if (n.IsScalar() && n.Scalar() == "false")
    return false;
  d.add(at, path, "expected true or false, got " + describe(n));
  return std::nullopt;
}

map_reader::map_reader(diagnostics& d, const YAML::Node& node, std::string path,
                       std::vector<std::string> keys, const YAML::Mark& fallback,
                       const std::vector<std::pair<std::string, std::string>>& forbidden)
    : d_(d), path_(std::move(path)), keys_(std::move(keys)), mark_(fallback) {
  exists_ = node.IsDefined();
  // An empty value's mark points past it (to the next line); keep the caller's.
  if (exists_ && !node.IsNull() && !node.Mark().is_null())
    mark_ = node.Mark();
  if (!exists_ || node.IsNull())
    return;
  if (!node.IsMap()) {
    valid_ = false;
    d_.add(mark_, path_.empty() ? "topology" : path_, "expected a map, got " + describe(node));
    return;
  }
  for (auto it = node.begin(); it != node.end(); ++it) {
    // By value: the iterator's -> yields a temporary.
    YAML::Node key = it->first;
    if (!key.IsScalar()) {
      d_.add(key.Mark(), path_.empty() ? "topology" : path_,
             "keys must be names, got " + describe(key));
      continue;
    }
    const std::string& name = key.Scalar();
    // The path is echoed in messages: a key from the file is escaped there.
    std::string key_path = join_path(path_, printable(name));
    auto forbid = std::find_if(forbidden.begin(), forbidden.end(),
                               [&](auto& f) { return f.first == name; });
    if (forbid != forbidden.end()) {
      d_.add(key.Mark(), key_path, forbid->second);
      continue;
    }
    if (std::find(keys_.begin(), keys_.end(), name) == keys_.end()) {
      std::string message = "unknown key";
      if (auto guess = closest(name, keys_); !guess.empty())
        message += ", did you mean '" + guess + "'?";
      std::string expected;
      for (auto& k : keys_)
        expected += (expected.empty() ? "" : ", ") + k;
      d_.add(key.Mark(), key_path, message + " (expected one of: " + expected + ")");
      continue;
    }
    if (auto* first = find(name)) {
      d_.add(key.Mark(), key_path,
             "duplicate key (first at line " + std::to_string(first->key_mark.line + 1) + ")");
      continue;
    }
    YAML::Node value = it->second;
    entries_.push_back({name, key.Mark(), value});
  }
}

const map_reader::entry* map_reader::find(const std::string& key) const {
  for (auto& e : entries_)
    if (e.key == key)
      return &e;
  return nullptr;
}

bool map_reader::has(const std::string& key) const { return find(key) != nullptr; }

YAML::Node map_reader::get(const std::string& key) const {
  auto* e = find(key);
  return e ? e->value : YAML::Node(YAML::NodeType::Undefined);
}

YAML::Mark map_reader::mark(const std::string& key) const {
  auto* e = find(key);
  if (!e)
    return mark_;
  if (e->value.IsNull() || e->value.Mark().is_null())
    return e->key_mark;
  return e->value.Mark();
}

void map_reader::error(const std::string& key, const std::string& message) const {
  d_.add(mark(key), path(key), message);
}

void map_reader::error(const std::string& message) const {
  d_.add(mark_, path_.empty() ? "topology" : path_, message);
}

bool map_reader::present(const std::string& key, presence p) const {
  if (std::find(keys_.begin(), keys_.end(), key) == keys_.end())
    throw std::logic_error("map_reader: key '" + key + "' read but not declared for " + path_);
  if (has(key))
    return true;
  if (p == presence::required && present())
    d_.add(mark_, path(key), "missing required key");
  return false;
}

bool map_reader::read(const std::string& key, std::string& out, presence p) const {
  if (!present(key, p))
    return false;
  auto v = read_string(d_, get(key), mark(key), path(key));
  if (v)
    out = *v;
  return v.has_value();
}

bool map_reader::read(const std::string& key, std::int64_t& out, int_range range, presence p) const {
  if (!present(key, p))
    return false;
  auto v = read_int(d_, get(key), mark(key), path(key), range);
  if (v)
    out = *v;
  return v.has_value();
}

bool map_reader::read(const std::string& key, std::uint64_t& out, presence p) const {
  std::int64_t v = 0;
  if (!read(key, v, non_negative(), p))
    return false;
  out = static_cast<std::uint64_t>(v);
  return true;
}

bool map_reader::read(const std::string& key, double& out, presence p) const {
  if (!present(key, p))
    return false;
  auto v = read_double(d_, get(key), mark(key), path(key));
  if (v)
    out = *v;
  return v.has_value();
}

bool map_reader::read(const std::string& key, bool& out, presence p) const {
  if (!present(key, p))
    return false;
  auto v = read_bool(d_, get(key), mark(key), path(key));
  if (v)
    out = *v;
  return v.has_value();
}

bool map_reader::read_size(const std::string& key, std::int64_t& out, int_range range,
                           presence p) const {
  if (!present(key, p))
    return false;
  auto v = yaml_fields::read_size(d_, get(key), mark(key), path(key), range);
  if (v)
    out = *v;
  return v.has_value();
}

bool map_reader::read_ms(const std::string& key, std::chrono::milliseconds& out, int_range range,
                         presence p) const {
  std::int64_t v = 0;
  if (!read(key, v, range, p))
    return false;
  out = std::chrono::milliseconds(v);
  return true;
}

map_reader map_reader::map(const std::string& key, std::vector<std::string> keys, presence p,
                           const std::vector<std::pair<std::string, std::string>>& forbidden) const {
  YAML::Node value = present(key, p) ? get(key) : YAML::Node(YAML::NodeType::Undefined);
  return map_reader(d_, value, path(key), std::move(keys), mark(key), forbidden);
}

std::optional<std::vector<list_item>> map_reader::list(const std::string& key, presence p) const {
  if (!present(key, p))
    return std::nullopt;
  YAML::Node value = get(key);
  if (!value.IsSequence()) {
    error(key, "expected a list, got " + describe(value));
    return std::nullopt;
  }
  std::vector<list_item> items;
  std::size_t i = 0;
  for (auto it = value.begin(); it != value.end(); ++it, ++i)
    items.push_back({*it, index_path(path(key), i)});
  return items;
}

std::optional<YAML::Node> load_one_document(diagnostics& d, const std::string& text, const std::string& root) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    d.add(e.mark, "", "syntax error: " + e.msg);
    return std::nullopt;
  }
  if (docs.empty() || (docs.size() == 1 && docs[0].IsNull())) {
    d.add(YAML::Mark(), root, "the file is empty");
    return std::nullopt;
  }
  if (docs.size() > 1) {
    d.add(docs[1].Mark(), root, "expected one YAML document, got " + std::to_string(docs.size()));
    return std::nullopt;
  }
  return docs[0];
}

} // namespace rlsync::yaml_fields
