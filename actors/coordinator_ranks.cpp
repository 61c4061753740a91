// The coordinator's trainer ranks (the sync round is in coordinator.cpp):
// rank registration and restarts, following each rank's versions through the
// version barrier, catch-up orders for ranks left behind, rank heartbeats,
// and freezing the ranks at the end of a job.

#include "actors/coordinator.hpp"
#include "actors/coordinator_internal.hpp"

#include "runtime/base/printable.hpp"

#include <caf/actor_system.hpp>

#include <algorithm>
#include <memory>
#include <set>
#include <utility>
#include <vector>

namespace rlsync::coordinator_detail {

// -- trainer ranks ----------------------------------------------------------------------

/// Following ranks rather than a single trainer: the topology has several,
/// or one registered.
bool follows_ranks(const coordinator_state& st) {
  return st.cfg.trainer_ranks > 1 || !st.ranks.empty() || st.cfg.await_ranks;
}

/// What a (re)starting rank catches up to: the newest version the cluster
/// published (a restored counter included), so that none goes backwards.
std::uint64_t cluster_newest(const coordinator_state& st) {
  return std::max({st.newest.version, st.synced_version, st.barrier.newest_published()});
}

/// Every rank of the topology registered, alive and answering.
bool ranks_live(const coordinator_state& st) {
  if (st.ranks.size() != st.cfg.trainer_ranks)
    return false;
  return std::all_of(st.ranks.begin(), st.ranks.end(),
                     [](const auto& kv) { return !kv.second.down && !kv.second.unreachable; });
}

/// The rank whose handle sent the current message, if any.
std::optional<std::uint32_t> sending_rank(self_ptr self) {
  auto sender = self->current_sender();
  if (!sender)
    return std::nullopt;
  for (auto& [r, rank] : self->state.ranks)
    if (!rank.down && rank.handle.address() == sender->address())
      return r;
  return std::nullopt;
}

/// Asks the barrier what is syncable: logs each new error once, raises the
/// round's version (on_version: never backwards), and notes whether every
/// rank still holds it.
void review_barrier(self_ptr self) {
  auto& st = self->state;
  auto verdict = st.barrier.evaluate();
  std::set<std::string> keys;
  for (auto& e : verdict.errors) {
    keys.insert(e.key);
    if (st.barrier_errors.count(e.key) == 0)
      log_line(self, "coordinator: trainer ranks: " + e.text + "; no round on it");
  }
  st.barrier_errors = std::move(keys);
  // A rank left behind (it joined late or restarted) is told to catch up
  // once per target: stepping at the others' pace it would never meet them.
  for (auto r : verdict.behind) {
    auto i = st.ranks.find(r);
    if (i == st.ranks.end() || i->second.down || i->second.catch_up_sent >= verdict.catch_up_to)
      continue;
    i->second.catch_up_sent = verdict.catch_up_to;
    log_line(self, "coordinator: trainer rank " + std::to_string(r) + " is behind: catching it up to v"
                     + std::to_string(verdict.catch_up_to));
    self->send(i->second.handle, catch_up_atom::value, verdict.catch_up_to);
  }
  if (verdict.syncable)
    on_version(self, *verdict.syncable);
  st.ranks_hold_newest = st.newest_heard && st.barrier.holds(st.newest.version);
}

/// A rank published a version (its subscription, or the answer to our query).
void on_rank_version(self_ptr self, std::uint32_t rank, const version_info& vi) {
  if (auto why = check(vi); !why.empty()) {
    log_line(self, "coordinator: refused a version of trainer rank " + std::to_string(rank) + ": " + why);
    return;
  }
  if (auto why = self->state.barrier.publish(rank, vi); !why.empty()) {
    log_line(self, "coordinator: refused a version: " + why);
    return;
  }
  if (auto i = self->state.ranks.find(rank); i != self->state.ranks.end())
    i->second.latest_published = std::max(i->second.latest_published, vi.version);
  review_barrier(self);
}

/// A rank registers: refused with an error, or followed from now on (a
/// higher incarnation replaces the old one: a restart).
caf::expected<registration> on_register_rank(self_ptr self, const rank_info& info, const trainer_actor& handle) {
  auto& st = self->state;
  auto who = "trainer rank " + std::to_string(info.rank);
  if (!handle)
    return make_error(errc::malformed, who + ": registration without an actor");
  if (auto why = check(info); !why.empty())
    return make_error(errc::malformed, who + ": registration: " + why);
  // A rank registers from its own node only: an impostor would feed the fleet its weights.
  if (auto why = origin_problem(self, who, handle.address()); !why.empty())
    return st.guard->refuse(self->current_sender(), "register", "the registration of " + who + ": " + why);
  if (st.cfg.trainer_ranks == 0)
    return make_error(errc::malformed, who + ": this coordinator follows no trainer ranks");
  auto known = st.ranks.find(info.rank);
  if (known != st.ranks.end()) {
    auto& k = known->second;
    bool same = k.handle.address() == handle.address() && k.info.incarnation == info.incarnation;
    if (same && !k.down)
      return registration{cluster_newest(st), false}; // a retry: nothing changes
    // Same and down: the same process again after its link was lost (a
    // partition healed): followed again like a new registration.
    if (!same && info.incarnation <= k.info.incarnation)
      return make_error(errc::version_mismatch, who + ": incarnation " + std::to_string(info.incarnation)
                                                  + " is not newer than the registered "
                                                  + std::to_string(k.info.incarnation));
  }
  // It vouches for no version the cluster knew before it: its earlier
  // incarnation may have published those numbers with other bytes.
  const auto newest = cluster_newest(st);
  if (auto why = st.barrier.join(info, next_version(newest)); !why.empty())
    return make_error(errc::malformed, why);
  if (known != st.ranks.end()) { // a restart: the old incarnation is gone
    if (!known->second.down)
      self->demonitor(known->second.handle.address());
    abort_round(self, who + " replaced by incarnation " + std::to_string(info.incarnation));
    nccl_suspect(self, who + " restarted"); // the new incarnation holds no link
    st.ranks.erase(known);
  }
  coordinator_rank rank;
  rank.info = info;
  rank.handle = handle;
  rank.last_heard_ns = now_ns(self);
  st.ranks.emplace(info.rank, std::move(rank));
  follow_trainer(self, handle, who, [=, r = info.rank, who_addr = handle.address()](const version_info& vi) {
    auto i = self->state.ranks.find(r);
    if (i != self->state.ranks.end() && !i->second.down && i->second.handle.address() == who_addr)
      on_rank_version(self, r, vi);
  });
  log_line(self, "coordinator: " + who + " (incarnation " + std::to_string(info.incarnation) + ", node "
                   + printable(info.node) + ", " + std::to_string(info.held.size()) + " tensors) registered; "
                   + std::to_string(st.ranks.size()) + " of " + std::to_string(st.cfg.trainer_ranks) + " ranks");
  review_barrier(self);
  return registration{cluster_newest(st), false};
}

// -- rank heartbeats --------------------------------------------------------------------

/// A rank silent past the heartbeat timeout: a round in progress is
/// aborted, and none starts until it answers again.
void mark_rank_unreachable(self_ptr self, std::uint32_t r, std::uint64_t silent_ns) {
  auto& st = self->state;
  nccl_rank_lost(self, r, "went silent");
  st.ranks.at(r).unreachable = true;
  log_line(self, "coordinator: trainer rank " + std::to_string(r) + " silent for " + millis(silent_ns)
                   + " (heartbeat timeout " + std::to_string(st.cfg.heartbeat_timeout.count())
                   + " ms): unreachable; no round until it answers");
  abort_round(self, "trainer rank " + std::to_string(r) + " is unreachable");
  nccl_suspect(self, "trainer rank " + std::to_string(r) + " went silent"); // its peers' waits may have aborted links
}

bool heard_from_rank(self_ptr self, std::uint32_t r, const caf::actor_addr& who) {
  auto& st = self->state;
  auto i = st.ranks.find(r);
  if (i == st.ranks.end() || i->second.down || i->second.handle.address() != who)
    return false; // gone or replaced meanwhile
  i->second.last_heard_ns = now_ns(self);
  if (!i->second.unreachable)
    return false;
  i->second.unreachable = false;
  log_line(self, "coordinator: trainer rank " + std::to_string(r) + " answers again");
  return true;
}

// -- the end of a job ---------------------------------------------------------------------

/// Freezes every live rank; answers how many froze (or the first failure).
caf::result<std::uint32_t> freeze_ranks(self_ptr self) {
  // A rank in another process keeps publishing until told: the job's
  // last round and its check need versions that stop moving.
  std::vector<trainer_actor> live;
  for (auto& [r, rank] : self->state.ranks)
    if (!rank.down && rank.handle)
      live.push_back(rank.handle);
  if (live.empty())
    return std::uint32_t{0};
  auto rp = self->make_response_promise<std::uint32_t>();
  auto left = std::make_shared<std::size_t>(live.size());
  auto frozen = std::make_shared<std::uint32_t>(0);
  auto failed = std::make_shared<caf::error>(); // the first rank's failure
  for (auto& handle : live) {
    auto done = [=]() mutable {
      if (--*left > 0)
        return;
      if (*failed)
        rp.deliver(*failed);
      else
        rp.deliver(*frozen);
    };
    self->request(handle, self->state.cfg.sync.deadlines.finish, freeze_atom::value)
      .then([=](const version_info&) mutable { ++*frozen; done(); },
            [=](caf::error& err) mutable {
              if (!*failed)
                *failed = std::move(err);
              done();
            });
  }
  return rp;
}

// -- status -------------------------------------------------------------------------------

std::vector<rank_status> rank_statuses(const coordinator_state& st) {
  std::vector<rank_status> out;
  out.reserve(st.ranks.size()); // at most cfg.trainer_ranks
  for (const auto& [r, rank] : st.ranks)
    out.push_back(rank_status{r, rank.info.node, rank.info.incarnation, rank.latest_published, rank.pinned,
                              !rank.down && !rank.unreachable});
  return out;
}

} // namespace rlsync::coordinator_detail
