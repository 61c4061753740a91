#include "runtime/plan/holders.hpp"

#include "runtime/plan/groups.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>

namespace rlsync::plan {

holder_index::holder_index(const std::vector<producer_holding>& producers) {
  std::map<std::uint32_t, std::size_t> by_rank;
  for (std::size_t i = 0; i < producers.size(); ++i) {
    const auto& p = producers[i];
    if (!by_rank.emplace(p.rank, i).second)
      throw std::invalid_argument("holder choice: trainer rank " + std::to_string(p.rank)
                                  + " is named twice among the producers");
    ranks_.push_back(p.rank);
    incarnations_.push_back(p.incarnation);
  }
  // Visiting producers by rank keeps every holder list sorted by rank.
  for (const auto& [rank, i] : by_rank) {
    (void)rank;
    for (const auto& name : producers[i].held) {
      auto& list = holders_[name];
      if (list.empty() || list.back() != i) // a name listed twice by one producer counts once
        list.push_back(i);
    }
  }
}

std::size_t holder_index::choose(const std::string& name, std::uint32_t group, int worker,
                                 const std::vector<bool>& excluded) const {
  if (!excluded.empty() && excluded.size() != ranks_.size())
    throw std::invalid_argument("holder choice: " + std::to_string(excluded.size()) + " exclusion flags for "
                                + std::to_string(ranks_.size()) + " producers");
  if (worker < 0)
    throw std::invalid_argument("holder choice: worker " + std::to_string(worker));
  std::vector<std::size_t> usable;
  if (auto it = holders_.find(name); it != holders_.end())
    for (auto i : it->second)
      if (excluded.empty() || !excluded[i])
        usable.push_back(i);
  if (usable.empty()) {
    std::string why = "holder choice: tensor '" + name + "' is held by no producer";
    if (!excluded.empty() && std::find(excluded.begin(), excluded.end(), true) != excluded.end())
      why += " left (excluded: " + describe(excluded) + ")";
    throw std::invalid_argument(why);
  }
  // 64-bit: an int worker plus a 32-bit group cannot overflow it.
  const std::uint64_t turn = static_cast<std::uint64_t>(worker) + group;
  return usable[static_cast<std::size_t>(turn % usable.size())];
}

std::size_t holder_index::holders_left(const std::string& name, const std::vector<bool>& excluded) const {
  auto it = holders_.find(name);
  if (it == holders_.end())
    return 0;
  std::size_t n = 0;
  for (auto i : it->second)
    n += (excluded.empty() || (i < excluded.size() && !excluded[i])) ? 1 : 0;
  return n;
}

std::string holder_index::describe(const std::vector<bool>& which) const {
  std::string out;
  for (std::size_t i = 0; i < which.size() && i < ranks_.size(); ++i)
    if (which[i])
      out += (out.empty() ? "" : ", ") + std::string("rank ") + std::to_string(ranks_[i]) + " (incarnation "
             + std::to_string(incarnations_[i]) + ")";
  return out.empty() ? "none" : out;
}

holder_choice choose_holders(const model_config& c, const worker_plan& p, const holder_index& holders,
                             const std::vector<std::size_t>& only, const std::vector<bool>& excluded) {
  holder_choice out;
  out.holder.assign(p.entries.size(), holders.producer_count());
  out.entries.resize(holders.producer_count());
  std::size_t previous = 0;
  for (std::size_t k = 0; k < only.size(); ++k) {
    const std::size_t i = only[k];
    if (i >= p.entries.size() || (k > 0 && i <= previous))
      throw std::invalid_argument("holder choice: entry " + std::to_string(i) + " out of order or beyond the plan's "
                                  + std::to_string(p.entries.size()));
    previous = i;
    const auto& e = p.entries[i];
    const std::size_t h = holders.choose(e.source, group_of(c, e.source), p.worker, excluded);
    out.holder[i] = h;
    out.entries[h].push_back(i);
  }
  return out;
}

holder_choice choose_holders(const model_config& c, const worker_plan& p, const holder_index& holders,
                             const std::vector<bool>& excluded) {
  std::vector<std::size_t> all(p.entries.size());
  for (std::size_t i = 0; i < all.size(); ++i)
    all[i] = i;
  return choose_holders(c, p, holders, all, excluded);
}

std::shared_ptr<const worker_plan> sub_plan(const worker_plan& p, const std::vector<std::size_t>& indices) {
  auto out = std::make_shared<worker_plan>();
  out->tp = p.tp;
  out->worker = p.worker;
  out->entries.reserve(indices.size());
  for (auto i : indices)
    out->entries.push_back(p.entries.at(i));
  return out;
}

} // namespace rlsync::plan
