#pragma once
// The main job, shared by `rlsync run` (one process) and `rlsync node` on a
// cluster's head node: drive the rollout workload through the router while
// the trainer produces versions and the coordinator syncs, print one line per
// sync with its four figures (stall, transfer, GB/s, control), then stop the
// trainer, run one last round, verify every engine's weights against the
// trainer's, and summarise.
#include "actors/assembly/local_deployment.hpp"
#include "actors/assembly/verify_weights.hpp"
#include "actors/interfaces.hpp"
#include "actors/workload.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/transfer/weight_source.hpp"

#include <caf/actor_system.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace rlsync::jobs {

/// The topology at `path`, or every error printed to stderr and nullopt.
std::optional<topology> load_topology_or_report(const std::string& path);

/// What a command line may override in a topology's workload.
struct workload_overrides {
  std::optional<std::uint64_t> prompts, concurrency, max_tokens;
};

/// The topology's workload with `o` applied. Throws std::invalid_argument
/// for a zero concurrency or max_tokens, or a value beyond 32 bits.
workload_options workload_from(const topology& t, const workload_overrides& o = {});

/// Writes progress to stderr: one line per sync (thread-safe: the
/// coordinator calls it), and a progress bar when stderr is a terminal.
class job_console {
public:
  /// `quiet_syncs`: keep every round's figures but print no line per sync.
  explicit job_console(bool progress_bar, bool quiet_syncs = false);
  ~job_console();
  /// The local data plane's speed of light, measured once at start.
  double memcpy_gbps() const { return memcpy_gbps_; }
  /// For coordinator_config::on_report.
  void on_sync(const sync_report& r);
  /// For logs: evictions and failures are worth a line.
  void on_log(const std::string& line);
  void line(const std::string& text);
  void progress(const workload_progress& p, std::uint32_t total);
  void done();
  /// The cold round (the first that moved weights) and the last
  /// kept_rounds rounds: a long job's head must not grow with every sync.
  std::vector<sync_report> reports() const;
  /// Rounds no longer in reports() (older than the last kept_rounds).
  std::uint64_t dropped_rounds() const;
  std::uint64_t total_rounds() const;
  static constexpr std::size_t kept_rounds = 1024;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
  double memcpy_gbps_;
};

/// What the main job talks to.
struct job_handles {
  router_actor router;
  coordinator_actor coordinator;
  trainer_actor trainer;
  std::shared_ptr<transfer::weight_source> source;
  /// With several trainer ranks: every rank this process hosts (each
  /// frozen at the end) and their sources (together the reference the
  /// engines are verified against). Empty: `trainer` and `source` alone.
  std::vector<trainer_actor> ranks;
  std::vector<std::shared_ptr<transfer::weight_source>> sources;
  /// Synthetic ranks running in other processes, rebuilt here: the same
  /// options make the same bytes, so each is advanced to the engines'
  /// version before the check and joins the reference.
  std::vector<std::shared_ptr<transfer::synthetic_source>> replayed;
};

/// How a job ends: the trainer frozen (no new versions), one last round
/// bringing every engine to its final version, every engine's weights
/// verified against the trainer's, and the coordinator's status. Bounded by
/// the phase deadlines; failures are collected, never thrown.
struct job_end {
  std::optional<sync_report> last;  ///< the last round, if it completed
  std::string error;                ///< what failed on the way (empty: nothing), check_error included
  /// What failed in the check after the round (digests, a rank's replay):
  /// no trainer's absence explains it.
  std::string check_error;
  /// The version the trainer held when it froze (ranks in this process: the
  /// lowest of theirs, the newest all hold); unset when none answered here
  /// (ranks of other processes).
  std::optional<std::uint64_t> frozen_version;
  std::vector<engine_verification> checks;
  coordinator_status status;
};
job_end finish_job(caf::actor_system& sys, const topology& t, const job_handles& h);

/// Runs the workload to the end (or Ctrl-C), the final round, the check and
/// the summary (stdout; JSON into `json_file` when set). Returns the exit
/// status: 0 all well, 1 a request failed or a check did not hold, 3 engines live and
/// serving within sync.staleness fell below sync.min_live_engines, 130 interrupted.
int run_main_job(caf::actor_system& sys, const topology& t, const std::string& label, const workload_options& w,
                 const job_handles& h, job_console& out, const std::optional<std::string>& json_file);

} // namespace rlsync::jobs
