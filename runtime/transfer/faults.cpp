#include "runtime/transfer/faults.hpp"

#include <algorithm>

namespace rlsync::transfer {

void fault_hooks::corrupt(corruption c) {
  if (c.times == 0)
    return;
  std::lock_guard<std::mutex> lock(mutex_);
  corruptions_.push_back(std::move(c));
}

void fault_hooks::withhold(std::uint32_t group, std::uint64_t version, clock::time_point until) {
  std::lock_guard<std::mutex> lock(mutex_);
  withheld_.push_back({group, version, until});
}

void fault_hooks::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  corruptions_.clear();
  withheld_.clear();
}

bool fault_hooks::take_corruption(const std::string& engine, int worker, std::uint64_t version,
                                  std::uint32_t group) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = corruptions_.begin(); it != corruptions_.end(); ++it)
    if ((it->engine.empty() || it->engine == engine) && (it->worker < 0 || it->worker == worker)
        && (it->version == 0 || it->version == version || (it->or_later && version > it->version))
        && it->group == group) {
      if (--it->times == 0)
        corruptions_.erase(it);
      auto& n = landed_[engine];
      n += n < UINT32_MAX;
      return true;
    }
  return false;
}

std::uint32_t fault_hooks::corruptions_landed(const std::string& engine) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = landed_.find(engine);
  return it == landed_.end() ? 0 : it->second;
}

bool fault_hooks::is_withheld_at(std::uint64_t version, std::uint32_t group, clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mutex_);
  withheld_.erase(std::remove_if(withheld_.begin(), withheld_.end(), [&](const auto& w) { return now >= w.until; }),
                  withheld_.end());
  return std::any_of(withheld_.begin(), withheld_.end(),
                     [&](const auto& w) { return w.group == group && (w.version == 0 || w.version == version); });
}

} // namespace rlsync::transfer
