#pragma once
// A scripted rollout engine for tests on the deterministic scheduler
// (actor_fixture.hpp). Each sync phase it is sent, it answers, holds its
// answer until released (a late answer), fails, dies, answers for the wrong
// version or falls silent, as its script says; heartbeats likewise. A
// generate streams canned tokens (token i of request r is r*100+i) and
// answers, holds the answer until resume (a long generation), or refuses.
//
// What it was asked lands in two places: per engine in its script, and across
// all engines, in arrival order, in a journal the test shares between them
// (the coordinator's barrier and the router's choices are promises about that
// order). One thread runs every actor here: no locks.
#include "actors/interfaces.hpp"
#include "actors/phase_orders.hpp"

#include <caf/atom.hpp>
#include <caf/exit_reason.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace rlsync::test {

/// What a scripted engine does with a request.
enum class act {
  answer, ///< reply at once
  hold,   ///< keep the reply until released (never, unless the test releases it)
  fail,   ///< reply with an error
  die,    ///< quit without replying
  wrong,  ///< reply for another version (finish, transfer)
  drop,   ///< never reply, not even when released: a silent engine
};

/// One sync phase as it reached one engine.
struct arrival {
  std::string engine;
  sync_phase phase;
};

/// What every engine sharing the journal received, in arrival order across them.
struct engine_journal {
  std::vector<arrival> phases;         ///< sync phases
  std::vector<heartbeat> beats;        ///< heartbeats, `from` set to the engine
  std::vector<std::string> dispatched; ///< "engine:request_id" per generate
  std::vector<std::string> aborted;    ///< "engine:request_id" per abort
  std::vector<std::string> vouched;    ///< "engine:router actor id" per router the coordinator named
};

/// What one engine does and saw; shared with the test.
struct engine_script {
  /// The version it holds; a finish(v) it answers makes it v.
  std::uint64_t version = 0;

  // -- sync phases and heartbeats --
  std::map<sync_phase, act> on; ///< missing: answer
  errc fail_with = errc::not_paused; ///< what a phase told to fail answers with
  std::uint64_t transfer_bytes = 1000;
  /// What its transfer report says of its pull: duration, wait and store,
  /// on a core and waiting for one.
  std::uint64_t pull_ns = 0, wait_ns = 0, store_ns = 0, ran_ns = 0, queued_ns = 0;
  /// The resume answer says the engine holds part of an update (an aborted round).
  bool dirty_on_resume = false;
  /// Resume first fails every held reply with round_aborted, as the real
  /// engine fails the transfer in flight when an aborted round continues.
  bool fail_held_on_resume = false;
  act on_heartbeat = act::answer; ///< answer, hold, drop or fail

  // -- generation --
  /// answer: stream the tokens and reply; hold: stream them, reply at the
  /// next resume; fail: refuse with engine_dirty; die: request_receiver_down
  /// (the engine is gone, its down message not yet seen).
  act on_generate = act::answer;
  errc refuse_with = errc::engine_dirty; ///< what act::fail answers a generate with
  std::uint32_t tokens = 2; ///< generated per request (capped by max_tokens)
  /// Token i's version; missing: `version`.
  std::vector<std::uint64_t> token_versions;
  /// A lying engine: every token twice (the first with three top tokens),
  /// once more for request id + 1000, and once ahead of its place.
  bool duplicate_tokens = false;

  // -- what it was asked --
  std::vector<pause_request> pauses;
  std::vector<std::uint64_t> starts;
  std::vector<transfer_order> orders;

  // -- nccl --
  act on_nccl_join = act::answer; ///< answer (the epoch), fail, hold (until released) or drop
  std::vector<nccl_rendezvous_msg> nccl_joins;
  std::vector<std::pair<std::uint64_t, std::string>> nccl_dead; ///< every member death told: (epoch, who)
};

/// Delivers the oldest held phase or heartbeat reply.
using release_atom = caf::atom_constant<caf::atom("release")>;

/// A rollout engine that also takes `release`.
using scripted_engine_actor = rollout_engine_actor::extend<caf::reacts_to<release_atom>>;

struct scripted_engine_state {
  /// A reply held back: delivered on `release`, or failed.
  struct held_reply {
    std::function<void()> deliver;
    std::function<void(caf::error)> fail;
  };

  std::string engine;
  phase_order_count phase_orders;
  std::shared_ptr<engine_script> script;
  std::shared_ptr<engine_journal> journal;
  std::vector<held_reply> held; ///< phase and heartbeat replies, oldest first
  std::vector<std::pair<generate_result, caf::typed_response_promise<generate_result>>> generations;

  static inline const char* name = "scripted-engine";
};

using scripted_engine_ptr = scripted_engine_actor::stateful_pointer<scripted_engine_state>;

/// Records the phase and replies as the script says for it.
template <class Reply>
caf::result<Reply> scripted_phase_reply(scripted_engine_ptr self, sync_phase phase, Reply reply,
                                        Reply wrong_reply = {}) {
  auto& st = self->state;
  st.journal->phases.push_back({st.engine, phase});
  auto i = st.script->on.find(phase);
  switch (i == st.script->on.end() ? act::answer : i->second) {
    case act::answer:
      return reply;
    case act::wrong:
      return wrong_reply;
    case act::fail:
      return make_error(st.script->fail_with, st.engine + " told to fail " + std::string{to_string(phase)});
    case act::hold: {
      auto rp = self->make_response_promise<Reply>();
      st.held.push_back({[rp, reply]() mutable { rp.deliver(reply); },
                         [rp](caf::error err) mutable { rp.deliver(std::move(err)); }});
      return rp;
    }
    case act::drop:
      return self->make_response_promise<Reply>(); // never delivered
    case act::die:
      self->quit(caf::exit_reason::kill);
      return self->make_response_promise<Reply>(); // never delivered
  }
  return reply;
}

/// Streams the canned tokens of `req` to `sink`: like the real engine, a
/// continuation starts at index generated.size(), and the result holds only
/// the tokens made here, its spans counted from 0.
inline generate_result scripted_generation(scripted_engine_ptr self, const generate_request& req,
                                           const token_sink_actor& sink) {
  auto& st = self->state;
  auto& script = *st.script;
  generate_result res;
  res.request_id = req.request_id;
  res.engine = st.engine;
  res.reason = finish_reason::length;
  auto first = static_cast<std::uint32_t>(req.generated.size());
  auto n = first < req.sampling.max_tokens ? std::min(script.tokens, req.sampling.max_tokens - first) : 0u;
  for (std::uint32_t i = first; i < first + n; ++i) {
    auto version = i < script.token_versions.size() ? script.token_versions[i] : script.version;
    token_event ev{req.request_id, i, static_cast<std::int32_t>(req.request_id * 100 + i), version, false};
    if (script.duplicate_tokens) {
      auto ahead = ev;
      ahead.index += 2;
      self->send(sink, token_atom_v, ahead);
      auto with_top = ev;
      with_top.top_tokens = {1, 2, 3};
      with_top.top_logprobs = {-0.1f, -0.2f, -0.3f};
      self->send(sink, token_atom_v, with_top);
      self->send(sink, token_atom_v, ev);
      auto other = ev;
      other.request_id += 1000;
      self->send(sink, token_atom_v, other);
    } else {
      self->send(sink, token_atom_v, ev);
    }
    res.tokens.push_back(ev.token);
    auto local = static_cast<std::uint32_t>(res.tokens.size());
    if (res.spans.empty() || res.spans.back().version != version)
      res.spans.push_back({version, local - 1, local});
    else
      res.spans.back().end = local;
  }
  return res;
}

/// Spawn with the engine's name, its script and the journal it shares.
inline scripted_engine_actor::behavior_type scripted_engine(scripted_engine_ptr self, std::string name,
                                                            std::shared_ptr<engine_script> script,
                                                            std::shared_ptr<engine_journal> journal) {
  self->state.engine = name;
  self->state.script = std::move(script);
  self->state.journal = std::move(journal);
  return {
    [=](pause_atom, const pause_request& req) -> caf::result<pause_report> {
      auto& script = *self->state.script;
      script.pauses.push_back(req);
      return scripted_phase_reply(self, sync_phase::pause,
                                  pause_report{name, script.version, scheduler_state::paused_all});
    },
    [=](flush_atom) -> caf::result<phase_ack> {
      return scripted_phase_reply(self, sync_phase::flush, phase_ack{name, self->state.script->version});
    },
    [=](start_atom, std::uint64_t v) -> caf::result<phase_ack> {
      self->state.script->starts.push_back(v);
      return scripted_phase_reply(self, sync_phase::start, phase_ack{name, v});
    },
    [=](update_atom, const weight_bucket&) -> caf::result<std::uint64_t> {
      return make_error(errc::no_session, "the scripted engine takes no buckets");
    },
    [=](transfer_atom, const transfer_order& o, const std::vector<trainer_actor>&) -> caf::result<transfer_report> {
      auto& script = *self->state.script;
      script.orders.push_back(o);
      auto bytes = script.transfer_bytes;
      const transfer_report rep{name,           o.version,      bytes,         4,
                                script.pull_ns, script.wait_ns, script.store_ns, script.ran_ns,
                                script.queued_ns};
      auto wrong = rep;
      ++wrong.version;
      return scripted_phase_reply(self, sync_phase::transfer, rep, wrong);
    },
    [=](finish_atom, std::uint64_t v) -> caf::result<phase_ack> {
      auto& script = *self->state.script;
      auto i = script.on.find(sync_phase::finish);
      if (i == script.on.end() || i->second == act::answer)
        script.version = v;
      return scripted_phase_reply(self, sync_phase::finish, phase_ack{name, v}, phase_ack{name, v + 1});
    },
    [=](resume_atom) -> caf::result<phase_ack> {
      auto& st = self->state;
      if (st.script->fail_held_on_resume) {
        auto held = std::exchange(st.held, {});
        for (auto& h : held)
          h.fail(make_error(errc::round_aborted, st.engine + ": the round was aborted"));
      }
      // Held generations stand for long ones: they finish now.
      auto generations = std::exchange(st.generations, {});
      for (auto& [res, promise] : generations)
        promise.deliver(std::move(res));
      return scripted_phase_reply(self, sync_phase::resume,
                                  phase_ack{name, st.script->version, st.script->dirty_on_resume});
    },
    [=](generate_atom, const generate_request& req,
        const token_sink_actor& sink) -> caf::result<generate_result> {
      auto& st = self->state;
      st.journal->dispatched.push_back(st.engine + ":" + std::to_string(req.request_id));
      switch (st.script->on_generate) {
        case act::answer:
          return scripted_generation(self, req, sink);
        case act::hold: {
          auto promise = self->make_response_promise<generate_result>();
          st.generations.emplace_back(scripted_generation(self, req, sink), promise);
          return promise;
        }
        case act::die: // what a request to an engine that just died gets
          return caf::make_error(caf::sec::request_receiver_down);
        default:
          return make_error(st.script->refuse_with, st.engine + " refuses (scripted)");
      }
    },
    [=](abort_atom, std::uint64_t id) {
      self->state.journal->aborted.push_back(self->state.engine + ":" + std::to_string(id));
      return true;
    },
    [=](status_atom) { return engine_status{name, self->state.script->version}; },
    [=](heartbeat_atom, const heartbeat& hb) -> caf::result<heartbeat> {
      auto& st = self->state;
      st.journal->beats.push_back(heartbeat{name, hb.seq});
      if (st.script->on_heartbeat == act::drop)
        return self->make_response_promise<heartbeat>(); // never delivered
      if (st.script->on_heartbeat == act::fail)
        return caf::make_error(caf::sec::runtime_error, "heartbeat handler failed");
      if (st.script->on_heartbeat != act::hold)
        return hb;
      auto rp = self->make_response_promise<heartbeat>();
      st.held.push_back({[rp, hb]() mutable { rp.deliver(hb); },
                         [rp](caf::error err) mutable { rp.deliver(std::move(err)); }});
      return rp;
    },
    [=](route_atom, const heartbeat_actor& router) {
      self->state.journal->vouched.push_back(self->state.engine + ":" + std::to_string(router.id()));
    },
    [=](digest_atom) { return weight_digest{name, self->state.script->version, false, {}, {}}; },
    [=](nccl_join_atom, const nccl_rendezvous_msg& msg) -> caf::result<std::uint64_t> {
      auto& script = *self->state.script;
      script.nccl_joins.push_back(msg);
      if (script.on_nccl_join == act::fail)
        return make_error(errc::malformed, self->state.engine + " told to refuse the rendezvous");
      if (script.on_nccl_join == act::drop)
        return self->make_response_promise<std::uint64_t>(); // never delivered
      if (script.on_nccl_join == act::hold) {
        auto rp = self->make_response_promise<std::uint64_t>();
        self->state.held.push_back({[rp, e = msg.epoch]() mutable { rp.deliver(e); },
                                    [rp](caf::error err) mutable { rp.deliver(std::move(err)); }});
        return rp;
      }
      return msg.epoch;
    },
    [=](nccl_dead_atom, std::uint64_t epoch, const std::string& who) {
      self->state.script->nccl_dead.emplace_back(epoch, who);
    },
    [=](phase_atom, const phase_order& order) { serve_phase_order(self, self->state.phase_orders, order); },
    [=](release_atom) {
      auto& held = self->state.held;
      if (held.empty())
        return;
      auto reply = std::move(held.front());
      held.erase(held.begin());
      reply.deliver();
    },
  };
}

} // namespace rlsync::test
