#include "gpu/nccl_membership.hpp"

#include <algorithm>
#include <stdexcept>

namespace rlsync::gpu {

nccl_membership::nccl_membership(link_factory make, packer_factory packers)
  : make_(std::move(make)), packers_(std::move(packers)) {
  if (!make_)
    throw std::invalid_argument("an nccl membership without a link factory");
}

nccl_membership::~nccl_membership() { leave(); }

std::string nccl_membership::join(const nccl_rendezvous& r, const std::vector<comm_member>& hosted) {
  std::lock_guard<std::mutex> one_join_at_a_time(join_mutex_);
  const std::uint64_t held = epoch();
  // Several actors of one process (two trainer ranks, two engines) each join
  // the same rendezvous for their own members: the first replaces the older
  // epoch, the others add their links to it.
  const bool same_epoch = held > 0 && r.epoch == held;
  if (same_epoch) {
    if (left_)
      return "stale rendezvous: epoch " + std::to_string(r.epoch) + " was left";
    if (r.id != joined_.id || r.members != joined_.members || r.root_ids != joined_.root_ids)
      return "a second rendezvous for epoch " + std::to_string(r.epoch) + " that differs from the first";
  } else if (auto valid = join_rank(r, r.members.empty() ? comm_member{} : r.members.front(), held); valid.rank < 0) {
    return valid.error; // stale, an empty id, members out of order: refused whole
  }
  std::vector<std::pair<comm_member, int>> mine;
  std::string already;
  for (const auto& m : hosted) {
    auto it = std::find(r.members.begin(), r.members.end(), m);
    if (it == r.members.end())
      continue;
    if (same_epoch && find(m, main_communicator))
      already += (already.empty() ? "" : ", ") + m.describe();
    else
      mine.emplace_back(m, static_cast<int>(it - r.members.begin()));
  }
  if (!already.empty())
    return "stale rendezvous: epoch " + std::to_string(r.epoch) + " already joined by " + already;
  comm_layout layout;
  layout.epoch = r.epoch;
  layout.members = r.members;
  link_map next;
  try {
    for (const auto& [m, rank] : mine)
      next[{m, main_communicator}] = std::shared_ptr<p2p_link>(make_(r.id, layout, rank));
    // The producers' own communicators: the i-th root id is the i-th producer's.
    for (std::size_t i = 0; i < r.root_ids.size(); ++i) {
      const auto sub = root_layout(layout, r.members[i].rank);
      for (const auto& [m, rank] : mine)
        if (const int in_sub = sub.rank_of(m); in_sub >= 0)
          next[{m, r.members[i].rank}] = std::shared_ptr<p2p_link>(make_(r.root_ids[i], sub, in_sub));
    }
  } catch (const std::exception& e) {
    abort_all(next);
    return "joining epoch " + std::to_string(r.epoch) + ": " + e.what();
  }
  link_map old;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (same_epoch) {
      links_.insert(next.begin(), next.end());
    } else {
      epoch_ = r.epoch;
      joined_ = r;
      left_ = false;
      dead_.clear(); // the new epoch was built without whoever died
      old.swap(links_);
      links_ = std::move(next);
    }
  }
  abort_all(old); // a puller still holding one sees it fail, never hang
  return {};
}

void nccl_membership::abort_all(const link_map& links) {
  for (auto& [key, l] : links)
    l->abort();
}

void nccl_membership::leave() {
  std::lock_guard<std::mutex> no_join_meanwhile(join_mutex_);
  link_map old;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    left_ = true;
    old.swap(links_);
  }
  abort_all(old);
}

std::shared_ptr<p2p_link> nccl_membership::find(const comm_member& m, int communicator) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = links_.find({m, communicator});
  return it == links_.end() ? nullptr : it->second;
}

std::shared_ptr<p2p_link> nccl_membership::root_link(const comm_member& m, int producer) const {
  return producer < 0 ? nullptr : find(m, producer); // ranks are never negative: -1 is the main communicator
}

std::shared_ptr<p2p_link> nccl_membership::link(const comm_member& m) const { return find(m, main_communicator); }

bool nccl_membership::joined(const nccl_rendezvous& r, const comm_member& m) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !left_ && r.epoch == epoch_ && r.id == joined_.id && r.members == joined_.members
         && r.root_ids == joined_.root_ids && links_.count({m, main_communicator}) > 0;
}

bool nccl_membership::mark_dead(std::uint64_t epoch, const std::string& who) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (left_ || epoch == 0 || epoch != epoch_)
    return false;
  if (dead_.empty())
    dead_ = who.empty() ? std::string("a member") : who;
  return true;
}

std::optional<std::string> nccl_membership::dead_member() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (dead_.empty())
    return std::nullopt;
  return dead_ + " died (the coordinator saw it go) in epoch " + std::to_string(epoch_);
}

wait_hooks dead_member_hooks(const std::shared_ptr<nccl_membership>& m) {
  wait_hooks hooks;
  if (m)
    hooks.dead_member = [weak = std::weak_ptr<nccl_membership>(m)]() -> std::optional<std::string> {
      auto held = weak.lock();
      return held ? held->dead_member() : std::nullopt;
    };
  return hooks;
}

std::uint64_t nccl_membership::epoch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return epoch_;
}

} // namespace rlsync::gpu
