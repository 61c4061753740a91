#include "actors/assembly/rank_drill_arms.hpp"

namespace rlsync {

void rank_drill_arms::attach(std::vector<hosted_rank> ranks,
                             const std::vector<std::unique_ptr<transfer::ucx_producer>>& producers) {
  std::lock_guard<std::mutex> lock(mutex_);
  ranks_ = std::move(ranks);
  producers_.clear();
  for (const auto& p : producers)
    producers_.push_back(p.get());
}

void rank_drill_arms::detach() {
  std::lock_guard<std::mutex> lock(mutex_);
  ranks_.clear();
  producers_.clear();
}

std::vector<std::string> rank_drill_arms::withhold(std::uint64_t version, std::chrono::milliseconds release_after) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> lines;
  const auto until = transfer::fault_hooks::clock::now() + release_after;
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    const auto& r = ranks_[i];
    const std::string who = "trainer rank " + std::to_string(r.rank);
    if (!r.trainer.source || r.trainer.source->held_groups().empty()) {
      lines.push_back(who + " holds no group to withhold");
      continue;
    }
    // Its first group: every holder pull of that version needs it from a
    // holder of its tensors, and with distinct layers this rank is the only one.
    const std::uint32_t group = r.trainer.source->held_groups().front();
    if (r.trainer.transfer)
      r.trainer.transfer->withhold(group, version, until);
    if (i < producers_.size() && producers_[i])
      producers_[i]->withhold(group, version, until);
    lines.push_back(who + " withholds group " + std::to_string(group) + " of "
                    + (version ? "v" + std::to_string(version) : std::string("any version"))
                    + " (released after " + std::to_string(release_after.count()) + " ms at the latest)");
  }
  return lines;
}

std::vector<std::string> rank_drill_arms::corrupt(const std::string& engine, std::uint64_t version) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> lines;
  for (std::size_t i = 0; i < ranks_.size() && i < producers_.size(); ++i) {
    if (!producers_[i])
      continue;
    transfer::corruption c; // any worker; group 0, once
    c.engine = engine;
    // From that version on: a signal handled after the round's group 0 went
    // out alters the next round's instead of none.
    c.version = version;
    c.or_later = true;
    producers_[i]->corrupt(c);
    lines.push_back("trainer rank " + std::to_string(ranks_[i].rank) + ": the next group 0 "
                    + (engine.empty() ? std::string("any engine") : engine) + " receives"
                    + (version ? " of v" + std::to_string(version) + " or later" : std::string()) + " will be corrupted");
  }
  return lines;
}

} // namespace rlsync
