// A deterministic simulation, FoundationDB style: the real router and the
// real coordinator run on CAF's test coordinator (one thread, simulated
// time), with scripted fake engines, a fake trainer and one client per
// request. A fault plan drawn from a seed kills, restarts, partitions
// (silences) and slows engines, fails their transfers, and kills and
// restarts the trainer — at moments in time and as phases of chosen rounds
// are sent. Then everything heals, one last version is published, time runs
// until the system is quiet, and check() asserts DESIGN §6's invariants:
//
//   1. every request answered exactly once: a result, or an explicit
//      not_routable / queue_full;
//   2. every result equals its token stream: indices 0..n-1, no gap, no
//      duplicate, no token after the answer; spans contiguous, each with the
//      version of the tokens it covers;
//   3. every live member routable at the coordinator's version, and the
//      fake behind it really holds that version, clean and unpaused;
//   4. no token with a version no round (or a wave of one) completed (nor
//      version 0, which every engine starts with), none produced while
//      dirty, and no generate reaching an incarnation before its first
//      completed sync;
//   5. restarted and healed engines are current (3 covers them).
//
// Along the way: between rounds, every engine the coordinator has routable
// holds the version it says, clean; the coordinator never orders start(v)
// below the version an engine holds (the same version is a re-sync); and
// messages never go round without simulated time passing (a livelock is
// reported, not hung on).
//
// A failing seed prints its fault plan as it ran and the coordinator's log.
// Replay one seed, with its whole log:
//   RLSYNC_SIM_SEED=<seed> test_actors -tc='simulation:*'
// RLSYNC_SIM_SEEDS=<n> runs n seeds instead of the default; RLSYNC_SIM_VERBOSE=1
// prints every run's log and a summary.
//
// The fakes follow the real engine (actors/rollout_engine.cpp,
// runtime/engine/engine_core.cpp): pause(keep) freezes and answers at once;
// start(v) opens a session and makes the engine dirty until finish(v) or a
// resume that abandons an untouched session; transfer takes a few simulated
// milliseconds and fails if the trainer died meanwhile; a generate on a
// dirty engine outside a session is refused; a generate for a request id
// the engine still holds is a newer attempt that ends the old one; one token per running
// request per simulated millisecond, unless paused, dirty or silenced;
// token i of request r is r*1000+i. A silenced engine drops every message
// unanswered (as the real engine's partition drill does) and produces
// nothing; a slow one answers phases late.
#include "actors/coordinator.hpp"
#include "actors/router.hpp"
#include "actors/system_config.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace rlsync;
using namespace std::chrono_literals;

namespace {

// -- the world the fakes and the checks share (one thread: no locks) ---------------

/// One incarnation of an engine replica: the fake's state, kept here so that
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

// -- fake engine ---------------------------------------------------------------------

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

bool producing(const engine_ctl& c) {
  return c.alive && !c.silenced && !c.paused && !c.dirty;
}

void schedule_tick(sim_engine_ptr self) {
  auto& st = self->state;
  if (st.tick_scheduled || st.requests.empty() || !producing(*st.ctl))
    return;
  st.tick_scheduled = true;
  self->delayed_send(self, 1ms, caf::tick_atom::value);
}

/// Answers the request with what this engine produced, as engine_core::finish.
void finish_request(sim_engine_ptr self, std::uint64_t id, finish_reason why) {
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
void produce(sim_engine_ptr self) {
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
void abort_session(engine_ctl& c) {
  c.in_session = false;
  c.dirty = true;
}

sim_engine_actor::behavior_type sim_engine(sim_engine_ptr self, std::shared_ptr<engine_ctl> ctl, world_ptr w) {
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
    [=](transfer_atom, const transfer_order& order) -> caf::result<transfer_report> {
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
    [=](digest_atom) -> caf::result<weight_digest> {
      auto& c = *self->state.ctl;
      if (c.silenced)
        return dropped<weight_digest>(self);
      return weight_digest{name, c.version, c.dirty, {}, {}};
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

// -- fake trainer --------------------------------------------------------------------

/// A trainer the test makes publish.
using sim_trainer_actor = trainer_actor::extend<
  // publish this version to every subscriber
  caf::reacts_to<caf::publish_atom, version_info>>;

struct sim_trainer_state {
  version_info current;
  std::vector<version_listener_actor> listeners;
  static inline const char* name = "sim-trainer";
};

sim_trainer_actor::behavior_type
sim_trainer(sim_trainer_actor::stateful_pointer<sim_trainer_state> self, version_info current) {
  self->state.current = current;
  return {
    [=](meta_atom) { return std::vector<tensor_meta>{}; },
    [=](version_atom) { return self->state.current; },
    [=](pull_atom, std::uint64_t, std::uint32_t) -> caf::result<weight_bucket> {
      return make_error(errc::unknown_name, "the simulated trainer holds no bytes");
    },
    [=](subscribe_atom, const version_listener_actor& l) { self->state.listeners.push_back(l); },
    [=](freeze_atom) { return self->state.current; },
    [=](pin_atom, std::uint64_t) {},
    [=](step_atom) { return self->state.current; },
    [=](heartbeat_atom, const heartbeat& hb) { return hb; },
    [=](caf::publish_atom, const version_info& vi) {
      self->state.current = vi;
      for (auto& l : self->state.listeners)
        self->send(l, version_atom::value, vi);
    },
  };
}

// -- client: one per request, its own token sink --------------------------------------

void on_token(world& w, request_record& rec, const token_event& ev) {
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
void on_result(world& w, request_record& rec, const generate_result& res) {
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

void on_error(world& w, request_record& rec, const caf::error& err, const std::string& text) {
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

caf::behavior sim_client(caf::event_based_actor* self, router_actor router, world_ptr w,
                         std::shared_ptr<request_record> rec) {
  self->request(router, caf::infinite, generate_atom_v, rec->req, caf::actor_cast<token_sink_actor>(self))
    .then([=](generate_result& res) { on_result(*w, *rec, res); },
          [=](caf::error& err) { on_error(*w, *rec, err, self->system().render(err)); });
  // It stays until the end: a token after the answer would be a violation.
  return {
    [=](token_atom, const token_event& ev) { on_token(*w, *rec, ev); },
  };
}

// -- the fault plan ------------------------------------------------------------------

enum class fault_kind { publish, kill_engine, silence, slow, bad_transfer, kill_trainer };

const char* to_string(fault_kind k) {
  switch (k) {
    case fault_kind::publish: return "publish";
    case fault_kind::kill_engine: return "kill engine";
    case fault_kind::silence: return "silence engine";
    case fault_kind::slow: return "slow engine";
    case fault_kind::bad_transfer: return "bad transfer";
    case fault_kind::kill_trainer: return "kill trainer";
  }
  return "?";
}

struct fault {
  fault_kind kind = fault_kind::publish;
  std::int64_t at_ms = -1;    ///< timed; -1: fires as `phase` of round `at_round` is sent
  std::uint64_t at_round = 0;
  sync_phase phase = sync_phase::pause;
  std::uint32_t target = 0;   ///< an engine, modulo those eligible then
  /// silence, slow: how long; kills: until the restart (-1: not before the end)
  std::int64_t duration_ms = 0;
  std::int64_t delay_ms = 0;  ///< slow: how late each phase answer is
  bool keep_version = false;  ///< a restarted engine comes back with the version it held
  bool fired = false;

  std::string to_string() const {
    std::string s = at_ms >= 0 ? "at " + std::to_string(at_ms) + " ms"
                               : "at round " + std::to_string(at_round) + " " + std::string{rlsync::to_string(phase)};
    s += ": " + std::string{::to_string(kind)};
    if (kind != fault_kind::publish && kind != fault_kind::kill_trainer)
      s += " #" + std::to_string(target);
    if (kind == fault_kind::silence || kind == fault_kind::slow)
      s += " for " + std::to_string(duration_ms) + " ms";
    if (kind == fault_kind::slow)
      s += ", answers " + std::to_string(delay_ms) + " ms late";
    if (kind == fault_kind::kill_engine || kind == fault_kind::kill_trainer)
      s += duration_ms < 0 ? ", back at the end" : ", back after " + std::to_string(duration_ms) + " ms";
    if (kind == fault_kind::kill_engine && keep_version)
      s += " holding its version";
    return s;
  }
};

struct request_plan {
  std::int64_t at_ms = 0;
  generate_request req;
};

/// Everything a seed decides, drawn up front (rng() % n: the same on every
/// standard library, unlike the distributions).
struct plan {
  std::uint64_t seed = 0;
  std::uint32_t engines = 3;
  std::int64_t plan_ms = 800;
  std::int64_t max_restarts = 3;
  std::int64_t wave_size = 0; ///< sync.wave_size: 0 = every engine at once
  std::vector<std::int64_t> transfer_ms; ///< per engine incarnation, drawn in order
  std::vector<fault> faults;
  std::vector<request_plan> requests;

  std::string to_string() const {
    std::string s = "seed " + std::to_string(seed) + ": " + std::to_string(engines) + " engines, "
                    + std::to_string(requests.size()) + " requests over " + std::to_string(plan_ms)
                    + " ms, sync.max_restarts " + std::to_string(max_restarts) + ", sync.wave_size "
                    + std::to_string(wave_size) + "\n";
    for (auto& f : faults)
      if (f.kind != fault_kind::publish)
        s += "  " + f.to_string() + "\n";
    return s;
  }
};

plan make_plan(std::uint64_t seed) {
  std::mt19937_64 rng{seed};
  auto pick = [&](std::uint64_t n) { return static_cast<std::int64_t>(rng() % n); };
  plan p;
  p.seed = seed;
  p.engines = 2 + static_cast<std::uint32_t>(pick(3));
  p.plan_ms = 800;
  p.max_restarts = 1 + pick(4);
  for (int i = 0; i < 64; ++i)
    p.transfer_ms.push_back(2 + pick(19));
  for (std::int64_t t = 0; (t += 40 + pick(140)) < p.plan_ms - 50;) {
    fault f;
    f.at_ms = t;
    p.faults.push_back(f);
  }
  auto engine_fault = [&](fault& f) {
    // kill 30%, silence 30%, slow 15%, bad transfer 15%, trainer 10%
    auto k = pick(100);
    f.kind = k < 30 ? fault_kind::kill_engine
           : k < 60 ? fault_kind::silence
           : k < 75 ? fault_kind::slow
           : k < 90 ? fault_kind::bad_transfer
                    : fault_kind::kill_trainer;
    f.target = static_cast<std::uint32_t>(pick(16));
    switch (f.kind) {
      case fault_kind::kill_engine:
        f.duration_ms = pick(5) == 0 ? -1 : 10 + pick(300);
        f.keep_version = pick(4) == 0;
        break;
      case fault_kind::silence: // a third stay below the heartbeat timeout
        f.duration_ms = pick(3) == 0 ? 3 + pick(40) : 60 + pick(250);
        break;
      case fault_kind::slow:
        f.duration_ms = 20 + pick(200);
        f.delay_ms = 20 + pick(180); // phase deadlines are 100 ms (transfer 200)
        break;
      case fault_kind::kill_trainer:
        f.duration_ms = pick(6) == 0 ? -1 : 5 + pick(250);
        break;
      default:
        break;
    }
  };
  for (auto n = 3 + pick(6); n > 0; --n) {
    fault f;
    f.at_ms = 30 + pick(static_cast<std::uint64_t>(p.plan_ms - 130));
    engine_fault(f);
    p.faults.push_back(f);
  }
  for (auto n = pick(4); n > 0; --n) {
    fault f;
    f.at_round = 2 + static_cast<std::uint64_t>(pick(8));
    f.phase = static_cast<sync_phase>(pick(6));
    engine_fault(f);
    p.faults.push_back(f);
  }
  std::stable_sort(p.faults.begin(), p.faults.end(),
                   [](const fault& a, const fault& b) { return a.at_ms < b.at_ms; });
  for (auto n = 25 + pick(30), i = std::int64_t{1}; i <= n; ++i) {
    request_plan r;
    r.at_ms = 10 + pick(static_cast<std::uint64_t>(p.plan_ms - 150));
    r.req.request_id = static_cast<std::uint64_t>(i);
    r.req.prompt = {1, 2, static_cast<std::int32_t>(i % 50)};
    r.req.sampling.max_tokens = 4 + static_cast<std::uint32_t>(pick(37));
    p.requests.push_back(r);
  }
  // Drawn last, so that the draws above stay what they were for every seed.
  p.wave_size = pick(3) == 0 ? 1 + pick(2) : 0;
  return p;
}

// -- the simulation --------------------------------------------------------------------

/// What one seed's run left behind.
struct run_result {
  std::vector<std::string> violations;
  std::string report; ///< the plan, the fault log and the coordinator's log
  outcome_counts counts;
  std::string fingerprint; ///< every answer and the log: equal for equal seeds
};

class simulation {
public:
  simulation(plan p, bool echo)
    : sys_(init(cfg_)),
      sched_(dynamic_cast<caf::scheduler::test_coordinator&>(sys_.scheduler())),
      plan_(std::move(p)),
      w_(std::make_shared<world>()) {
    w_->echo = echo;
    if (echo)
      std::cerr << plan_.to_string();
  }

  ~simulation() {
    // Every actor must be gone before ~actor_system. The router first, so it
    // answers its clients; then everyone else.
    if (router_)
      caf::anon_send_exit(router_, caf::exit_reason::user_shutdown);
    sched_.run(job_limit);
    for (auto& a : tracked_)
      caf::anon_send_exit(a, caf::exit_reason::kill);
    for (int i = 0; i < 100 && (sched_.has_job() || sched_.has_pending_timeout()); ++i) {
      sched_.run(job_limit);
      sched_.trigger_timeouts();
    }
  }

  simulation(const simulation&) = delete;
  simulation& operator=(const simulation&) = delete;

  run_result run() {
    start();
    for (auto& r : plan_.requests)
      agenda_.emplace(r.at_ms, [this, r] { submit(r.req); });
    for (auto& f : plan_.faults)
      if (f.at_ms >= 0)
        agenda_.emplace(f.at_ms, [this, &f] { fire(f, {}); });
    for (; w_->now_ms < plan_.plan_ms && !livelock_; step())
      do_due();
    if (!livelock_)
      heal();
    auto quiet = !livelock_ && drain();
    if (!livelock_)
      check(quiet);
    return result();
  }

private:
  static caf::actor_system_config& init(caf::actor_system_config& c) {
    c.set("scheduler.policy", caf::atom("testing"));
    c.set("logger.file-verbosity", caf::atom("quiet"));
    register_rlsync_types(c);
    return c;
  }

  template <class... Ts>
  auto spawn(Ts&&... xs) {
    auto handle = sys_.spawn(std::forward<Ts>(xs)...);
    tracked_.push_back(caf::actor_cast<caf::actor>(handle));
    return handle;
  }

  template <class T>
  using slot = std::shared_ptr<std::optional<caf::expected<T>>>;

  /// A request from a throwaway client; the answer lands in the slot once
  /// the scheduler has run.
  template <class T, class Handle, class... Ts>
  slot<T> request(const Handle& dst, Ts... xs) {
    auto out = std::make_shared<std::optional<caf::expected<T>>>();
    sys_.spawn([=](caf::event_based_actor* self) {
      self->request(dst, std::chrono::seconds(3600), xs...)
        .then([=](T& x) { *out = std::move(x); }, [=](caf::error& err) { *out = std::move(err); });
    });
    return out;
  }

  template <class T, class Handle, class... Ts>
  std::optional<T> ask(const Handle& dst, Ts... xs) {
    auto out = request<T>(dst, xs...);
    run_jobs();
    if (!out->has_value() || !**out)
      return std::nullopt;
    return ***out;
  }

  /// Jobs one simulated millisecond may take (a busy one takes a few
  /// hundred); more is a livelock (messages going round without time
  /// passing), reported rather than hung on.
  static constexpr std::size_t job_limit = 10'000;

  /// Runs what is queued, within job_limit.
  void run_jobs() {
    if (livelock_)
      return;
    if (sched_.run(job_limit) == job_limit && sched_.has_job()) {
      livelock_ = true;
      w_->violation("livelock: " + std::to_string(job_limit)
                    + " jobs ran without simulated time passing");
    }
  }

  /// One simulated millisecond: time moves, what is due fires and runs.
  void step() {
    if (livelock_)
      return;
    sched_.advance_time(1ms);
    run_jobs();
    ++w_->now_ms;
    settle_registrations();
    if (!round_open_ && (audit_due_ || w_->now_ms % 25 == 0))
      audit();
  }

  /// Between rounds, what the coordinator says of every routable member is
  /// what that engine holds: its version, clean. (Mid-round it may differ:
  /// an engine holds the new version from finish until the round ends.)
  void audit() {
    audit_due_ = false;
    auto s = ask<coordinator_status>(coordinator_, status_atom::value);
    if (!s || round_open_)
      return;
    std::set<std::string> routable(s->routable.begin(), s->routable.end());
    for (auto& m : s->members) {
      if (!routable.count(m.name))
        continue;
      auto& ctl = *w_->engines.at(m.name);
      if (ctl.incarnation != m.incarnation || !ctl.alive || ctl.dirty || ctl.version != m.version || m.dirty)
        w_->violation("between rounds the coordinator has " + m.name + "#" + std::to_string(m.incarnation)
                      + " routable at v" + std::to_string(m.version) + (m.dirty ? " dirty" : "") + "; "
                      + m.name + "#" + std::to_string(ctl.incarnation) + " holds v" + std::to_string(ctl.version)
                      + (ctl.dirty ? " dirty" : "") + (ctl.alive ? "" : " and is dead"));
    }
  }

  void do_due() {
    while (!agenda_.empty() && agenda_.begin()->first <= w_->now_ms) {
      auto job = std::move(agenda_.begin()->second);
      agenda_.erase(agenda_.begin());
      job();
      run_jobs();
    }
  }

  // -- setup ------------------------------------------------------------------

  void start() {
    auto w = w_;
    router_config rc;
    rc.queue_deadline = 2000ms;
    rc.engine_deadline = 1000ms;
    rc.control_deadline = 100ms;
    rc.log = [w](const std::string& line) { w->add(w->router_log, line); };
    router_ = caf::actor_cast<router_actor>(spawn(rlsync::router, rc));
    trainer_ = spawn(sim_trainer, version_info{++latest_, 4, 4096});
    coordinator_config c;
    c.router = router_;
    c.trainer = caf::actor_cast<trainer_actor>(trainer_);
    c.trainer_deadline = 20ms;
    c.heartbeat_interval = 10ms;
    c.heartbeat_timeout = 50ms;
    c.sync.deadlines = sync_deadlines{100ms, 100ms, 100ms, 200ms, 100ms, 100ms};
    c.sync.every_versions = 1;
    c.sync.min_live_engines = 1;
    c.sync.max_restarts = plan_.max_restarts;
    c.sync.wave_size = plan_.wave_size;
    c.log = [w](const std::string& line) { w->add(w->coordinator_log, line); };
    c.on_report = [this, w](const sync_report& r) {
      round_open_ = false;
      audit_due_ = true;
      ++w->counts.rounds;
      w->counts.evictions += r.evicted.size();
      if (r.aborted) {
        ++w->counts.aborted_rounds;
        w->aborted.insert(r.version);
        if (r.engines_synced > 0) // waves that ended before the abort hold the whole version
          w->completed.insert(r.version);
      } else {
        w->completed.insert(r.version);
        if (r.engines_synced == 0)
          ++w->counts.empty_rounds;
      }
    };
    c.on_member = [w](const std::string& engine, const std::string& what) {
      if (what == "routable")
        if (auto i = w->engines.find(engine); i != w->engines.end())
          i->second->ever_routable = true;
    };
    c.on_phase = [this](std::uint64_t round, std::uint64_t, sync_phase phase,
                        const std::vector<std::string>& engines) {
      round_open_ = true;
      if (!faults_on_)
        return;
      for (auto& f : plan_.faults)
        if (f.at_ms < 0 && !f.fired && f.at_round == round && f.phase == phase)
          fire(f, engines);
    };
    coordinator_ = spawn(rlsync::coordinator, std::move(c));
    run_jobs();
    for (std::uint32_t i = 0; i < plan_.engines; ++i)
      launch("e" + std::to_string(i), 0, 0);
    run_jobs();
    settle_registrations();
  }

  /// Spawns an incarnation of `name` and registers it with the coordinator.
  void launch(const std::string& name, std::uint64_t incarnation, std::uint64_t version) {
    auto ctl = std::make_shared<engine_ctl>();
    ctl->name = name;
    ctl->incarnation = incarnation;
    ctl->version = version;
    ctl->transfer_ms = plan_.transfer_ms[launched_++ % plan_.transfer_ms.size()];
    w_->engines[name] = ctl;
    w_->incarnations.push_back(ctl);
    auto h = spawn(sim_engine, ctl, w_);
    handles_[name] = h;
    auto reg = request<registration>(coordinator_, register_atom::value,
                                     engine_info{name, "node-" + name, 1, version, false, incarnation},
                                     caf::actor_cast<rollout_engine_actor>(h));
    registrations_.push_back({ctl, reg});
  }

  void settle_registrations() {
    for (auto i = registrations_.begin(); i != registrations_.end();) {
      auto& [ctl, reg] = *i;
      if (!reg->has_value()) {
        ++i;
        continue;
      }
      auto who = ctl->name + "#" + std::to_string(ctl->incarnation);
      if (!**reg) {
        auto err = (**reg).error();
        if (is(err, errc::evicted)) {
          w_->note(who + " refused: " + sys_.render(err));
          ++w_->counts.retired;
          retired_.insert(ctl->name);
        } else {
          w_->violation(who + ": registration failed: " + sys_.render(err));
        }
        ctl->alive = false;
        caf::anon_send_exit(handles_[ctl->name], caf::exit_reason::kill);
      } else if ((**reg)->routable) {
        w_->violation(who + " routable at registration, before any sync");
      }
      i = registrations_.erase(i);
    }
  }

  void submit(const generate_request& req) {
    auto rec = std::make_shared<request_record>();
    rec->req = req;
    w_->requests[req.request_id] = rec;
    spawn(sim_client, router_, w_, rec);
  }

  // -- faults -----------------------------------------------------------------

  std::vector<std::string> alive_engines() const {
    std::vector<std::string> out;
    for (auto& [name, ctl] : w_->engines)
      if (ctl->alive)
        out.push_back(name);
    return out;
  }

  /// Fires `f`; `in_round`: the engines of the round whose phase fires it
  /// (empty for a timed fault: every live engine may be hit).
  void fire(fault& f, const std::vector<std::string>& in_round) {
    f.fired = true;
    if (!faults_on_)
      return;
    auto& w = *w_;
    if (f.kind == fault_kind::publish) {
      publish();
      return;
    }
    if (f.kind == fault_kind::kill_trainer) {
      if (!trainer_alive_) {
        w.note("(" + f.to_string() + ": the trainer is down already)");
        return;
      }
      w.note(f.to_string());
      ++w.counts.trainer_kills;
      caf::anon_send_exit(trainer_, caf::exit_reason::kill);
      trainer_alive_ = false;
      ++w.trainer_epoch;
      if (f.duration_ms >= 0)
        agenda_.emplace(w.now_ms + f.duration_ms, [this] { restart_trainer(); });
      return;
    }
    auto alive = alive_engines();
    std::vector<std::string> eligible;
    for (auto& name : in_round.empty() ? alive : in_round)
      if (w.engines.count(name) && w.engines[name]->alive)
        eligible.push_back(name);
    if (eligible.empty()) {
      w.note("(" + f.to_string() + ": no engine to hit)");
      return;
    }
    auto name = eligible[f.target % eligible.size()];
    auto ctl = w.engines[name];
    auto who = name + "#" + std::to_string(ctl->incarnation);
    std::size_t unsilenced = 0;
    for (auto& n : alive)
      unsilenced += w.engines[n]->silenced ? 0 : 1;
    switch (f.kind) {
      case fault_kind::kill_engine: {
        if (alive.size() < 2) { // keep one engine alive
          w.note("(" + f.to_string() + ": " + who + " is the last one alive)");
          return;
        }
        w.note(f.to_string() + " -> kill " + who);
        ++w.counts.kills;
        ctl->alive = false;
        caf::anon_send_exit(handles_[name], caf::exit_reason::kill);
        if (f.duration_ms >= 0) {
          auto keep = f.keep_version;
          agenda_.emplace(w.now_ms + f.duration_ms, [this, name, keep] { restart_engine(name, keep); });
        }
        return;
      }
      case fault_kind::silence: {
        if (ctl->silenced || unsilenced < 2) {
          w.note("(" + f.to_string() + ": " + who + (ctl->silenced ? " is silent already)" : " is the last one heard)"));
          return;
        }
        w.note(f.to_string() + " -> silence " + who);
        ++w.counts.silences;
        caf::anon_send(handles_[name], silence_atom::value, true);
        ctl->silenced = true; // at once: a second silence must not pick it
        auto h = handles_[name];
        agenda_.emplace(w.now_ms + f.duration_ms, [this, h, ctl, who] {
          if (!ctl->alive || !ctl->silenced)
            return;
          w_->note("heal " + who);
          caf::anon_send(h, silence_atom::value, false);
        });
        return;
      }
      case fault_kind::slow: {
        w.note(f.to_string() + " -> " + who + " answers " + std::to_string(f.delay_ms) + " ms late");
        ++w.counts.slows;
        ctl->slow_ms = f.delay_ms;
        agenda_.emplace(w.now_ms + f.duration_ms, [ctl] { ctl->slow_ms = 0; });
        return;
      }
      case fault_kind::bad_transfer:
        w.note(f.to_string() + " -> " + who + "'s next transfer fails");
        ++w.counts.bad_transfers;
        ++ctl->fail_transfers;
        return;
      default:
        return;
    }
  }

  void publish() {
    if (!trainer_alive_) {
      w_->note("(no version published: the trainer is down)");
      return;
    }
    ++latest_;
    ++w_->counts.publishes;
    w_->note("publish v" + std::to_string(latest_));
    caf::anon_send(trainer_, caf::publish_atom::value, version_info{latest_, 4, 4096});
  }

  void restart_engine(const std::string& name, bool keep_version) {
    auto old = w_->engines.at(name);
    if (old->alive || retired_.count(name))
      return;
    ++w_->counts.restarts;
    auto version = keep_version ? old->version : 0;
    w_->note("restart " + name + "#" + std::to_string(old->incarnation + 1) + " holding v" + std::to_string(version));
    launch(name, old->incarnation + 1, version);
  }

  void restart_trainer() {
    if (trainer_alive_)
      return;
    // It comes back from its checkpoint: the last version it published.
    trainer_ = spawn(sim_trainer, version_info{latest_, 4, 4096});
    trainer_alive_ = true;
    w_->note("restart the trainer at v" + std::to_string(latest_));
    caf::anon_send(coordinator_, register_atom::value, caf::actor_cast<trainer_actor>(trainer_));
  }

  // -- the end: heal, last version, quiet ------------------------------------------------------

  void heal() {
    faults_on_ = false;
    agenda_.clear();
    w_->note("heal everything");
    for (auto& [name, ctl] : w_->engines) {
      ctl->slow_ms = 0;
      ctl->fail_transfers = 0;
      if (ctl->alive && ctl->silenced)
        caf::anon_send(handles_[name], silence_atom::value, false);
    }
    restart_trainer();
    for (auto& name : alive_or_dead_names())
      restart_engine(name, false);
    run_jobs();
    for (int i = 0; i < 20; ++i)
      step();
    publish();
    final_version_ = latest_;
    run_jobs();
  }

  std::vector<std::string> alive_or_dead_names() const {
    std::vector<std::string> out;
    for (auto& [name, ctl] : w_->engines)
      out.push_back(name);
    return out;
  }

  bool answered_all() const {
    for (auto& [id, rec] : w_->requests)
      if (rec->answers == 0)
        return false;
    return true;
  }

  /// Runs until every request is answered and every engine is current at the
  /// last version, for at most 4 s of simulated time. Returns whether it got there.
  bool drain() {
    const std::int64_t limit = w_->now_ms + 4000;
    while (w_->now_ms < limit && !livelock_) {
      for (int i = 0; i < 10; ++i)
        step();
      if (!answered_all() || !registrations_.empty())
        continue;
      auto s = ask<coordinator_status>(coordinator_, status_atom::value);
      auto r = ask<router_status>(router_, status_atom::value);
      if (!s || !r || s->version != final_version_ || s->routable.size() != s->members.size()
          || r->queued != 0 || r->outstanding != 0)
        continue;
      w_->counts.quiet_after_ms = w_->now_ms - plan_.plan_ms;
      return true;
    }
    return false;
  }

  // -- check ---------------------------------------------------------------------------

  void check(bool quiet) {
    auto& w = *w_;
    if (!quiet)
      w.violation("not quiet 4 s after the faults ended (a request unanswered, an engine not current, "
                  "or the router still busy)");
    // 1. every request answered exactly once (2 was checked as each answer came)
    for (auto& [id, rec] : w.requests) {
      ++w.counts.requests;
      if (rec->answers != 1) {
        w.violation("request " + std::to_string(id) + " answered " + std::to_string(rec->answers) + " times");
        continue;
      }
      if (rec->result) {
        (rec->result->reason == finish_reason::failed ? w.counts.failed : w.counts.length) += 1;
      } else if (rec->error && is(*rec->error, errc::queue_full)) {
        ++w.counts.queue_full;
      } else {
        ++w.counts.not_routable;
      }
      // 4. every token's version is one a round completed at
      for (auto& ev : rec->stream) {
        ++w.counts.tokens;
        if (ev.version == 0 || w.completed.count(ev.version) == 0) {
          w.violation("request " + std::to_string(id) + ": token " + std::to_string(ev.index) + " with v"
                      + std::to_string(ev.version) + ", which no round completed"
                      + (w.aborted.count(ev.version) ? " (its round was aborted)" : ""));
          break;
        }
      }
    }
    // 4. no token produced while dirty
    for (auto& ctl : w.incarnations) {
      if (ctl->dirty_tokens != 0)
        w.violation(ctl->name + "#" + std::to_string(ctl->incarnation) + " produced "
                    + std::to_string(ctl->dirty_tokens) + " tokens while dirty");
      w.counts.duplicate_refusals += ctl->duplicate_refusals;
      w.counts.start_refusals += ctl->start_refusals;
    }
    // 3, 5. every live member routable at the coordinator's version, and
    // really holding it; every replica not retired is a member.
    auto s = ask<coordinator_status>(coordinator_, status_atom::value);
    auto r = ask<router_status>(router_, status_atom::value);
    if (!s || !r) {
      w.violation("the coordinator or the router did not answer status");
      return;
    }
    w.counts.reroutes = r->rerouted;
    if (s->version != final_version_)
      w.violation("the coordinator is at v" + std::to_string(s->version) + ", the last version is v"
                  + std::to_string(final_version_));
    std::set<std::string> routable(s->routable.begin(), s->routable.end());
    std::set<std::string> members;
    for (auto& m : s->members) {
      members.insert(m.name);
      auto ctl = w.engines.at(m.name);
      auto who = m.name + "#" + std::to_string(ctl->incarnation);
      if (m.incarnation != ctl->incarnation)
        w.violation(m.name + ": the coordinator has incarnation " + std::to_string(m.incarnation) + ", "
                    + who + " runs");
      if (!routable.count(m.name))
        w.violation(who + " is a member but not routable");
      if (m.version != s->version || m.dirty)
        w.violation(who + ": the coordinator says v" + std::to_string(m.version) + (m.dirty ? " dirty" : ""));
      if (!ctl->alive || ctl->silenced || ctl->paused || ctl->dirty || ctl->in_session
          || ctl->version != s->version)
        w.violation(who + " really holds v" + std::to_string(ctl->version) + (ctl->alive ? "" : ", dead")
                    + (ctl->silenced ? ", silent" : "") + (ctl->paused ? ", paused" : "")
                    + (ctl->dirty ? ", dirty" : "") + (ctl->in_session ? ", in a session" : ""));
    }
    if (!s->unreachable.empty())
      w.violation(std::to_string(s->unreachable.size()) + " members still unreachable");
    for (auto& [name, ctl] : w.engines)
      if (!retired_.count(name) && !members.count(name))
        w.violation(name + " is neither a member nor retired");
    std::set<std::string> retired(s->retired.begin(), s->retired.end());
    if (retired != retired_)
      w.violation("the coordinator retired " + std::to_string(retired.size()) + " replicas, the test saw "
                  + std::to_string(retired_.size()) + " refused");
    if (r->routable != routable.size() || r->queued != 0 || r->outstanding != 0)
      w.violation("the router has " + std::to_string(r->routable) + " routable, " + std::to_string(r->queued)
                  + " queued, " + std::to_string(r->outstanding) + " outstanding; the coordinator "
                  + std::to_string(routable.size()) + " routable");
  }

  run_result result() {
    auto& w = *w_;
    run_result out;
    out.violations = w.violations;
    out.counts = w.counts;
    std::ostringstream os;
    os << plan_.to_string() << "fault log:\n";
    for (auto& line : w.log)
      os << "  " << line << "\n";
    os << "coordinator log:\n";
    for (auto& line : w.coordinator_log)
      os << "  " << line << "\n";
    os << "router log:\n";
    for (auto& line : w.router_log)
      os << "  " << line << "\n";
    out.report = os.str();
    std::ostringstream fp;
    for (auto& [id, rec] : w.requests) {
      fp << id << ":" << rec->stream.size() << ":";
      if (rec->result)
        for (auto& sp : rec->result->spans)
          fp << sp.version << "[" << sp.begin << "," << sp.end << ")";
      fp << (rec->error ? rec->error_text : "") << ";";
    }
    out.fingerprint = fp.str() + out.report;
    return out;
  }

  caf::actor_system_config cfg_;
  caf::actor_system sys_;
  caf::scheduler::test_coordinator& sched_;
  plan plan_;
  world_ptr w_;
  std::vector<caf::actor> tracked_;
  std::multimap<std::int64_t, std::function<void()>> agenda_; ///< by simulated ms, FIFO within one
  router_actor router_;
  coordinator_impl_actor coordinator_;
  sim_trainer_actor trainer_;
  bool trainer_alive_ = true;
  bool faults_on_ = true;
  bool livelock_ = false;
  bool round_open_ = false; ///< a round's phases went out and its report did not come yet
  bool audit_due_ = false;
  std::uint64_t latest_ = 0;
  std::uint64_t final_version_ = 0;
  std::size_t launched_ = 0;
  std::map<std::string, sim_engine_actor> handles_;
  std::set<std::string> retired_;
  std::vector<std::pair<std::shared_ptr<engine_ctl>, slot<registration>>> registrations_;
};

run_result simulate(std::uint64_t seed, bool echo = false) {
  simulation sim{make_plan(seed), echo};
  return sim.run();
}

std::optional<std::uint64_t> env_number(const char* name) {
  if (auto v = std::getenv(name); v != nullptr && *v != '\0')
    return std::strtoull(v, nullptr, 10);
  return std::nullopt;
}

} // namespace

TEST_CASE("simulation: seeded fault plans keep every request whole and every engine current") {
  std::vector<std::uint64_t> seeds;
  auto one = env_number("RLSYNC_SIM_SEED");
  if (one) {
    seeds.push_back(*one);
  } else {
    auto n = env_number("RLSYNC_SIM_SEEDS").value_or(200);
    for (std::uint64_t s = 1; s <= n; ++s)
      seeds.push_back(s);
  }
  bool verbose = env_number("RLSYNC_SIM_VERBOSE").value_or(0) != 0;
  outcome_counts total;
  std::vector<std::uint64_t> failed;
  for (auto seed : seeds) {
    INFO("seed " << seed << " (replay: RLSYNC_SIM_SEED=" << seed << ")"); // printed on a crash too
    auto r = simulate(seed, one.has_value()); // one seed: its log streams to stderr as it runs
    total.add(r.counts);
    if (verbose && !one)
      std::cout << r.report;
    if (verbose || one)
      std::cout << "seed " << seed << ": " << r.counts.to_string() << "\n\n";
    if (r.violations.empty())
      continue;
    failed.push_back(seed);
    std::string text;
    for (auto& v : r.violations)
      text += "  " + v + "\n";
    // The whole story for the first few; the plan for the others.
    INFO("violations:\n" << text << (failed.size() <= 3 || one ? r.report : make_plan(seed).to_string()));
    CHECK_MESSAGE(r.violations.empty(), "seed " << seed << ": " << r.violations.size() << " violations");
  }
  std::string list;
  for (auto seed : failed)
    list += " " + std::to_string(seed);
  if (verbose)
    std::cout << seeds.size() << " seeds, " << failed.size() << " failed:" << list << "\n" << total.to_string() << "\n";
  CHECK_MESSAGE(failed.empty(), failed.size() << " of " << seeds.size() << " seeds failed:" << list);
  // The faults must have happened for the run to mean anything.
  if (seeds.size() >= 50) {
    CHECK(total.kills > 0);
    CHECK(total.restarts > 0);
    CHECK(total.silences > 0);
    CHECK(total.trainer_kills > 0);
    CHECK(total.aborted_rounds > 0);
    CHECK(total.reroutes > 0);
    CHECK(total.length > total.requests / 2);
  }
}

TEST_CASE("simulation: a seed replays identically") {
  auto seed = env_number("RLSYNC_SIM_SEED").value_or(7);
  CAPTURE(seed);
  auto a = simulate(seed);
  auto b = simulate(seed);
  CHECK(a.fingerprint == b.fingerprint);
  CHECK(a.violations == b.violations);
}
