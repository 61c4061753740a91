// The coordinator's membership and heartbeats: engines registering, leaving,
// dying and rejoining, the trainer (re)starting, and the heartbeat tick that
// finds silent members. The sync round itself reads top to bottom in
// coordinator.cpp; trainer ranks are in coordinator_ranks.cpp.
#include "actors/coordinator.hpp"
#include "actors/coordinator_internal.hpp"

#include "runtime/base/printable.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/system_messages.hpp>
#include <caf/sec.hpp>

#include <algorithm>
#include <utility>

namespace rlsync::coordinator_detail {

// -- membership -------------------------------------------------------------------

/// Where every registered engine runs, for the trainers (ranks) followed.
std::vector<engine_placement> engine_placements(const coordinator_state& st) {
  std::vector<engine_placement> out;
  out.reserve(st.members.size());
  for (const auto& [name, m] : st.members)
    out.push_back({name, to_string(m.handle.node())});
  return out;
}

/// Tells `trainer` where the engines run: it issues an engine's UCX tickets
/// only to that engine's node.
void tell_placements(self_ptr self, const trainer_actor& trainer) {
  if (trainer)
    self->send(trainer, register_atom::value, engine_placements(self->state));
}

/// The same, to every trainer followed, after the members changed.
void tell_placements(self_ptr self) {
  auto& st = self->state;
  if (st.cfg.trainer && !st.trainer_down)
    tell_placements(self, st.cfg.trainer);
  for (const auto& [r, rank] : st.ranks)
    if (!rank.down)
      tell_placements(self, rank.handle);
}

/// Forgets an engine: it left, died, or a newer incarnation replaced it. It
/// leaves the round and the router stops using it.
void drop_member(self_ptr self, std::string name, const std::string& why, bool replaced) {
  auto& st = self->state;
  auto i = st.members.find(name);
  if (i == st.members.end())
    return;
  self->demonitor(i->second.handle.address());
  st.members.erase(i); // first: nothing below may find it a member
  tell_placements(self); // its node gets no more tickets for it
  if (st.round && st.round->book.still_to_sync(name))
    evict(self, name, why); // tells the router too
  else if (st.cfg.router)
    self->send(st.cfg.router, evict_atom::value, name);
  log_line(self, "coordinator: " + name + " left (" + why + ")");
  member_event(self, name, "left");
  persist(self);
  if (!replaced) // its successor registers in this same message: no gap in the fleet
    check_min_live(self);
}

std::string retired_text(const std::string& name, std::uint32_t restarts, std::int64_t max_restarts) {
  return name + " is retired after " + std::to_string(restarts) + " restarts (sync.max_restarts = "
         + std::to_string(max_restarts) + ")";
}

std::string origin_problem(self_ptr self, const std::string& member, const caf::actor_addr& handle) {
  const auto& check_origin = self->state.cfg.origin;
  if (!check_origin)
    return {};
  auto sender = self->current_sender();
  if (!sender)
    return "an anonymous sender";
  if (auto why = check_origin(member, sender->node()); !why.empty())
    return why;
  if (handle && handle.node() != sender->node())
    return "its actor is not on the sender's node";
  return {};
}

/// A registration: refused with an error, or the member joins; returns
/// whether it is routable at once (it was current when it left).
caf::expected<bool> on_register(self_ptr self, const engine_info& info, const rollout_engine_actor& engine) {
  auto& st = self->state;
  if (!engine)
    return make_error(errc::malformed, "registration without an actor");
  if (auto why = check(info); !why.empty())
    return make_error(errc::malformed, "registration: " + why);
  // A member registers its own engines only: an admitted node that names
  // another node's engine (or hands in an actor elsewhere) would take its
  // place in rounds and its data-plane tickets.
  if (auto why = origin_problem(self, "engine " + info.name, engine.address()); !why.empty())
    return st.guard->refuse(self->current_sender(), "register", // counted, logged rate-limited
                            "the registration of " + printable(info.name) + ": " + why);
  registration_facts f;
  f.incarnation = info.incarnation;
  f.version = info.version;
  f.dirty = info.dirty;
  f.paused = info.paused;
  f.synced_version = st.synced_version;
  f.max_restarts = st.cfg.sync.max_restarts;
  auto seen = st.replicas.find(info.name);
  // Every name ever registered keeps a record (restarts, retirement): a new
  // one beyond the placements' bound would get no tickets anyway.
  const std::size_t max_engines = std::min(st.cfg.max_engines, engine_nodes::max_engines);
  if (seen == st.replicas.end() && st.replicas.size() >= max_engines)
    return make_error(errc::malformed, "registration of " + printable(info.name) + ": the coordinator keeps at most "
                                           + std::to_string(max_engines) + " engines");
  if (seen != st.replicas.end()) {
    f.known_replica = true;
    f.retired = seen->second.retired;
    f.last_incarnation = seen->second.incarnation;
    f.restarts = seen->second.restarts;
    f.recorded_version = seen->second.version;
    f.was_routable = seen->second.was_routable;
  }
  auto known = st.members.find(info.name);
  if (known != st.members.end()) {
    f.registered = true;
    f.registered_incarnation = known->second.info.incarnation;
    f.same_actor = known->second.handle.address() == engine.address();
  }
  auto d = decide_registration(f);
  switch (d.verdict) {
    case registration_verdict::retired:
      return make_error(errc::evicted, retired_text(info.name, f.restarts, f.max_restarts));
    case registration_verdict::retry: // nothing changes
      return known->second.routable;
    case registration_verdict::not_newer:
      return make_error(errc::version_mismatch,
                        info.name + ": incarnation " + std::to_string(info.incarnation)
                          + " is not newer than the registered " + std::to_string(f.registered_incarnation));
    case registration_verdict::older_than_seen:
      return make_error(errc::version_mismatch, info.name + ": incarnation " + std::to_string(info.incarnation)
                                                  + " is older than the last one seen, "
                                                  + std::to_string(f.last_incarnation));
    case registration_verdict::join:
    case registration_verdict::retire:
      break;
  }
  if (d.replaces) {
    drop_member(self, info.name, "replaced by incarnation " + std::to_string(info.incarnation), true);
    nccl_suspect(self, info.name + " restarted"); // the new incarnation holds no link
  }
  auto& rec = st.replicas[info.name]; // a first registration creates the record
  if (d.restart) {
    ++rec.restarts;
    rec.was_routable = false;
  }
  if (d.verdict == registration_verdict::retire) {
    rec.retired = true;
    member_event(self, info.name, "retired");
    log_line(self, "coordinator: ALERT: " + printable(info.name) + " retired: restart " + std::to_string(rec.restarts)
                     + " is past sync.max_restarts = " + std::to_string(st.cfg.sync.max_restarts));
    persist(self);
    check_min_live(self);
    return make_error(errc::evicted, retired_text(info.name, rec.restarts, st.cfg.sync.max_restarts));
  }
  rec.incarnation = info.incarnation;
  coordinator_member m;
  m.info = info;
  m.handle = engine;
  m.last_heard_ns = now_ns(self);
  if (d.routable_at_once) {
    m.routable = true;
    m.newcomer = false;
    log_line(self, "coordinator: " + printable(info.name) + " is back at v" + std::to_string(info.version)
                     + ", current: routable at once");
  }
  self->monitor(engine);
  st.members.emplace(info.name, std::move(m));
  tell_placements(self); // before any order: its workers ask for tickets then
  member_event(self, info.name, "registered");
  if (d.routable_at_once)
    member_event(self, info.name, "routable");
  if (d.routable_at_once && st.cfg.router)
    self->send(st.cfg.router, route_atom::value, route_update{info.name, info.version, true}, engine);
  persist(self);
  // Only a member serving at once, or one replacing a member (drop_member
  // leaves the count to here), changes the count: a fleet joining stays
  // O(1) per registration here instead of a pass over every member each.
  if (d.routable_at_once || d.replaces)
    check_min_live(self);
  return d.routable_at_once; // a newcomer: settle starts its cold sync
}

void on_down(self_ptr self, const caf::down_msg& dm) {
  auto& st = self->state;
  for (auto& [name, m] : st.members)
    if (m.handle.address() == dm.source) {
      nccl_engine_lost(self, name, "is down");
      drop_member(self, name, "down: " + self->system().render(dm.reason));
      return;
    }
  for (auto& [r, rank] : st.ranks)
    if (!rank.down && rank.handle.address() == dm.source) {
      nccl_rank_lost(self, r, "is down");
      rank.down = true;
      log_line(self, "coordinator: trainer rank " + std::to_string(r) + " is down (" + self->system().render(dm.reason)
                       + "); no round until it registers again");
      abort_round(self, "trainer rank " + std::to_string(r) + " is down");
      review_barrier(self);
      return;
    }
  if (st.cfg.trainer && dm.source == st.cfg.trainer.address()) {
    if (!follows_ranks(st))
      nccl_rank_lost(self, 0, "is down"); // the one trainer is rank 0
    st.trainer_down = true;
    if (dm.reason != caf::exit_reason::user_shutdown && dm.reason != caf::exit_reason::normal) // not a shutdown
      log_line(self, "coordinator: the trainer is down (" + self->system().render(dm.reason)
                       + "); no round until a trainer attaches again");
    abort_round(self, "the trainer is down");
  }
  // else: an incarnation already replaced: nothing to do here
}

/// A (restarted) trainer: follow its versions, pin the next rounds there.
void attach_trainer(self_ptr self, trainer_actor trainer) {
  auto& st = self->state;
  if (!trainer)
    return;
  if (st.cfg.trainer && st.cfg.trainer != trainer && !st.trainer_down)
    self->demonitor(st.cfg.trainer.address());
  if (st.cfg.trainer && st.cfg.trainer != trainer) {
    nccl_suspect(self, "the trainer restarted"); // the new one holds no link
    // The round pulls from the one replaced, whose down message may not have
    // come yet (or will be ignored now): it cannot complete.
    abort_round(self, "the trainer was replaced");
  }
  if (st.cfg.trainer != trainer) {
    // The first version it may vouch for.
    st.trainer_vouches_from = next_version(std::max(st.newest.version, st.synced_version));
    // No round until this trainer says which version it holds: the one
    // before may have held a version it does not.
    st.newest_heard = false;
  }
  st.cfg.trainer = std::move(trainer);
  st.trainer_down = false;
  follow_trainer(self, st.cfg.trainer, "the trainer", from_current_trainer(self));
}

// -- heartbeats -------------------------------------------------------------------------

/// A member silent past the heartbeat timeout: out of the round and out of
/// routing; the router reroutes its requests. It stays a member.
void mark_unreachable(self_ptr self, const std::string& name, std::uint64_t silent_ns) {
  auto& st = self->state;
  auto& m = st.members.at(name);
  m.unreachable = true;
  m.routable = false;
  member_event(self, name, "unreachable");
  log_line(self, "coordinator: " + name + " silent for " + millis(silent_ns) + " (heartbeat timeout "
                   + std::to_string(st.cfg.heartbeat_timeout.count()) + " ms): unreachable");
  if (st.cfg.router)
    self->send(st.cfg.router, failed_atom::value, name);
  check_min_live(self);
  if (st.round && st.round->book.still_to_sync(name))
    evict(self, name, "unreachable");
}

bool heard_from(self_ptr self, const std::string& name, const caf::actor_addr& who) {
  auto& st = self->state;
  auto i = st.members.find(name);
  if (i == st.members.end() || i->second.handle.address() != who)
    return false; // gone or replaced meanwhile
  auto& m = i->second;
  m.last_heard_ns = now_ns(self);
  if (!m.unreachable)
    return false;
  m.unreachable = false;
  m.newcomer = true; // a round is due: its full transfer brings it current
  member_event(self, name, "reachable");
  log_line(self, "coordinator: " + name + " answers again: rejoins at the next sync boundary");
  check_min_live(self);
  return true;
}

bool is_heartbeat_target(const coordinator_state& st, const caf::actor_addr& who) {
  auto i = st.heartbeat_targets.find(who);
  if (i == st.heartbeat_targets.end())
    return false;
  if (auto* name = std::get_if<std::string>(&i->second)) {
    auto m = st.members.find(*name);
    return m != st.members.end() && m->second.handle.address() == who;
  }
  auto r = st.ranks.find(std::get<std::uint32_t>(i->second));
  return r != st.ranks.end() && !r->second.down && r->second.handle.address() == who;
}

bool heard_heartbeat(self_ptr self) {
  auto& st = self->state;
  auto sender = self->current_sender();
  if (!sender)
    return false;
  auto who = sender->address();
  auto i = st.heartbeat_targets.find(who);
  if (i == st.heartbeat_targets.end())
    return false; // not asked since the last tick (replaced, gone): proves nothing
  if (auto* name = std::get_if<std::string>(&i->second))
    return heard_from(self, *name, who);
  return heard_from_rank(self, std::get<std::uint32_t>(i->second), who);
}

/// Every heartbeat_interval: who has been silent too long, then the next
/// heartbeat to every member and every rank.
void heartbeat_tick(self_ptr self) {
  auto& st = self->state;
  // Rounds wait for the current trainer's version: an answer lost or
  // refused is asked for again, one ask at a time, tick by tick.
  if (!follows_ranks(st) && st.cfg.trainer && !st.newest_heard && !st.trainer_down && !st.asking_version) {
    st.asking_version = true;
    ask_version(
      self, st.cfg.trainer,
      [self, heard = from_current_trainer(self)](const version_info& vi) {
        self->state.asking_version = false;
        heard(vi);
      },
      [self](const caf::error&) { self->state.asking_version = false; });
  }
  auto now = now_ns(self);
  auto timeout = static_cast<std::uint64_t>(
    std::chrono::duration_cast<std::chrono::nanoseconds>(st.cfg.heartbeat_timeout).count());
  std::vector<std::pair<std::string, std::uint64_t>> silent;
  for (auto& [name, m] : st.members)
    if (!m.unreachable && silent_too_long(now, m.last_heard_ns, timeout))
      silent.emplace_back(name, now - m.last_heard_ns);
  for (auto& [name, ns] : silent)
    mark_unreachable(self, name, ns);
  std::vector<std::pair<std::uint32_t, std::uint64_t>> silent_ranks;
  for (auto& [r, rank] : st.ranks)
    if (!rank.down && !rank.unreachable && silent_too_long(now, rank.last_heard_ns, timeout))
      silent_ranks.emplace_back(r, now - rank.last_heard_ns);
  for (auto& [r, ns] : silent_ranks)
    mark_rank_unreachable(self, r, ns);
  heartbeat hb{"coordinator", ++st.heartbeat_seq};
  // One-way: each answer comes back as a plain `heartbeat` (heard_heartbeat);
  // a late one still proves its sender alive. A failing handler's error
  // goes to the error handler and proves nothing.
  st.heartbeat_targets.clear();
  for (auto& [name, m] : st.members) {
    st.heartbeat_targets.emplace(m.handle.address(), name);
    self->send(m.handle, heartbeat_atom::value, hb);
  }
  for (auto& [r, rank] : st.ranks)
    if (!rank.down) {
      st.heartbeat_targets.emplace(rank.handle.address(), r);
      self->send(rank.handle, heartbeat_atom::value, hb);
    }
  self->delayed_send(self, st.cfg.heartbeat_interval, caf::tick_atom::value);
}

} // namespace rlsync::coordinator_detail
