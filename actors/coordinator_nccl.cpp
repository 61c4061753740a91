// transfer.backend nccl: the coordinator keeps one NCCL communicator of the
// live trainer ranks and the engine workers that pull from them, and
// rebuilds it only at a round boundary (gpu/nccl_group.hpp draws the rule).
//
//   round wanted ─► decide(layout, healthy, wanted) ─ keep ─► open the round
//                        │ rebuild
//                        ▼
//   ask the first producer rank for a unique id ─► (the collective, several
//   ranks: each rank for its own communicator's) ─► every member's actor joins
//   (its ranks or its workers) ─► all joined: the new layout, settle
//                               └─► an engine refused: left out, rebuild now
//                               └─► a rank refused or was silent: retry later,
//                                   each wait twice the last (up to 30 s)
//
// Every ask has the start phase's deadline: a member that never answers
// fails the rendezvous, never hangs it. Inside a round nothing is rebuilt:
// pulls on a broken communicator fail by their own deadlines (the sender
// and puller poll and abort), the engines are evicted, and the boundary
// after rebuilds. One thing is sent mid-round: when a member dies, the
// others hear it at once (tell_members_lost), so their waits abort now
// rather than at their deadlines.
#include "actors/coordinator_internal.hpp"

#include <algorithm>
#include <functional>
#include <memory>

namespace rlsync::coordinator_detail {

namespace {

struct producer_ref {
  std::uint32_t rank = 0;
  trainer_actor handle;
};

std::vector<producer_ref> live_producers(const coordinator_state& st) {
  std::vector<producer_ref> out;
  if (follows_ranks(st)) {
    for (const auto& [r, k] : st.ranks)
      if (!k.down && !k.unreachable && k.handle)
        out.push_back({r, k.handle});
  } else if (st.cfg.trainer && !st.trainer_down) {
    out.push_back({0, st.cfg.trainer});
  }
  return out;
}

bool shares_process(const coordinator_state& st, const caf::actor_addr& engine, const caf::actor_addr& producer) {
  if (st.cfg.shares_process)
    return st.cfg.shares_process(engine, producer);
  return engine.node() == producer.node();
}

/// An engine's workers are members when some producer runs in another
/// process: a producer in its own process hands it weights over the local plane.
bool pulls_over_nccl(const coordinator_state& st, const coordinator_member& m,
                     const std::vector<producer_ref>& producers) {
  return std::any_of(producers.begin(), producers.end(), [&](const producer_ref& p) {
    return !shares_process(st, m.handle.address(), p.handle.address());
  });
}

std::vector<gpu::comm_member> wanted_members(const coordinator_state& st, const std::vector<producer_ref>& producers) {
  std::vector<gpu::comm_member> out;
  for (const auto& p : producers)
    out.push_back(gpu::comm_member::trainer_rank(static_cast<int>(p.rank)));
  for (const auto& [name, m] : st.members) {
    if (m.unreachable || st.nccl.left_out.count(name) || !pulls_over_nccl(st, m, producers))
      continue;
    for (std::uint32_t w = 0; w < m.info.tp; ++w)
      out.push_back(gpu::comm_member::worker(name, static_cast<int>(w)));
  }
  return out;
}

/// The answers of one rendezvous as they arrive.
struct join_tally {
  std::uint64_t epoch = 0;
  std::size_t left = 0;
  std::vector<std::string> engines_failed; ///< "name: why"
  std::vector<std::string> names_failed;
  std::string rank_failure; ///< the first rank that failed, and why
};

bool current(const coordinator_state& st, std::uint64_t epoch) {
  return st.nccl.joining && st.nccl.epoch_sent == epoch;
}

/// The longest wait between rendezvous that a trainer rank failed.
constexpr std::chrono::milliseconds max_retry_delay{30000};

void retry_later(self_ptr self, const std::string& why) {
  auto& st = self->state;
  auto& n = st.nccl;
  n.joining = false;
  n.healthy = false;
  ++n.failures_in_a_row;
  n.retry_delay = n.retry_delay.count() == 0 ? st.cfg.nccl_retry : std::min(n.retry_delay * 2, max_retry_delay);
  n.retry_at_ns = now_ns(self) + static_cast<std::uint64_t>(n.retry_delay.count()) * 1000000u;
  log_line(self, "coordinator: nccl: " + why + "; no round until a rendezvous succeeds (" + std::to_string(n.failures_in_a_row)
                   + " failed in a row), the next in " + std::to_string(n.retry_delay.count()) + " ms");
  self->delayed_send(self, n.retry_delay, settle_atom::value);
}

void joins_answered(self_ptr self, const gpu::comm_layout& next, const join_tally& t) {
  auto& st = self->state;
  auto& n = st.nccl;
  if (!t.rank_failure.empty()) {
    retry_later(self, "communicator epoch " + std::to_string(t.epoch) + " failed: " + t.rank_failure);
  } else if (!t.engines_failed.empty()) {
    // Out until the round after ends, then asked again (DESIGN: a replica
    // rejoins at a sync boundary); its pulls fail meanwhile and it is evicted.
    n.joining = false;
    n.healthy = false;
    n.left_out.insert(t.names_failed.begin(), t.names_failed.end());
    std::string list;
    for (const auto& f : t.engines_failed)
      list += (list.empty() ? "" : "; ") + f;
    log_line(self, "coordinator: nccl: communicator epoch " + std::to_string(t.epoch)
                     + " is rebuilt without engines that did not join: " + list);
  } else if (n.suspect_while_joining) {
    // Someone restarted or failed mid-rendezvous: the new incarnation holds
    // no link, so what was joined cannot serve. Build it again now.
    n.joining = false;
    n.healthy = false;
    log_line(self, "coordinator: nccl: communicator epoch " + std::to_string(t.epoch)
                     + " was joined, but a member restarted or failed meanwhile: built again");
  } else {
    n.joining = false;
    n.healthy = true;
    n.layout = next;
    n.retry_delay = std::chrono::milliseconds{0};
    n.failures_in_a_row = 0;
    ++n.rebuilds;
    log_line(self, "coordinator: nccl: communicator epoch " + std::to_string(t.epoch) + " joined by "
                     + std::to_string(next.members.size()) + " members");
  }
  settle(self);
}

using failure_note = void (*)(join_tally&, const std::string& who, const std::string& why);

void rank_failed(join_tally& t, const std::string& who, const std::string& why) {
  if (t.rank_failure.empty())
    t.rank_failure = who + " did not join: " + why;
}

void engine_failed(join_tally& t, const std::string& name, const std::string& why) {
  t.engines_failed.push_back(name + ": " + why);
  t.names_failed.push_back(name);
}

/// One rendezvous's shared parts: every ask refers to them, none copies them
/// (a communicator of thousands of members, asked of thousands of engines).
struct rendezvous_ask {
  std::shared_ptr<const gpu::comm_layout> next;
  std::shared_ptr<const nccl_rendezvous_msg> msg;
  std::shared_ptr<join_tally> tally;
};

/// One member's answer (or failure) counted; the last one ends the rendezvous.
void count_answer(self_ptr self, const rendezvous_ask& ask, failure_note failed, const std::string& who,
                  const std::string& why) {
  if (!current(self->state, ask.tally->epoch))
    return; // a newer rendezvous replaced this one
  if (!why.empty())
    failed(*ask.tally, who, why);
  if (--ask.tally->left == 0)
    joins_answered(self, *ask.next, *ask.tally);
}

template <class Handle>
void ask_to_join(self_ptr self, const Handle& handle, const rendezvous_ask& ask, failure_note failed,
                 const std::string& who) {
  self->request(handle, self->state.cfg.sync.deadlines.start, nccl_join_atom::value, *ask.msg)
    .then(
      [=](std::uint64_t epoch) {
        const auto sent = ask.msg->epoch;
        count_answer(self, ask, failed, who,
                     epoch == sent ? std::string{}
                                   : "answered epoch " + std::to_string(epoch) + " for " + std::to_string(sent));
      },
      [=](caf::error& err) { count_answer(self, ask, failed, who, self->system().render(err)); });
}

void send_joins(self_ptr self, const std::shared_ptr<const gpu::comm_layout>& next, const std::vector<std::uint8_t>& id,
                const std::vector<std::vector<std::uint8_t>>& root_ids, const std::vector<producer_ref>& producers) {
  auto& st = self->state;
  gpu::nccl_rendezvous r;
  r.epoch = next->epoch;
  r.members = next->members;
  // Copies `from` into `to`; false (after retry_later) when it is not NCCL's size.
  auto copy_id = [&](const std::vector<std::uint8_t>& from, gpu::nccl_id& to, const std::string& whose) {
    if (from.size() != to.size()) {
      retry_later(self, whose + " has " + std::to_string(from.size()) + " bytes, not NCCL's " + std::to_string(to.size()));
      return false;
    }
    std::copy(from.begin(), from.end(), to.begin());
    return true;
  };
  if (!copy_id(id, r.id, "the unique id"))
    return;
  r.root_ids.resize(root_ids.size());
  for (std::size_t i = 0; i < root_ids.size(); ++i)
    if (!copy_id(root_ids[i], r.root_ids[i], "trainer rank " + std::to_string(next->members[i].rank) + "'s unique id"))
      return;
  rendezvous_ask ask{next, std::make_shared<const nccl_rendezvous_msg>(gpu::to_wire(r)), std::make_shared<join_tally>()};
  ask.tally->epoch = next->epoch;
  std::vector<std::string> engines;
  for (const auto& m : next->members)
    if (!m.producer && (engines.empty() || engines.back() != m.engine))
      engines.push_back(m.engine); // canonical order: an engine's workers are adjacent
  std::vector<producer_ref> ranks;
  for (const auto& p : producers)
    if (next->rank_of(gpu::comm_member::trainer_rank(static_cast<int>(p.rank))) >= 0)
      ranks.push_back(p);
  ask.tally->left = ranks.size() + engines.size();
  for (const auto& p : ranks)
    ask_to_join(self, p.handle, ask, rank_failed, "trainer rank " + std::to_string(p.rank));
  for (const auto& name : engines) {
    // It may have left while the id was made: it fails the rendezvous, counted like any other.
    auto m = st.members.find(name);
    if (m == st.members.end())
      count_answer(self, ask, engine_failed, name, "it left before the rendezvous");
    else
      ask_to_join(self, m->second.handle, ask, engine_failed, name);
  }
}

void start_rendezvous(self_ptr self, gpu::comm_layout planned, const std::vector<producer_ref>& producers,
                      const std::string& why) {
  auto& n = self->state.nccl;
  n.joining = true;
  n.suspect_while_joining = false;
  planned.epoch = std::max({planned.epoch, n.epoch_sent + 1, self->state.cfg.nccl_epoch_base + 1});
  n.epoch_sent = planned.epoch;
  auto next = std::make_shared<const gpu::comm_layout>(std::move(planned));
  // The root (the first member, a producer) makes the id: NCCL's bootstrap
  // listens in the process that made it.
  const auto found = std::find_if(producers.begin(), producers.end(), [&](const producer_ref& p) {
    return static_cast<int>(p.rank) == next->members.front().rank;
  });
  if (found == producers.end()) // decide() takes members from `producers`: never
    return retry_later(self, "no live trainer rank " + std::to_string(next->members.front().rank) + " to make an id");
  const producer_ref root = *found;
  log_line(self, "coordinator: nccl: building communicator epoch " + std::to_string(next->epoch) + " of "
                   + std::to_string(next->members.size()) + " members (" + why + ")");
  const auto epoch = next->epoch;
  // The collective with several ranks: each rank broadcasts in a
  // communicator of its own, whose id it makes (its process is that
  // communicator's bootstrap root). The ids come back in member order.
  std::vector<producer_ref> roots;
  if (self->state.cfg.transfer.collective)
    for (const auto& m : next->members)
      if (m.producer)
        for (const auto& p : producers)
          if (static_cast<int>(p.rank) == m.rank)
            roots.push_back(p);
  if (roots.size() < 2)
    roots.clear(); // one rank: the main communicator has one root already
  struct ids {
    std::vector<std::uint8_t> main;
    std::vector<std::vector<std::uint8_t>> roots;
    std::size_t left = 0;
    bool failed = false;
  };
  auto got = std::make_shared<ids>();
  got->roots.resize(roots.size());
  got->left = 1 + roots.size();
  auto answered = [=] {
    if (--got->left == 0 && !got->failed && current(self->state, epoch))
      send_joins(self, next, got->main, got->roots, producers);
  };
  auto ask = [=](const producer_ref& p, std::vector<std::uint8_t>* into) {
    self->request(p.handle, self->state.cfg.sync.deadlines.start, nccl_id_atom::value)
      .then(
        [=](std::vector<std::uint8_t>& id) {
          *into = std::move(id);
          answered();
        },
        [=](caf::error& err) {
          if (got->failed || !current(self->state, epoch))
            return;
          got->failed = true;
          retry_later(self, "trainer rank " + std::to_string(p.rank) + " made no unique id for epoch "
                              + std::to_string(epoch) + ": " + self->system().render(err));
        });
  };
  ask(root, &got->main);
  for (std::size_t i = 0; i < roots.size(); ++i)
    ask(roots[i], &got->roots[i]);
}

} // namespace

bool nccl_ready(self_ptr self) {
  auto& st = self->state;
  auto& n = st.nccl;
  if (st.cfg.transfer.backend != transfer_backend::nccl)
    return true;
  if (n.joining || now_ns(self) < n.retry_at_ns)
    return false; // its answers, or the retry timer, settle again
  const auto producers = live_producers(st);
  auto d = gpu::decide(n.layout, n.healthy, wanted_members(st, producers), true);
  switch (d.action) {
    case gpu::comm_action::keep:
      return true;
    case gpu::comm_action::close:
      // Its members' links idle until the next rendezvous replaces them.
      log_line(self, "coordinator: nccl: communicator epoch " + std::to_string(n.layout.epoch) + " closed: " + d.why);
      n.layout = d.next;
      n.healthy = false;
      return true;
    case gpu::comm_action::abort_now: // never at a boundary
    case gpu::comm_action::rebuild:
      break;
  }
  start_rendezvous(self, std::move(d.next), producers, d.why);
  return false;
}

void nccl_suspect(self_ptr self, const std::string& member) {
  auto& n = self->state.nccl;
  if (self->state.cfg.transfer.backend != transfer_backend::nccl)
    return;
  if (n.joining)
    n.suspect_while_joining = true;
  if (!n.healthy)
    return;
  n.healthy = false;
  log_line(self, "coordinator: nccl: " + member + ": communicator epoch " + std::to_string(n.layout.epoch)
                   + " is rebuilt at the next boundary");
}

namespace {

/// Tells every member of the joined communicator but `lost` that `who` died.
void tell_members_lost(self_ptr self, const std::function<bool(const gpu::comm_member&)>& lost, const std::string& who,
                       const std::string& why) {
  auto& st = self->state;
  const auto& layout = st.nccl.layout;
  if (st.cfg.transfer.backend != transfer_backend::nccl || layout.epoch == 0
      || std::none_of(layout.members.begin(), layout.members.end(), lost))
    return;
  if (st.nccl.dead_told_epoch == layout.epoch) { // every member's process holds a death of this epoch already
    log_line(self, "coordinator: nccl: " + who + " " + why + " in communicator epoch " + std::to_string(layout.epoch)
                     + ", whose members were told of a death already");
    nccl_suspect(self, who + " " + why);
    return;
  }
  st.nccl.dead_told_epoch = layout.epoch;
  std::size_t told = 0;
  for (const auto& p : live_producers(st))
    if (const auto m = gpu::comm_member::trainer_rank(static_cast<int>(p.rank)); layout.rank_of(m) >= 0 && !lost(m)) {
      self->send(p.handle, nccl_dead_atom::value, layout.epoch, who);
      ++told;
    }
  std::string last;
  for (const auto& m : layout.members) {
    if (m.producer || m.engine == last || lost(m))
      continue;
    last = m.engine; // canonical order: an engine's workers are adjacent
    if (auto e = st.members.find(m.engine); e != st.members.end()) {
      self->send(e->second.handle, nccl_dead_atom::value, layout.epoch, who);
      ++told;
    }
  }
  log_line(self, "coordinator: nccl: " + who + " " + why + ": told " + std::to_string(told)
                   + " member actor(s) of communicator epoch " + std::to_string(layout.epoch) + " to abort their waits");
  nccl_suspect(self, who + " " + why);
}

} // namespace

void nccl_engine_lost(self_ptr self, const std::string& name, const std::string& why) {
  tell_members_lost(self, [&](const gpu::comm_member& m) { return !m.producer && m.engine == name; },
                    "engine " + name, why);
}

void nccl_rank_lost(self_ptr self, std::uint32_t rank, const std::string& why) {
  const auto dead = gpu::comm_member::trainer_rank(static_cast<int>(rank));
  tell_members_lost(self, [&](const gpu::comm_member& m) { return m == dead; }, dead.describe(), why);
}

void nccl_round_ended(self_ptr self) {
  self->state.nccl.left_out.clear();
}

} // namespace rlsync::coordinator_detail
