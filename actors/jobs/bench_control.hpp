#pragma once
// `rlsync bench control`: the control plane alone. N engine processes (one
// tp-1 engine each) on loopback around a head in this process run K
// zero-byte sync rounds (a near-empty model the trainer's steps leave
// unchanged: every engine already serves the version's bytes and skips the
// data plane); each round is compared with six waves of CAF round trips to
// every engine (pause, flush, start, transfer, finish and continue are six
// waves) measured between the rounds. Then K rounds that move the model
// (164 kB, changed by every step) in a second deployment, for comparison.
#include "actors/jobs/bench_sync.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace rlsync::jobs {

/// The bench's topology: a head on 127.0.0.1:`port` with the trainer, router
/// and coordinator, and `engines` nodes on loopback with one tp-1 engine
/// each, transfer over UCX, sharded.
std::string control_topology_yaml(std::uint64_t engines, int port);

struct bench_control_options {
  std::uint64_t engines = 8; ///< 1..64
  int rounds = 20;
  bool verbose = false;
  std::string exe;
  std::function<void(const std::string&)> note;
};

struct bench_control_result {
  std::uint64_t engines = 0;
  int rounds = 0;
  unsigned cores = 0;
  case_result control; ///< zero-byte rounds: the figure against six round trips
  case_result moving;  ///< the same rounds moving the 164 kB model
};

/// Runs the rounds; a failure is control.error or moving.error.
bench_control_result run_bench_control(const bench_control_options& o);

/// `rlsync bench control --http`: the control phases of a zero-byte round
/// (pause keep, flush, start, continue: no bytes move, and the continue
/// abandons the session, as the coordinator's continue of an aborted round
/// does) against `engines` built-in engines in this process, each behind its
/// own `rlsync serve` HTTP server; every round drives the phases twice, as
/// waves across all engines: once as CAF requests to the engine actors, once
/// as vLLM's routes over keep-alive HTTP/1.1 (/pause?mode=keep, /reset_prefix_cache,
/// /start_weight_update, /resume). Finish is not among them: over vLLM's API
/// it needs a loaded checkpoint (the disk backend), so it is no zero-byte phase.
struct bench_control_http_result {
  std::uint64_t engines = 0;
  int rounds = 0;
  unsigned cores = 0;
  std::vector<double> builtin_ms; ///< one round's four waves over CAF, per round
  std::vector<double> http_ms;    ///< the same over HTTP, per round
  /// Whole coordinator rounds (pause → flush → start → transfer → finish →
  /// continue; the near-empty model moves every round) in this process:
  /// each round's stall with N built-in engines, and with N engines of kind
  /// vllm fronting the same rlsync serve servers (weights through the disk
  /// backend: safetensors written, then loaded by the server).
  std::vector<double> builtin_round_ms;
  std::vector<double> http_round_ms;
  std::string error;              ///< non-empty: the bench failed here
  double ratio() const;           ///< median HTTP / median built-in; 0 when not measured
  double round_ratio() const;     ///< the same for whole rounds
};
bench_control_http_result run_bench_control_http(std::uint64_t engines, int rounds,
                                                 const std::function<void(const std::string&)>& note);
std::string bench_control_http_report(const bench_control_http_result& r);
nlohmann::ordered_json bench_control_http_json(const bench_control_http_result& r);

/// What `rlsync bench control` prints: the round, its transfer and the six
/// round-trip waves (median, min, max), and their ratio.
std::string bench_control_report(const bench_control_result& r);

nlohmann::ordered_json bench_control_json(const bench_control_result& r);

} // namespace rlsync::jobs
