#pragma once
// The multi-process drill's pure parts: what each fault does to which node's
// process (a signal, a restart, its network link cut), which faults processes
// cannot stage, and the structured line the head prints as a round's phase
// goes out (the drill times `at_sync` faults by it). The runner
// (process_drill) forks the processes and reads the lines.
#include "runtime/config/modes.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/control/protocol.hpp"

#include <signal.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rlsync::jobs {

/// Whether `rlsync drill` runs `t` as one process per node: more than one node.
bool runs_as_processes(const topology& t);

/// Whether `node` hosts a trainer rank of `t` (the trainer's node when
/// trainer.ranks is left out).
bool hosts_rank(const topology& t, const std::string& node);
/// The node whose process a fault acts on with processes: an engine's node,
/// the node named, or the trainer's, router's or coordinator's node.
std::string fault_node(const topology& t, const fault_spec& f);

/// What a fault does to a node's process.
enum class process_action : std::uint8_t {
  kill,         ///< SIGKILL; with an end, started again after it
  kill_restart, ///< SIGKILL and started again at once
  stop,         ///< SIGSTOP; SIGCONT at its end (its acknowledgements wait meanwhile)
  cut_link,     ///< its veth link down (network namespaces only); up again at its end
  restore_link, ///< its veth link up
  corrupt,      ///< drill_corrupt_signal() to every process hosting a trainer rank: their UCX producers alter the next group 0
                ///< the engine receives (of the round's version), once
};

/// The signals that have a node's trainer ranks withhold a group and alter
/// one (sent with sigqueue, the value a drill_order); real-time signals, so
/// that two sent at once (two corruptions at one phase) queue instead of
/// merging.
int drill_withhold_signal();
int drill_corrupt_signal();
/// Both, as a signal set (blocked while a node starts, until it handles them).
sigset_t drill_order_signals();

/// What a drill's signal carries (sigqueue's 64-bit value): the engine
/// whose bytes to alter (corrupt: its index in the topology; none: any
/// engine) and the round's version (0: any). Bits 0-15: engine index + 1 (0:
/// none), bits 16-63: the version.
struct drill_order {
  std::optional<std::uint32_t> engine;
  std::uint64_t version = 0;
  bool operator==(const drill_order& o) const { return engine == o.engine && version == o.version; }
};
inline constexpr std::uint32_t max_drill_order_engine = 0xfffd; // no order encodes to all ones
inline constexpr std::uint64_t max_drill_order_version = (std::uint64_t{1} << 48) - 1;
/// nullopt when the engine index or the version does not fit.
std::optional<std::uint64_t> encode_drill_order(const drill_order& o);
drill_order decode_drill_order(std::uint64_t value);

/// Where a node's signal handlers keep the drill's orders until its watcher
/// takes them (lock-free: stored from a signal handler). Real-time signals
/// queue, so several orders may arrive between two takes: each goes to the
/// next slot; one that finds its slot still full is counted as lost, never
/// stored over an order not yet taken.
class drill_order_ring {
public:
  static constexpr std::uint64_t no_order = ~std::uint64_t{0}; // encode_drill_order never gives it
  static constexpr std::size_t capacity = 16;
  drill_order_ring() {
    for (auto& s : slots_)
      s.store(no_order);
  }
  void store(std::uint64_t order) {
    auto expected = no_order;
    if (!slots_[next_.fetch_add(1) % capacity].compare_exchange_strong(expected, order))
      lost_.fetch_add(1);
  }
  /// Every order stored since the last take, each once; returns how many
  /// were lost since (the ring was full).
  template <class F>
  std::uint64_t take(F act) {
    for (auto& s : slots_)
      if (auto v = s.exchange(no_order); v != no_order)
        act(v);
    return lost_.exchange(0);
  }

private:
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "touched from a signal handler");
  static_assert(std::atomic<unsigned>::is_always_lock_free, "touched from a signal handler");
  std::array<std::atomic<std::uint64_t>, capacity> slots_;
  std::atomic<unsigned> next_{0};
  std::atomic<std::uint64_t> lost_{0};
};

std::string_view to_string(process_action a);

struct process_fault {
  std::string node;        ///< the node whose process it hits
  std::size_t node_index = 0; ///< in topology order (its namespace's index)
  process_action action = process_action::kill;
  /// When the fault ends (restart, SIGCONT, link up), after it fired; none: never.
  std::optional<std::chrono::milliseconds> ends_after;
  bool head = false;       ///< the node is the coordinator's (its restart resumes from the state file)
  /// corrupt: every node hosting a trainer rank, in topology order (each
  /// arms its ranks' UCX producers; only the one serving the engine's group 0
  /// of the round's version alters it). `node` is the first of them.
  std::vector<std::string> rank_nodes;
  /// A kill, restart or partition of a member node hosting trainer ranks,
  /// at a round's transfer: as an earlier phase of that round goes out, the
  /// drill has those ranks withhold a group of the round's version (released
  /// by a deadline), so the fault lands while an engine waits for that group
  /// however small and fast the model.
  bool withhold_first = false;
};

/// The plan for fault `f` of `t`, or why processes cannot stage it (the text
/// names the fault's action and target; `place` is prefixed, e.g. "T.yaml:31:7").
struct process_fault_plan {
  std::optional<process_fault> fault;
  std::string refusal;
};
process_fault_plan plan_process_fault(const topology& t, const fault_spec& f, bool netns, const std::string& place);

/// Every fault of `t` planned; the first refusal ("PLACE: drill.faults[I]:
/// why"), or "no drill.faults" when there is nothing to rehearse. `place(i)`
/// gives fault i's "file:line:col".
struct process_drill_plan {
  std::vector<process_fault> faults; ///< parallel to t.drill.faults
  std::string refusal;
};
process_drill_plan plan_process_drill(const topology& t, bool netns,
                                      const std::function<std::string(std::size_t)>& place);

/// The head's phase line: "rlsync-drill: phase round=16 version=17
/// phase=transfer engines=rollout-a,rollout-b" (phase as drills spell it:
/// "continue" for resume).
inline constexpr std::string_view drill_phase_prefix = "rlsync-drill: phase ";
std::string drill_phase_line(std::uint64_t round, std::uint64_t version, sync_phase phase,
                             const std::vector<std::string>& engines);

/// The head's line as a round ends (its report): "rlsync-drill: synced
/// version=17 engines=2 aborted=0". An aborted round sends its continue
/// phase too, so only this line says whether engines reached the version.
inline constexpr std::string_view drill_synced_prefix = "rlsync-drill: synced ";
std::string drill_synced_line(const sync_report& r);

struct drill_synced_event {
  std::uint64_t version = 0;
  std::uint64_t engines = 0; ///< engines that reached the version
  bool aborted = false;
};
/// The event in one line of the head's stderr, or nullopt (as parse_drill_phase_line).
std::optional<drill_synced_event> parse_drill_synced_line(std::string_view line);

struct drill_phase_event {
  std::uint64_t round = 0;
  std::uint64_t version = 0;
  sync_phase phase = sync_phase::pause;
  std::vector<std::string> engines;
};

/// The event in one line of the head's stderr (a trailing '\n' or '\r' is
/// ignored; so is a launcher's "[NAME] " prefix), or nullopt for any other
/// line or a malformed one (numbers out of range, unknown phase, bad names).
std::optional<drill_phase_event> parse_drill_phase_line(std::string_view line);

/// Rounds as a drill counts them: round 1 is the first the head sends to
/// every engine of the topology (the whole fleet's first sync, as round 1 is
/// in one process). With processes the head starts rounds as soon as it is
/// up, before the engine nodes have joined; those rounds do not count. With
/// sync.wave_size each phase event names one wave's engines only: a round
/// reaches every engine when its waves together do (round 1 is numbered from
/// the event that completes the fleet on).
class drill_rounds {
public:
  explicit drill_rounds(std::vector<std::string> engines);
  /// The drill's number for the round of `e`; nullopt before round 1 (or for
  /// a round numbered below it).
  std::optional<std::uint64_t> on_phase(const drill_phase_event& e);
  bool started() const { return base_ != 0; }

private:
  std::vector<std::string> engines_;
  std::uint64_t base_ = 0; ///< the head's number of drill round 1
  /// Before round 1: the head's round being seen and the engines its waves
  /// reached so far (at most the topology's engines).
  std::uint64_t seen_round_ = 0;
  std::vector<std::string> seen_engines_;
};

/// "No version goes backwards", over the head's restarts: once a round of
/// version V completed (engines reached it: its synced line, even for a
/// round aborted after its first wave), no later round may carry a version
/// below V. A round that died with its head (a transfer of V+1 cut short)
/// or was aborted before any engine reached V+1 completed nothing, so the
/// head may sync V again. regression() names the first breach: "v12 (round 9) after v14
/// completed (round 8)"; empty when none. Not thread-safe.
class version_watch {
public:
  void on_phase(const drill_phase_event& e);
  /// A round ended: the round of the last phase event completed when
  /// engines reached its version.
  void on_synced(const drill_synced_event& e);
  const std::string& regression() const { return regression_; }
  /// The highest version a completed round carried.
  std::uint64_t highest_completed() const { return highest_; }

private:
  std::uint64_t highest_ = 0;
  std::uint64_t highest_round_ = 0;
  std::uint64_t last_round_ = 0; ///< of the last phase event
  std::string regression_;
};

/// When a process drill ends its job. The head's job runs until the drill
/// stops it (as in one process), so that the job's length follows the faults,
/// not the machine's speed: once every fault fired and ended (arm()), a
/// round whose continue phase reaches every engine of the topology (its
/// waves together) and that then ends not aborted shows the fleet back, and
/// the drill stops the job a settle time later. Not thread-safe.
class fleet_recovery_watch {
public:
  explicit fleet_recovery_watch(std::vector<std::string> engines);
  /// Every fault is over: only rounds from here on count.
  void arm();
  bool armed() const { return armed_; }
  void on_phase(const drill_phase_event& e);
  void on_synced(const drill_synced_event& e);
  /// A round after arm() completed on every engine.
  bool recovered() const { return recovered_; }

private:
  std::vector<std::string> engines_;
  bool armed_ = false;
  bool recovered_ = false;
  bool reached_all_ = false;          ///< the round being collected continued on every engine
  std::uint64_t round_ = 0;           ///< the head's round being collected
  std::vector<std::string> resumed_;  ///< its engines at continue so far
};

} // namespace rlsync::jobs
