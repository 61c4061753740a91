#pragma once
// rlsync drill: rehearse failures. The topology runs in this
// process with its rollout workload; the drill section's faults fire at
// their sync round's phase or at their time; everything heals; then the
// invariants are checked (runtime/drill/drill_check) and a report is written
// (runtime/drill/drill_report): JSON and one HTML page with the timeline.
//
//   deploy ─▶ cold sync ─▶ workload ─▶ faults fire ─▶ all healed, every
//   replica back ─▶ settle window ─▶ stop workload ─▶ freeze trainer, final
//   round ─▶ weights verified ─▶ check ─▶ report
//
// drill_injector fires the faults on the deployment. The pure parts live
// apart: drill_faults (labels, refusals, when each fault is due and ends),
// drill_timeline (lanes, marks and failover times from the hooks' events),
// drill_figures (throughput windows, figures, the summary).
#include "actors/jobs/drill_options.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/drill/drill_report.hpp"

#include <caf/actor_system.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace rlsync::jobs {

/// Runs the topology's drill in `sys` (the topology must pass refuse_drill)
/// and returns its record: timeline, figures and invariants. Never hangs:
/// every wait is bounded. `source` names the YAML file in the report.
drill_record rehearse(caf::actor_system& sys, const topology& t, const std::string& source,
                      throughput_verdict throughput);

/// `rlsync drill`: loads the topology at `path`; one with several nodes runs
/// with a process per node (process_drill.hpp); otherwise refuses what one
/// process cannot stage, runs the drill, writes report.json and report.html and
/// prints the summary (stdout; progress on stderr). Returns the exit status:
/// 0 every judged invariant held, 1 one was violated, a fault never fired,
/// or the topology was refused.
int run_drill(const std::string& path, const drill_options& o);

} // namespace rlsync::jobs
