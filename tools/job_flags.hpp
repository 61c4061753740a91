#pragma once
// Flags several commands share that feed the jobs library.
#include "actors/jobs/main_job.hpp"
#include "tools/cli.hpp"

namespace rlsync::tools {

/// --prompts, --concurrency and --max-tokens, when given; the last two must
/// be positive (usage_error otherwise, so the command exits 2).
inline jobs::workload_overrides workload_flags(const cli::args& a) {
  jobs::workload_overrides o;
  if (a.has("prompts"))
    o.prompts = a.get_u64("prompts", 0);
  if (a.has("concurrency"))
    o.concurrency = a.get_u64("concurrency", 0);
  if (a.has("max-tokens"))
    o.max_tokens = a.get_u64("max-tokens", 0);
  if (o.concurrency == std::uint64_t{0} || o.max_tokens == std::uint64_t{0})
    throw cli::usage_error("--concurrency and --max-tokens must be positive");
  return o;
}

} // namespace rlsync::tools
