#include "gpu/nccl_group.hpp"

#include <algorithm>
#include <iterator>
#include <set>
#include <stdexcept>
#include <tuple>

namespace rlsync::gpu {

std::string comm_member::describe() const {
  return producer ? "trainer rank " + std::to_string(rank)
                  : "engine " + engine + " worker " + std::to_string(rank);
}

bool comm_member::operator==(const comm_member& o) const {
  return std::tie(producer, engine, rank) == std::tie(o.producer, o.engine, o.rank);
}

bool comm_member::operator<(const comm_member& o) const {
  // Producers first: !producer is false for them.
  return std::make_tuple(!producer, engine, rank) < std::make_tuple(!o.producer, o.engine, o.rank);
}

int comm_layout::rank_of(const comm_member& m) const {
  auto it = std::find(members.begin(), members.end(), m);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

namespace {

/// Why `members` (in the order given) cannot be a communicator, or "".
std::string layout_problem(const std::vector<comm_member>& members) {
  if (members.size() > max_comm_members)
    return std::to_string(members.size()) + " members; a communicator takes at most "
           + std::to_string(max_comm_members);
  bool any_producer = false, any_worker = false;
  for (std::size_t i = 0; i < members.size(); ++i) {
    const auto& m = members[i];
    if (m.rank < 0)
      return m.describe() + " has a negative rank";
    if (!m.producer && m.engine.empty())
      return "a worker without an engine name";
    if (m.producer && !m.engine.empty())
      return "trainer rank " + std::to_string(m.rank) + " names an engine";
    if (i > 0 && !(members[i - 1] < m))
      return members[i - 1] == m ? m.describe() + " is named twice"
                                 : m.describe() + " is out of order (producers first, then workers by engine)";
    any_producer |= m.producer;
    any_worker |= !m.producer;
  }
  if (!any_producer)
    return "no trainer rank to send";
  if (!any_worker)
    return "no engine worker to receive";
  return {};
}

std::string names(const std::vector<comm_member>& ms) {
  std::string out;
  for (std::size_t i = 0; i < ms.size() && i < 4; ++i)
    out += (i ? ", " : "") + ms[i].describe();
  if (ms.size() > 4)
    out += " and " + std::to_string(ms.size() - 4) + " more";
  return out;
}

} // namespace

comm_layout make_layout(std::uint64_t epoch, std::vector<comm_member> members) {
  std::sort(members.begin(), members.end());
  if (auto problem = layout_problem(members); !problem.empty())
    throw std::invalid_argument("NCCL communicator: " + problem);
  return {epoch, std::move(members)};
}

const char* to_string(comm_action a) {
  switch (a) {
  case comm_action::keep: return "keep";
  case comm_action::abort_now: return "abort";
  case comm_action::rebuild: return "rebuild";
  case comm_action::close: return "close";
  }
  return "?";
}

comm_decision decide(const comm_layout& current, bool healthy, const std::vector<comm_member>& wanted,
                     bool at_boundary) {
  const bool exists = !current.members.empty();
  if (!at_boundary) {
    // In the communicator, no longer wanted; both sorted: O(M log M), not a
    // find per member (a boundary of 65536 members must not stall the coordinator).
    std::vector<comm_member> sorted_wanted = wanted, sorted_current = current.members, gone;
    std::sort(sorted_wanted.begin(), sorted_wanted.end());
    std::sort(sorted_current.begin(), sorted_current.end());
    std::set_difference(sorted_current.begin(), sorted_current.end(), sorted_wanted.begin(), sorted_wanted.end(),
                        std::back_inserter(gone));
    if (exists && !healthy)
      return {comm_action::abort_now, {}, "the communicator failed"};
    if (!gone.empty())
      return {comm_action::abort_now, {}, names(gone) + (gone.size() == 1 ? " is" : " are") + " gone"};
    return {};
  }
  std::vector<comm_member> next = wanted;
  std::sort(next.begin(), next.end());
  next.erase(std::unique(next.begin(), next.end()), next.end());
  if (!layout_problem(next).empty()) // nobody to talk to: the epoch stays, so later rendezvous are newer
    return {exists ? comm_action::close : comm_action::keep, comm_layout{current.epoch, {}},
            exists ? layout_problem(next) : ""};
  if (exists && healthy && next == current.members)
    return {};
  std::string why = !exists    ? "no communicator yet"
                    : !healthy ? "the communicator failed"
                               : "members changed";
  return {comm_action::rebuild, comm_layout{current.epoch + 1, std::move(next)}, why};
}

comm_layout root_layout(const comm_layout& main, int rank) {
  const auto root = comm_member::trainer_rank(rank);
  if (main.rank_of(root) < 0)
    throw std::invalid_argument("NCCL communicator epoch " + std::to_string(main.epoch) + " has no " + root.describe());
  comm_layout out{main.epoch, {root}};
  for (const auto& m : main.members)
    if (!m.producer)
      out.members.push_back(m);
  return out;
}

join_result join_rank(const nccl_rendezvous& r, const comm_member& me, std::uint64_t held_epoch) {
  if (r.epoch <= held_epoch)
    return {-1, "stale rendezvous: epoch " + std::to_string(r.epoch) + ", already at "
                  + std::to_string(held_epoch)};
  auto empty = [](const nccl_id& id) { return std::all_of(id.begin(), id.end(), [](std::uint8_t b) { return b == 0; }); };
  if (empty(r.id))
    return {-1, "the rendezvous carries an empty NCCL id"};
  if (auto problem = layout_problem(r.members); !problem.empty())
    return {-1, "bad rendezvous: " + problem};
  if (!r.root_ids.empty()) {
    const auto producers = static_cast<std::size_t>(
      std::count_if(r.members.begin(), r.members.end(), [](const comm_member& m) { return m.producer; }));
    if (r.root_ids.size() != producers)
      return {-1, "bad rendezvous: " + std::to_string(r.root_ids.size()) + " root ids for "
                    + std::to_string(producers) + " trainer ranks"};
    std::set<nccl_id> seen{r.id};
    for (std::size_t i = 0; i < r.root_ids.size(); ++i) {
      if (empty(r.root_ids[i]))
        return {-1, "bad rendezvous: root id " + std::to_string(i) + " is empty"};
      if (!seen.insert(r.root_ids[i]).second)
        return {-1, "bad rendezvous: root id " + std::to_string(i) + " repeats another id"};
    }
  }
  auto it = std::find(r.members.begin(), r.members.end(), me);
  if (it == r.members.end())
    return {-1, me.describe() + " is not a member of communicator epoch " + std::to_string(r.epoch)};
  return {static_cast<int>(it - r.members.begin()), {}};
}

nccl_rendezvous_msg to_wire(const nccl_rendezvous& r) {
  nccl_rendezvous_msg m;
  m.epoch = r.epoch;
  m.id.assign(r.id.begin(), r.id.end());
  for (const auto& member : r.members)
    m.members.push_back({member.producer, member.engine, member.rank});
  for (const auto& id : r.root_ids)
    m.root_ids.emplace_back(id.begin(), id.end());
  return m;
}

nccl_rendezvous from_wire(const nccl_rendezvous_msg& m) {
  if (m.id.size() != nccl_id_bytes)
    throw std::invalid_argument("NCCL rendezvous: an id of " + std::to_string(m.id.size()) + " bytes, not "
                                + std::to_string(nccl_id_bytes));
  if (m.members.size() > max_comm_members)
    throw std::invalid_argument("NCCL rendezvous: " + std::to_string(m.members.size()) + " members, more than "
                                + std::to_string(max_comm_members));
  nccl_rendezvous r;
  r.epoch = m.epoch;
  std::copy(m.id.begin(), m.id.end(), r.id.begin());
  for (std::size_t i = 0; i < m.members.size(); ++i) {
    const auto& w = m.members[i];
    if (w.rank < 0 || w.producer != w.engine.empty() || w.engine.size() > 4096)
      throw std::invalid_argument("NCCL rendezvous: member " + std::to_string(i) + " is neither a trainer rank "
                                  "nor an engine's worker (rank " + std::to_string(w.rank) + ", engine name of "
                                  + std::to_string(w.engine.size()) + " bytes)");
    r.members.push_back(w.producer ? comm_member::trainer_rank(w.rank) : comm_member::worker(w.engine, w.rank));
  }
  if (m.root_ids.size() > m.members.size())
    throw std::invalid_argument("NCCL rendezvous: " + std::to_string(m.root_ids.size()) + " root ids for "
                                + std::to_string(m.members.size()) + " members");
  for (std::size_t i = 0; i < m.root_ids.size(); ++i) {
    if (m.root_ids[i].size() != nccl_id_bytes)
      throw std::invalid_argument("NCCL rendezvous: root id " + std::to_string(i) + " of "
                                  + std::to_string(m.root_ids[i].size()) + " bytes, not "
                                  + std::to_string(nccl_id_bytes));
    r.root_ids.emplace_back();
    std::copy(m.root_ids[i].begin(), m.root_ids[i].end(), r.root_ids.back().begin());
  }
  return r;
}

} // namespace rlsync::gpu
