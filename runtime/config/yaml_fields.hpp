#pragma once
// Strict reading of YAML maps for configuration files: every key must be
// declared, every value is type-checked, and every problem is recorded with
// its file, 1-based line and column, and field path ("engines[1].tp"), so that
// one pass reports all of them. Used by the topology reader.
#include "runtime/base/printable.hpp"

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rlsync::yaml_fields {

/// Everything wrong with one file, collected while reading it.
class diagnostics {
public:
  explicit diagnostics(std::string file) : file_(std::move(file)) {}

  /// Records "<file>:<line>:<col>: <path>: <message>". A null mark (yaml-cpp
  /// gives one to nodes that are not in the file) is reported as 1:1.
  void add(const YAML::Mark& at, const std::string& path, const std::string& message);

  bool empty() const { return entries_.empty(); }
  std::size_t size() const { return entries_.size(); }
  const std::string& file() const { return file_; }

  /// The formatted messages, in file order (ties keep the order of adding).
  std::vector<std::string> lines() const;

private:
  struct entry {
    int line, column;
    std::string text;
  };
  std::string file_;
  std::vector<entry> entries_;
};

/// "a" + "b" -> "a.b"; "" + "b" -> "b".
std::string join_path(const std::string& parent, const std::string& key);
/// "a" + 2 -> "a[2]".
std::string index_path(const std::string& parent, std::size_t index);

/// A node as messages show it: "a map", "a list", "nothing", or the scalar
/// quoted ('abc').
std::string describe(const YAML::Node& node);

/// The key in `candidates` closest to `key` by edit distance, if close enough
/// to be a plausible typo; empty otherwise.
std::string closest(const std::string& key, const std::vector<std::string>& candidates);

/// An inclusive range for integer fields; the message names the bound that
/// was broken ("must be positive", "must be at least 2", ...).
struct int_range {
  std::int64_t min = std::numeric_limits<std::int64_t>::min();
  std::int64_t max = std::numeric_limits<std::int64_t>::max();
};
inline int_range positive() { return {1}; }
inline int_range non_negative() { return {0}; }
inline int_range at_least(std::int64_t min) { return {min}; }
inline int_range between(std::int64_t min, std::int64_t max) { return {min, max}; }

/// Scalar conversions of one node. Each returns nullopt after recording why
/// (at `at`, under `path`) when the node is not of the expected kind.
std::optional<std::string> read_string(diagnostics& d, const YAML::Node& n, const YAML::Mark& at,
                                       const std::string& path);
/// Decimal integers only ("1.5", "0x10", "3 ", "yes" are errors).
std::optional<std::int64_t> read_int(diagnostics& d, const YAML::Node& n, const YAML::Mark& at,
                                     const std::string& path, int_range range = {});
/// An integer, or a size string: a non-negative integer and one of the units
/// B, KiB, MiB, GiB, TiB, KB, MB, GB, TB (optionally separated by a space).
std::optional<std::int64_t> read_size(diagnostics& d, const YAML::Node& n, const YAML::Mark& at,
                                      const std::string& path, int_range range = {});
/// A finite number (integers accepted).
std::optional<double> read_double(diagnostics& d, const YAML::Node& n, const YAML::Mark& at,
                                  const std::string& path);
/// Exactly `true` or `false` (not YAML 1.1's yes/no/on/off).
std::optional<bool> read_bool(diagnostics& d, const YAML::Node& n, const YAML::Mark& at,
                              const std::string& path);

/// Spellings of an enum's values, in the order messages list them.
template <class E>
using choices = std::vector<std::pair<std::string_view, E>>;

/// One of `options`; anything else is reported as
/// "must be one of a, b, c, got 'x'".
template <class E>
std::optional<E> read_choice(diagnostics& d, const YAML::Node& n, const YAML::Mark& at,
                             const std::string& path, const choices<E>& options) {
  auto text = read_string(d, n, at, path);
  if (!text)
    return std::nullopt;
  std::string names;
  for (auto& [name, value] : options) {
    if (*text == name)
      return value;
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  d.add(at, path, "must be one of " + names + ", got '" + printable(*text) + "'");
  return std::nullopt;
}

/// The one YAML document of a configuration file: nullopt after recording a
/// syntax error, an empty file or several documents (named `root`).
std::optional<YAML::Node> load_one_document(diagnostics& d, const std::string& text, const std::string& root);

enum class presence { optional, required };

/// One element of a YAML list, with its path ("engines[2]").
struct list_item {
  YAML::Node node;
  std::string path;
};

/// Reads a YAML map whose allowed keys are declared up front. The
/// constructor reports a value that is not a map, every unknown key (with
/// the expected keys and the closest one) and every duplicate key; the
/// read_* members then fill fields that are present and valid and leave
/// defaults alone otherwise, so a typo never silently becomes a default.
class map_reader {
public:
  /// `forbidden` keys get their own message instead of "unknown key" (for
  /// keys users are likely to try and must not use, e.g. `secret`).
  /// A null node (a section written as `key:` with nothing under it) reads
  /// as an empty map. `fallback` positions errors when `node` has no mark.
  map_reader(diagnostics& d, const YAML::Node& node, std::string path, std::vector<std::string> keys,
             const YAML::Mark& fallback = YAML::Mark(),
             const std::vector<std::pair<std::string, std::string>>& forbidden = {});

  /// False when the node was something other than a map (already reported).
  bool valid() const { return valid_; }
  /// True when the map is in the file (possibly empty) and is a map. Missing
  /// required keys are only reported for such maps: an absent or mistyped
  /// section has been reported once already.
  bool present() const { return exists_ && valid_; }
  bool has(const std::string& key) const;
  /// The value of `key`; an undefined node when absent.
  YAML::Node get(const std::string& key) const;

  const std::string& path() const { return path_; }
  std::string path(const std::string& key) const { return join_path(path_, key); }
  /// Where the map is (its first key, for block maps).
  const YAML::Mark& mark() const { return mark_; }
  /// Where errors about `key` go: its value, or the key itself when the value
  /// is empty (yaml-cpp places empty values on the next line), or the map
  /// when the key is absent.
  YAML::Mark mark(const std::string& key) const;

  /// True when `key` is present; reports it missing otherwise (for keys
  /// read by hand rather than through read()).
  bool require(const std::string& key) const { return present(key, presence::required); }

  /// Records a problem with `key` at mark(key).
  void error(const std::string& key, const std::string& message) const;
  /// Records a problem with the map itself.
  void error(const std::string& message) const;

  /// Typed reads: true when `key` is present and valid (`out` is then set).
  /// A required key that is absent is reported as missing.
  bool read(const std::string& key, std::string& out, presence p = presence::optional) const;
  bool read(const std::string& key, std::int64_t& out, int_range range = {},
            presence p = presence::optional) const;
  bool read(const std::string& key, std::uint64_t& out, presence p = presence::optional) const;
  bool read(const std::string& key, double& out, presence p = presence::optional) const;
  bool read(const std::string& key, bool& out, presence p = presence::optional) const;
  bool read_size(const std::string& key, std::int64_t& out, int_range range = {},
                 presence p = presence::optional) const;
  bool read_ms(const std::string& key, std::chrono::milliseconds& out, int_range range = {},
               presence p = presence::optional) const;
  template <class E>
  bool read_choice(const std::string& key, E& out, const choices<E>& options,
                   presence p = presence::optional) const {
    if (!present(key, p))
      return false;
    auto v = yaml_fields::read_choice(d_, get(key), mark(key), path(key), options);
    if (v)
      out = *v;
    return v.has_value();
  }

  /// A nested map; if absent, an empty reader (valid, with nothing in it).
  map_reader map(const std::string& key, std::vector<std::string> keys,
                 presence p = presence::optional,
                 const std::vector<std::pair<std::string, std::string>>& forbidden = {}) const;
  /// The elements of a nested list; nullopt when absent or not a list.
  std::optional<std::vector<list_item>> list(const std::string& key,
                                             presence p = presence::optional) const;

private:
  /// Checks the key was declared, and reports it missing when required.
  bool present(const std::string& key, presence p) const;

  struct entry {
    std::string key;
    YAML::Mark key_mark;
    YAML::Node value;
  };
  const entry* find(const std::string& key) const;

  diagnostics& d_;
  std::string path_;
  std::vector<std::string> keys_;
  YAML::Mark mark_;
  bool valid_ = true;
  bool exists_ = false;
  // The declared keys present, first occurrence only (repeats are reported).
  std::vector<entry> entries_;
};

} // namespace rlsync::yaml_fields
