#pragma once
// A small, strict command-line parser for the rlsync subcommands: every flag
// must be declared, every value is checked, and errors name the flag.
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace rlsync::cli {

/// A command-line error; what() names the offending flag or argument.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Parses `--name value`, `--name=value` and boolean `--name` flags.
class args {
public:
  /// `value_flags` take a value, `bool_flags` do not. Unknown flags throw.
  args(std::vector<std::string> argv, const std::vector<std::string>& value_flags,
       const std::vector<std::string>& bool_flags);

  bool has(const std::string& flag) const;
  std::optional<std::string> get(const std::string& flag) const;
  std::string required(const std::string& flag) const;
  std::string get_or(const std::string& flag, const std::string& fallback) const;

  /// Integer flags accept a plain number or a size with a binary/decimal
  /// unit (4KiB, 2MB, 1GiB). Negative or malformed values throw.
  std::uint64_t get_u64(const std::string& flag, std::uint64_t fallback) const;
  std::uint64_t required_u64(const std::string& flag) const;
  double get_double(const std::string& flag, double fallback) const;

  const std::vector<std::string>& positional() const { return positional_; }

private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

/// Parses "123", "4KiB", "64MiB", "2GB"... into bytes; throws usage_error
/// naming `what` on anything else (negative numbers included).
std::uint64_t parse_size(const std::string& text, const std::string& what);

} // namespace rlsync::cli
