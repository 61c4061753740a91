#pragma once
// rlsync bench engine: the built-in engine's own figures, never pass/fail:
// the time to apply a full update (full tensors through the loader, and
// plan-packed shards, cold and warm), prefill and decode throughput.
#include "runtime/config/model_config.hpp"

#include <cstdint>
#include <iosfwd>
#include <vector>

namespace rlsync::jobs {

struct bench_engine_options {
  model_config model;                          ///< seeded random bf16 weights of this shape
  std::vector<int> tps = {1, 2};               ///< tensor-parallel sizes, one engine each
  std::vector<std::uint32_t> batches = {1, 8, 32};
  std::uint32_t steps = 32;                    ///< decode steps timed per batch
  std::uint32_t prompt_tokens = 512;           ///< per prompt of the prefill (4 prompts)
};

struct bench_engine_decode {
  std::uint32_t batch = 0;
  double tokens_per_s = 0;
  double ms_per_step = 0;
};

/// The figures of one tensor-parallel size.
struct bench_engine_case {
  int tp = 1;
  double full_update_s = 0;    ///< full tensors through the loader (cold)
  double pack_s = 0;           ///< the trainer's side: replaying every worker's plan
  double sharded_cold_s = 0;   ///< packed shards applied, first session
  double allocating_s = 0;     ///< of which opening the session (staging pages)
  double sharded_warm_s = 0;   ///< again, into the set the first session replaced
  std::uint64_t bytes_per_worker = 0;
  double prefill_tokens_per_s = 0;
  std::vector<bench_engine_decode> decode;
};

struct bench_engine_result {
  std::uint64_t parameters = 0;
  std::uint64_t bytes = 0; ///< bf16
  const char* kernels = "";
  std::vector<bench_engine_case> cases;
};

/// Throws std::invalid_argument for a model or tp the engine refuses, and
/// std::runtime_error when an update session fails. `progress`, when given,
/// gets each line as soon as its figure is known.
bench_engine_result run_bench_engine(const bench_engine_options& o, std::ostream* progress = nullptr);

/// The model line and one line per figure, as `rlsync bench engine` prints them.
void print_model_line(std::ostream& out, const bench_engine_options& o, const bench_engine_result& r);

} // namespace rlsync::jobs
