#pragma once
// Command-line parsing for the rlsync subcommands: every flag must be
// declared, every value is checked, and errors name the flag. Commands build a
// CLI::App (which generates --help) with the helpers below.
#include <CLI/CLI.hpp>

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

/// Parses "123", "4KiB", "64MiB", "2GB"... into bytes; throws usage_error
/// naming `what` on anything else (negative numbers included).
std::uint64_t parse_size(const std::string& text, const std::string& what);

/// Parses a count or a duration in milliseconds: digits only ("10", not
/// "10K" or "1MB", which parse_size would read as bytes); throws
/// usage_error naming `what` on anything else.
std::uint64_t parse_count(const std::string& text, const std::string& what);

/// A number such as "0.5" or "1e-3"; throws usage_error naming `what` on
/// anything else (including inf and nan).
double parse_number(const std::string& text, const std::string& what);

/// An app named `name` ("rlsync run") whose help starts with its usage line,
/// where the last of a repeated flag wins, and whose unknown flags parse()
/// reports by name.
void configure(CLI::App& app);

/// Parses `argv` (the arguments after the subcommand). Returns false when
/// --help was asked for and printed to stdout (the command then exits 0).
/// Every other problem throws usage_error naming the flag, so rlsync exits 2.
bool parse(CLI::App& app, const std::vector<std::string>& argv);

/// `flag` takes a size: a plain number or one with a unit (see parse_size),
/// stored into `target` with parse_size's messages on bad input.
CLI::Option* add_size(CLI::App& app, const std::string& flag, std::uint64_t& target,
                      const std::string& description);

/// `flag` takes a count or milliseconds (see parse_count), stored into `target`.
CLI::Option* add_count(CLI::App& app, const std::string& flag, std::uint64_t& target,
                       const std::string& description);

/// `flag` takes a number (see parse_number), stored into `target`.
CLI::Option* add_number(CLI::App& app, const std::string& flag, double& target,
                        const std::string& description);

/// Throws "missing required flag --x" when `option` was not given. Checked by
/// hand rather than CLI11's required() so the message stays the same.
void require(const CLI::Option* option);

} // namespace rlsync::cli
