#pragma once
// One pause across an engine's data-parallel scheduler ranks, with vLLM's
// DP semantics (its engine core moved pause into the scheduler as a
// two-phase pause — each rank locally, then the engine as a whole — after a
// deadlock under DP + EP): a pause goes to every rank at once; the engine is
// paused only when every rank has reached its pause condition (abort and
// keep at once, wait once the rank's running requests have finished); a
// resume while any rank is still on its way is refused (pause_in_flight) and
// changes nothing; an accepted resume restarts every rank together, so no
// rank steps while another is still paused.
//
//            pause(mode)                     last rank reached
//   running ───────────► pausing{reached ⊂ ranks} ─────────────► paused
//      ▲                    │  ▲  reached(r)                        │
//      │                    │  └──────────┘                         │
//      │      resume: refused (pause_in_flight), state unchanged     │
//      └────────────────────────── resume: accepted ◄───────────────┘
//
// A pause while pausing or paused starts over (vLLM lets a caller pause an
// engine that is already paused, possibly in another mode). Pure: the
// engine core feeds it events and acts on its verdicts, so every order in
// which ranks finish can be tested as a table.
#include "runtime/control/protocol.hpp"

#include <cstdint>
#include <vector>

namespace rlsync::engine {

class rank_pause {
public:
  enum class phase : std::uint8_t { running, pausing, paused };

  /// An engine of `ranks` (>= 1) scheduler ranks, running.
  explicit rank_pause(int ranks);

  int ranks() const { return static_cast<int>(reached_.size()); }
  phase now() const { return phase_; }
  /// The mode of the pause in progress or held (meaningless while running).
  pause_mode mode() const { return mode_; }

  /// Every rank is told to pause; none has reached its condition yet.
  void begin(pause_mode mode);
  /// Rank `rank` reached its pause condition. True when this completed the
  /// pause (the engine may report it now). Ignored while running, and
  /// for a rank that already reached it.
  bool reached(int rank);
  bool has_reached(int rank) const;
  /// Ranks still on their way to the pause condition.
  int outstanding() const;

  /// A resume: accepted (true: every rank restarts now, phase running) unless
  /// a pause is in flight (false: refuse with pause_in_flight; nothing
  /// changes). Resuming a running engine is accepted and does nothing.
  bool resume();

private:
  phase phase_ = phase::running;
  pause_mode mode_ = pause_mode::abort;
  std::vector<bool> reached_;
};

} // namespace rlsync::engine
