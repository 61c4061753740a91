#pragma once
// The bookkeeping of one sync round as a pure state machine: who
// is still in the round, which wave is syncing, whom the current phase still
// waits on, and when the barrier is reached. No actors, no clocks: the
// coordinator (actors/coordinator.cpp) feeds it acknowledgements and
// evictions and asks it what comes next, and tests drive it row by row.
//
// Waves: with a wave size N > 0 the round's engines (in snapshot order) are
// cut into waves of at most N, and each wave goes through every phase, pause
// to resume, before the next one pauses. N = 0 is one wave of everybody.
//
// Every reply costs O(1): engines are numbered by their place in the snapshot
// (the coordinator answers by number; a name is one hash lookup), and the
// barrier is a count of pending engines. Only a new phase touches every
// engine of its wave, walking an array.
#include "runtime/config/modes.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace rlsync {

/// Whether a round is due: the trainer is at least `every_versions` ahead of
/// the last synced version, or a newcomer waits for its cold sync. Engines
/// evicted from an earlier round do not count: they rejoin at the next
/// boundary, so a replica that fails at once cannot make rounds back to back.
bool round_due(std::uint64_t newest_version, std::uint64_t synced_version,
               std::int64_t every_versions, bool newcomer_waiting);

/// One round over a fixed set of engines, wave by wave. Every phase starts
/// with all live engines of the current wave pending; the barrier is reached
/// when none is. An evicted engine leaves the round for good, so its late
/// acknowledgements change nothing.
class sync_round {
public:
  /// A round over `engines` (the membership snapshot; names unique) towards
  /// `version`, in waves of at most `wave_size` engines (0: one wave). It
  /// starts in the first wave's `pause`, or `done` when `engines` is empty.
  sync_round(std::uint64_t id, std::uint64_t version, std::vector<std::string> engines,
             std::size_t wave_size = 0);

  std::uint64_t id() const { return id_; }
  std::uint64_t version() const { return version_; }
  /// The current wave's phase.
  sync_phase phase() const { return phase_; }
  bool done() const { return phase_ == sync_phase::done; }

  /// The current wave (from 0) and how many waves the round was cut into.
  std::size_t wave() const { return wave_; }
  std::size_t waves() const { return wave_live_.size(); }

  /// Engines still in the round (whatever their wave), in snapshot order.
  std::vector<std::string> live() const;

  /// Engines of the current wave still in the round, in snapshot order: the
  /// ones the current phase goes to.
  std::vector<std::string> wave_engines() const;

  /// The same, by place in the snapshot (what `engine` names): the numbers
  /// the `_at` calls take.
  std::vector<std::size_t> wave_indices() const;

  /// The engine at place `i` of the snapshot (i < the snapshot's size).
  const std::string& engine(std::size_t i) const { return engines_.at(i); }

  /// Engines evicted from the round, in eviction order.
  const std::vector<std::string>& evicted() const { return evicted_; }

  /// Whether the current phase still waits on `name` (or on place `i`).
  bool waiting_on(std::string_view name) const;
  bool waiting_on_at(std::size_t i) const;

  /// Whether `name` is in the round and not evicted.
  bool in_round(std::string_view name) const;

  /// Whether `name` is in the round and its wave has not ended: in the
  /// current wave or a later one. Engines of ended waves are done with it.
  bool still_to_sync(std::string_view name) const;

  /// Whether `name` is live in the current wave.
  bool in_current_wave(std::string_view name) const;

  /// No live engine of the current wave is pending in the current phase.
  bool barrier_reached() const { return pending_ == 0; }

  /// The barrier of the current wave's last phase is reached (or nobody in
  /// the wave is left): the next `advance` starts the next wave or ends the round.
  bool wave_ending() const;

  /// `name` acknowledged `phase`. Returns false and changes nothing when the
  /// acknowledgement is stale: another phase, an engine not in the current
  /// wave, or one that already acknowledged.
  bool ack(std::string_view name, sync_phase phase);
  /// The same for the engine at place `i` (out of range: stale).
  bool ack_at(std::size_t i, sync_phase phase);

  /// Removes `name` from the round (from the current wave or a later one).
  /// Returns false when it was not in it or its wave has ended.
  bool evict(std::string_view name);

  /// Once the barrier is reached: moves to the next phase with every live
  /// engine of the wave pending; after `resume` (or when the wave has nobody
  /// left) to the next wave's `pause`, or to `done` when no wave with a live
  /// engine is left. Before the barrier it changes nothing. Returns the phase.
  sync_phase advance();

  /// The update is abandoned (the trainer died): no later wave starts, and a
  /// wave before `finish` skips straight to `resume`, with every live engine
  /// of the wave pending, so that engines leave the pause (`done` when none
  /// is live). Late acknowledgements of the abandoned phase are stale.
  /// Returns false (and changes nothing) when nothing is left to abandon: the
  /// last wave at `finish` or later completes, every engine of it then holds
  /// the whole version.
  bool abort();
  /// Some engine of the round will not reach the version: abort() took effect.
  bool aborted() const { return aborted_; }
  /// The current wave skipped its update: its engines resume on what they held.
  bool wave_aborted() const { return wave_aborted_; }

  /// Bookkeeping steps taken so far (lookups and per-engine loop steps): a
  /// whole round costs O(engines), whatever their number.
  std::uint64_t ops() const { return ops_; }

private:
  struct slot {
    std::size_t wave = 0;
    bool evicted = false;
    bool pending = false;
  };

  const slot* find(std::string_view name) const;
  slot* find(std::string_view name);
  const slot* at(std::size_t i) const;
  slot* at(std::size_t i);
  /// Makes every live engine of the current wave pending.
  void pend_wave();
  /// The next wave with a live engine at `pause`, or `done`.
  void next_wave();

  std::uint64_t id_;
  std::uint64_t version_;
  std::size_t wave_size_;
  sync_phase phase_ = sync_phase::pause;
  std::size_t wave_ = 0;
  bool aborted_ = false;
  bool wave_aborted_ = false;
  std::vector<std::string> engines_; ///< the snapshot, in order
  std::vector<slot> slots_;          ///< engines_[i]'s at i
  std::unordered_map<std::string, std::size_t> places_; ///< name -> i
  std::vector<std::size_t> wave_live_; ///< live engines per wave
  std::size_t pending_ = 0;            ///< pending engines of the current wave
  std::vector<std::string> evicted_;
  mutable std::uint64_t ops_ = 0;
};

} // namespace rlsync
