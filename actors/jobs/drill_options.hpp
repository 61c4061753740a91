#pragma once
// What `rlsync drill` is asked for, shared by the drill in one process
// (drill_runner) and the drill with a process per node (process_drill).
#include <optional>
#include <string>
#include <string_view>

namespace rlsync::jobs {

/// What the throughput invariant counts for: judged (a drop fails the drill)
/// or reported (its figures are written and printed, marked "reported, not
/// judged", and never fail the drill: on a shared machine other jobs move
/// tokens/s by more than the 10% it allows).
enum class throughput_verdict { judge, report };

/// "judge" or "report", or nullopt.
std::optional<throughput_verdict> parse_throughput_verdict(std::string_view text);

struct drill_options {
  std::string report_dir; ///< empty: a new folder named after the drill and the time
  throughput_verdict throughput = throughput_verdict::judge;
  /// Multi-node topologies (one process per node): each node in its own
  /// network namespace (root only), so that partition can cut its link.
  bool netns = false;
  /// deploy/netns.sh; empty: looked for above the executable (build/tools/rlsync).
  std::string netns_script;
};

/// "rlsync-drill-NAME-YYYYmmdd-HHMMSS", with "-2", "-3"... if it exists.
std::string default_report_dir(const std::string& drill_name);

} // namespace rlsync::jobs
