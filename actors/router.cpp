#include "actors/router.hpp"

#include <caf/actor_cast.hpp>
#include <caf/system_messages.hpp>
#include <caf/send.hpp>
#include <caf/sec.hpp>

#include "runtime/config/model_config.hpp"

#include <algorithm>
#include <utility>

namespace rlsync {

namespace {

// -- the token relay ---------------------------------------------------------

// One relay serves one dispatch of one request. A reroute gets a fresh relay,
// after the old one has closed: late tokens from the old engine then reach a
// relay that is gone, so nothing from an abandoned attempt reaches the sink,
// whichever actor on the engine's side sends the tokens.
struct relay_state {
  token_sink_actor sink;
  std::uint64_t request_id = 0;
  std::uint32_t next_index = 0;  ///< the index the next token must have
  std::uint32_t max_tokens = 0;  ///< indices at or past it are bogus: bounds the record
  bool logprobs = false;         ///< the request asked for them: record them with the tokens
  std::uint32_t top_logprobs = 0; ///< most probable tokens per step the request asked for
  generate_result forwarded;     ///< what reached the sink, with its version spans

  static inline const char* name = "router-relay";
};

token_relay_actor::behavior_type token_relay(token_relay_actor::stateful_pointer<relay_state> self,
                                             token_sink_actor sink, caf::actor_addr router,
                                             const generate_request& request, std::shared_ptr<sender_guard> guard) {
  auto& st = self->state;
  st.sink = std::move(sink);
  st.request_id = request.request_id;
  st.next_index = static_cast<std::uint32_t>(request.generated.size());
  st.max_tokens = request.sampling.max_tokens;
  st.logprobs = request.sampling.logprobs;
  st.top_logprobs = request.sampling.top_logprobs;
  st.forwarded.request_id = request.request_id;
  // A relay lives as long as its request, and never longer than the router
  // or its sink: a requester that hung up (an HTTP client gone) ends the
  // relay, and the engine, which watches the relay, stops generating for it.
  // CAF 0.17 keeps a monitor on the watched actor until that one ends or
  // the watcher demonitors: a relay that just quit would leave two entries
  // (and its own memory) on the router and the sink for every request.
  self->monitor(caf::actor_cast<caf::abstract_actor*>(router));
  self->monitor(caf::actor_cast<caf::abstract_actor*>(st.sink));
  auto leave = [self, router, sink = caf::actor_cast<caf::actor_addr>(st.sink)] {
    self->demonitor(router);
    self->demonitor(sink);
    self->quit();
  };
  self->set_down_handler([=](caf::down_msg&) { leave(); });
  // Under the router's guard: an outsider must not end a request or inject tokens.
  return {
    authorized(self, guard, [=](token_atom, token_event& ev) {
      auto& st = self->state;
      if (ev.request_id != st.request_id || ev.index != st.next_index || ev.index >= st.max_tokens)
        return; // another request's, a duplicate, one out of its place, or past the budget
      st.next_index = ev.index + 1;
      // As many top tokens as asked for, each with its log-probability: an
      // engine's extra ones neither grow the record nor shift the next token's.
      const auto top = std::min<std::size_t>({st.logprobs ? st.top_logprobs : 0u, ev.top_tokens.size(),
                                              ev.top_logprobs.size()});
      ev.top_tokens.resize(top);
      ev.top_logprobs.resize(top);
      auto& out = st.forwarded;
      auto n = static_cast<std::uint32_t>(out.tokens.size());
      out.tokens.push_back(ev.token);
      if (out.spans.empty() || out.spans.back().version != ev.version)
        out.spans.push_back({ev.version, n, n + 1});
      else
        out.spans.back().end = n + 1;
      if (ev.stale_kv)
        ++out.stale_kv_tokens;
      if (st.logprobs) {
        out.logprobs.push_back(ev.logprob);
        out.top_tokens.insert(out.top_tokens.end(), ev.top_tokens.begin(), ev.top_tokens.end());
        out.top_logprobs.insert(out.top_logprobs.end(), ev.top_logprobs.begin(), ev.top_logprobs.end());
      }
      self->send(st.sink, token_atom_v, std::move(ev));
    }),
    authorized(self, guard, [=](finish_atom) -> generate_result {
      // Every token that arrived before this message has been forwarded.
      leave();
      return std::move(self->state.forwarded);
    }),
  };
}

// -- the router ----------------------------------------------------------------

using router_ptr = router_impl_actor::stateful_pointer<router_state>;

std::string ms(std::chrono::milliseconds d) {
  return std::to_string(d.count()) + " ms";
}

/// How long `req` may wait for a replica: its own deadline, or the router's.
std::chrono::milliseconds hold_deadline(const router_state& st, const generate_request& req) {
  return req.deadline_ms != 0 ? std::chrono::milliseconds(req.deadline_ms) : st.config.queue_deadline;
}

/// The router's figures; `per_engine`: with each engine's requests out too (O(engines) to build).
router_status status_of(const router_state& st, bool per_engine) {
  router_status s;
  for (auto& r : st.replicas) {
    if (is_current(r, st.rules))
      ++s.routable;
    if (per_engine)
      s.outstanding_by_engine[r.name] = r.outstanding;
  }
  s.queued = static_cast<std::uint32_t>(st.queued.size());
  s.outstanding = static_cast<std::uint32_t>(st.running.size());
  s.completed = st.completed;
  s.rejected = st.rejected;
  s.rerouted = st.rerouted;
  s.refused = st.guard->refused();
  return s;
}

/// Tells config.on_status (the metrics) what changed: the queue, the
/// requests out, the counts.
void publish(router_ptr self) {
  if (self->state.config.on_status)
    self->state.config.on_status(status_of(self->state, false));
}

/// Arms the queue's one timer for its earliest deadline, unless one is due
/// by then already.
void arm_queue_timer(router_ptr self) {
  auto& st = self->state;
  if (st.queue_deadlines.empty())
    return;
  const auto first = st.queue_deadlines.begin()->first;
  if (st.queue_timer_at && *st.queue_timer_at <= first)
    return;
  const auto now = self->clock().now();
  self->delayed_send(caf::actor_cast<router_impl_actor>(self), std::max(first - now, caf::timespan{0}),
                     caf::timeout_atom_v, std::uint64_t{0}, std::uint32_t{0});
  st.queue_timer_at = first;
}

/// Puts an accepted request in the queue with its deadline.
void enqueue(router_ptr self, request_record rec) {
  auto& st = self->state;
  rec.queued_until = self->clock().now() + hold_deadline(st, rec.request);
  st.queue_deadlines.emplace(rec.queued_until, rec.ticket);
  st.queued.emplace(rec.ticket, std::move(rec));
  arm_queue_timer(self);
  publish(self);
}

/// Takes a queued request off the books (dispatched, or past its deadline).
request_record dequeue(router_state& st, std::map<std::uint64_t, request_record>::iterator it) {
  auto rec = std::move(it->second);
  st.queued.erase(it);
  auto [from, to] = st.queue_deadlines.equal_range(rec.queued_until);
  for (auto d = from; d != to; ++d)
    if (d->second == rec.ticket) {
      st.queue_deadlines.erase(d);
      break;
    }
  return rec;
}

std::optional<std::size_t> choose(router_ptr self, const generate_request& req,
                                  const std::vector<std::string>* avoid = nullptr) {
  auto& st = self->state;
  route_query q{req.min_version, 0, avoid};
  if (st.config.policy == router_policy::prefix_affinity)
    q.prefix = prefix_hash(req.prompt, st.config.affinity_prefix_tokens);
  return choose_replica(st.replicas, st.rules, q, st.round_robin_cursor);
}

replica_load* find_replica(router_state& st, const std::string& name) {
  auto i = std::find_if(st.replicas.begin(), st.replicas.end(),
                        [&](const replica_load& r) { return r.name == name; });
  return i == st.replicas.end() ? nullptr : &*i;
}

void dispatch(router_ptr self, request_record rec, std::size_t replica);

/// Sends every queued request that a replica can serve now, oldest first. A
/// request no replica can serve (its min_version is ahead) does not hold up
/// the ones behind it.
void drain_queue(router_ptr self) {
  auto& st = self->state;
  for (auto i = st.queued.begin(); i != st.queued.end();) {
    auto choice = choose(self, i->second.request);
    if (!choice) {
      ++i;
      continue;
    }
    auto rec = dequeue(st, i++);
    rec.left.clear(); // the table changed: a replica it left may take it now
    dispatch(self, std::move(rec), *choice);
  }
}

/// `head` followed by `tail`: tokens appended, tail's spans shifted past
/// head's and joined where the version continues.
generate_result stitch(generate_result head, const generate_result& tail) {
  auto shift = static_cast<std::uint32_t>(head.tokens.size());
  head.tokens.insert(head.tokens.end(), tail.tokens.begin(), tail.tokens.end());
  for (auto s : tail.spans) {
    s.begin += shift;
    s.end += shift;
    if (!head.spans.empty() && head.spans.back().version == s.version && head.spans.back().end == s.begin)
      head.spans.back().end = s.end;
    else
      head.spans.push_back(s);
  }
  head.stale_kv_tokens += tail.stale_kv_tokens;
  head.logprobs.insert(head.logprobs.end(), tail.logprobs.begin(), tail.logprobs.end());
  head.top_tokens.insert(head.top_tokens.end(), tail.top_tokens.begin(), tail.top_tokens.end());
  head.top_logprobs.insert(head.top_logprobs.end(), tail.top_logprobs.begin(), tail.top_logprobs.end());
  return head;
}

/// The answer to a request whose engine failed: what its sink already has.
generate_result failed_result(const request_record& rec, const generate_result& forwarded) {
  auto out = stitch(rec.prior, forwarded);
  out.request_id = rec.request.request_id;
  out.reason = finish_reason::failed;
  out.engine = rec.engine_name;
  return out;
}

/// What the next attempt of `rec` sends: the client's request continued
/// after every token earlier attempts delivered.
generate_request continued(const request_record& rec) {
  auto req = rec.request;
  req.generated.insert(req.generated.end(), rec.prior.tokens.begin(), rec.prior.tokens.end());
  return req;
}

/// Takes a running request off the books and answers it: with the engine's
/// result, or (none) as failed. The answer waits for the relay to close, so
/// that the sink has every token before the requester has the result.
void close_running(router_ptr self, std::map<std::uint64_t, request_record>::iterator it,
                   std::optional<generate_result> result, bool release_slot = true) {
  auto& st = self->state;
  auto rec = std::move(it->second);
  st.running.erase(it);
  st.in_flight.erase(rec.request.request_id);
  if (auto r = find_replica(st, rec.engine_name); release_slot && r != nullptr && r->outstanding > 0)
    --r->outstanding;
  ++st.completed;
  rec.result = std::move(result);
  auto ticket = rec.ticket;
  auto relay = rec.relay;
  st.closing.emplace(ticket, std::move(rec));
  publish(self);
  // A slot came free: a request that every replica had just refused (full)
  // may go now, rather than at the next change of the table.
  if (!st.queued.empty())
    drain_queue(self);
  auto answer = [self, ticket](generate_result forwarded) {
    auto& st = self->state;
    auto i = st.closing.find(ticket);
    if (i == st.closing.end())
      return;
    auto& rec = i->second;
    if (rec.result)
      rec.promise.deliver(std::move(*rec.result));
    else
      rec.promise.deliver(failed_result(rec, std::move(forwarded)));
    st.closing.erase(i);
  };
  self->request(relay, st.config.control_deadline, finish_atom_v)
    .then([answer](generate_result& forwarded) { answer(std::move(forwarded)); },
          [answer](caf::error&) { answer({}); });
}

void on_engine_result(router_ptr self, std::uint64_t ticket, std::uint32_t attempt,
                      generate_result res) {
  auto& st = self->state;
  auto it = st.running.find(ticket);
  if (it == st.running.end() || it->second.attempts != attempt)
    return; // already answered (its engine went down) or a stale attempt
  // The engine is a peer: a result that does not add up is a failure, not an answer.
  if (!check(res).empty() || res.request_id != it->second.request.request_id) {
    close_running(self, it, std::nullopt);
    return;
  }
  auto whole = stitch(it->second.prior, res);
  whole.request_id = res.request_id;
  whole.reason = res.reason;
  whole.engine = res.engine;
  close_running(self, it, std::move(whole));
}

void reroute(router_ptr self, std::map<std::uint64_t, request_record>::iterator it, const std::string& why);

/// Errors after which another replica may well succeed: the engine refused
/// (dirty, full, evicted mid-round) or is gone.
bool worth_rerouting(const caf::error& err) {
  return is(err, errc::engine_dirty) || is(err, errc::queue_full) || is(err, errc::evicted)
         || is(err, errc::round_aborted) || is(err, errc::not_routable)
         || err == caf::sec::request_receiver_down;
}

void on_engine_error(router_ptr self, std::uint64_t ticket, std::uint32_t attempt,
                     const caf::error& err) {
  auto& st = self->state;
  auto it = st.running.find(ticket);
  if (it == st.running.end() || it->second.attempts != attempt)
    return;
  if (is(err, errc::engine_dirty) || err == caf::sec::request_receiver_down) {
    // A replica that refuses at once, or is gone before its down message
    // arrived, would otherwise draw every request, having the fewest
    // outstanding. The coordinator makes it routable after a sync.
    if (auto r = find_replica(st, it->second.engine_name))
      r->routable = false;
  }
  if (worth_rerouting(err)) {
    reroute(self, it, self->system().render(err));
    return;
  }
  if (err == caf::sec::request_timeout) {
    // The engine may still be working on it: free its slot. Best effort.
    self->request(it->second.engine, st.config.control_deadline, abort_atom_v,
                  it->second.request.request_id)
      .then([](bool) {}, [](caf::error&) {});
  }
  close_running(self, it, std::nullopt);
}

void dispatch(router_ptr self, request_record rec, std::size_t replica) {
  auto& st = self->state;
  auto& r = st.replicas[replica];
  ++r.outstanding;
  rec.engine_name = r.name;
  rec.engine = st.engines.at(r.name);
  ++rec.attempts;
  auto req = continued(rec);
  rec.relay = self->spawn(token_relay, rec.sink, self->address(), req, st.guard);
  auto ticket = rec.ticket;
  auto attempt = rec.attempts;
  self
    ->request(rec.engine, st.config.engine_deadline, generate_atom_v, std::move(req),
              caf::actor_cast<token_sink_actor>(rec.relay))
    .then(
      [=](generate_result& res) { on_engine_result(self, ticket, attempt, std::move(res)); },
      [=](caf::error& err) { on_engine_error(self, ticket, attempt, err); });
  st.running.emplace(ticket, std::move(rec));
  publish(self);
}

/// Sends a request whose engine failed elsewhere, continuing after what its
/// sink already has (state diagram in router.hpp). The old relay closes
/// first: its record is exactly what reached the sink.
void reroute(router_ptr self, std::map<std::uint64_t, request_record>::iterator it, const std::string& why) {
  auto& st = self->state;
  auto rec = std::move(it->second);
  st.running.erase(it);
  if (auto r = find_replica(st, rec.engine_name); r != nullptr && r->outstanding > 0)
    --r->outstanding;
  if (std::find(rec.left.begin(), rec.left.end(), rec.engine_name) == rec.left.end())
    rec.left.push_back(rec.engine_name);
  // Best effort: a dead engine ignores it, an unreachable one gets it later.
  // Sent as the router: an engine refuses anonymous messages.
  self->request(rec.engine, st.config.control_deadline, abort_atom_v, rec.request.request_id)
    .then([](bool) {}, [](caf::error&) {});
  auto ticket = rec.ticket;
  auto relay = rec.relay;
  st.rerouting.emplace(ticket, std::move(rec));
  auto next = [self, ticket, why](std::optional<generate_result> forwarded) {
    auto& st = self->state;
    auto i = st.rerouting.find(ticket);
    if (i == st.rerouting.end())
      return; // answered while the relay closed (the router is stopping)
    auto rec = std::move(i->second);
    st.rerouting.erase(i);
    auto close = [&](std::optional<generate_result> result) {
      // Through `running`, so that counters and the answer path stay in one
      // place; its engine slot was released already. The old relay is gone:
      // closing it again answers at once.
      auto pos = st.running.emplace(rec.ticket, std::move(rec)).first;
      close_running(self, pos, std::move(result), false);
    };
    if (!forwarded) { // the sink's record is lost: continuing could duplicate tokens
      close(std::nullopt);
      return;
    }
    rec.prior = stitch(std::move(rec.prior), *forwarded);
    auto done = rec.request.generated.size() + rec.prior.tokens.size();
    // Ended by its last token (EOS or a stop token), as the engine would have.
    bool eos = !rec.prior.tokens.empty() && ends_as_eos(rec.request.sampling, rec.prior.tokens.back());
    if (done >= rec.request.sampling.max_tokens || eos) { // it had finished when the engine failed
      auto res = rec.prior;
      res.request_id = rec.request.request_id;
      res.reason = eos ? finish_reason::eos : finish_reason::length;
      res.engine = rec.engine_name;
      close(std::move(res));
      return;
    }
    if (rec.attempts > st.config.max_reroutes) {
      close(std::nullopt);
      return;
    }
    ++st.rerouted;
    if (st.config.log)
      st.config.log("router: request " + std::to_string(rec.request.request_id) + " rerouted from "
                    + rec.engine_name + " (" + why + ") after " + std::to_string(done) + " tokens");
    // Elsewhere at once; where every replica able to serve it just failed
    // it, it waits in the queue for the next change of the routing table.
    if (auto choice = choose(self, rec.request, &rec.left)) {
      dispatch(self, std::move(rec), *choice);
    } else { // accepted already: it waits past the queue limit, with a fresh deadline
      enqueue(self, std::move(rec));
    }
  };
  self->request(relay, st.config.control_deadline, finish_atom_v)
    .then([next](generate_result& forwarded) { next(std::move(forwarded)); },
          [next](caf::error&) { next(std::nullopt); });
}

/// An engine failed: drop it from the table (when it is still the handle on
/// record) and reroute its running requests. `died`: it is gone for good (a
/// down message), not just silent.
void engine_failed(router_ptr self, const caf::actor_addr& who, const std::string& why, bool died) {
  auto& st = self->state;
  for (auto i = st.engines.begin(); i != st.engines.end();) {
    if (i->second.address() == who) {
      auto name = i->first;
      if (died) // a silent one may come back under the same handle
        st.dead[name] = who;
      else // watched again when it comes back: one monitor per return, not one more
        self->demonitor(who);
      st.replicas.erase(std::remove_if(st.replicas.begin(), st.replicas.end(),
                                       [&](const replica_load& r) { return r.name == name; }),
                        st.replicas.end());
      i = st.engines.erase(i);
    } else {
      ++i;
    }
  }
  std::vector<std::uint64_t> lost;
  for (auto& [ticket, rec] : st.running)
    if (rec.engine.address() == who)
      lost.push_back(ticket);
  for (auto ticket : lost)
    reroute(self, st.running.find(ticket), why);
}

/// A queued request whose deadline passed: answered as not routable, or
/// (a requeued reroute, whose sink has tokens already) with those tokens,
/// marked rejected, so that the stream stays whole.
void give_up_waiting(router_ptr self, request_record rec) {
  auto& st = self->state;
  st.in_flight.erase(rec.request.request_id);
  ++st.rejected;
  publish(self);
  auto why = "deadline passed: no replica could serve request " + std::to_string(rec.request.request_id)
             + " within " + ms(hold_deadline(st, rec.request)) + " ("
             + (st.replicas.empty() ? std::string("no engine is up")
                                    : "none of " + std::to_string(st.replicas.size())
                                        + " known engines is current")
             + ")";
  if (rec.prior.tokens.empty()) {
    rec.promise.deliver(make_error(errc::not_routable, std::move(why)));
    return;
  }
  // A requeued reroute: its sink has tokens already, so the answer is a
  // result carrying them (the stream stays whole), marked rejected.
  if (st.config.log)
    st.config.log("router: " + why);
  auto res = rec.prior;
  res.request_id = rec.request.request_id;
  res.reason = finish_reason::rejected;
  res.engine = rec.engine_name;
  rec.promise.deliver(std::move(res));
}

/// Answers every request before the router goes: nobody waits on a router
/// that no longer exists. Running requests are aborted on their engines.
void shut_down(router_ptr self) {
  auto& st = self->state;
  for (auto& [ticket, rec] : st.queued) {
    ++st.rejected;
    rec.promise.deliver(make_error(errc::not_routable, "the router is shutting down"));
  }
  for (auto& [ticket, rec] : st.running) {
    ++st.rejected;
    self->request(rec.engine, st.config.control_deadline, abort_atom_v, rec.request.request_id) // as the router
      .then([](bool) {}, [](caf::error&) {});
    rec.promise.deliver(make_error(errc::not_routable, "the router is shutting down"));
  }
  // Finished requests still waiting for their relay get their answer now.
  for (auto& [ticket, rec] : st.closing)
    rec.promise.deliver(rec.result ? std::move(*rec.result) : failed_result(rec, {}));
  for (auto& [ticket, rec] : st.rerouting)
    rec.promise.deliver(failed_result(rec, {}));
  st.rerouting.clear();
  st.queued.clear();
  st.queue_deadlines.clear();
  st.running.clear();
  st.closing.clear();
  st.in_flight.clear();
}

} // namespace

router_impl_actor::behavior_type router(router_ptr self, router_config config, sender_policy authorize) {
  self->state.config = std::move(config);
  self->state.rules.policy = self->state.config.policy;
  self->state.rules.staleness = self->state.config.staleness;
  self->set_down_handler([=](caf::down_msg& dm) {
    // A lost link is not a death: a member node that reconnects registers
    // the same engine actors again, and its proxies compare equal to these.
    const bool died = dm.reason != caf::exit_reason::remote_link_unreachable;
    engine_failed(self, dm.source, "down: " + self->system().render(dm.reason), died);
  });
  self->set_exit_handler([=](caf::exit_msg& em) {
    shut_down(self);
    self->quit(em.reason);
  });
  // Every handler: a peer that was not admitted reads, routes and changes nothing.
  auto guard = self->state.guard
    = std::make_shared<sender_guard>("router", std::move(authorize), self->state.config.log);
  refuse_stray_errors(self, guard);
  return {
    authorized(self, guard, [=](generate_atom, generate_request& req,
        token_sink_actor& sink) -> caf::result<generate_result> {
      auto& st = self->state;
      auto why = check(req);
      if (why.empty() && !sink)
        why = "generate: no token sink";
      if (why.empty() && st.in_flight.count(req.request_id) != 0)
        why = "generate_request.request_id: " + std::to_string(req.request_id)
              + " is already in flight";
      if (!why.empty()) {
        ++st.rejected;
        return make_error(errc::malformed, std::move(why));
      }
      auto choice = choose(self, req);
      if (!choice && st.queued.size() >= st.config.queue_limit) {
        ++st.rejected;
        return make_error(errc::queue_full, "no replica can serve and "
                                              + std::to_string(st.queued.size())
                                              + " requests are already waiting");
      }
      // Only now: a promise takes over the reply, so no error may follow it.
      request_record rec;
      rec.ticket = st.next_ticket++;
      rec.request = std::move(req);
      rec.sink = std::move(sink);
      rec.promise = self->make_response_promise<generate_result>();
      auto promise = rec.promise;
      st.in_flight.emplace(rec.request.request_id, rec.ticket);
      if (choice)
        dispatch(self, std::move(rec), *choice);
      else
        enqueue(self, std::move(rec));
      return promise;
    }),
    authorized(self, guard, [=](route_atom, route_update& u, rollout_engine_actor& engine) {
      auto& st = self->state;
      if (!engine || !check(u).empty())
        return; // nothing to route to (the coordinator never sends such a name)
      if (auto d = st.dead.find(u.engine); d != st.dead.end() && d->second == engine.address())
        return; // news from before its death: it stays off the table
      auto& known = st.engines[u.engine];
      if (known != engine) {
        // New, or restarted under the same name: watch this incarnation.
        known = engine;
        self->monitor(engine);
      }
      auto r = find_replica(st, u.engine);
      if (r == nullptr) {
        st.replicas.push_back({u.engine, 0, false, 0});
        r = &st.replicas.back();
      }
      r->version = u.version;
      r->routable = u.routable;
      if (u.routable)
        st.rules.newest_version = std::max(st.rules.newest_version, u.version);
      drain_queue(self);
    }),
    authorized(self, guard, [=](version_atom, const version_info& published) {
      // Only ever raises the bar: no queued request can become servable here.
      auto& rules = self->state.rules;
      rules.published_version = std::max(rules.published_version, published.version);
    }),
    authorized(self, guard, [=](evict_atom, const std::string& name) {
      // Evicted before its round reached it: its running requests go on
      // there, on the version it holds (one evicted in its wave is failed).
      if (auto r = find_replica(self->state, name))
        r->routable = false;
    }),
    authorized(self, guard, [=](failed_atom, const std::string& name) {
      auto& st = self->state;
      if (auto i = st.engines.find(name); i != st.engines.end())
        engine_failed(self, i->second.address(),
                      "taken out of routing by the coordinator (silent, evicted in a round, or dirty)", false);
    }),
    authorized(self, guard, [=](caf::timeout_atom, std::uint64_t, std::uint32_t) {
      if (self->current_sender() != self->ctrl())
        return; // only the router's own deadlines
      auto& st = self->state;
      // Timers armed for later than the earliest deadline may still come: each just sweeps.
      st.queue_timer_at.reset();
      const auto now = self->clock().now();
      while (!st.queue_deadlines.empty() && st.queue_deadlines.begin()->first <= now) {
        auto i = st.queued.find(st.queue_deadlines.begin()->second);
        if (i == st.queued.end()) { // a guard: dequeue drops the deadline with the request
          st.queue_deadlines.erase(st.queue_deadlines.begin());
          continue;
        }
        give_up_waiting(self, dequeue(st, i));
      }
      arm_queue_timer(self);
    }),
    authorized(self, guard, [=](status_atom) -> router_status {
      return status_of(self->state, true);
    }),
    authorized(self, guard, [=](heartbeat_atom, const heartbeat& hb) -> heartbeat {
      return {self->state.config.name, hb.seq};
    }),
  };
}

router_actor spawn_router(caf::actor_system& sys, router_config config, sender_policy authorize) {
  return sys.spawn(router, std::move(config), std::move(authorize));
}

} // namespace rlsync
