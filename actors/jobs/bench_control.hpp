#pragma once
// `rlsync bench control`: the control plane alone. N engine processes (one
// tp-1 engine each) on loopback around a head in this process run K sync
// rounds of a near-empty model; each round is compared with six waves of CAF
// round trips to every engine (pause, flush, start, transfer, finish and
// continue are six waves) measured between the rounds.
#include "actors/jobs/bench_sync.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>

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
  case_result control;
};

/// Runs the rounds; a failure is control.error.
bench_control_result run_bench_control(const bench_control_options& o);

/// What `rlsync bench control` prints: the round, its transfer and the six
/// round-trip waves (median, min, max), and their ratio.
std::string bench_control_report(const bench_control_result& r);

nlohmann::ordered_json bench_control_json(const bench_control_result& r);

} // namespace rlsync::jobs
