#pragma once
// Flags several commands share that feed the jobs library.
#include "actors/jobs/main_job.hpp"
#include "runtime/config/topology.hpp"
#include "tools/cli.hpp"

namespace rlsync::tools {

/// Declares --prompts, --concurrency and --max-tokens on `app`, stored into
/// `o` when given; check_workload_flags(o) after parsing checks them.
inline void add_workload_flags(CLI::App& app, jobs::workload_overrides& o) {
  auto into = [&app](const std::string& flag, std::optional<std::uint64_t>& target, const std::string& what) {
    app.add_option_function<std::string>(
         flag, [&target, flag](const std::string& text) { target = cli::parse_count(text, flag); }, what)
      ->type_name("N");
  };
  into("--prompts", o.prompts, "requests to send (overrides workload.prompts)");
  into("--concurrency", o.concurrency, "requests in flight at once (overrides workload.concurrency)");
  into("--max-tokens", o.max_tokens, "tokens per request (overrides workload.max_tokens)");
}

/// Throws usage_error (exit 2) for a zero --concurrency or --max-tokens, and
/// for a value beyond the limit the topology's workload section has.
inline void check_workload_flags(const jobs::workload_overrides& o) {
  if (o.concurrency == std::uint64_t{0} || o.max_tokens == std::uint64_t{0})
    throw cli::usage_error("--concurrency and --max-tokens must be positive");
  auto at_most = [](const char* flag, const std::optional<std::uint64_t>& v, std::int64_t limit) {
    if (v && *v > static_cast<std::uint64_t>(limit))
      throw cli::usage_error(std::string(flag) + ": must be at most " + std::to_string(limit) + ", got "
                             + std::to_string(*v));
  };
  at_most("--prompts", o.prompts, topology_limits::max_prompts);
  at_most("--concurrency", o.concurrency, topology_limits::max_concurrency);
  at_most("--max-tokens", o.max_tokens, topology_limits::max_tokens);
}

/// --allow-nonfinite: the trainer publishes weights holding NaN or infinity
/// instead of refusing the step.
inline CLI::Option* add_allow_nonfinite_flag(CLI::App& app) {
  return app.add_flag("--allow-nonfinite",
                      "publish trainer weights even when they hold NaN or infinity (refused by default)");
}

} // namespace rlsync::tools
