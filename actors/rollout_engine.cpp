#include "actors/rollout_engine.hpp"

#include "actors/fleet_metrics.hpp"

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/apply_packed.hpp"
#include "runtime/engine/device_gemm.hpp"
#include "runtime/engine/loader.hpp"
#include "runtime/engine/weight_view.hpp"
#include "runtime/transfer/bucket.hpp"

#include <caf/actor_system.hpp>
#include <caf/blocking_actor.hpp>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <limits>

namespace rlsync {

namespace {

using engine_ptr = rollout_engine_impl::stateful_pointer<rollout_engine_state>;

/// A drill cut this engine off: messages from outside go unanswered.
bool cut_off(engine_ptr self) {
  return self->state.faults && self->state.faults->partitioned.load();
}

/// An unanswered request: the promise is never delivered, so the requester
/// meets its own deadline, as with a process that stopped answering.
template <class... Ts>
caf::result<Ts...> unanswered(engine_ptr self, caf::result<Ts...>*) {
  return self->make_response_promise<Ts...>();
}

template <class F, class Result, class... Args>
auto gate(engine_ptr self, F handler, Result (F::*)(Args...) const) {
  return [self, handler](Args... xs) -> Result {
    // The engine's own request (a phase order it took before the cut) passes.
    if (cut_off(self) && self->current_sender() != self->ctrl())
      return unanswered(self, static_cast<Result*>(nullptr));
    return handler(std::forward<Args>(xs)...);
  };
}

/// The partition gate around a request handler from outside: while a drill
/// cuts the engine off, the request goes unanswered and the handler does not
/// run (the phase-order handler applies it to an order as it arrives). The wrapper has the handler's own signature, so the behaviour's
/// typing is unchanged.
template <class F>
auto gated(engine_ptr self, F handler) {
  return gate(self, std::move(handler), &F::operator());
}

/// True when a worker thread of the engine died (a kill_worker drill is
/// applied here first): the engine stops with the failure as its exit
/// reason — what the coordinator sees, evicting it — and serves nothing more.
bool worker_died(engine_ptr self) {
  auto& st = self->state;
  if (st.faults)
    if (int rank = st.faults->kill_rank.exchange(-1); rank >= 0)
      st.core->kill_worker(std::min(rank, st.core->dp() - 1),
                           std::min(st.faults->kill_worker.load(), st.core->options().tp - 1));
  auto failure = st.core->failure();
  if (!failure)
    return false;
  std::cerr << *failure << ": the engine stops\n";
  self->quit(caf::make_error(caf::sec::runtime_error, *failure));
  return true;
}

/// How long a delay_acks drill still holds acknowledgements; 0: not held.
std::chrono::nanoseconds ack_hold(engine_ptr self) {
  if (!self->state.faults)
    return std::chrono::nanoseconds{0};
  auto until = self->state.faults->acks_held_until_ns.load();
  auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  return std::chrono::nanoseconds{until > now ? until - now : 0};
}

/// Delivers `value` now, or when a delay_acks drill lets it go.
template <class T>
void deliver_held(engine_ptr self, caf::typed_response_promise<T> rp, T value) {
  auto wait = ack_hold(self);
  if (wait.count() == 0) {
    rp.deliver(std::move(value));
    return;
  }
  auto id = self->state.next_held_ack++;
  self->state.held_acks.emplace(id, [rp, value]() mutable { rp.deliver(std::move(value)); });
  self->delayed_send(self, wait, caf::timeout_atom::value, id);
}

/// A phase acknowledgement, held while a delay_acks drill says so.
template <class T>
caf::result<T> held(engine_ptr self, T value) {
  if (ack_hold(self).count() == 0)
    return value;
  auto rp = self->make_response_promise<T>();
  deliver_held(self, rp, std::move(value));
  return rp;
}

caf::error to_error(const engine::engine_error& e) { return make_error(e.code, e.what); }

errc to_errc(transfer::transfer_failure f) {
  switch (f) {
    case transfer::transfer_failure::checksum_mismatch: return errc::checksum_mismatch;
    case transfer::transfer_failure::version_unavailable: return errc::version_gone;
    default: return errc::round_aborted; // timeout, producer gone: the round cannot complete here
  }
}

/// Pulls every worker's groups into a sink before a deadline: from the
/// engine's one producer, or from several trainer ranks (the M:N pull).
using pull_fn = std::function<transfer_report(const transfer::group_sink&, transfer::clock::time_point)>;

/// Runs on the pulling thread: every worker's groups into the staging
/// weights, and into `landing` (an engine on a device; null: none) where
/// the data plane holds them on a device.
/// `abandoned()`: the round let this pull go; a data plane that can stops
/// at its next group (group_sink::abandoned).
std::shared_ptr<pull_outcome> pull_version(const pull_fn& pull, const std::string& name,
                                           std::vector<std::shared_ptr<const plan::grouped_plan>> plans,
                                           std::shared_ptr<engine::weight_set> staging,
                                           std::shared_ptr<engine::device_landing> landing, transfer_order order,
                                           std::chrono::milliseconds deadline, std::function<bool()> abandoned) {
  auto out = std::make_shared<pull_outcome>();
  out->version = order.version;
  out->received.resize(plans.size());
  transfer::group_sink sink;
  sink.abandoned = std::move(abandoned);
  // Each callback touches only its own worker's shard and slot.
  sink.on_group = [&](int w, std::uint32_t g, const std::uint8_t* bytes, std::size_t size) {
    auto& plan = *plans[static_cast<std::size_t>(w)];
    engine::apply_group(plan, g, bytes, size, staging->workers[static_cast<std::size_t>(w)]);
    for (const auto* e : plan.entries(g))
      out->received[static_cast<std::size_t>(w)].insert(e->source);
  };
  // Stored as sent: the data plane copies each group straight into place.
  sink.targets = [&](int w, std::uint32_t g) {
    std::vector<transfer::store_target> out;
    auto ranges = engine::group_destinations(*plans[static_cast<std::size_t>(w)], g,
                                             staging->workers[static_cast<std::size_t>(w)]);
    for (const auto& r : ranges)
      out.push_back({r.at, r.bytes});
    return out;
  };
  sink.on_stored = [&](int w, std::uint32_t g) {
    for (const auto* e : plans[static_cast<std::size_t>(w)]->entries(g))
      out->received[static_cast<std::size_t>(w)].insert(e->source);
  };
  // Serving from a device: runs the data plane holds on one land in the
  // device copy too. A failed copy leaves the rest to the upload at finish.
  if (landing) {
    auto failed = std::make_shared<std::atomic<bool>>(false);
    sink.lands_from = [landing, failed](int device) { return !failed->load() && landing->accepts(device); };
    sink.on_device = [landing, failed](const transfer::store_target& t, const void* bytes, int device) {
      if (failed->load())
        return;
      try {
        landing->land(t.at, bytes, t.bytes, device);
      } catch (const std::exception&) {
        failed->store(true);
      }
    };
  }
  sink.on_full_group = [&](int w, std::uint32_t, const std::vector<tensor_view>& tensors) {
    auto& dst = staging->workers[static_cast<std::size_t>(w)];
    for (const auto& t : tensors) {
      if (ignored_weight(staging->config(), t.name))
        continue;
      engine::load_weight(*engine::real_weight(t.name, t.type, t.shape, t.data), dst);
      out->received[static_cast<std::size_t>(w)].insert(t.name);
    }
  };
  try {
    auto report = pull(sink, transfer::clock::now() + deadline);
    report.engine = name;
    out->report = report;
  } catch (const transfer::transfer_error& e) {
    out->code = to_errc(e.failure);
    out->what = name + ": " + e.what();
  } catch (const std::exception& e) {
    out->code = errc::malformed;
    out->what = name + ": " + e.what();
  }
  return out;
}

/// SHA-256 of `size` bytes as lower-case hex.
std::string sha256_hex(const void* data, std::size_t size) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data, size, digest, &length, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("SHA-256 failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

/// Seconds since `since` into `h` (no metrics: nothing).
void observe_since(metrics::histogram* h, std::chrono::steady_clock::time_point since) {
  if (h)
    h->observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count());
}

/// The transfer in flight ended (done, failed or abandoned): its update duration.
void transfer_ended(engine_ptr self, const std::shared_ptr<engine_metrics>& m) {
  if (!m)
    return;
  observe_since(&m->update_seconds, self->state.transfer_started);
  m->operations_in_flight.dec();
}

} // namespace

rollout_engine_impl::behavior_type
rollout_engine(rollout_engine_impl::stateful_pointer<rollout_engine_state> self, rollout_engine_config cfg) {
  const auto init_started = std::chrono::steady_clock::now();
  const auto metrics = cfg.metrics;
  self->state.core = std::make_unique<engine::engine_core>(cfg.model, cfg.options);
  self->state.node = cfg.node;
  self->state.self_stepping = cfg.self_stepping;
  self->state.puller = cfg.puller;
  self->state.faults = cfg.faults;
  for (int w = 0; w < cfg.options.tp; ++w) {
    auto plan = std::make_shared<const plan::worker_plan>(self->state.core->worker_plan(w));
    self->state.plans.push_back(std::make_shared<const plan::grouped_plan>(cfg.model, plan));
    self->state.worker_plans.push_back(plan);
    if (cfg.puller)
      cfg.puller->register_worker(cfg.options.name, plan);
  }
  self->state.producer_links = std::make_shared<transfer::producer_links>();
  if (metrics) { // init: the engine, its plans and their data-plane registration
    observe_since(&metrics->init_seconds, init_started);
    metrics->sample(self->state.core->status());
  }
  self->attach_functor([puller = cfg.puller, links = self->state.producer_links, name = cfg.options.name,
                        abandoned = self->state.pulls_abandoned_through] {
    abandoned->store(std::numeric_limits<std::uint64_t>::max()); // a pull still running lets go where it can
    if (puller)
      puller->unregister_engine(name);
    for (auto& [rank, link] : *links)
      link->unregister(name);
  });
  const std::string name = cfg.options.name;

  // Keeps exactly one step message in flight while the engine has work.
  auto schedule_step = [self] {
    if (self->state.self_stepping && !self->state.step_scheduled && self->state.core->has_work()) {
      self->state.step_scheduled = true;
      self->send(self, step_atom::value);
    }
  };
  auto deliver_pause_if_done = [self] {
    if (!self->state.pause_promise)
      return;
    if (auto report = self->state.core->poll_pause()) {
      deliver_held(self, *self->state.pause_promise, *report);
      self->state.pause_promise.reset();
    }
  };
  self->set_down_handler([self, deliver_pause_if_done](caf::down_msg& dm) {
    auto range = self->state.sinks.equal_range(dm.source);
    std::vector<std::uint64_t> orphans;
    for (auto i = range.first; i != range.second; ++i)
      orphans.push_back(i->second);
    self->state.sinks.erase(range.first, range.second);
    for (auto id : orphans)
      self->state.core->abort(id); // answered as aborted to a requester that moved on
    deliver_pause_if_done();
  });
  auto ack = [self, name] { return phase_ack{name, self->state.core->version(), self->state.core->dirty()}; };
  // Every handler: only the coordinator and router it registered with (and
  // this process's actors) drive it; anyone else is refused before the drill gate.
  auto guard = self->state.guard = std::make_shared<sender_guard>("engine " + name, cfg.authorize, cfg.log);
  const auto vouched = cfg.vouched_router;
  refuse_stray_errors(self, guard);

  return {
    authorized(self, guard, gated(self, [=](pause_atom, const pause_request& req) -> caf::result<pause_report> {
      if (auto why = check(req); !why.empty())
        return make_error(errc::malformed, why);
      if (self->state.pause_promise) // a newer pause supersedes one still in flight
        self->state.pause_promise->deliver(make_error(errc::pause_in_flight, name + ": superseded by a newer pause"));
      self->state.pause_promise.reset();
      self->state.core->pause(req);
      if (metrics)
        metrics->sample(self->state.core->status());
      if (auto report = self->state.core->poll_pause())
        return held(self, *report);
      auto rp = self->make_response_promise<pause_report>();
      self->state.pause_promise = rp;
      schedule_step();
      return rp;
    })),
    authorized(self, guard, gated(self, [=](flush_atom) -> caf::result<phase_ack> {
      self->state.core->flush();
      return held(self, ack());
    })),
    authorized(self, guard, gated(self, [=](start_atom, std::uint64_t version) -> caf::result<phase_ack> {
      if (self->state.transfer_promise)
        return make_error(errc::malformed, name + ": a transfer is in flight");
      auto started = std::chrono::steady_clock::now();
      auto e = self->state.core->start_update(version);
      observe_since(metrics ? &metrics->start_seconds : nullptr, started);
      if (e)
        return to_error(*e);
      return held(self, ack());
    })),
    authorized(self, guard, gated(self, [=](update_atom, const weight_bucket& bucket) -> caf::result<std::uint64_t> {
      if (self->state.transfer_promise)
        return make_error(errc::malformed, name + ": a transfer is in flight");
      if (auto why = check(bucket); !why.empty())
        return make_error(errc::malformed, why);
      // A late bucket of an earlier session must not count as this one's.
      if (auto session = self->state.core->session_version(); session && *session != bucket.version)
        return make_error(errc::version_mismatch, name + ": a bucket of version " + std::to_string(bucket.version)
                                                    + " in the session for version " + std::to_string(*session));
      if (!transfer::verify_bucket(bucket))
        return make_error(errc::checksum_mismatch, name + ": bucket of group " + std::to_string(bucket.group)
                                                     + " of version " + std::to_string(bucket.version));
      std::vector<tensor_view> tensors;
      try {
        tensors = transfer::whole_tensor_views(bucket);
      } catch (const std::invalid_argument& e) {
        return make_error(errc::malformed, std::string(e.what()) + " (not accepted inline)");
      }
      std::uint64_t applied = 0;
      auto started = std::chrono::steady_clock::now();
      for (const auto& t : tensors) {
        if (auto err = self->state.core->apply_tensor(t)) {
          observe_since(metrics ? &metrics->update_seconds : nullptr, started);
          return to_error(*err);
        }
        applied += t.size;
      }
      observe_since(metrics ? &metrics->update_seconds : nullptr, started);
      return applied;
    })),
    authorized(self, guard, gated(self, [=](transfer_atom, const transfer_order& order, const std::vector<trainer_actor>& producers) -> caf::result<transfer_report> {
      auto& st = self->state;
      if (auto why = check(order); !why.empty())
        return make_error(errc::malformed, why);
      if (producers.size() != order.producers.size())
        return make_error(errc::malformed, name + ": the transfer order names " + std::to_string(order.producers.size())
                                             + " producers but carries " + std::to_string(producers.size()) + " handles");
      if (st.core->session_version() != order.version)
        return make_error(errc::no_session, name + ": transfer of version " + std::to_string(order.version)
                                              + " outside its session");
      if (st.transfer_promise)
        return make_error(errc::malformed, name + ": a transfer is already in flight");
      // A trainer step that changed nothing this engine serves: no data plane at all.
      if (st.core->keep_served(order.same_bytes_since))
        return held(self, transfer_report{name, order.version, 0, 0, 0});
      // The trainer ranks of the order, each behind the puller of its current incarnation.
      std::vector<std::shared_ptr<transfer::producer_link>> links;
      if (!order.producers.empty()) {
        if (!cfg.producer_puller)
          return make_error(errc::malformed, name + ": no data plane to pull from trainer ranks (backend '"
                                               + order.backend + "')");
        try {
          links = transfer::links_for(*st.producer_links, order.producers, name, [&](std::size_t i) {
            return cfg.producer_puller(order.producers[i], producers[i]);
          });
        } catch (const std::exception& e) {
          return make_error(errc::malformed, name + ": " + e.what());
        }
      } else if (!st.puller) {
        return make_error(errc::malformed, name + ": no data plane for backend '" + order.backend + "'");
      }
      // The pull blocks: it runs on its own thread and reports back here.
      auto deadline = std::chrono::milliseconds(cfg.transfer_deadline_ms);
      auto seq = ++st.transfer_seq;
      auto abandoned = [through = st.pulls_abandoned_through, seq] { return through->load() >= seq; };
      pull_fn pull;
      if (links.empty())
        pull = [puller = st.puller, name, tp = static_cast<int>(st.plans.size()), order](const transfer::group_sink& sink,
                                                                                       transfer::clock::time_point until) {
          return transfer::pull_engine(*puller, name, tp, order.version, order.mode, sink, until);
        };
      else
        pull = [links, name, model = cfg.model, plans = st.worker_plans, order](const transfer::group_sink& sink,
                                                                               transfer::clock::time_point until) {
          return transfer::pull_from_holders(model, {name, order.version, order.mode, until}, plans, links, sink);
        };
      // On the kept pulling thread when it is free, else on a thread of its own.
      const bool kept = !st.pull_thread_busy;
      auto job = std::make_shared<pull_job>();
      // On a device, a data plane that holds the bytes there fills its copy too.
      const bool may_land = links.empty() ? st.puller && st.puller->lands_on_device()
                                          : std::any_of(links.begin(), links.end(), [](const auto& l) {
                                              return l->puller().lands_on_device();
                                            });
      job->run = [pull, name, plans = st.plans, staging = st.core->session_staging(),
                  landing = may_land ? st.core->open_landing() : nullptr, order, deadline, seq, kept,
                  format = st.core->options().weights, engine = self->address(), abandoned] {
        auto outcome = pull_version(pull, name, plans, staging, landing, order, deadline, abandoned);
        // The process step here, off the engine's thread: finish then only swaps.
        if (outcome->report && format == engine::weight_format::int8 && staging)
          engine::process_weights(*staging, format);
        outcome->seq = seq;
        outcome->kept_thread = kept;
        // A weak reference until here: a stopping engine must not be kept alive by its pull.
        if (auto e = caf::actor_cast<rollout_engine_impl>(engine))
          caf::anon_send(e, pull_atom::value, std::move(outcome));
      };
      if (kept) {
        if (!st.pull_thread) {
          // An empty job stops it (sent as the engine goes, after any pull it still runs).
          st.pull_thread = self->spawn<caf::detached>([](caf::blocking_actor* thread) {
            bool running = true;
            thread->receive_while(running)([&](pull_atom, const std::shared_ptr<pull_job>& j) {
              if (j)
                j->run();
              else
                running = false;
            });
          });
          self->attach_functor(
            [thread = st.pull_thread] { caf::anon_send(thread, pull_atom::value, std::shared_ptr<pull_job>{}); });
        }
        st.pull_thread_busy = true;
        caf::anon_send(st.pull_thread, pull_atom::value, std::move(job));
      } else {
        self->spawn<caf::detached>([job](caf::blocking_actor*) { job->run(); });
      }
      auto rp = self->make_response_promise<transfer_report>();
      st.transfer_promise = rp;
      st.transfer_started = std::chrono::steady_clock::now();
      if (metrics)
        metrics->operations_in_flight.inc();
      return rp;
    })),
    [=](pull_atom, std::shared_ptr<pull_outcome> out) {
      auto& st = self->state;
      if (out->kept_thread)
        st.pull_thread_busy = false;
      if (!st.transfer_promise || out->seq != st.transfer_seq)
        return; // the pull of an aborted round: its session is gone
      auto rp = *st.transfer_promise;
      st.transfer_promise.reset();
      transfer_ended(self, metrics);
      if (!out->report) {
        st.core->abort_update(); // dirty until a complete update
        rp.deliver(make_error(out->code, out->what));
        return;
      }
      for (std::size_t w = 0; w < out->received.size(); ++w)
        if (auto e = st.core->mark_received(static_cast<int>(w), out->received[w], out->version)) {
          rp.deliver(to_error(*e));
          return;
        }
      deliver_held(self, rp, *out->report);
    },
    authorized(self, guard, gated(self, [=](finish_atom, std::uint64_t version) -> caf::result<phase_ack> {
      if (self->state.transfer_promise)
        return make_error(errc::malformed, name + ": a transfer is in flight");
      auto started = std::chrono::steady_clock::now();
      auto e = self->state.core->finish_update(version);
      observe_since(metrics ? &metrics->finish_seconds : nullptr, started);
      if (metrics)
        metrics->sample(self->state.core->status());
      if (e)
        return to_error(*e);
      return ack();
    })),
    authorized(self, guard, gated(self, [=](resume_atom) -> caf::result<phase_ack> {
      auto& st = self->state;
      if (st.core->in_session()) { // continue without finish: the round was aborted
        bool pulling = st.transfer_promise.has_value();
        if (pulling) {
          st.transfer_promise->deliver(make_error(errc::round_aborted, name + ": the round was aborted"));
          st.transfer_promise.reset();
          transfer_ended(self, metrics);
          st.pulls_abandoned_through->store(st.transfer_seq);
        }
        st.core->abandon_update(pulling);
      }
      auto resumed = self->state.core->resume();
      if (metrics)
        metrics->sample(self->state.core->status());
      if (resumed)
        return to_error(*resumed);
      schedule_step();
      return ack();
    })),
    authorized(self, guard, gated(self, [=](generate_atom, generate_request req, token_sink_actor sink) -> caf::result<generate_result> {
      auto id = req.request_id;
      // The same request again is a newer attempt: the router rerouted it
      // while this engine was unreachable and the abort of the old one was
      // lost. The old attempt ends here (aborted; its requester moved on).
      if (self->state.pending.count(id)) {
        self->state.core->abort(id);
        deliver_pause_if_done(); // it may have been the last request a wait-pause waited for
      }
      engine::request_callbacks cb;
      cb.on_token = [self, sink](const token_event& ev) { self->send(sink, token_atom::value, ev); };
      cb.on_finish = [self, id, who = sink.address()](generate_result r) {
        auto range = self->state.sinks.equal_range(who);
        for (auto i = range.first; i != range.second; ++i)
          if (i->second == id) {
            self->state.sinks.erase(i);
            break;
          }
        auto it = self->state.pending.find(id);
        if (it == self->state.pending.end())
          return;
        it->second.deliver(std::move(r));
        self->state.pending.erase(it);
      };
      // Refusals are answered before a promise exists: once a promise is
      // made, CAF sends nothing for the handler's return value.
      auto prompt_tokens = req.prompt.size() + req.generated.size(); // a continuation prefills both
      if (auto e = self->state.core->add(std::move(req), std::move(cb)))
        return to_error(*e);
      if (metrics) {
        metrics->prompt_tokens.inc(static_cast<double>(prompt_tokens));
        metrics->sample(self->state.core->status());
      }
      auto rp = self->make_response_promise<generate_result>();
      self->state.pending.emplace(id, rp);
      self->state.sinks.emplace(sink.address(), id);
      self->monitor(sink);
      schedule_step();
      return rp;
    })),
    authorized(self, guard, gated(self, [=](abort_atom, std::uint64_t request_id) -> caf::result<bool> {
      bool found = self->state.core->abort(request_id);
      deliver_pause_if_done();
      return found;
    })),
    authorized(self, guard, gated(self, [=](status_atom) -> caf::result<engine_status> {
      auto s = self->state.core->status();
      s.refused = self->state.guard->refused();
      return s;
    })),
    authorized(self, guard, gated(self, [=](heartbeat_atom, const heartbeat& hb) -> caf::result<heartbeat> {
      if (worker_died(self))
        return caf::make_error(caf::sec::runtime_error, *self->state.core->failure());
      return heartbeat{name, hb.seq};
    })),
    authorized(self, guard, [=](route_atom, const heartbeat_actor& router) {
      if (vouched && !vouched(self->current_sender(), router.address()))
        guard->refuse(self->current_sender(), "route", "only the coordinator vouches for a router");
    }),
    authorized(self, guard, [=](phase_atom, const phase_order& order) {
      if (!cut_off(self)) // a partition drill: the order is lost, as the request would go unanswered
        serve_phase_order(self, self->state.phase_orders, order);
    }),
    authorized(self, guard, gated(self, [=, join = cfg.nccl_join](nccl_join_atom, const nccl_rendezvous_msg& msg)
                                          -> caf::result<std::uint64_t> {
      if (!join)
        return make_error(errc::unknown_name, "engine " + name + " joins no nccl communicator");
      if (auto why = join(msg); !why.empty())
        return make_error(errc::malformed, "engine " + name + ": " + why);
      return msg.epoch;
    })),
    authorized(self, guard, [=, dead = cfg.nccl_dead](nccl_dead_atom, std::uint64_t epoch, const std::string& who) {
      if (dead)
        dead(epoch, who);
    }),
    authorized(self, guard, gated(self, [=](digest_atom) -> caf::result<weight_digest> {
      weight_digest d;
      d.engine = name;
      d.version = self->state.core->version();
      d.dirty = self->state.core->dirty();
      for (auto& [param, sum] : self->state.core->weight_checksums()) {
        d.names.push_back(param);
        d.checksums.push_back(sum);
      }
      return d;
    })),
    authorized(self, guard, [=](load_atom, const std::string& dir) -> caf::result<std::uint64_t> {
      auto& st = self->state;
      if (st.transfer_promise)
        return make_error(errc::malformed, name + ": a transfer is in flight");
      if (!st.core->in_session())
        return make_error(errc::no_session, name + ": load of " + dir + " outside a weight-update session");
      // vLLM's "update" operation, observed on failure too.
      struct observe_update {
        metrics::histogram* h;
        std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
        ~observe_update() { observe_since(h, since); }
      } observe{metrics ? &metrics->update_seconds : nullptr};
      try {
        auto ckpt = checkpoint::open(dir);
        // Checked whole before the first tensor lands, so that a wrong
        // checkpoint leaves the session untouched.
        auto problems = check_llama_parameters(ckpt, cfg.model, checkpoint_dtype(ckpt),
                                               [&](const std::string& n) { return ignored_weight(cfg.model, n); });
        if (!problems.empty())
          return make_error(errc::malformed, dir + " does not fit the served model: " + problems.front()
                                               + (problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1)
                                                                            + " more)" : ""));
        std::uint64_t bytes = 0;
        for (const auto& e : ckpt.tensors()) {
          if (auto err = st.core->apply_tensor(*e.tensor))
            return to_error(*err);
          bytes += e.tensor->size;
        }
        return bytes;
      } catch (const std::exception& e) {
        return make_error(errc::malformed, dir + ": " + e.what());
      }
    }),
    authorized(self, guard, [=](release_atom) -> caf::result<std::uint64_t> {
      auto& st = self->state;
      if (st.transfer_promise)
        return make_error(errc::malformed, name + ": a transfer is in flight");
      auto released = st.core->release_weights();
      if (auto err = std::get_if<engine::engine_error>(&released))
        return to_error(*err);
      return std::get<std::uint64_t>(released);
    }),
    authorized(self, guard, [=](drop_atom) -> caf::result<phase_ack> {
      auto& st = self->state;
      if (st.transfer_promise)
        return make_error(errc::malformed, name + ": a transfer is in flight");
      if (st.core->in_session())
        st.core->abandon_update(false);
      return ack();
    }),
    authorized(self, guard, [=](sha256_atom) -> caf::result<std::string> {
      auto weights = self->state.core->weights();
      nlohmann::json out = nlohmann::json::object();
      if (weights)
        for (std::size_t w = 0; w < weights->workers.size(); ++w)
          for (const auto& p : weights->workers[w].params())
            out[std::to_string(w) + "/" + p.name] = sha256_hex(p.bytes.data(), p.bytes.size());
      return out.dump();
    }),
    authorized(self, guard, [=](caf::timeout_atom, std::uint64_t id) {
      if (self->current_sender() != self->ctrl())
        return; // only its own timers
      auto i = self->state.held_acks.find(id);
      if (i == self->state.held_acks.end())
        return;
      auto send = std::move(i->second);
      self->state.held_acks.erase(i);
      send();
    }),
    authorized(self, guard, [=](step_atom) {
      if (cut_off(self)) { // a hung process: no steps, no tokens; look again later
        self->delayed_send(self, std::chrono::milliseconds(10), step_atom::value);
        return;
      }
      self->state.step_scheduled = false;
      if (worker_died(self))
        return;
      try {
        self->state.core->step();
      } catch (const std::exception& e) {
        // A step that failed (on a device: a CUDA or cuBLAS error) leaves its
        // requests half-advanced: the engine stops, as for a dead worker.
        std::cerr << self->state.core->options().name << ": a step failed: " << e.what() << ": the engine stops\n";
        self->quit(caf::make_error(caf::sec::runtime_error, std::string(e.what())));
        return;
      }
      if (metrics)
        metrics->sample(self->state.core->status());
      deliver_pause_if_done();
      schedule_step();
    }),
  };
}

rollout_engine_impl spawn_rollout_engine(caf::actor_system& sys, rollout_engine_config cfg) {
  return sys.spawn<caf::detached>(rollout_engine, std::move(cfg));
}

} // namespace rlsync
