#pragma once
// The coordinator's membership decisions as pure functions: who may register
// and what that registration means, who joins a round, when a member is
// silent too long, what an eviction or a wave's end does to an engine, and
// the min_live_engines alert. No actors, no clocks (times are arguments): the
// coordinator (actors/coordinator.cpp) acts on the answers, tests check them
// row by row.
#include "runtime/control/sync_round.hpp"

#include <cstdint>

namespace rlsync {

// -- registration -------------------------------------------------------------------

/// What the coordinator knows when an engine registers.
struct registration_facts {
  /// The replica name was seen before (now or by a restored coordinator).
  bool known_replica = false;
  bool retired = false;
  std::uint64_t last_incarnation = 0; ///< of the replica record, when known
  std::uint32_t restarts = 0;         ///< so far, when known
  /// From a state file or a previous registration: the version it held and
  /// whether it was current then.
  std::uint64_t recorded_version = 0;
  bool was_routable = false;
  /// A member of that name is registered now; its incarnation, and whether
  /// the registration comes from that very actor (a retry).
  bool registered = false;
  std::uint64_t registered_incarnation = 0;
  bool same_actor = false;
  /// The registration itself.
  std::uint64_t incarnation = 0;
  std::uint64_t version = 0;
  bool dirty = false;
  bool paused = false;
  /// The coordinator's synced version and sync.max_restarts.
  std::uint64_t synced_version = 0;
  std::int64_t max_restarts = 3;
};

enum class registration_verdict : std::uint8_t {
  join,            ///< becomes a member
  retry,           ///< the registered actor again: nothing changes
  retired,         ///< refused: retired earlier
  retire,          ///< refused: this restart is past sync.max_restarts
  not_newer,       ///< refused: not newer than the registered incarnation
  older_than_seen, ///< refused: older than the last incarnation seen
};

struct registration_decision {
  registration_verdict verdict = registration_verdict::join;
  /// The registered member is dropped first (a newer incarnation replaces it).
  bool replaces = false;
  /// A new incarnation of a known replica: one more restart.
  bool restart = false;
  /// It reconnects holding the synced version, clean, and was current then:
  /// routable at once, no cold sync.
  bool routable_at_once = false;
};

registration_decision decide_registration(const registration_facts& f);

/// Whether `restarts` restarts are past the cap (sync.max_restarts).
bool past_restart_cap(std::uint32_t restarts, std::int64_t max_restarts);

// -- rounds ---------------------------------------------------------------------------

/// A member as the round snapshot sees it.
struct member_view {
  bool routable = false;
  bool dirty = false;
  std::uint64_t version = 0;
  bool unreachable = false;
  bool newcomer = false;
};

/// It serves `newest` already: routable, clean, at that version.
bool serves(const member_view& m, std::uint64_t newest);

/// Joins a round towards `newest`: it does not serve it yet (behind, dirty,
/// evicted or new) and answers heartbeats (an unreachable one would only
/// miss the pause deadline).
bool joins_round(const member_view& m, std::uint64_t newest);

/// A newcomer that waits for its cold sync and can take it (reachable).
bool waits_for_cold_sync(const member_view& m);

/// An engine evicted in `phase` may hold a half-applied update session.
bool dirty_after_eviction(sync_phase phase);

/// What an engine of a wave that just ended does now.
enum class wave_outcome : std::uint8_t {
  current,     ///< holds the round's version: routable at it
  dirty,       ///< an aborted update left part of it: unroutable until a complete one
  old_version, ///< the update was skipped: it serves what it held before
};

wave_outcome after_wave(bool wave_aborted, bool said_dirty);

// -- liveness -------------------------------------------------------------------------

/// Silent for longer than `timeout_ns` at `now_ns` (a clock that seems to go
/// backwards is not silence).
bool silent_too_long(std::uint64_t now_ns, std::uint64_t last_heard_ns, std::uint64_t timeout_ns);

/// The sync.min_live_engines alert: armed once that many members served,
/// raised once per fall below, cleared when enough are live again.
struct min_live_alert {
  bool armed = false;
  bool below = false;
  std::uint64_t events = 0; ///< falls below so far
};

enum class min_live_change : std::uint8_t { none, alert, recovered };

/// The alert after counting `live` members (serving within the staleness
/// bound, or being brought there by the round in progress) against
/// `min_live`; `serving` (those serving now) arms it.
min_live_change count_live(min_live_alert& a, std::int64_t live, std::int64_t serving, std::int64_t min_live);

} // namespace rlsync
