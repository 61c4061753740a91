#pragma once
// The final check of a drill, as a pure function over what the
// drill observed: FoundationDB's "workload, faults, then a check". Each
// invariant comes back held or violated with its evidence, so that a report
// says why, not just whether. tools/cmd_drill.cpp gathers the observation.
#include "runtime/drill/drill_report.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace rlsync {

/// One engine replica as the drill found it at the end.
struct drill_engine_end {
  std::string name;
  bool alive = true;      ///< its actor or process is running
  bool reachable = true;  ///< answers the coordinator's heartbeats
  bool retired = false;   ///< refused for good past max_restarts
  bool routable = false;  ///< the coordinator's word
  bool dirty = false;
  std::uint64_t version = 0;
  std::uint64_t dirty_tokens = 0; ///< tokens it produced while dirty
  bool faulted = false;   ///< a drill fault hit it (it had to rejoin)
  /// Its weights compared with the trainer's: empty when byte-identical,
  /// else what differs or why nothing could be compared.
  std::string weights_problem;
};

struct drill_observation {
  // The workload's requests.
  std::uint32_t sent = 0;
  std::uint32_t completed = 0;
  std::uint32_t rejected = 0; ///< explicitly refused (queue full, nothing routable)
  std::uint32_t failed = 0;   ///< answered failed or aborted, or an error
  std::uint32_t stream_mismatches = 0; ///< streams with a gap, a duplicate or a reordering
  std::uint64_t tokens = 0;            ///< in the results
  std::uint64_t streamed_tokens = 0;   ///< token events the sink received
  std::map<std::uint64_t, std::uint64_t> tokens_by_version;
  /// Versions some round completed (engines may serve only these).
  std::set<std::uint64_t> completed_versions;
  std::uint64_t synced_version = 0; ///< the coordinator's, at the end
  /// The version the trainer froze at before the final round, when known:
  /// every live engine must end at it.
  std::optional<std::uint64_t> trainer_version;
  /// What failed in the final round (the trainer did not freeze, the round
  /// or the digests failed); empty when it ran.
  std::string final_round_problem;
  /// The part of it no trainer's absence explains (the engines' digests, a
  /// rank's replay): judged even when the trainer was taken for good.
  std::string final_check_problem;
  /// The drill's own faults take the trainer out for good: a final round
  /// that fails is reported, not judged.
  bool trainer_lost_by_design = false;
  /// Engines the drill's own faults take out for good; every other engine
  /// must end alive, reachable, not retired, and current.
  std::set<std::string> lost_by_design;
  std::vector<drill_engine_end> engines;
  std::int64_t min_live_engines = 1;
  std::uint64_t below_min_live_events = 0;
  /// The most engine replicas the drill's own faults kill at the same moment.
  /// When that leaves fewer than min_live_engines, falling below it is the
  /// drill's doing: reported, not judged.
  std::int64_t engines_killed_at_once = 0;
  /// Tokens per second before the first fault and after everything healed.
  double throughput_before = 0;
  double throughput_after = 0;
  double throughput_tolerance = 0.10; ///< "within 10% of its pre-fault level"
  /// False: the throughput invariant is reported with its figures but not
  /// judged (a shared CI machine's neighbours move tokens/s more than 10%).
  bool judge_throughput = true;
};

/// Every invariant of the fault model, in a fixed order:
///  1. every request finished or was explicitly rejected
///  2. no token lost or duplicated in any stream
///  3. every live engine on the same version, with the trainer's weights, and
///     the final round ran (the trainer's final version, when known)
///  4. no token produced by a dirty engine
///  5. rejoined replicas are current, and every engine is back but those
///     the drill took out for good
///  6. throughput back to its pre-fault level (not judged unless judge_throughput)
///  7. live engines never below sync.min_live_engines
std::vector<invariant_result> check_drill(const drill_observation& o);

} // namespace rlsync
