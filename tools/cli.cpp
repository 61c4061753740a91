#include "tools/cli.hpp"

#include "runtime/base/printable.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>

namespace rlsync::cli {

namespace {

// The usage line first (what `rlsync X --help | head -1` shows), then the
// description, the options and the footer.
class usage_first_formatter : public CLI::Formatter {
public:
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub)
      return make_expanded(app);
    return make_usage(app, name) + "\n" + make_description(app) + make_positionals(app) + make_groups(app, mode)
           + make_subcommands(app, mode) + "\n" + make_footer(app);
  }
};

} // namespace

void configure(CLI::App& app) {
  auto formatter = std::make_shared<usage_first_formatter>();
  formatter->label("Usage", "usage");
  formatter->column_width(26);
  app.formatter(formatter);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->disable_flag_override();
  app.allow_extras(); // left over for parse() to name
}

bool parse(CLI::App& app, const std::vector<std::string>& argv) {
  std::vector<std::string> reversed(argv.rbegin(), argv.rend()); // CLI11 consumes from the back
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return false;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return false;
  } catch (const CLI::ParseError& e) {
    throw usage_error(e.what());
  }
  for (auto& extra : app.remaining())
    if (extra.size() > 1 && extra[0] == '-')
      throw usage_error("unknown flag '" + printable(extra) + "'");
  if (auto extras = app.remaining(); !extras.empty())
    throw usage_error("unexpected argument '" + printable(extras.front()) + "'");
  return true;
}

CLI::Option* add_size(CLI::App& app, const std::string& flag, std::uint64_t& target,
                      const std::string& description) {
  return app
    .add_option_function<std::string>(
      flag, [&target, flag](const std::string& text) { target = parse_size(text, flag); }, description)
    ->type_name("SIZE");
}

CLI::Option* add_count(CLI::App& app, const std::string& flag, std::uint64_t& target,
                       const std::string& description) {
  return app
    .add_option_function<std::string>(
      flag, [&target, flag](const std::string& text) { target = parse_count(text, flag); }, description)
    ->type_name("N");
}

CLI::Option* add_number(CLI::App& app, const std::string& flag, double& target, const std::string& description) {
  return app
    .add_option_function<std::string>(
      flag, [&target, flag](const std::string& text) { target = parse_number(text, flag); }, description)
    ->type_name("NUMBER");
}

void require(const CLI::Option* option) {
  if (option->count() == 0)
    throw usage_error("missing required flag " + option->get_name());
}

double parse_number(const std::string& text, const std::string& what) {
  char* end = nullptr;
  errno = 0;
  double d = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(d))
    throw usage_error(what + ": expected a number, got '" + printable(text) + "'");
  return d;
}

std::uint64_t parse_count(const std::string& text, const std::string& what) {
  if (!text.empty() && std::isdigit(static_cast<unsigned char>(text[0]))
      && !std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    throw usage_error(what + ": expected a whole number without a unit, got '" + printable(text) + "'");
  return parse_size(text, what); // digits only now: its range and empty-text checks
}

std::uint64_t parse_size(const std::string& text, const std::string& what) {
  auto fail = [&](const std::string& why) -> std::uint64_t {
    throw usage_error(what + ": " + why + ", got '" + printable(text) + "'");
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
  return fail("unknown unit '" + printable(unit) + "' (use B, KiB, MiB, GiB, KB, MB, GB)");
}

} // namespace rlsync::cli
