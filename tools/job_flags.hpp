#pragma once
// Flags several commands share that feed the jobs library.
#include "actors/jobs/main_job.hpp"
#include "tools/cli.hpp"

namespace rlsync::tools {

/// Declares --prompts, --concurrency and --max-tokens on `app`, stored into
/// `o` when given; check_workload_flags(o) after parsing checks them.
inline void add_workload_flags(CLI::App& app, jobs::workload_overrides& o) {
  auto into = [&app](const std::string& flag, std::optional<std::uint64_t>& target, const std::string& what) {
    app.add_option_function<std::string>(
         flag, [&target, flag](const std::string& text) { target = cli::parse_size(text, flag); }, what)
      ->type_name("N");
  };
  into("--prompts", o.prompts, "requests to send (overrides workload.prompts)");
  into("--concurrency", o.concurrency, "requests in flight at once (overrides workload.concurrency)");
  into("--max-tokens", o.max_tokens, "tokens per request (overrides workload.max_tokens)");
}

/// Throws usage_error (exit 2) for a zero --concurrency or --max-tokens.
inline void check_workload_flags(const jobs::workload_overrides& o) {
  if (o.concurrency == std::uint64_t{0} || o.max_tokens == std::uint64_t{0})
    throw cli::usage_error("--concurrency and --max-tokens must be positive");
}

} // namespace rlsync::tools
