#pragma once
// The world of the deterministic simulation (tests/actors/test_simulation.cpp):
// what its engines hold and did, what every client saw, and the violations
// found along the way; the simulated engine; and the client, one per request,
// which checks each answer as it arrives (every result equals its token
// stream, every rejection is an explicit one). One thread runs every actor
// here: no locks.
//
// The engine follows the real one (actors/rollout_engine.cpp,
// runtime/engine/engine_core.cpp): pause(keep) freezes and answers at once;
// start(v) opens a session and makes the engine dirty until finish(v) or a
// resume that abandons an untouched session; transfer takes a few simulated
// milliseconds and fails if the trainer died meanwhile; a generate on a
// dirty engine outside a session is refused; a generate for a request id
// the engine still holds is a newer attempt that ends the old one; one token per running
// request per simulated millisecond, unless paused, dirty or silenced;
// token i of request r is r*1000+i. A silenced engine drops every message
// unanswered (as the real engine's partition drill does) and produces
// nothing; a slow one answers phases late. Unlike the scripted engine
// (scripted_engine.hpp), which answers as each test tells it, this one keeps
// the real engine's state, so that the simulation's checks can compare what
// the coordinator believes with what the engines hold.
#include "actors/interfaces.hpp"
#include "actors/phase_orders.hpp"

#include <caf/actor_cast.hpp>
#include <caf/atom.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace rlsync::test::sim {

// -- the world the engines and the checks share -------------------------------------

/// One incarnation of an engine replica: the engine's state, kept here so that
/// the test reads what the engine really holds.
struct engine_ctl {
  std::string name;
  std::uint64_t incarnation = 0;
  bool alive = true;
  /// The coordinator announced this incarnation routable at least once.
  bool ever_routable = false;
  std::int64_t transfer_ms = 5; ///< how long a pull takes
  // What the engine holds and does.
  std::uint64_t version = 0;
  bool dirty = false;
  bool paused = false;
  bool silenced = false;
  bool in_session = false;
  std::uint64_t session_version = 0;
  bool touched = false;  ///< the session's bytes were in flight or arrived
  bool received = false; ///< the session's transfer completed
  bool was_dirty = false;
  // Faults.
  std::int64_t slow_ms = 0;         ///< phase answers this late; 0: at once
  std::uint32_t fail_transfers = 0; ///< the next n transfers fail (corrupt bytes)
  // What it did.
  std::uint64_t tokens = 0;
  std::uint64_t dirty_tokens = 0;
  std::uint64_t duplicate_refusals = 0; ///< generates for a request id it still held
  std::uint64_t start_refusals = 0;     ///< start(v) with v <= its version
};

/// One client request and everything its client saw.
struct request_record {
  generate_request req;
  std::vector<token_event> stream;
  std::uint32_t answers = 0;
  std::optional<generate_result> result;
  std::optional<caf::error> error;
  std::string error_text;
};

struct outcome_counts {
  std::uint64_t requests = 0, length = 0, failed = 0, not_routable = 0, queue_full = 0;
  std::uint64_t rounds = 0, aborted_rounds = 0, empty_rounds = 0, evictions = 0, reroutes = 0;
  std::uint64_t kills = 0, restarts = 0, retired = 0, silences = 0, slows = 0, bad_transfers = 0;
  std::uint64_t trainer_kills = 0, publishes = 0, tokens = 0, duplicate_refusals = 0,
                start_refusals = 0;
  std::int64_t quiet_after_ms = -1;

  void add(const outcome_counts& o) {
    requests += o.requests, length += o.length, failed += o.failed;
    not_routable += o.not_routable, queue_full += o.queue_full;
    quiet_after_ms = std::max(quiet_after_ms, o.quiet_after_ms);
    rounds += o.rounds, aborted_rounds += o.aborted_rounds, empty_rounds += o.empty_rounds;
    evictions += o.evictions, reroutes += o.reroutes;
    kills += o.kills, restarts += o.restarts, retired += o.retired, silences += o.silences;
    slows += o.slows, bad_transfers += o.bad_transfers, trainer_kills += o.trainer_kills;
    publishes += o.publishes, tokens += o.tokens, duplicate_refusals += o.duplicate_refusals;
    start_refusals += o.start_refusals;
  }

  std::string to_string() const {
    std::ostringstream os;
    os << requests << " requests (" << length << " length, " << failed << " failed, " << not_routable
       << " not_routable, " << queue_full << " queue_full), " << tokens << " tokens, " << reroutes
       << " reroutes; " << rounds << " rounds (" << aborted_rounds << " aborted, " << empty_rounds
       << " with no engine left), " << evictions << " evictions; faults: " << kills << " kills, "
       << restarts << " restarts (" << retired << " refused: retired), " << silences << " silences, "
       << slows << " slow spells, " << bad_transfers << " bad transfers, " << trainer_kills
       << " trainer kills, " << publishes << " versions; engines refused " << duplicate_refusals
       << " duplicate request ids and " << start_refusals << " start(v) at a version they held";
    if (quiet_after_ms >= 0)
      os << "; quiet " << quiet_after_ms << " ms after the faults ended";
    return os.str();
  }
};

struct world {
  std::int64_t now_ms = 0;
  std::vector<std::string> log;         ///< the fault plan as it ran, and notable events
  std::vector<std::string> violations;  ///< broken invariants, with the time
  std::vector<std::string> coordinator_log;
  std::vector<std::string> router_log;
  std::set<std::uint64_t> completed;    ///< versions of rounds that completed (not aborted)
  std::set<std::uint64_t> aborted;      ///< versions of aborted rounds
  std::uint64_t trainer_epoch = 0;      ///< grows with every trainer death
  std::map<std::string, std::shared_ptr<engine_ctl>> engines; ///< current incarnation per name
  std::vector<std::shared_ptr<engine_ctl>> incarnations;      ///< all of them
  std::map<std::uint64_t, std::shared_ptr<request_record>> requests;
  outcome_counts counts;

  std::string stamp() const { return "t=" + std::to_string(now_ms) + "ms "; }
  /// Replaying one seed: every line goes to stderr as it happens too, so
  /// that a crash still shows how far the run got.
  bool echo = false;
  void add(std::vector<std::string>& to, const std::string& s) {
    to.push_back(stamp() + s);
    if (echo)
      std::cerr << to.back() << '\n';
  }
  void note(const std::string& s) { add(log, s); }
  /// Records a broken invariant once (the first time it is seen).
  void violation(const std::string& s) {
    if (violation_texts.insert(s).second)
      add(violations, "VIOLATION " + s);
  }
  std::set<std::string> violation_texts;
};

using world_ptr = std::shared_ptr<world>;

// -- the engine ---------------------------------------------------------------------

using silence_atom = caf::atom_constant<caf::atom("silence")>;
using late_atom = caf::atom_constant<caf::atom("late")>;
using pulled_atom = caf::atom_constant<caf::atom("pulled")>;

/// A rollout engine plus its own timers and the test's partition switch.
using sim_engine_actor = rollout_engine_actor::extend<
  // produce one token per running request (its own 1 ms timer)
  caf::reacts_to<caf::tick_atom>,
  // the test partitions (true) or heals (false) it
  caf::reacts_to<silence_atom, bool>,
  // a slow phase answer is due (its own timer)
  caf::reacts_to<late_atom, std::uint64_t>,
  // the pull of transfer n ended (its own timer)
  caf::reacts_to<pulled_atom, std::uint64_t>>;

struct sim_request {
  generate_request req;
  token_sink_actor sink;
  caf::typed_response_promise<generate_result> rp;
  generate_result out; ///< tokens produced here, spans from 0, as the real engine
};

struct sim_engine_state {
  phase_order_count phase_orders;
  std::shared_ptr<engine_ctl> ctl;
  world_ptr w;
  std::map<std::uint64_t, sim_request> requests; ///< by request id
  bool tick_scheduled = false;
  std::optional<caf::typed_response_promise<transfer_report>> transfer;
  transfer_order order;
  std::uint64_t transfer_seq = 0;
  std::uint64_t transfer_epoch = 0;
  std::map<std::uint64_t, std::function<void()>> late; ///< slow answers not yet sent
  std::uint64_t next_late = 0;

  static inline const char* name = "sim-engine";
};

using sim_engine_ptr = sim_engine_actor::stateful_pointer<sim_engine_state>;

inline bool producing(const engine_ctl& c) {
  return c.alive && !c.silenced && !c.paused && !c.dirty;
}

inline void schedule_tick(sim_engine_ptr self) {
  auto& st = self->state;
  if (st.tick_scheduled || st.requests.empty() || !producing(*st.ctl))
    return;
  st.tick_scheduled = true;
  self->delayed_send(self, std::chrono::milliseconds{1}, caf::tick_atom::value);
}

/// Answers the request with what this engine produced, as engine_core::finish.
inline void finish_request(sim_engine_ptr self, std::uint64_t id, finish_reason why) {
  auto& st = self->state;
  auto i = st.requests.find(id);
  if (i == st.requests.end())
    return;
  auto r = std::move(i->second);
  st.requests.erase(i);
  r.out.request_id = id;
  r.out.reason = why;
  r.out.engine = st.ctl->name;
  r.rp.deliver(std::move(r.out));
}

/// One token for every running request, as engine_core::step and emit.
inline void produce(sim_engine_ptr self) {
  auto& st = self->state;
  auto& c = *st.ctl;
  std::vector<std::uint64_t> done;
  for (auto& [id, r] : st.requests) {
    auto index = static_cast<std::uint32_t>(r.req.generated.size() + r.out.tokens.size());
    if (index >= r.req.sampling.max_tokens) {
      done.push_back(id);
      continue;
    }
    token_event ev{id, index, static_cast<std::int32_t>(id * 1000 + index), c.version, false};
    auto local = static_cast<std::uint32_t>(r.out.tokens.size());
    if (r.out.spans.empty() || r.out.spans.back().version != c.version)
      r.out.spans.push_back({c.version, local, local + 1});
    else
      r.out.spans.back().end = local + 1;
    r.out.tokens.push_back(ev.token);
    ++c.tokens;
    if (c.dirty)
      ++c.dirty_tokens;
    self->send(r.sink, token_atom_v, ev);
    if (index + 1 >= r.req.sampling.max_tokens)
      done.push_back(id);
  }
  for (auto id : done)
    finish_request(self, id, finish_reason::length);
}

/// A phase answer: at once, or `slow_ms` later (a straggler). A silenced
/// engine's late answer is lost.
template <class T>
caf::result<T> answer(sim_engine_ptr self, T value) {
  auto& st = self->state;
  if (st.ctl->slow_ms <= 0)
    return value;
  auto rp = self->make_response_promise<T>();
  auto id = st.next_late++;
  st.late.emplace(id, [rp, value]() mutable { rp.deliver(std::move(value)); });
  self->delayed_send(self, std::chrono::milliseconds(st.ctl->slow_ms), late_atom::value, id);
  return rp;
}

/// An unanswered request: the requester meets its own deadline.
template <class T>
caf::result<T> dropped(sim_engine_ptr self) {
  return self->make_response_promise<T>();
}

/// Ends the open session without publishing it: dirty until a complete update.
inline void abort_session(engine_ctl& c) {
  c.in_session = false;
  c.dirty = true;
}

inline sim_engine_actor::behavior_type sim_engine(sim_engine_ptr self, std::shared_ptr<engine_ctl> ctl, world_ptr w) {
  self->state.ctl = ctl;
  self->state.w = w;
  const std::string name = ctl->name;
  auto ack = [self, name] {
    auto& c = *self->state.ctl;
    return phase_ack{name, c.version, c.dirty};
  };
  return {
    [=](pause_atom, const pause_request&) -> caf::result<pause_report> {
      auto& c = *self->state.ctl;
      if (c.silenced)
        return dropped<pause_report>(self);
      c.paused = true; // keep: frozen in place; every token sent so far is in its sink's mailbox
      auto frozen = static_cast<std::uint32_t>(self->state.requests.size());
      return answer(self, pause_report{name, c.version, scheduler_state::paused_all, 0, frozen, 0});
    },
    [=](flush_atom) -> caf::result<phase_ack> {
      if (self->state.ctl->silenced)
        return dropped<phase_ack>(self);
      return answer(self, ack());
    },
    [=](start_atom, std::uint64_t v) -> caf::result<phase_ack> {
      auto& st = self->state;
      auto& c = *st.ctl;
      if (c.silenced)
        return dropped<phase_ack>(self);
      if (!c.paused)
        return make_error(errc::not_paused, name + ": start_update needs a paused, idle engine");
      if (st.transfer)
        return make_error(errc::malformed, name + ": a transfer is in flight");
      if (v < c.version) {
        // As the real engine (engine_core::start_update): never backwards.
        // The same version again is a full re-sync of a rejoining replica.
        ++c.start_refusals;
        auto who = name + "#" + std::to_string(c.incarnation);
        st.w->violation("the coordinator ordered " + who + " to start(" + std::to_string(v) + ") while it holds v"
                        + std::to_string(c.version) + ": backwards");
        return make_error(errc::version_mismatch, name + " holds version " + std::to_string(c.version)
                                                    + ", refuses to go to " + std::to_string(v));
      }
      if (c.in_session)
        abort_session(c); // a new start supersedes an open session
      c.was_dirty = c.dirty;
      c.in_session = true;
      c.session_version = v;
      c.touched = false;
      c.received = false;
      c.dirty = true;
      return answer(self, ack());
    },
    [=](update_atom, const weight_bucket&) -> caf::result<std::uint64_t> {
      return make_error(errc::no_session, "the simulated engine takes no inline buckets");
    },
    [=](transfer_atom, const transfer_order& order, const std::vector<trainer_actor>&) -> caf::result<transfer_report> {
      auto& st = self->state;
      auto& c = *st.ctl;
      if (c.silenced)
        return dropped<transfer_report>(self);
      if (!c.in_session || c.session_version != order.version)
        return make_error(errc::no_session, name + ": transfer of version " + std::to_string(order.version)
                                              + " outside its session");
      if (st.transfer)
        return make_error(errc::malformed, name + ": a transfer is already in flight");
      c.touched = true; // bytes in flight
      st.order = order;
      st.transfer_epoch = st.w->trainer_epoch;
      auto rp = self->make_response_promise<transfer_report>();
      st.transfer = rp;
      self->delayed_send(self, std::chrono::milliseconds(c.transfer_ms), pulled_atom::value, ++st.transfer_seq);
      return rp;
    },
    [=](pulled_atom, std::uint64_t seq) {
      auto& st = self->state;
      auto& c = *st.ctl;
      if (!st.transfer || seq != st.transfer_seq)
        return; // the pull of an abandoned session
      auto rp = *st.transfer;
      st.transfer.reset();
      if (st.transfer_epoch != st.w->trainer_epoch) { // the producer died under the pull
        abort_session(c);
        rp.deliver(make_error(errc::round_aborted, name + ": the trainer went away during the pull"));
        return;
      }
      if (c.fail_transfers > 0) {
        --c.fail_transfers;
        abort_session(c);
        st.w->note(name + "#" + std::to_string(c.incarnation) + " fails its transfer of v"
                   + std::to_string(st.order.version) + " (checksum)");
        rp.deliver(make_error(errc::checksum_mismatch, name + ": group 0 of version "
                                                         + std::to_string(st.order.version)));
        return;
      }
      c.received = true;
      if (c.silenced)
        return; // the bytes arrived; the answer is lost in the partition
      transfer_report rep{name, st.order.version, 1000, 4 /* groups of every simulated version */,
                          static_cast<std::uint64_t>(c.transfer_ms) * 1'000'000};
      if (c.slow_ms > 0) {
        auto id = st.next_late++;
        st.late.emplace(id, [rp, rep]() mutable { rp.deliver(rep); });
        self->delayed_send(self, std::chrono::milliseconds(c.slow_ms), late_atom::value, id);
        return;
      }
      rp.deliver(rep);
    },
    [=](finish_atom, std::uint64_t v) -> caf::result<phase_ack> {
      auto& st = self->state;
      auto& c = *st.ctl;
      if (c.silenced)
        return dropped<phase_ack>(self);
      if (st.transfer)
        return make_error(errc::malformed, name + ": a transfer is in flight");
      if (!c.in_session)
        return make_error(errc::no_session, name + ": finish without start_update");
      if (v != c.session_version)
        return make_error(errc::version_mismatch, name + ": finish(" + std::to_string(v) + ") in the session of "
                                                    + std::to_string(c.session_version));
      if (!c.received) {
        abort_session(c);
        return make_error(errc::update_incomplete, name + ": nothing received");
      }
      c.in_session = false;
      c.version = v;
      c.dirty = false;
      return answer(self, ack());
    },
    [=](resume_atom) -> caf::result<phase_ack> {
      auto& st = self->state;
      auto& c = *st.ctl;
      if (c.silenced)
        return dropped<phase_ack>(self);
      if (c.in_session) { // continue without finish: the round was aborted
        if (st.transfer) {
          st.transfer->deliver(make_error(errc::round_aborted, name + ": the round was aborted"));
          st.transfer.reset();
        }
        c.in_session = false;
        if (!c.touched) // the serving weights were never written
          c.dirty = c.was_dirty;
      }
      c.paused = false;
      schedule_tick(self);
      return answer(self, ack());
    },
    [=](generate_atom, const generate_request& req,
        const token_sink_actor& sink) -> caf::result<generate_result> {
      auto& st = self->state;
      auto& c = *st.ctl;
      if (c.silenced)
        return dropped<generate_result>(self);
      auto id = req.request_id;
      auto who = name + "#" + std::to_string(c.incarnation);
      if (!c.ever_routable)
        st.w->violation("request " + std::to_string(id) + " reached " + who + " before its first completed sync");
      for (std::size_t i = 0; i < req.generated.size(); ++i)
        if (req.generated[i] != static_cast<std::int32_t>(id * 1000 + i)) {
          st.w->violation("request " + std::to_string(id) + " reached " + who + " with generated["
                          + std::to_string(i) + "] = " + std::to_string(req.generated[i]));
          break;
        }
      if (st.requests.count(id)) {
        // As the real engine: the same request again is a newer attempt (the
        // router rerouted it while this engine was cut off and the abort was
        // lost); the old attempt ends here, aborted.
        ++c.duplicate_refusals;
        finish_request(self, id, finish_reason::aborted);
      }
      if (c.dirty && !c.in_session)
        return make_error(errc::engine_dirty, name + " holds no complete weights");
      if (req.generated.size() >= req.sampling.max_tokens) {
        generate_result res;
        res.request_id = id;
        res.engine = name;
        return res;
      }
      auto& r = st.requests[id];
      r.req = req;
      r.sink = sink;
      r.rp = self->make_response_promise<generate_result>();
      schedule_tick(self);
      return r.rp;
    },
    [=](abort_atom, std::uint64_t id) -> caf::result<bool> {
      auto& st = self->state;
      if (st.ctl->silenced)
        return dropped<bool>(self);
      bool found = st.requests.count(id) != 0;
      finish_request(self, id, finish_reason::aborted);
      return found;
    },
    [=](status_atom) -> caf::result<engine_status> {
      auto& c = *self->state.ctl;
      if (c.silenced)
        return dropped<engine_status>(self);
      engine_status s;
      s.name = name;
      s.version = c.version;
      s.dirty = c.dirty;
      s.state = c.paused ? scheduler_state::paused_all : scheduler_state::unpaused;
      s.running = static_cast<std::uint32_t>(self->state.requests.size());
      s.tokens_generated = c.tokens;
      s.dirty_tokens = c.dirty_tokens;
      return s;
    },
    [=](heartbeat_atom, const heartbeat& hb) -> caf::result<heartbeat> {
      if (self->state.ctl->silenced)
        return dropped<heartbeat>(self);
      return heartbeat{name, hb.seq};
    },
    [=](route_atom, const heartbeat_actor&) {}, // every actor of the simulation is local: trusted
    [=](digest_atom) -> caf::result<weight_digest> {
      auto& c = *self->state.ctl;
      if (c.silenced)
        return dropped<weight_digest>(self);
      return weight_digest{name, c.version, c.dirty, {}, {}};
    },
    [=](nccl_dead_atom, std::uint64_t, const std::string&) {}, // ... and waits on no communicator
    [=](nccl_join_atom, const nccl_rendezvous_msg&) -> caf::result<std::uint64_t> { // the simulation moves no weights
      return make_error(errc::unknown_name, name + " joins no nccl communicator");
    },
    [=](phase_atom, const phase_order& order) {
      if (!self->state.ctl->silenced) // partitioned: the order is lost
        serve_phase_order(self, self->state.phase_orders, order);
    },
    [=](caf::tick_atom) {
      self->state.tick_scheduled = false;
      if (producing(*self->state.ctl))
        produce(self);
      schedule_tick(self);
    },
    [=](silence_atom, bool on) {
      self->state.ctl->silenced = on;
      schedule_tick(self);
    },
    [=](late_atom, std::uint64_t id) {
      auto& st = self->state;
      auto i = st.late.find(id);
      if (i == st.late.end())
        return;
      auto send = std::move(i->second);
      st.late.erase(i);
      if (!st.ctl->silenced)
        send();
    },
  };
}

// -- client: one per request, its own token sink --------------------------------------

inline void on_token(world& w, request_record& rec, const token_event& ev) {
  auto id = rec.req.request_id;
  auto what = "request " + std::to_string(id) + ": token " + std::to_string(ev.index);
  if (rec.answers > 0)
    w.violation(what + " arrived after the answer");
  if (ev.request_id != id)
    w.violation(what + " of request " + std::to_string(ev.request_id) + " at its sink");
  else if (ev.index != rec.stream.size())
    w.violation(what + " arrived when " + std::to_string(rec.stream.size())
                + " tokens had (a gap, a duplicate or out of order)");
  else if (ev.token != static_cast<std::int32_t>(id * 1000 + ev.index))
    w.violation(what + " is " + std::to_string(ev.token));
  rec.stream.push_back(ev);
}

/// Invariant 2, as the answer arrives: the client's sink has every token of
/// the result already (the router answers after the relay closed).
inline void on_result(world& w, request_record& rec, const generate_result& res) {
  auto id = rec.req.request_id;
  auto what = "request " + std::to_string(id) + ": ";
  if (++rec.answers > 1)
    w.violation(what + "answered " + std::to_string(rec.answers) + " times");
  rec.result = res;
  if (res.request_id != id)
    w.violation(what + "result for request " + std::to_string(res.request_id));
  std::vector<std::int32_t> streamed;
  for (auto& ev : rec.stream)
    streamed.push_back(ev.token);
  if (res.tokens != streamed)
    w.violation(what + "result has " + std::to_string(res.tokens.size()) + " tokens, its sink got "
                + std::to_string(streamed.size()) + " (or others)");
  if (auto why = check(res); !why.empty())
    w.violation(what + why);
  for (auto& s : res.spans)
    for (auto i = s.begin; i < s.end && i < rec.stream.size(); ++i)
      if (rec.stream[i].version != s.version) {
        w.violation(what + "span [" + std::to_string(s.begin) + ", " + std::to_string(s.end) + ") says v"
                    + std::to_string(s.version) + ", token " + std::to_string(i) + " came with v"
                    + std::to_string(rec.stream[i].version));
        break;
      }
  switch (res.reason) {
    case finish_reason::length:
      if (res.tokens.size() != rec.req.sampling.max_tokens)
        w.violation(what + "length with " + std::to_string(res.tokens.size()) + " of "
                    + std::to_string(rec.req.sampling.max_tokens) + " tokens");
      break;
    case finish_reason::failed: // explicit: the router gave up on it (reroutes, deadline)
      w.note(what + "failed after " + std::to_string(res.tokens.size()) + " tokens");
      break;
    default:
      w.violation(what + "finished with reason " + to_string(res.reason));
  }
}

inline void on_error(world& w, request_record& rec, const caf::error& err, const std::string& text) {
  auto what = "request " + std::to_string(rec.req.request_id) + ": ";
  if (++rec.answers > 1)
    w.violation(what + "answered " + std::to_string(rec.answers) + " times");
  rec.error = err;
  rec.error_text = text;
  if (!is(err, errc::not_routable) && !is(err, errc::queue_full))
    w.violation(what + "error that is no explicit rejection: " + text);
  else if (!rec.stream.empty())
    w.violation(what + "rejected after " + std::to_string(rec.stream.size()) + " tokens reached its sink");
  else
    w.note(what + "rejected: " + text);
}

inline caf::behavior sim_client(caf::event_based_actor* self, router_actor router, world_ptr w,
                         std::shared_ptr<request_record> rec) {
  self->request(router, caf::infinite, generate_atom_v, rec->req, caf::actor_cast<token_sink_actor>(self))
    .then([=](generate_result& res) { on_result(*w, *rec, res); },
          [=](caf::error& err) { on_error(*w, *rec, err, self->system().render(err)); });
  // It stays until the end: a token after the answer would be a violation.
  return {
    [=](token_atom, const token_event& ev) { on_token(*w, *rec, ev); },
  };
}

} // namespace rlsync::test::sim
