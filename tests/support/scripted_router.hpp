#pragma once
// A scripted router for tests on the deterministic scheduler
// (actor_fixture.hpp). A generate streams canned tokens to the requester's
// sink (token i of request r is r*100+i, with versions[i]) and answers,
// refuses, holds the answer until resume, or garbles the stream, as the
// script says per request. Whatever the coordinator tells it (routes,
// evictions, failures, published versions) it writes down in order; a route
// without an engine handle fails the test. One
// thread runs every actor here: no locks.
#include "actors/interfaces.hpp"

#include <caf/typed_event_based_actor.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace rlsync::test {

/// How a generate's token stream reaches the sink wrong.
enum class stream_fault {
  drop,      ///< token 1 is never streamed (a gap)
  swap,      ///< tokens 0 and 1 arrive in the wrong order
  duplicate, ///< token 0 arrives twice
};

/// What the router does and saw; shared with the test.
struct router_script {
  // -- generation --
  /// Token i's version; as many tokens as there are versions (capped by max_tokens).
  std::vector<std::uint64_t> versions = {1, 1, 2};
  std::vector<bool> stale = {false, false, true}; ///< token i was produced over stale KV
  bool hold = false; ///< keep every answer until resume (stands for long generations)
  std::uint32_t held_stream = 0; ///< with hold: stream only this many tokens before the answer (0: all)
  std::map<std::uint64_t, std::uint32_t> refuse; ///< id → attempts refused with refuse_with
  errc refuse_with = errc::queue_full;
  std::map<std::uint64_t, caf::error> errors;     ///< id → answer with this error
  std::map<std::uint64_t, finish_reason> reasons; ///< id → finish with this reason
  std::map<std::uint64_t, stream_fault> faults;   ///< id → garble its stream
  /// Dies (exit reason kill) on reading its die_on-th generate, answering
  /// none: requests still in its mailbox are bounced unread (0: never).
  std::uint32_t die_on = 0;

  // -- what it saw --
  std::vector<generate_request> received;          ///< every generate, in order
  std::map<std::uint64_t, std::uint32_t> attempts; ///< generates per request id
  std::uint32_t outstanding = 0;
  std::uint32_t max_outstanding = 0;
  /// "route <name> v<version>[ unroutable]", "evict <name>" and "failed <name>", in arrival order.
  std::vector<std::string> routes;
  std::vector<std::uint64_t> published; ///< the versions it was told of
};

/// A router that also takes `resume`: deliver every held answer.
using scripted_router_actor = router_actor::extend<caf::reacts_to<resume_atom>>;

struct scripted_router_state {
  std::shared_ptr<router_script> script;
  std::vector<std::pair<generate_result, caf::typed_response_promise<generate_result>>> held;
  static inline const char* name = "scripted-router";
};

inline scripted_router_actor::behavior_type
scripted_router(scripted_router_actor::stateful_pointer<scripted_router_state> self,
                std::shared_ptr<router_script> script) {
  self->state.script = std::move(script);
  return {
    [=](generate_atom, const generate_request& req,
        const token_sink_actor& sink) -> caf::result<generate_result> {
      auto& s = *self->state.script;
      auto id = req.request_id;
      s.received.push_back(req);
      if (s.die_on != 0 && s.received.size() == s.die_on) {
        self->quit(caf::exit_reason::kill);
        return make_error(caf::sec::request_receiver_down); // as a killed router's never-answered request ends
      }
      auto attempt = ++s.attempts[id];
      if (auto it = s.refuse.find(id); it != s.refuse.end() && attempt <= it->second)
        return make_error(s.refuse_with, "the scripted router refuses");
      if (auto it = s.errors.find(id); it != s.errors.end())
        return it->second;
      generate_result res;
      res.request_id = id;
      res.engine = "fake";
      std::vector<token_event> stream;
      // Like the router: a continuation streams from index generated.size()
      // on, and the result holds only the new tokens (spans from 0).
      auto first = static_cast<std::uint32_t>(req.generated.size());
      for (std::uint32_t i = first; i < std::min<std::size_t>(s.versions.size(), req.sampling.max_tokens);
           ++i) {
        token_event ev{id, i, static_cast<std::int32_t>(id * 100 + i), s.versions[i], s.stale[i]};
        stream.push_back(ev);
        res.tokens.push_back(ev.token);
        auto n = static_cast<std::uint32_t>(res.tokens.size());
        if (res.spans.empty() || res.spans.back().version != ev.version)
          res.spans.push_back({ev.version, n - 1, n - 1});
        ++res.spans.back().end;
        res.stale_kv_tokens += ev.stale_kv ? 1 : 0;
      }
      if (s.hold && s.held_stream > 0 && stream.size() > s.held_stream)
        stream.resize(s.held_stream);
      if (auto it = s.faults.find(id); it != s.faults.end()) {
        switch (it->second) {
          case stream_fault::drop: stream.erase(stream.begin() + 1); break;
          case stream_fault::swap: std::swap(stream[0], stream[1]); break;
          case stream_fault::duplicate: stream.insert(stream.begin(), stream[0]); break;
        }
      }
      for (auto& ev : stream)
        self->send(sink, token_atom_v, ev);
      if (auto it = s.reasons.find(id); it != s.reasons.end())
        res.reason = it->second;
      s.max_outstanding = std::max(s.max_outstanding, ++s.outstanding);
      if (s.hold) {
        auto promise = self->make_response_promise<generate_result>();
        self->state.held.emplace_back(std::move(res), promise);
        return promise;
      }
      --s.outstanding;
      return res;
    },
    [=](resume_atom) {
      auto held = std::exchange(self->state.held, {});
      for (auto& [res, promise] : held) {
        --self->state.script->outstanding;
        promise.deliver(std::move(res));
      }
    },
    [=](route_atom, const route_update& u, const rollout_engine_actor& engine) {
      CHECK(engine);
      self->state.script->routes.push_back("route " + u.engine + " v" + std::to_string(u.version)
                                           + (u.routable ? "" : " unroutable"));
    },
    [=](evict_atom, const std::string& name) { self->state.script->routes.push_back("evict " + name); },
    [=](failed_atom, const std::string& name) { self->state.script->routes.push_back("failed " + name); },
    [=](version_atom, const version_info& vi) { self->state.script->published.push_back(vi.version); },
    [=](status_atom) { return router_status{}; },
    [=](heartbeat_atom, const heartbeat& hb) { return hb; },
  };
}

} // namespace rlsync::test
