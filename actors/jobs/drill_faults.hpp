#pragma once
// The faults of a drill as values: their labels, which ones one process
// cannot stage, and when each is due. The runner fires them; this only keeps
// the books, so the ordering rules can be tested without actors.
#include "runtime/config/topology.hpp"
#include "runtime/drill/drill_report.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace rlsync::jobs {

/// "kill rollout-0 (sync 16 transfer) for 1500 ms", "partition rollout-1 (at 4500 ms)".
std::string fault_label(const fault_spec& f);

/// Why one process cannot stage `f` (a whole node's kill or restart), or empty.
std::string unsupported_fault(const fault_spec& f);

/// Whether `f` ends after its duration: an engine's or a node's fault heals
/// (partition, delay_acks) or restarts what it killed; the router, the
/// coordinator or the trainer killed is restarted. False without a duration.
bool fault_has_end(const fault_spec& f);

/// Whether `node` hosts trainer ranks holding a layer no rank elsewhere
/// holds (or the single trainer): its death leaves that layer unheld.
bool holds_layers_alone(const topology& t, const std::string& node);

/// The most engine replicas `faults` kill at the same moment (the same
/// at_ms, or the same round and phase; a corruption counts, as it evicts its
/// engine from the round); a node's kill counts its engines,
/// and killing the trainer (or killing or cutting off a node holding some
/// layers alone) as a round's transfer goes out counts every engine (all receive part of the
/// update and stay dirty).
std::int64_t engines_killed_at_once(const topology& t);

/// Which node's process a fault takes whole (with processes: fault_node);
/// empty in one process, where a fault hits its target alone.
using fault_node_fn = std::function<std::string(const fault_spec&)>;

/// Engines the drill's own faults take out for good: killed (an engine, or
/// its node) with no duration_ms to restart them, or cut off by a partition
/// with no duration_ms and no later heal. With `node_hit`, such a fault
/// takes every engine of the node it hits. Every other engine must be back,
/// current, at the end.
std::set<std::string> engines_lost_by_design(const topology& t, const fault_node_fn& node_hit = {});
/// Whether the drill's own faults take the trainer out for good (killed with
/// no duration_ms, or a node hosting it or any of its ranks killed or cut
/// off for good: rounds wait for every rank): then no final version can be
/// published, and a final round that fails is the drill's doing.
bool trainer_lost_by_design(const topology& t, const fault_node_fn& node_hit = {});

/// Why the drill in `t` cannot run in one process, or empty:
/// "no drill.faults: ..." or "PLACE: drill.faults[I]: why", PLACE being
/// place(I) (the fault's file:line:col) when given.
std::string refuse_drill(const topology& t, const std::function<std::string(std::size_t)>& place = {});

/// Where every fault of a drill stands: handed over (queued), fired or
/// skipped, and the ends (heal, restart) of the ones with a duration. Times
/// are measured from the start of the workload. Not thread-safe: the runner
/// holds its lock around every call.
class fault_schedule {
public:
  using duration = std::chrono::steady_clock::duration;

  explicit fault_schedule(std::vector<fault_spec> faults);

  std::size_t size() const { return faults_.size(); }
  const fault_spec& spec(std::size_t i) const { return faults_.at(i).spec; }
  bool fired(std::size_t i) const { return faults_.at(i).fired; }
  bool skipped(std::size_t i) const { return faults_.at(i).skipped; }

  /// The faults due as `phase` of round `round` goes out, in their order in
  /// the drill; each is handed over once.
  std::vector<std::size_t> take_at_phase(std::uint64_t round, sync_phase phase);

  /// The faults with a time (at_ms) due by `elapsed`, in their order in the
  /// drill; each is handed over once.
  std::vector<std::size_t> take_due_by(duration elapsed);

  /// Fault i was dealt with: fired, or skipped (`fired` false).
  void settle(std::size_t i, bool fired);

  /// Whether the coordinator's hook may stop waiting for `due`: each fired or
  /// was skipped, or is a restart (which needs that coordinator to register).
  bool landed(const std::vector<std::size_t>& due) const;

  /// Every fault was dealt with (fired or skipped).
  bool all_settled() const;

  /// Fault i ends (heals, restarts what it killed) at `at`.
  void end_at(std::size_t i, duration at);

  /// The ends due by `elapsed`, earliest first (ties in the order
  /// scheduled); each is handed out once.
  std::vector<std::size_t> take_ends_due(duration elapsed);

  bool ends_pending() const { return !ends_.empty(); }

  /// The faults never dealt with (their round did not come).
  std::vector<std::size_t> never_fired() const;

  /// "every scheduled fault fired", with each fault's label and fate.
  invariant_result fired_invariant() const;

private:
  struct pending {
    fault_spec spec;
    bool queued = false;
    bool fired = false;
    bool skipped = false;
  };
  struct end {
    duration at;
    std::size_t fault;
  };
  std::vector<pending> faults_;
  std::vector<end> ends_; ///< at most one per fault
};

} // namespace rlsync::jobs
