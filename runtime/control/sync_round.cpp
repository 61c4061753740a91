#include "runtime/control/sync_round.hpp"

#include <algorithm>

namespace rlsync {

bool round_due(std::uint64_t newest_version, std::uint64_t synced_version,
               std::int64_t every_versions, bool newcomer_waiting) {
  if (newcomer_waiting)
    return true;
  // A cadence below 1 would sync on no change at all; treat it as "every version".
  auto every = static_cast<std::uint64_t>(std::max<std::int64_t>(every_versions, 1));
  return newest_version > synced_version && newest_version - synced_version >= every;
}

sync_round::sync_round(std::uint64_t id, std::uint64_t version, std::vector<std::string> engines,
                       std::size_t wave_size)
  : id_(id), version_(version), engines_(std::move(engines)) {
  // 0 (or more than there are engines): everybody in one wave.
  wave_size_ = wave_size == 0 || wave_size > engines_.size() ? std::max<std::size_t>(engines_.size(), 1) : wave_size;
  wave_live_.assign((engines_.size() + wave_size_ - 1) / wave_size_, 0);
  slots_.resize(engines_.size());
  places_.reserve(engines_.size());
  for (std::size_t i = 0; i < engines_.size(); ++i) {
    ++ops_;
    slots_[i].wave = i / wave_size_;
    places_.emplace(engines_[i], i);
    ++wave_live_[slots_[i].wave];
  }
  if (engines_.empty())
    phase_ = sync_phase::done;
  else
    pend_wave();
}

const sync_round::slot* sync_round::find(std::string_view name) const {
  ++ops_;
  auto i = places_.find(std::string{name});
  return i == places_.end() ? nullptr : &slots_[i->second];
}

sync_round::slot* sync_round::find(std::string_view name) {
  return const_cast<slot*>(static_cast<const sync_round*>(this)->find(name));
}

const sync_round::slot* sync_round::at(std::size_t i) const {
  ++ops_;
  return i < slots_.size() ? &slots_[i] : nullptr;
}

sync_round::slot* sync_round::at(std::size_t i) {
  return const_cast<slot*>(static_cast<const sync_round*>(this)->at(i));
}

std::vector<std::string> sync_round::live() const {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < engines_.size(); ++i) {
    ++ops_;
    if (!slots_[i].evicted)
      out.push_back(engines_[i]);
  }
  return out;
}

std::vector<std::size_t> sync_round::wave_indices() const {
  std::vector<std::size_t> out;
  if (done())
    return out;
  auto first = wave_ * wave_size_;
  auto last = std::min(first + wave_size_, engines_.size());
  for (auto i = first; i < last; ++i) {
    ++ops_;
    if (!slots_[i].evicted)
      out.push_back(i);
  }
  return out;
}

std::vector<std::string> sync_round::wave_engines() const {
  std::vector<std::string> out;
  for (auto i : wave_indices())
    out.push_back(engines_[i]);
  return out;
}

bool sync_round::waiting_on(std::string_view name) const {
  auto s = find(name);
  return s && s->pending;
}

bool sync_round::waiting_on_at(std::size_t i) const {
  auto s = at(i);
  return s && s->pending;
}

bool sync_round::in_round(std::string_view name) const {
  auto s = find(name);
  return s && !s->evicted;
}

bool sync_round::still_to_sync(std::string_view name) const {
  auto s = find(name);
  return s && !s->evicted && !done() && s->wave >= wave_;
}

bool sync_round::in_current_wave(std::string_view name) const {
  auto s = find(name);
  return s && !s->evicted && !done() && s->wave == wave_;
}

bool sync_round::wave_ending() const {
  return !done() && barrier_reached() && (phase_ == sync_phase::resume || wave_live_[wave_] == 0);
}

namespace {

/// Clears a pending slot of the current wave; false when the ack is stale.
template <class Slot>
bool clear_pending(Slot* s, std::size_t wave, std::size_t& pending) {
  if (!s || !s->pending || s->wave != wave)
    return false;
  s->pending = false;
  --pending;
  return true;
}

} // namespace

bool sync_round::ack(std::string_view name, sync_phase phase) {
  if (phase != phase_ || done())
    return false;
  return clear_pending(find(name), wave_, pending_);
}

bool sync_round::ack_at(std::size_t i, sync_phase phase) {
  if (phase != phase_ || done())
    return false;
  return clear_pending(at(i), wave_, pending_);
}

bool sync_round::evict(std::string_view name) {
  auto s = find(name);
  if (!s || s->evicted || done() || s->wave < wave_)
    return false;
  s->evicted = true;
  --wave_live_[s->wave];
  if (s->pending) {
    s->pending = false;
    --pending_;
  }
  evicted_.emplace_back(name);
  return true;
}

void sync_round::pend_wave() {
  pending_ = 0;
  auto first = wave_ * wave_size_;
  auto last = std::min(first + wave_size_, engines_.size());
  for (auto i = first; i < last; ++i) {
    ++ops_;
    auto& s = slots_[i];
    s.pending = !s.evicted;
    pending_ += s.pending ? 1 : 0;
  }
}

void sync_round::next_wave() {
  wave_aborted_ = false;
  if (!aborted_) // an abandoned update starts no later wave
    for (++wave_; wave_ < wave_live_.size(); ++wave_) {
      ++ops_;
      if (wave_live_[wave_] > 0) {
        phase_ = sync_phase::pause;
        pend_wave();
        return;
      }
    }
  phase_ = sync_phase::done;
  pending_ = 0;
}

sync_phase sync_round::advance() {
  if (!barrier_reached() || done())
    return phase_;
  if (wave_ending())
    next_wave();
  else {
    phase_ = next(phase_);
    pend_wave();
  }
  return phase_;
}

bool sync_round::abort() {
  if (done())
    return false;
  if (phase_ >= sync_phase::finish) {
    // This wave holds the whole version and completes; what is left to
    // abandon are the later waves, if any has a live engine.
    bool later = false;
    for (auto w = wave_ + 1; w < wave_live_.size() && !later; ++w) {
      ++ops_;
      later = wave_live_[w] > 0;
    }
    if (aborted_ || !later)
      return false;
    aborted_ = true;
    return true;
  }
  aborted_ = true;
  wave_aborted_ = true;
  if (wave_live_[wave_] == 0) { // nobody left to resume
    phase_ = sync_phase::done;
    pending_ = 0;
    return true;
  }
  phase_ = sync_phase::resume;
  pend_wave();
  return true;
}

} // namespace rlsync
