#pragma once
// rlsync's error codes. A code exists only when a caller reacts to it
// differently from the others (FoundationDB's rule); details go into the
// error's context, not into new codes. Registered with CAF as the "rlsync"
// error category by actors/system_config.cpp.
#include <cstdint>
#include <string>

namespace rlsync {

enum class errc : std::uint8_t {
  queue_full = 1,    ///< a bounded queue is full: retry later or elsewhere
  engine_dirty,      ///< the engine holds a partial update and refuses to serve
  pause_in_flight,   ///< resume arrived while a pause is still running
  not_paused,        ///< a weight-update call arrived while the engine generates
  no_session,        ///< update/finish without a matching start
  version_mismatch,  ///< finish(v) for another session, or a version going backwards
  checksum_mismatch, ///< transferred bytes failed verification: the update is void
  update_incomplete, ///< finish(v) before every parameter arrived: the engine stays dirty
  malformed,         ///< a peer sent a value that fails its check: refused, logged
  unauthenticated,   ///< a peer did not prove it holds the cluster secret
  evicted,           ///< the coordinator evicted this engine from the round
  not_routable,      ///< nothing can serve the request now
  round_aborted,     ///< the sync round was aborted (e.g. the trainer died)
  unknown_name,      ///< a name (engine, request, tensor) the receiver does not know
  version_gone,      ///< the trainer no longer holds that version: pull the latest instead
};

std::string to_string(errc x);

} // namespace rlsync
