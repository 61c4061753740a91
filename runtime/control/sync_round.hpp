#pragma once
// The bookkeeping of one sync round (DESIGN §3) as a pure state machine: who
// is still in the round, whom the current phase still waits on, and when the
// barrier is reached. No actors, no clocks: the coordinator
// (actors/coordinator.cpp) feeds it acknowledgements and evictions and asks
// it what comes next, and tests drive it row by row.
#include "runtime/config/modes.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rlsync {

/// Whether a round is due: the trainer is at least `every_versions` ahead of
/// the last synced version, or a newcomer waits for its cold sync. Engines
/// evicted from an earlier round do not count: they rejoin at the next
/// boundary, so a replica that fails at once cannot make rounds back to back.
bool round_due(std::uint64_t newest_version, std::uint64_t synced_version,
               std::int64_t every_versions, bool newcomer_waiting);

/// One round over a fixed set of engines. Every phase starts with all live
/// engines pending; the barrier is reached when none is. An evicted engine
/// leaves the round for good, so its late acknowledgements change nothing.
class sync_round {
public:
  /// A round over `engines` (the membership snapshot; names unique) towards
  /// `version`. It starts in `pause`, or `done` when `engines` is empty.
  sync_round(std::uint64_t id, std::uint64_t version, std::vector<std::string> engines);

  std::uint64_t id() const { return id_; }
  std::uint64_t version() const { return version_; }
  sync_phase phase() const { return phase_; }
  bool done() const { return phase_ == sync_phase::done; }

  /// Engines still in the round, in snapshot order.
  const std::vector<std::string>& live() const { return live_; }

  /// Engines evicted from the round, in eviction order.
  const std::vector<std::string>& evicted() const { return evicted_; }

  /// Whether the current phase still waits on `name`.
  bool waiting_on(std::string_view name) const;

  /// Whether `name` is still in the round.
  bool in_round(std::string_view name) const;

  /// No live engine is pending in the current phase.
  bool barrier_reached() const { return pending_.empty(); }

  /// `name` acknowledged `phase`. Returns false and changes nothing when the
  /// acknowledgement is stale: another phase, an engine not in the round, or
  /// one that already acknowledged.
  bool ack(std::string_view name, sync_phase phase);

  /// Removes `name` from the round. Returns false when it was not in it.
  bool evict(std::string_view name);

  /// Once the barrier is reached: moves to the next phase with every live
  /// engine pending, or straight to `done` when none is left. Before the
  /// barrier it changes nothing. Returns the phase it is in.
  sync_phase advance();

  /// The update is abandoned (the trainer died): straight to `resume`, with
  /// every live engine pending, so that engines leave the pause; `done`
  /// when none is live. Late acknowledgements of the abandoned phase are
  /// stale. Returns false (and changes nothing) from `finish` on: every
  /// live engine then holds the whole version and the round completes.
  bool abort();
  bool aborted() const { return aborted_; }

private:
  bool aborted_ = false;
  std::uint64_t id_;
  std::uint64_t version_;
  sync_phase phase_ = sync_phase::pause;
  std::vector<std::string> live_;
  std::vector<std::string> pending_;
  std::vector<std::string> evicted_;
};

} // namespace rlsync
