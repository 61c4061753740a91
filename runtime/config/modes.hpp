#pragma once
// The modes a topology names and the control plane carries: how a round
// pauses engines, how a transfer moves bytes, and the phases of a round.
// They live with the configuration so that config/ needs nothing of
// control/; control/ speaks them on the wire.
#include <cstdint>
#include <string>
#include <string_view>

namespace rlsync {

/// How `pause` treats running requests, as in vLLM.
enum class pause_mode : std::uint8_t {
  abort, ///< paused_new; running requests aborted, partial output returned
  wait,  ///< paused_new; running requests run to completion
  keep,  ///< paused_all; running requests frozen in place
};

std::string to_string(pause_mode x);

/// Arguments of one `pause` call.
struct pause_request {
  pause_mode mode = pause_mode::keep;
  bool clear_cache = false; ///< drop the prefix cache and the KV of frozen requests
};

/// sharded: each engine worker receives exactly the bytes it keeps;
/// broadcast (the baseline): every worker receives the full tensors.
enum class transfer_mode : std::uint8_t { sharded, broadcast };

std::string to_string(transfer_mode x);

/// The phases of a round, in order. `resume` is the design's "continue".
enum class sync_phase : std::uint8_t { pause, flush, start, transfer, finish, resume, done };

std::string_view to_string(sync_phase x);

/// The phase after `x` (`done` stays `done`).
sync_phase next(sync_phase x);

} // namespace rlsync
