#include "tools/cli.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace rlsync::cli {

namespace {

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

} // namespace

std::uint64_t parse_size(const std::string& text, const std::string& what) {
  auto fail = [&](const std::string& why) -> std::uint64_t {
    throw usage_error(what + ": " + why + ", got '" + text + "'");
  };
  if (text.empty())
    return fail("expected a non-negative number");
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])))
    ++i;
  if (i == 0)
    return fail("expected a non-negative number");
  errno = 0;
  unsigned long long n = std::strtoull(text.substr(0, i).c_str(), nullptr, 10);
  if (errno == ERANGE)
    return fail("number out of range");
  std::string unit = text.substr(i);
  static const std::pair<const char*, std::uint64_t> units[] = {
    {"", 1},          {"B", 1},         {"KiB", 1ull << 10}, {"MiB", 1ull << 20},
    {"GiB", 1ull << 30}, {"TiB", 1ull << 40}, {"KB", 1000ull},  {"MB", 1000000ull},
    {"GB", 1000000000ull}, {"TB", 1000000000000ull}, {"K", 1ull << 10}, {"M", 1ull << 20},
    {"G", 1ull << 30}};
  for (auto& [name, mult] : units) {
    if (unit == name) {
      if (n > std::numeric_limits<std::uint64_t>::max() / mult)
        return fail("number out of range");
      return n * mult;
    }
  }
  return fail("unknown unit '" + unit + "' (use B, KiB, MiB, GiB, KB, MB, GB)");
}

args::args(std::vector<std::string> argv, const std::vector<std::string>& value_flags,
           const std::vector<std::string>& bool_flags) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.size() < 2 || a[0] != '-' || a == "-") {
      positional_.push_back(a);
      continue;
    }
    if (a == "--") {
      positional_.insert(positional_.end(), argv.begin() + i + 1, argv.end());
      break;
    }
    std::string name = a.substr(a[1] == '-' ? 2 : 1);
    std::optional<std::string> inline_value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (contains(bool_flags, name)) {
      if (inline_value)
        throw usage_error("--" + name + " takes no value");
      values_[name] = "true";
    } else if (contains(value_flags, name)) {
      if (inline_value) {
        values_[name] = *inline_value;
      } else {
        if (i + 1 >= argv.size())
          throw usage_error("--" + name + " needs a value");
        values_[name] = argv[++i];
      }
    } else {
      throw usage_error("unknown flag '" + a + "'");
    }
  }
}

bool args::has(const std::string& flag) const { return values_.count(flag) > 0; }

std::optional<std::string> args::get(const std::string& flag) const {
  auto it = values_.find(flag);
  if (it == values_.end())
    return std::nullopt;
  return it->second;
}

std::string args::required(const std::string& flag) const {
  auto v = get(flag);
  if (!v)
    throw usage_error("missing required flag --" + flag);
  return *v;
}

std::string args::get_or(const std::string& flag, const std::string& fallback) const {
  return get(flag).value_or(fallback);
}

std::uint64_t args::get_u64(const std::string& flag, std::uint64_t fallback) const {
  auto v = get(flag);
  return v ? parse_size(*v, "--" + flag) : fallback;
}

std::uint64_t args::required_u64(const std::string& flag) const {
  return parse_size(required(flag), "--" + flag);
}

double args::get_double(const std::string& flag, double fallback) const {
  auto v = get(flag);
  if (!v)
    return fallback;
  char* end = nullptr;
  errno = 0;
  double d = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0' || errno == ERANGE || !std::isfinite(d))
    throw usage_error("--" + flag + ": expected a number, got '" + *v + "'");
  return d;
}

} // namespace rlsync::cli
