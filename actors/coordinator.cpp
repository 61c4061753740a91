// The coordinator (state diagram in coordinator.hpp). Top to bottom:
// helpers, when a round is due, the round itself (`settle`, then the steps
// it takes, phase by phase), and the behaviour that wires messages to them.
//
// One rule keeps it free of re-entrancy: handlers and reply callbacks only
// record what happened (an acknowledgement, an eviction, a new member, an
// abort) and end with `settle`, the one place that moves the round on. An
// eviction can complete a barrier, a barrier can end a wave or the round, and
// the end of a round can start the next one: `settle` loops through all of
// that; nothing else sends a phase or ends a round.
//
// Membership (engines registering, leaving, dying; the trainer restarting)
// and heartbeats live in coordinator_membership.cpp; trainer ranks
// (registration, following their versions through the version barrier,
// catch-up orders, rank heartbeats) in coordinator_ranks.cpp; helpers the
// files share are declared in coordinator_internal.hpp.
//
// Decisions live in runtime/membership_policy (who joins, registrations,
// liveness, the min_live alert), the round's bookkeeping in
// runtime/sync_round, its figures and log line in runtime/round_figures.
#include "actors/coordinator.hpp"
#include "actors/coordinator_internal.hpp"

#include "runtime/base/printable.hpp"
#include "runtime/checkpoint/checkpoint.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/system_messages.hpp>
#include <caf/sec.hpp>

#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <utility>

namespace rlsync {

coordinator_config coordinator_config_from(const topology& t) {
  coordinator_config cc;
  cc.sync = t.sync;
  cc.transfer = t.transfer;
  cc.heartbeat_interval = t.cluster.heartbeat_interval;
  cc.heartbeat_timeout = t.cluster.heartbeat_timeout;
  cc.state_file = t.coordinator.state_file;
  cc.trainer_ranks = static_cast<std::uint32_t>(t.trainer.ranks.size());
  cc.expected_engines = t.engines.size();
  cc.nccl_epoch_base = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                    std::chrono::system_clock::now().time_since_epoch())
                                                    .count());
  for (auto& spec : llama_parameter_specs(t.model.config, t.model.weights_dtype.value_or(dtype::bf16)))
    cc.parameter_names.push_back(spec.name);
  return cc;
}

void log_to_stderr(const std::string& line) {
  std::cerr << (line + '\n'); // one write: lines of concurrent actors do not interleave
}

namespace coordinator_detail {

using sync_waiter = caf::typed_response_promise<sync_report>;

// -- helpers --------------------------------------------------------------------

std::uint64_t now_ns(self_ptr self) {
  if (self->state.cfg.now_ns)
    return self->state.cfg.now_ns();
  auto t = self->clock().now().time_since_epoch();
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t).count());
}

void log_line(self_ptr self, const std::string& line) {
  if (self->state.cfg.log)
    self->state.cfg.log(line);
}

void member_event(self_ptr self, const std::string& engine, const char* what) {
  if (self->state.cfg.on_member)
    self->state.cfg.on_member(engine, what);
}

std::chrono::milliseconds deadline_of(const sync_deadlines& d, sync_phase phase) {
  switch (phase) {
    case sync_phase::pause: return d.pause;
    case sync_phase::flush: return d.flush;
    case sync_phase::start: return d.start;
    case sync_phase::transfer: return d.transfer;
    case sync_phase::finish: return d.finish;
    case sync_phase::resume: return d.resume;
    case sync_phase::done: break;
  }
  return std::chrono::milliseconds{0};
}

member_view view_of(const coordinator_member& m) {
  return member_view{m.routable, m.info.dirty, m.info.version, m.unreachable, m.newcomer};
}

// -- persistence and alerts ---------------------------------------------------------

/// Writes the state file (when configured). A failed write is logged, never
/// fatal: the run goes on, only a restart would start from an older file.
void persist(self_ptr self) {
  auto& st = self->state;
  if (st.cfg.state_file.empty())
    return;
  persisted_coordinator out;
  out.synced_version = st.synced_version;
  out.newest_version = std::max(st.newest.version, st.synced_version);
  out.rounds = st.rounds;
  for (auto& [name, rec] : st.replicas) {
    persisted_member pm;
    pm.name = name;
    pm.incarnation = rec.incarnation;
    pm.restarts = rec.restarts;
    pm.retired = rec.retired;
    pm.version = std::min(rec.version, out.newest_version);
    pm.routable = rec.was_routable;
    if (auto m = st.members.find(name); m != st.members.end()) {
      pm.version = std::min(m->second.info.version, out.newest_version);
      pm.routable = m->second.routable;
    }
    out.members.push_back(std::move(pm));
  }
  try {
    write_coordinator_state(st.cfg.state_file, out);
  } catch (const std::exception& e) {
    log_line(self, std::string{"coordinator: could not write the state file: "} + e.what());
  }
}

/// Reachable members serving: routable (a completed round, not evicted or
/// dirty since) within sync.staleness of the version rounds bring engines to
/// (the round's in progress, else the trainer's newest). With
/// `count_round`, also those in the round in progress, which brings them there.
std::int64_t serving_members(const coordinator_state& st, bool count_round) {
  auto target = st.round ? st.round->book.version() : st.newest.version;
  auto bound = static_cast<std::uint64_t>(std::max<std::int64_t>(st.cfg.sync.staleness, 0));
  std::int64_t n = 0;
  for (auto& [name, m] : st.members) {
    bool within = m.info.version >= target || target - m.info.version <= bound;
    bool serving = m.routable && !m.info.dirty && within;
    bool being_synced = count_round && st.round && st.round->book.in_round(name);
    if (!m.unreachable && (serving || being_synced))
      ++n;
  }
  return n;
}

/// sync.min_live_engines: the alert is armed once that many served, and
/// raised once per fall below it (members being synced count as serving).
void check_min_live(self_ptr self) {
  auto& st = self->state;
  auto live = serving_members(st, true);
  auto min = st.cfg.sync.min_live_engines;
  switch (count_live(st.live_alert, live, serving_members(st, false), min)) {
    case min_live_change::recovered:
      log_line(self, "coordinator: " + std::to_string(live)
                       + " live engines serving within sync.staleness again (sync.min_live_engines = "
                       + std::to_string(min) + ")");
      break;
    case min_live_change::alert:
      log_line(self, "coordinator: ALERT: only " + std::to_string(live)
                       + " live engines serving within sync.staleness = " + std::to_string(st.cfg.sync.staleness)
                       + ", below sync.min_live_engines = " + std::to_string(min));
      break;
    case min_live_change::none:
      break;
  }
}

// -- when a round is due --------------------------------------------------------

void on_version(self_ptr self, const version_info& vi) {
  auto& st = self->state;
  if (auto why = check(vi); !why.empty()) {
    log_line(self, "coordinator: refused a version of the trainer: " + why);
    return;
  }
  if (vi.version == 0 || vi.version < st.newest.version) { // the counter never goes backwards
    if (vi.version != 0 && st.ignored_versions++ % 100 == 0) // loud once, then now and then
      log_line(self, "coordinator: ignored version " + std::to_string(vi.version) + ", older than the published "
                       + std::to_string(st.newest.version)
                       + (st.cfg.restored ? " (restored from " + st.cfg.state_file
                                              + "; versions never go backwards: start the trainer at or past it)"
                                          : std::string{})
                       + "; " + std::to_string(st.ignored_versions) + " ignored so far");
    return;
  }
  // Unchanged bytes only as far back as this trainer may vouch for (ranks:
  // the barrier saw to it).
  auto since = vi.same_bytes_since;
  if (!follows_ranks(st) && since != 0) {
    since = std::max(since, st.trainer_vouches_from);
    if (since > vi.version)
      since = 0;
  }
  // The same number again changes nothing; but a restarted trainer
  // reporting it is what a round held back while the trainer was down
  // waits for, and settle looks again. Whoever reports it now may not
  // vouch for its bytes as the one before did.
  if (vi.version == st.newest.version && st.newest_heard) {
    if (since != st.newest.same_bytes_since)
      st.newest.same_bytes_since = 0;
    return;
  }
  st.newest = vi; // the same number from a restored counter brings its groups
  st.newest.same_bytes_since = since;
  st.newest_heard = true;
  if (st.cfg.router) // sync.staleness is measured against it
    self->send(st.cfg.router, version_atom::value, vi);
}

/// Whether a round may start as far as the trainer is concerned: it reported
/// a version (the first one starts the cold sync) and is not down (nothing
/// to pull from). Without a trainer, versions arrive as messages: always.
/// Following ranks: every rank is registered, live, and holds the version.
bool trainer_ready(const coordinator_state& st) {
  if (follows_ranks(st))
    return ranks_live(st) && st.ranks_hold_newest;
  return !st.cfg.trainer || (st.newest_heard && !st.trainer_down);
}

/// No round runs, the trainer is ready, and someone asked for one, or the
/// cadence or a newcomer's cold sync calls for one.
bool round_wanted(const coordinator_state& st) {
  if (st.round || !trainer_ready(st))
    return false;
  // An unreachable newcomer waits until it answers: counting it would start
  // round after round without it (back to back, with no time passing).
  auto newcomer = std::any_of(st.members.begin(), st.members.end(),
                              [](const auto& kv) { return waits_for_cold_sync(view_of(kv.second)); });
  return !st.sync_waiters.empty()
         || round_due(st.newest.version, st.synced_version, st.cfg.sync.every_versions, newcomer);
}

// -- the round ----------------------------------------------------------------------

void open_round(self_ptr self);
void send_phase(self_ptr self);
void close_wave(self_ptr self);
void close_round(self_ptr self);

/// sync.first_round_wait: at start, no round opens (unless one was asked
/// for) until every engine of the topology registered or the wait ended,
/// so that the fleet's first sync is one round for all of it.
bool gathering(self_ptr self) {
  auto& st = self->state;
  if (!st.gather_until)
    return false;
  const bool all = st.members.size() >= st.cfg.expected_engines;
  if (!all && self->clock().now() < *st.gather_until)
    return st.sync_waiters.empty();
  if (!all)
    log_line(self, "coordinator: sync.first_round_wait_ms passed with " + std::to_string(st.members.size()) + " of "
                     + std::to_string(st.cfg.expected_engines) + " engines registered: rounds go on without the rest");
  st.gather_until.reset();
  return false;
}

/// Moves the round on as far as it goes without waiting for an engine: sends
/// the current phase if it has not gone out, and while its barrier is
/// reached, ends the wave or moves to the next phase; ends the round when no
/// wave is left, and opens the next round when one is due. Every handler
/// ends here; a loop, so nothing re-enters.
void settle(self_ptr self) {
  auto& st = self->state;
  bool round_closed = false;
  for (;;) {
    if (!st.round) {
      if (gathering(self) || !round_wanted(st) || !nccl_ready(self))
        break; // a rendezvous's answers settle again
      open_round(self);
      continue;
    }
    auto& r = *st.round;
    if (r.book.done()) {
      close_round(self);
      round_closed = true;
      continue;
    }
    if (!r.sent_any || r.sent_wave != r.book.wave() || r.sent_phase != r.book.phase())
      send_phase(self);
    if (!r.book.barrier_reached())
      break; // the replies settle again
    if (r.book.phase() == sync_phase::transfer)
      r.record.waves.back().transfer_done_ns = now_ns(self);
    if (r.book.wave_ending())
      close_wave(self);
    r.book.advance();
  }
  // Once per round, not per reply: the evictions and dirt of the round that
  // ended; engines of the next one (if any) count as serving.
  if (round_closed)
    check_min_live(self);
}

/// Snapshot of the membership towards the newest version: every engine that
/// does not serve it yet — behind, dirty, evicted or new (a full transfer
/// brings it current). Engines already serving it keep serving.
void open_round(self_ptr self) {
  auto& st = self->state;
  std::vector<std::string> names, cold_syncs;
  for (auto& [name, m] : st.members) {
    if (joins_round(view_of(m), st.newest.version))
      names.push_back(name);
    if (waits_for_cold_sync(view_of(m)))
      cold_syncs.push_back(name);
    if (!m.unreachable)
      m.newcomer = false;
  }
  auto wave_size = static_cast<std::size_t>(std::max<std::int64_t>(st.cfg.sync.wave_size, 0));
  auto id = st.next_round_id++;
  std::vector<caf::actor_addr> engines_at;
  engines_at.reserve(names.size());
  for (auto& name : names)
    engines_at.push_back(st.members.at(name).handle.address());
  st.round.emplace(sync_round{id, st.newest.version, std::move(names), wave_size}, st.newest);
  st.round->engines_at = std::move(engines_at);
  st.round->cold_syncs = std::move(cold_syncs);
  st.round->record.id = id;
  st.round->record.version = st.newest.version;
  st.round->waiters = std::exchange(st.sync_waiters, {});
  if (st.round->book.done())
    return;
  // Consumers may pull it long after newer versions: every producer keeps it.
  if (follows_ranks(st)) {
    for (auto& [r, rank] : st.ranks) {
      st.round->producers.push_back(producer_holding{r, rank.info.incarnation, rank.info.held});
      st.round->producer_handles.push_back(rank.handle);
      self->send(rank.handle, pin_atom::value, st.newest.version);
      rank.pinned = st.newest.version;
    }
  } else if (st.cfg.trainer) {
    self->send(st.cfg.trainer, pin_atom::value, st.newest.version);
  }
}

template <class Reply>
void on_reply(self_ptr self, std::size_t place, const Reply& reply);
void on_failure(self_ptr self, std::size_t place, const caf::error& err);

/// Fans the current phase out to every live engine of the current wave at once.
void send_phase(self_ptr self) {
  auto& st = self->state;
  auto& r = *st.round;
  auto v = r.book.version();
  auto phase = r.book.phase();
  r.sent_any = true;
  r.sent_wave = r.book.wave();
  r.sent_phase = phase;
  auto places = r.book.wave_indices();
  if (phase == sync_phase::pause) { // a wave begins
    r.record.waves.emplace_back();
    r.record.waves.back().pause_sent_ns = now_ns(self);
    r.dirty_after_abort.clear();
  }
  if (st.cfg.on_phase)
    st.cfg.on_phase(r.book.id(), v, phase, r.book.wave_engines());
  // One order for every engine of the wave, one-way: only the token differs.
  phase_order order;
  order.phase = phase;
  order.deadline_ms = deadline_of(st.cfg.sync.deadlines, phase).count();
  order.pause = st.cfg.sync.pause; // by default keep (running requests freeze and continue
                                   // after the update) without clear_cache (flush resets the prefix cache)
  order.version = v;
  if (phase == sync_phase::transfer) {
    order.transfer.version = v;
    order.transfer.mode = st.cfg.transfer.mode;
    order.transfer.backend = std::string{to_string(st.cfg.transfer.backend)};
    order.transfer.producers = r.producers;
    order.producers = r.producer_handles;
    // Engines serving a version with these bytes already skip the data plane.
    order.transfer.same_bytes_since = r.target.same_bytes_since;
    r.record.waves.back().transfer_sent_ns = now_ns(self);
  }
  r.first_token = st.next_token;
  st.next_token += std::max<std::size_t>(places.size(), 1); // never reused, not even by an empty phase
  for (std::size_t i = 0; i < places.size(); ++i) {
    order.token = r.first_token + i;
    // One that is gone already: its down message evicts it.
    if (auto engine = caf::actor_cast<rollout_engine_actor>(r.engines_at[places[i]]))
      self->send(engine, phase_atom::value, order);
  }
  r.ordered = std::move(places);
  // One deadline for the whole phase: whoever has not answered by then is evicted.
  self->delayed_send(self, deadline_of(st.cfg.sync.deadlines, phase), caf::timeout_atom::value, r.first_token);
}

/// The place (in the round's snapshot) of the engine a phase_done with
/// `token` answers for, or none: a token of an earlier phase, wave or round
/// (a late answer, ignored as a late reply was), or a sender that is not the
/// engine the order went to (refused and counted).
std::optional<std::size_t> answerer(self_ptr self, std::uint64_t token) {
  auto& st = self->state;
  if (!st.round)
    return std::nullopt;
  auto& r = *st.round;
  if (token < r.first_token || token - r.first_token >= r.ordered.size())
    return std::nullopt;
  auto place = r.ordered[token - r.first_token];
  const auto& sender = self->current_sender();
  const auto& engine = r.engines_at[place];
  if (!sender || !engine || sender->node() != engine.node() || sender->id() != engine.id()) {
    st.guard->refuse(sender, "phase_done", "an answer for an order sent to " + r.book.engine(place));
    return std::nullopt;
  }
  return place;
}

/// An engine's answer to the current phase's order.
template <class Reply>
void on_answer(self_ptr self, std::uint64_t token, const Reply& reply) {
  if (auto place = answerer(self, token)) {
    on_reply(self, *place, reply);
    settle(self);
  }
}

void on_answer_error(self_ptr self, std::uint64_t token, const caf::error& err) {
  if (auto place = answerer(self, token)) {
    on_failure(self, *place, err);
    settle(self);
  }
}

/// The deadline of the phase whose orders began at `first_token`: every
/// engine it still waits on is evicted, as a request's timeout did.
void on_phase_deadline(self_ptr self, std::uint64_t first_token) {
  auto& st = self->state;
  if (!st.round || st.round->first_token != first_token)
    return; // that phase ended
  auto& r = *st.round;
  for (auto place : r.ordered) // evictions change neither the orders nor the places
    on_failure(self, place, caf::make_error(caf::sec::request_timeout));
  settle(self);
}

/// What is wrong with a reply, or nothing. Engines that answer for another
/// version are evicted: serving it would mix versions.
std::string check_reply(const coordinator_round&, sync_phase, const pause_report&) {
  return {};
}

std::string check_reply(const coordinator_round& r, sync_phase phase, const phase_ack& ack) {
  if (phase == sync_phase::finish && ack.version != r.book.version())
    return "finished version " + std::to_string(ack.version);
  return {};
}

std::string check_reply(const coordinator_round& r, sync_phase, const transfer_report& rep) {
  if (rep.version != r.book.version())
    return "transferred version " + std::to_string(rep.version);
  return {};
}

bool is_dirty(const pause_report&) { return false; }
bool is_dirty(const transfer_report&) { return false; }
bool is_dirty(const phase_ack& ack) { return ack.dirty; }

void record_figures(coordinator_round&, const pause_report&) {}
void record_figures(coordinator_round&, const phase_ack&) {}
void record_figures(coordinator_round& r, const transfer_report& rep) {
  r.record.bytes += rep.bytes;
  if (rep.duration_ns >= r.record.slowest_pull.duration_ns)
    r.record.slowest_pull = rep;
}

/// Whether the engine at `place` owes an answer to the orders last sent:
/// false for a late answer (the phase moved on, e.g. an abort skipped to
/// `continue`) or an engine evicted or already heard from.
bool owes_answer(const coordinator_round& r, std::size_t place) {
  return r.book.phase() == r.sent_phase && r.book.waiting_on_at(place);
}

/// Records one engine's answer: O(1), whatever the size of the round.
template <class Reply>
void on_reply(self_ptr self, std::size_t place, const Reply& reply) {
  auto& r = *self->state.round;
  if (!owes_answer(r, place))
    return;
  const auto& name = r.book.engine(place);
  auto phase = r.sent_phase;
  if (auto what = check_reply(r, phase, reply); !what.empty()) {
    evict(self, name, what);
    return;
  }
  record_figures(r, reply);
  if (phase == sync_phase::resume) {
    r.record.waves.back().last_resume_ack_ns = now_ns(self);
    if (is_dirty(reply))
      r.dirty_after_abort.insert(name);
  }
  r.book.ack_at(place, phase);
}

void on_failure(self_ptr self, std::size_t place, const caf::error& err) {
  auto& st = self->state;
  auto& r = *st.round;
  if (!owes_answer(r, place))
    return;
  auto why = err == caf::sec::request_timeout
               ? "no answer within "
                   + std::to_string(deadline_of(st.cfg.sync.deadlines, r.sent_phase).count()) + " ms"
               : self->system().render(err);
  // A round aborted during its pause resumes an engine whose wait-pause
  // still waits for its requests: it refuses, and it never began the
  // update, so it keeps serving its old version once a round resumes it.
  const bool still_pausing = r.sent_phase == sync_phase::resume && is(err, errc::pause_in_flight);
  evict(self, r.book.engine(place), why, still_pausing);
}

/// Takes an engine out of the round and out of routing. It stays a member
/// (when alive) and needs a full sync before it is routable again.
void evict(self_ptr self, const std::string& name, const std::string& why, bool untouched) {
  auto& st = self->state;
  auto& r = *st.round;
  bool in_wave = r.book.in_current_wave(name); // else a later wave: nothing sent to it yet
  auto phase = r.book.phase();
  if (!r.book.evict(name))
    return; // already out: its second failure changes nothing
  auto where = in_wave ? std::string{to_string(phase)} : std::string{"before its wave"};
  r.record.eviction_notes.push_back(name + " (" + where + ": " + why + ")");
  if (auto rec = st.replicas.find(name); rec != st.replicas.end())
    rec->second.last_eviction = where + ": " + why;
  if (st.cfg.on_evict)
    st.cfg.on_evict(name, in_wave ? std::optional<sync_phase>{phase} : std::nullopt, why);
  if (in_wave && (phase == sync_phase::transfer || phase == sync_phase::finish)
      && st.nccl.layout.rank_of(gpu::comm_member::worker(name, 0)) >= 0)
    nccl_suspect(self, name + " was evicted in " + std::string{to_string(phase)}); // its link may be aborted
  if (auto i = st.members.find(name); i != st.members.end()) {
    i->second.routable = false;
    if (in_wave && !untouched && dirty_after_eviction(phase)) // the update session may be half applied
      i->second.info.dirty = true;
    member_event(self, name, "evicted");
  }
  // An engine of the current wave holds requests the round paused: they
  // move elsewhere (continuing from their tokens), since no round may bring
  // it current soon. One evicted before its wave still serves its old version.
  if (st.cfg.router && in_wave)
    self->send(st.cfg.router, failed_atom::value, name);
  else if (st.cfg.router)
    self->send(st.cfg.router, evict_atom::value, name);
}

/// The trainer died mid-round: no later wave, and the current one skips to
/// `continue` (state diagram in the header); settle sends it.
void abort_round(self_ptr self, const std::string& why) {
  auto& st = self->state;
  if (!st.round || !st.round->book.abort())
    return; // no round, or it is resuming already: it completes
  st.round->record.abort_reason = why;
  nccl_suspect(self, "the round was aborted (" + why + ")"); // pulls cut short may have aborted their links
}

/// The wave's survivors become routable at the round's version, or, when the
/// wave was aborted, dirty or back on their old version.
void close_wave(self_ptr self) {
  auto& st = self->state;
  auto& r = *st.round;
  auto v = r.book.version();
  r.record.waves.back().ended_ns = now_ns(self);
  for (auto& name : r.book.wave_engines()) {
    auto& m = st.members.at(name);
    switch (after_wave(r.book.wave_aborted(), r.dirty_after_abort.count(name) > 0)) {
      case wave_outcome::current:
        m.info.version = v;
        m.info.dirty = false;
        m.routable = true;
        ++r.record.engines_synced;
        member_event(self, name, "routable");
        if (st.cfg.router)
          self->send(st.cfg.router, route_atom::value, route_update{name, v, true}, m.handle);
        break;
      case wave_outcome::dirty: // it holds part of v: serves nothing
        m.info.dirty = true;
        m.routable = false;
        ++r.record.dirty;
        member_event(self, name, "dirty");
        if (st.cfg.router) // its frozen requests would wait for a complete update: they move
          self->send(st.cfg.router, failed_atom::value, name);
        break;
      case wave_outcome::old_version: // it serves its old version, as before the round
        break;
    }
  }
  if (r.book.waves() > 1) // who is current changed before the round's end
    persist(self);
}

/// The figures, the history, the waiters.
void close_round(self_ptr self) {
  auto& st = self->state;
  auto r = std::move(*st.round);
  st.round.reset();
  auto& rec = r.record;
  rec.aborted = r.book.aborted();
  rec.evicted = r.book.evicted();
  if (rec.aborted) { // the aborted wave's clean engines and the waves never run
    rec.old_version = static_cast<std::uint32_t>(r.book.live().size()) - rec.engines_synced - rec.dirty;
    for (auto& name : r.cold_syncs)
      if (auto m = st.members.find(name); m != st.members.end() && !m->second.routable)
        m->second.newcomer = true; // its cold sync is retried once the trainer is ready
  } else
    st.synced_version = std::max(st.synced_version, r.book.version());
  auto rep = report_of(rec, now_ns(self));
  st.last_round_ops = r.book.ops();
  ++st.rounds;
  st.history.push_back(rep);
  while (st.history.size() > st.cfg.history_limit)
    st.history.pop_front();
  log_line(self, log_line_of(rec, rep));
  if (st.cfg.on_report)
    st.cfg.on_report(rep);
  persist(self);
  nccl_round_ended(self);
  for (auto& w : r.waiters)
    w.deliver(rep);
}

// -- control-plane probe ------------------------------------------------------------

// A sync round is six waves of requests to every engine (pause, flush,
// start, transfer, finish, continue), each a barrier. probe(6) times six
// such waves of heartbeats in the same run: the round's control-plane speed
// of light. Its state lives in the callbacks only, never in the round, so a
// probe and a round can run side by side; nobody is evicted, it only measures.

struct control_probe {
  caf::typed_response_promise<std::uint64_t> rp;
  std::uint32_t waves = 0;
  std::uint32_t sent = 0;    ///< waves sent so far
  std::size_t pending = 0;   ///< answers the current wave still waits for
  std::uint64_t started_ns = 0;
};

/// Sends the next wave to every current member at once, or replies when all
/// waves are done (or no member is left).
void probe_wave(self_ptr self, std::shared_ptr<control_probe> p) {
  auto& st = self->state;
  if (p->sent == p->waves || st.members.empty()) {
    p->rp.deliver(now_ns(self) - p->started_ns);
    return;
  }
  heartbeat hb{"coordinator", p->sent++};
  p->pending = st.members.size();
  // An answer, an error and a timeout all count: the wave ends when the
  // last member is heard from or its request expires.
  auto answered = [=] {
    if (--p->pending == 0)
      probe_wave(self, p);
  };
  for (auto& [name, m] : st.members)
    self->request(m.handle, st.cfg.sync.deadlines.pause, heartbeat_atom::value, hb)
      .then([=](heartbeat&) { answered(); }, [=](caf::error&) { answered(); });
}

} // namespace coordinator_detail

using namespace coordinator_detail;

// -- behaviour ------------------------------------------------------------------------

coordinator_impl_actor::behavior_type
coordinator(coordinator_impl_actor::stateful_pointer<coordinator_state> self, coordinator_config cfg) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.barrier = version_barrier{st.cfg.trainer_ranks, st.cfg.parameter_names, st.cfg.rank_keep_versions};
  if (auto& r = st.cfg.restored) { // a restart: the counter goes on from the file
    st.synced_version = r->synced_version;
    st.newest.version = r->newest_version;
    st.rounds = r->rounds;
    st.next_round_id = r->rounds + 1; // round numbers go on too (drills and logs count them)
    for (auto& pm : r->members)
      st.replicas[pm.name] = replica_record{pm.incarnation, pm.restarts, pm.retired, pm.version, pm.routable, {}};
    log_line(self, "coordinator: restored from " + st.cfg.state_file + ": v" + std::to_string(st.synced_version)
                     + " synced, " + std::to_string(r->members.size()) + " replicas known");
    // A router that outlived the last coordinator still routes by its
    // table; an engine that one left paused mid-round would draw requests it
    // cannot serve. Each comes back as it registers: at once when current,
    // after its sync otherwise.
    if (st.cfg.router)
      for (auto& pm : r->members)
        self->send(st.cfg.router, evict_atom::value, pm.name);
  }
  self->set_down_handler([=](caf::down_msg& dm) {
    on_down(self, dm);
    settle(self);
  });
  if (auto trainer = st.cfg.trainer) {
    st.cfg.trainer = nullptr;
    attach_trainer(self, trainer);
  }
  if (st.cfg.heartbeat_interval.count() > 0)
    self->delayed_send(self, st.cfg.heartbeat_interval, caf::tick_atom::value);
  // Only a job's first coordinator: a restarted one's engines are serving,
  // and a replica it restored as retired would never register.
  if (const auto wait = st.cfg.sync.first_round_wait; wait.count() > 0 && st.cfg.expected_engines > 0 && !st.cfg.restored) {
    st.gather_until = self->clock().now() + wait;
    self->delayed_send(self, wait, settle_atom::value);
  }
  // Every handler: a peer that was not admitted reads, changes and learns nothing.
  auto guard = st.guard = std::make_shared<sender_guard>("coordinator", st.cfg.authorize, st.cfg.log);
  // Stray errors are refused and counted, except a heartbeat's: a current
  // member or rank whose handler fails is silent, which the tick judges.
  refuse_stray_errors(self, guard, [self](const caf::strong_actor_ptr& sender) {
    return is_heartbeat_target(self->state, sender->address());
  });
  return {
    authorized(self, guard, [=](version_atom, const version_info& vi) {
      auto& st = self->state;
      const auto sender = self->current_sender() ? self->current_sender()->address() : caf::actor_addr{};
      if (!follows_ranks(st) && (!st.cfg.trainer || sender == st.cfg.trainer.address())) {
        on_version(self, vi);
      } else if (!follows_ranks(st)) {
        // A trainer replaced (its partition healed after another attached):
        // its numbers are not the current trainer's.
        if (st.ignored_unranked_versions++ % 100 == 0) // loud once, then now and then
          log_line(self, "coordinator: ignored version " + std::to_string(vi.version)
                           + " from a sender that is not the current trainer");
      } else if (auto r = sending_rank(self)) {
        on_rank_version(self, *r, vi);
      } else if (st.ignored_unranked_versions++ % 100 == 0) { // loud once, then now and then
        log_line(self, "coordinator: ignored version " + std::to_string(vi.version)
                         + " from a sender that is no registered trainer rank (following "
                         + std::to_string(st.cfg.trainer_ranks) + " ranks)");
      }
      settle(self);
    }),
    authorized(self, guard, [=](register_atom, trainer_actor& trainer) {
      // The one trainer is rank 0; a member posing as it would feed the fleet its weights.
      if (auto why = origin_problem(self, "trainer rank 0", trainer.address()); !why.empty()) {
        self->state.guard->refuse(self->current_sender(), "register", "the trainer's registration: " + why);
        return;
      }
      attach_trainer(self, std::move(trainer));
      settle(self); // a round the replacement aborted resumes its wave now
    }),
    authorized(self, guard, [=](register_atom, const rank_info& info,
        const trainer_actor& rank) -> caf::result<registration> {
      auto joined = on_register_rank(self, info, rank);
      settle(self); // the round a restart held back retries
      if (!joined) {
        log_line(self, "coordinator: refused a trainer rank: " + self->system().render(joined.error()));
        return std::move(joined.error());
      }
      return *joined;
    }),
    authorized(self, guard, [=](register_atom, router_actor& router) {
      auto& st = self->state;
      if (auto why = origin_problem(self, "router", router.address()); !why.empty()) {
        st.guard->refuse(self->current_sender(), "register", "the router's registration: " + why);
        return;
      }
      st.cfg.router = std::move(router);
      // Engines on other nodes obey only the router the coordinator names
      // to them: every member first, then the router learns whom to route to.
      for (auto& [name, m] : st.members)
        self->send(m.handle, route_atom::value, caf::actor_cast<heartbeat_actor>(st.cfg.router));
      if (st.cfg.on_router)
        st.cfg.on_router(st.cfg.router);
      log_line(self, "coordinator: a new router attached; routing " + std::to_string(std::count_if(
                       st.members.begin(), st.members.end(), [](const auto& kv) { return kv.second.routable; }))
                       + " members");
      for (auto& [name, m] : st.members)
        if (m.routable)
          self->send(st.cfg.router, route_atom::value, route_update{name, m.info.version, true}, m.handle);
      if (st.newest_heard)
        self->send(st.cfg.router, version_atom::value, st.newest);
    }),
    authorized(self, guard, [=](caf::tick_atom) {
      if (self->current_sender() == self->ctrl()) // only its own timer
        heartbeat_tick(self);
      settle(self);
    }),
    authorized(self, guard, [=](register_atom, const engine_info& info,
        const rollout_engine_actor& engine) -> caf::result<registration> {
      auto joined = on_register(self, info, engine);
      if (joined && self->state.cfg.router) // before it is routable: engines elsewhere obey only a router named to them
        self->send(engine, route_atom::value, caf::actor_cast<heartbeat_actor>(self->state.cfg.router));
      settle(self); // a newcomer's cold sync; a replaced incarnation left the round
      if (!joined)
        return std::move(joined.error());
      return registration{self->state.synced_version, *joined};
    }),
    authorized(self, guard, [=](deregister_atom, const std::string& name) {
      if (auto why = check_name(name, "deregister: engine name"); !why.empty()) {
        log_line(self, "coordinator: refused a deregistration: " + why);
        return;
      }
      if (auto why = origin_problem(self, "engine " + name); !why.empty()) {
        self->state.guard->refuse(self->current_sender(), "deregister", "the deregistration of " + name + ": " + why);
        return;
      }
      drop_member(self, name, "deregistered");
      settle(self);
    }),
    authorized(self, guard, [=](sync_atom) -> caf::result<sync_report> {
      // One round at a time, and a trainer to pull from: it gets the next
      // round, which may be this one. While none can open, callers time out
      // and ask again; their promises stay, so at the bound the oldest (the
      // likeliest to have given up) is answered, not the newest refused.
      auto& waiters = self->state.sync_waiters;
      if (waiters.size() >= max_sync_waiters) {
        waiters.front().deliver(make_error(errc::queue_full, std::to_string(max_sync_waiters)
                                                               + " newer sync requests wait for the next round"));
        waiters.erase(waiters.begin());
      }
      auto rp = self->make_response_promise<sync_report>();
      waiters.push_back(rp);
      settle(self);
      return rp;
    }),
    authorized(self, guard, [=](freeze_atom) -> caf::result<std::uint32_t> {
      return freeze_ranks(self);
    }),
    authorized(self, guard, [=](status_atom) -> coordinator_status {
      auto& st = self->state;
      coordinator_status s;
      s.version = st.synced_version;
      for (auto& [name, m] : st.members) {
        s.members.push_back(m.info);
        if (m.routable)
          s.routable.push_back(name);
      }
      s.rounds = st.rounds;
      s.history.assign(st.history.begin(), st.history.end());
      for (auto& [name, m] : st.members) {
        if (m.unreachable)
          s.unreachable.push_back(name);
        else
          ++s.live;
      }
      for (auto& [name, rec] : st.replicas) {
        if (rec.retired)
          s.retired.push_back(name);
        if (!rec.last_eviction.empty())
          s.last_evictions[name] = rec.last_eviction;
      }
      s.below_min_live_events = st.live_alert.events;
      s.refused = st.guard->refused();
      s.ranks = rank_statuses(st);
      s.nccl_epoch = st.nccl.layout.epoch;
      s.nccl_members = static_cast<std::uint32_t>(st.nccl.layout.members.size());
      s.nccl_rebuilds = st.nccl.rebuilds;
      s.nccl_healthy = st.nccl.healthy;
      return s;
    }),
    authorized(self, guard, [=](digest_atom) -> caf::result<std::vector<weight_digest>> {
      // Fan out to every member; an engine that does not answer in time is
      // reported with its name only, so the caller sees it unverified.
      auto& members = self->state.members;
      if (members.empty()) // before the promise: once one is made, CAF drops a returned value
        return std::vector<weight_digest>{};
      auto rp = self->make_response_promise<std::vector<weight_digest>>();
      auto out = std::make_shared<std::vector<weight_digest>>();
      auto left = std::make_shared<std::size_t>(members.size());
      for (auto& [name, m] : members) {
        auto answered = [=](weight_digest d) mutable {
          out->push_back(std::move(d));
          if (--*left == 0)
            rp.deliver(*out);
        };
        self->request(m.handle, self->state.cfg.sync.deadlines.finish, digest_atom::value)
          .then(answered, [=, name = name](caf::error&) mutable { answered(weight_digest{name, 0, true, {}, {}}); });
      }
      return rp;
    }),
    authorized(self, guard, [=](const heartbeat&) {
      // The common answer (alive, as before) changes nothing a round waits
      // on: no settle, so a tick stays O(members).
      if (heard_heartbeat(self))
        settle(self);
    }),
    authorized(self, guard, [=](heartbeat_atom, const heartbeat& hb) {
      // A member's own unsolicited heartbeat proves it alive like an answer;
      // a name the sender does not own changes nothing (no per-sender state).
      if (!check(hb).empty())
        return; // no member has such a name
      if (auto sender = self->current_sender(); sender && heard_from(self, hb.from, sender->address()))
        settle(self);
    }),
    authorized(self, guard, [=](phase_done_atom, std::uint64_t token, const pause_report& rep) {
      on_answer(self, token, rep);
    }),
    authorized(self, guard, [=](phase_done_atom, std::uint64_t token, const transfer_report& rep) {
      on_answer(self, token, rep);
    }),
    authorized(self, guard, [=](phase_done_atom, std::uint64_t token, const phase_ack& ack) {
      on_answer(self, token, ack);
    }),
    authorized(self, guard, [=](phase_done_atom, std::uint64_t token, const caf::error& err) {
      on_answer_error(self, token, err);
    }),
    authorized(self, guard, [=](caf::timeout_atom, std::uint64_t first_token) {
      if (self->current_sender() == self->ctrl()) // only its own timers
        on_phase_deadline(self, first_token);
    }),
    authorized(self, guard, [=](settle_atom) {
      if (self->current_sender() == self->ctrl()) // its own timers
        settle(self);
    }),
    authorized(self, guard, [=](probe_atom, std::uint32_t waves) -> caf::result<std::uint64_t> {
      if (waves > max_probe_waves)
        return make_error(errc::malformed, "probe: " + std::to_string(waves) + " waves exceed the bound of "
                                             + std::to_string(max_probe_waves));
      if (waves == 0 || self->state.members.empty())
        return std::uint64_t{0};
      auto p = std::make_shared<control_probe>();
      p->rp = self->make_response_promise<std::uint64_t>();
      p->waves = waves;
      p->started_ns = now_ns(self);
      probe_wave(self, p);
      return p->rp;
    }),
  };
}

} // namespace rlsync
