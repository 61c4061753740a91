#include "runtime/engine/rank_pause.hpp"

#include <algorithm>
#include <stdexcept>

namespace rlsync::engine {

rank_pause::rank_pause(int ranks) {
  if (ranks < 1)
    throw std::invalid_argument("rank_pause: an engine has at least one rank");
  reached_.assign(static_cast<std::size_t>(ranks), false);
}

void rank_pause::begin(pause_mode mode) {
  mode_ = mode;
  phase_ = phase::pausing;
  std::fill(reached_.begin(), reached_.end(), false);
}

bool rank_pause::reached(int rank) {
  if (rank < 0 || rank >= ranks())
    throw std::out_of_range("rank_pause: rank " + std::to_string(rank) + " of " + std::to_string(ranks()));
  if (phase_ != phase::pausing || reached_[static_cast<std::size_t>(rank)])
    return false;
  reached_[static_cast<std::size_t>(rank)] = true;
  if (outstanding() > 0)
    return false;
  phase_ = phase::paused;
  return true;
}

bool rank_pause::has_reached(int rank) const {
  return phase_ == phase::paused || (phase_ == phase::pausing && reached_.at(static_cast<std::size_t>(rank)));
}

int rank_pause::outstanding() const {
  if (phase_ != phase::pausing)
    return 0;
  return static_cast<int>(std::count(reached_.begin(), reached_.end(), false));
}

bool rank_pause::resume() {
  if (phase_ == phase::pausing)
    return false;
  phase_ = phase::running;
  return true;
}

} // namespace rlsync::engine
