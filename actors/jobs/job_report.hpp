#pragma once
// The end-of-job report of the main job (`rlsync run`, `rlsync node` on a
// head, `rlsync launch --run`) as functions over plain values: the summary
// text, its JSON (`--json FILE`) and the exit status, from the rounds'
// reports, the workload's result and the weight verification.
#include "actors/assembly/verify_weights.hpp"
#include "actors/workload.hpp"
#include "runtime/control/protocol.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rlsync::jobs {

/// `x` with `digits` digits after the point ("12.5").
std::string fixed(double x, int digits = 1);

/// A round's four figures: stall, transfer, bandwidth, control plane.
struct sync_figures {
  double stall_ms = 0;
  double transfer_ms = 0;
  double gbps = 0;
  double control_ms = 0;
};
sync_figures figures_of(const sync_report& r);

/// The rounds of a job in brief. The cold sync (the first round that moved
/// weights) is reported apart; warm syncs are the later rounds that moved
/// weights; rounds that moved nothing count only as rounds.
struct sync_summary {
  std::size_t rounds = 0;
  std::size_t evictions = 0;
  std::optional<sync_figures> cold;
  std::size_t warm = 0;
  sync_figures warm_median; ///< each figure's median over the warm syncs (rlsync::median)
};
sync_summary summarize_syncs(const std::vector<sync_report>& rounds);

/// Every engine was verified and holds the trainer's weights (false for none).
bool weights_verified(const std::vector<engine_verification>& checks);

/// What a finished main job reports.
struct job_outcome {
  std::string label;          ///< the topology file
  bool interrupted = false;   ///< Ctrl-C or SIGTERM stopped sending
  int stop_signal = 0;        ///< which one (SIGINT, SIGTERM); 0 with interrupted: SIGINT
  std::string drain;          ///< how the drain after the signal went (empty: none)
  std::uint32_t requests = 0; ///< the workload's prompts
  workload_result workload;
  double seconds = 0;     ///< the workload's wall-clock time
  double memcpy_gbps = 0; ///< the local data plane's speed of light
  std::vector<sync_report> syncs; ///< the cold round and the last ones, in order (a bounded record)
  std::uint64_t total_syncs = 0;  ///< rounds in all (0: syncs.size())
  std::optional<sync_report> last; ///< the final round, when it completed
  std::string last_error;          ///< what failed on the way to it (empty: nothing)
  std::string last_check_error;    ///< the part of it in the check after the round (digests, replay)
  std::vector<engine_verification> checks;
  std::int64_t min_live_engines = 1;
  std::uint64_t below_min_live_events = 0;
  std::size_t retired = 0;
  std::vector<rank_status> ranks; ///< the coordinator's trainer ranks at the end (none: a single trainer)
};

/// One trainer rank in a line: "rank 1 on node-b (incarnation 7): published
/// v12, pinned v11, reachable" ("none" for a version not seen yet,
/// "UNREACHABLE" when down or silent).
std::string rank_status_text(const rank_status& r);

/// The summary printed on stdout: requests, tokens (by version), syncs with
/// the cold sync and the warm medians, one weight verification line per
/// engine, one line per trainer rank, the workload's errors and the min_live
/// alert.
std::string job_summary_text(const job_outcome& o);

/// The same as one JSON object (what `--json FILE` writes): topology,
/// interrupted, requests, tokens, seconds, memcpy_gbps, syncs (every round),
/// weights (one row per engine), weights_verified.
std::string job_summary_json(const job_outcome& o);

/// 128 + the signal when interrupted (130 for Ctrl-C); 3 engines live and serving fell below
/// sync.min_live_engines (the figures do not stand); 0 every request
/// completed, every stream whole and every engine identical to the trainer;
/// 1 otherwise.
int job_exit_status(const job_outcome& o);

} // namespace rlsync::jobs
