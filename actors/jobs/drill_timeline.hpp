#pragma once
// What a drill learns from the deployment's hooks, as values: every engine's
// lane on the timeline, the marks, which engines a fault hit (they have to
// rejoin), the versions rounds completed, and the failover and detection
// times measured from those events. Times are ms since the drill started and
// are passed in, so a table of events gives the same record every time.
#include "runtime/config/modes.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/control/protocol.hpp"
#include "runtime/drill/drill_report.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace rlsync::jobs {

/// The router's "request N rerouted from ENGINE (why) after C tokens".
struct reroute_line {
  std::uint64_t request_id = 0;
  std::string engine; ///< the failed engine
  std::uint32_t tokens = 0; ///< already streamed: the continuation's first token has this index
};

/// The reroute in one of the router's log lines, or nullopt for any other line.
std::optional<reroute_line> parse_reroute_line(const std::string& line);

/// Not thread-safe: the runner holds its lock around every call.
class drill_timeline {
public:
  /// Lanes and marks kept at most (a report stays readable; more are counted in dropped()).
  static constexpr std::size_t max_events = 100000;
  /// Rerouted requests watched for their continuation's first token at most.
  static constexpr std::size_t max_watches = 10000;

  /// `engine` entered `state`.
  void lane(double at_ms, const std::string& engine, lane_state state);
  /// A vertical mark: "sync", "fault", "heal", "detect".
  void mark(double at_ms, const std::string& kind, const std::string& label);

  /// A round's phase went out to `engines`: pause and transfer show on their lanes.
  void on_phase(double at_ms, sync_phase phase, const std::vector<std::string>& engines);
  /// The coordinator's word about a member: "routable", "registered",
  /// "evicted", "dirty", "unreachable", "reachable", "left", "retired".
  /// "registered" before the workload started is the cold start, not a rejoin.
  void on_member(double at_ms, const std::string& engine, const std::string& what, bool workload_started);
  /// A round ended; an aborted one sends its engines that were not evicted back to generating.
  void on_sync(double at_ms, const sync_report& r);
  /// A fault hit `engine` now.
  void on_fault(double at_ms, const std::string& engine, fault_action action);
  /// The router rerouted a request: its continuation's first token ends the failover.
  void on_reroute(const reroute_line& r);
  /// A token reached the workload's sink.
  void on_token(double at_ms, std::uint64_t request_id, std::uint32_t index);

  const std::vector<lane_event>& lanes() const { return lanes_; }
  const std::vector<drill_mark>& marks() const { return marks_; }
  std::size_t dropped() const { return dropped_; }
  bool faulted(const std::string& engine) const { return faulted_.count(engine) > 0; }
  /// The coordinator evicted `engine` (or called it dirty) after a
  /// corruption was its last fault: its update failed, as it must.
  bool evicted_after_corruption(const std::string& engine) const { return caught_.count(engine) > 0; }
  const std::set<std::uint64_t>& completed_versions() const { return completed_versions_; }
  /// A killed engine's request: its fault to the continuation's first token.
  const std::vector<double>& failover_after_kill_ms() const { return failover_kill_ms_; }
  /// The same after a partition, a delayed ack or a corruption.
  const std::vector<double>& failover_after_other_ms() const { return failover_other_ms_; }
  /// An engine's fault to the coordinator calling it unreachable.
  const std::vector<double>& detect_ms() const { return detect_ms_; }

private:
  struct watch {
    std::uint32_t index = 0; ///< the continuation's first token
    std::string engine;      ///< the failed engine
  };

  std::vector<lane_event> lanes_;
  std::vector<drill_mark> marks_;
  std::size_t dropped_ = 0;
  std::vector<std::string> round_engines_;
  std::set<std::uint64_t> completed_versions_;
  std::map<std::string, double> last_fault_ms_;
  std::map<std::string, fault_action> fault_action_;
  std::set<std::string> faulted_; ///< hit by a fault, or out of service because of one
  std::set<std::string> unreachable_;
  std::set<std::string> caught_; ///< evicted or dirty after a corruption
  std::map<std::uint64_t, watch> watches_;
  std::vector<double> failover_kill_ms_, failover_other_ms_, detect_ms_;
};

} // namespace rlsync::jobs
