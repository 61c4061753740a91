#include "gpu/nccl_membership.hpp"

#include <algorithm>
#include <stdexcept>

namespace rlsync::gpu {

nccl_membership::nccl_membership(link_factory make) : make_(std::move(make)) {
  if (!make_)
    throw std::invalid_argument("an nccl membership without a link factory");
}

nccl_membership::~nccl_membership() { leave(); }

std::string nccl_membership::join(const nccl_rendezvous& r, const std::vector<comm_member>& hosted) {
  // Stale, an empty id, members out of order: the whole rendezvous is refused.
  if (auto valid = join_rank(r, r.members.empty() ? comm_member{} : r.members.front(), epoch()); valid.rank < 0)
    return valid.error;
  std::vector<std::pair<comm_member, int>> mine;
  for (const auto& m : hosted)
    if (auto it = std::find(r.members.begin(), r.members.end(), m); it != r.members.end())
      mine.emplace_back(m, static_cast<int>(it - r.members.begin()));
  comm_layout layout;
  layout.epoch = r.epoch;
  layout.members = r.members;
  std::map<comm_member, std::shared_ptr<p2p_link>> next;
  try {
    for (const auto& [m, rank] : mine)
      next[m] = std::shared_ptr<p2p_link>(make_(r.id, layout, rank));
  } catch (const std::exception& e) {
    for (auto& [name, l] : next)
      l->abort();
    return "joining epoch " + std::to_string(r.epoch) + ": " + e.what();
  }
  std::map<comm_member, std::shared_ptr<p2p_link>> old;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (r.epoch <= epoch_) // another join won meanwhile
      return "stale rendezvous: epoch " + std::to_string(r.epoch) + ", already at " + std::to_string(epoch_);
    epoch_ = r.epoch;
    old.swap(links_);
    links_ = std::move(next);
  }
  for (auto& [name, l] : old)
    l->abort(); // a puller still holding one sees it fail, never hang
  return {};
}

void nccl_membership::leave() {
  std::map<comm_member, std::shared_ptr<p2p_link>> old;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    old.swap(links_);
  }
  for (auto& [name, l] : old)
    l->abort();
}

std::shared_ptr<p2p_link> nccl_membership::link(const comm_member& m) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = links_.find(m);
  return it == links_.end() ? nullptr : it->second;
}

std::uint64_t nccl_membership::epoch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return epoch_;
}

} // namespace rlsync::gpu
