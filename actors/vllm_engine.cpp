#include "actors/vllm_engine.hpp"

#include "actors/fleet_metrics.hpp"
#include "actors/vllm_server_calls.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/engine_core.hpp"
#include "runtime/engine/loader.hpp"
#include "runtime/engine/weights.hpp"
#include "runtime/http/client.hpp"
#include "runtime/plan/grouped_plan.hpp"
#include "runtime/vllm/remote_engine.hpp"

#include <caf/blocking_actor.hpp>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <thread>
#include <utility>

namespace rlsync {

namespace {

using self_ptr = vllm_engine_impl::stateful_pointer<vllm_engine_state>;
using clock_type = std::chrono::steady_clock;
using nlohmann::json;
using ms = std::chrono::milliseconds;
using vllm_calls::http_failure;
using vllm_calls::ok_status;
using vllm_calls::run_health;
using vllm_calls::run_stream;
using vllm_calls::server_conn;

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

void observe_since(metrics::histogram* h, clock_type::time_point since) {
  if (h)
    h->observe(std::chrono::duration<double>(clock_type::now() - since).count());
}

/// A message from this process (the adapter's workers and timers): the
/// guard's policy may admit only the coordinator and router, not them.
bool from_here(self_ptr self) {
  const auto& sender = self->current_sender();
  return sender && sender->node() == self->node();
}

ms remaining(clock_type::time_point until) {
  return std::chrono::duration_cast<ms>(until - clock_type::now());
}

/// Runs `work` (blocking: HTTP, files) on a detached worker; what it returns
/// runs in the actor afterwards. False when max_control_calls are in flight.
template <class Work>
bool run_job(self_ptr self, std::uint32_t max_calls, Work work) {
  if (self->state.control_calls >= max_calls)
    return false;
  ++self->state.control_calls;
  self->spawn<caf::detached>([work = std::move(work), engine = self->address()](caf::blocking_actor* w) mutable {
    std::function<void()> apply = work();
    // A weak reference until here: a stopping engine is not kept alive by its calls.
    if (auto e = caf::actor_cast<vllm_engine_impl>(engine))
      w->send(e, vllm_job_atom::value, std::make_shared<vllm_job_done>(vllm_job_done{std::move(apply)}));
  });
  return true;
}

/// What a transfer worker reports.
struct transfer_outcome {
  std::optional<transfer_report> report;
  std::string dir;
  errc code = errc::round_aborted;
  std::string what;
};

errc to_errc(transfer::transfer_failure f) {
  switch (f) {
    case transfer::transfer_failure::checksum_mismatch: return errc::checksum_mismatch;
    case transfer::transfer_failure::version_unavailable: return errc::version_gone;
    default: return errc::round_aborted;
  }
}

/// What a failed stream tells the router. A request the server refused as
/// malformed or too large (400, 413, 422: longer than its --max-model-len,
/// say) is the request's fault: malformed, so that it is not sent to every
/// other engine, taking each out of routing. A busy server (429) asks to
/// retry elsewhere. Anything else is the server's fault: engine_dirty, so
/// the router stops sending here until the next round, instead of trying
/// this server again at once (the one with the fewest outstanding) until
/// the reroutes run out.
errc stream_failure(int refused_with) {
  switch (refused_with) {
    case 400:
    case 413:
    case 422: return errc::malformed;
    case 429: return errc::queue_full;
    default: return errc::engine_dirty;
  }
}

/// What is wrong with stream update `u` of `s`, or nothing: a server that
/// lies fails the request instead of growing it without bound (more tokens
/// than asked, ids outside the vocabulary) or shifting log-probabilities
/// onto the wrong tokens (they line up one to one with the tokens, the top
/// ones k to one). The first chunk of tokens says whether the server sends
/// top log-probabilities (s.sends_top); every later one must say the same.
std::string lie_in(const vllm_stream_update& u, vllm_stream& s, std::int64_t vocab_size) {
  const auto& sampling = s.request.sampling;
  const auto asked = sampling.max_tokens - s.request.generated.size();
  if (s.result.tokens.size() + u.tokens.size() > asked)
    return "the server sent more than the " + std::to_string(asked) + " tokens asked for";
  for (auto t : u.tokens)
    if (t >= vocab_size)
      return "the server sent token " + std::to_string(t) + ", outside the vocabulary";
  for (const auto& row : u.top)
    for (const auto& [t, logprob] : row)
      if (t >= vocab_size)
        return "the server sent top token " + std::to_string(t) + ", outside the vocabulary";
  if (!sampling.logprobs || u.tokens.empty())
    return {};
  if (u.logprobs.size() != u.tokens.size())
    return "the server sent " + std::to_string(u.tokens.size()) + " tokens with " + std::to_string(u.logprobs.size())
           + " log-probabilities";
  const auto k = sampling.top_logprobs;
  if (k == 0)
    return {};
  const bool sent = !u.top.empty();
  if (!s.sends_top)
    s.sends_top = sent;
  const bool short_of_k = sent && (u.top.size() != u.tokens.size()
                                   || std::any_of(u.top.begin(), u.top.end(), [k](const auto& t) { return t.size() < k; }));
  if (*s.sends_top != sent || short_of_k)
    return "the server sent top log-probabilities for some tokens and not others, or fewer than the "
           + std::to_string(k) + " asked for";
  return {};
}

/// Tensors of one group as the tp-1 whole-tensor plan packs them: back to back.
std::vector<tensor_view> whole_tensors(const plan::grouped_plan& plan, std::uint32_t g, const std::uint8_t* bytes,
                                       std::size_t size) {
  std::vector<tensor_view> out;
  std::uint64_t at = 0;
  for (const auto* e : plan.entries(g)) {
    tensor_view t;
    t.name = e->source;
    t.type = e->source_type;
    t.shape = e->source_shape;
    t.size = e->bytes();
    if (t.size > size - std::min<std::uint64_t>(at, size))
      throw std::invalid_argument("group " + std::to_string(g) + ": " + std::to_string(size)
                                  + " bytes do not hold tensor " + t.name + " (does the trainer send "
                                  + std::string(short_name(e->source_type)) + "?)");
    t.data = reinterpret_cast<const std::byte*>(bytes + at);
    at += t.size;
    out.push_back(t);
  }
  if (at != size)
    throw std::invalid_argument("group " + std::to_string(g) + ": " + std::to_string(size) + " bytes for tensors of "
                                + std::to_string(at) + " (does the trainer send another dtype?)");
  return out;
}

} // namespace

vllm_engine_impl::behavior_type vllm_engine(vllm_engine_impl::stateful_pointer<vllm_engine_state> self,
                                            vllm_engine_config cfg) {
  const auto address = vllm::parse_server_url(cfg.url);
  const server_conn conn{address.host, address.port, cfg.bearer_token};
  const std::string name = cfg.name;
  const auto metrics = cfg.metrics;
  const auto log = cfg.log ? cfg.log : std::function<void(const std::string&)>([](const std::string& line) {
    std::cerr << line << std::endl;
  });
  auto say = [log, name](const std::string& what) { log("engine " + name + ": " + what); };
  auto& st0 = self->state;
  st0.node = cfg.node;
  st0.stopped = std::make_shared<std::atomic<bool>>(false);
  st0.last_change = clock_type::now();

  // The data plane sees one worker of tp 1 whose plan is every tensor whole.
  const auto tensors = vllm::checkpoint_tensors(cfg.model, cfg.source_dtype);
  const auto worker_plan =
    std::make_shared<const plan::worker_plan>(vllm::whole_tensor_plan(cfg.model, cfg.source_dtype));
  const auto grouped = std::make_shared<const plan::grouped_plan>(cfg.model, worker_plan);
  if (cfg.puller)
    cfg.puller->register_worker(name, worker_plan);
  auto links = std::make_shared<transfer::producer_links>();
  self->attach_functor([puller = cfg.puller, links, name, stopped = st0.stopped] {
    stopped->store(true);
    if (puller)
      puller->unregister_engine(name);
    for (auto& [rank, link] : *links)
      link->unregister(name);
  });

  auto guard = st0.guard = std::make_shared<sender_guard>("engine " + name, cfg.authorize, cfg.log);
  const auto vouched = cfg.vouched_router;
  refuse_stray_errors(self, guard);

  auto status = [self, name] {
    auto& st = self->state;
    engine_status s;
    s.name = name;
    s.version = st.version;
    s.dirty = st.dirty;
    s.state = st.sched;
    std::uint32_t open = static_cast<std::uint32_t>(st.stream_of.size());
    (st.sched == scheduler_state::paused_all ? s.frozen : s.running) = open;
    s.tokens_generated = st.tokens_generated;
    s.refused = st.guard->refused();
    return s;
  };
  auto sample = [metrics, status] {
    if (metrics)
      metrics->sample(status());
  };
  auto ack = [self, name] { return phase_ack{name, self->state.version, self->state.dirty}; };

  // One control call to the server, under `deadline_ms`: `ok` runs in the
  // actor with a 2xx answer, anything else fails the phase.
  auto http_phase = [self, conn, cfg, say, sample, name](
                      auto rp, const std::string& method, const std::string& target, const std::string& body,
                      std::uint64_t deadline_ms, std::function<void(const http::client_response&)> ok,
                      metrics::histogram* duration = nullptr) {
    auto fail = [self, rp, say, sample, name](const std::string& what) mutable {
      self->state.dirty = true;
      say(what);
      sample();
      rp.deliver(make_error(errc::round_aborted, name + ": " + what));
    };
    auto call = method + " " + target;
    bool started = run_job(self, cfg.max_control_calls, [=]() -> std::function<void()> {
      auto began = clock_type::now();
      try {
        auto r = conn.call(ms(deadline_ms), method, target, body);
        observe_since(duration, began);
        if (!ok_status(r.status))
          return [fail, what = http_failure(call, r)]() mutable { fail(what); };
        return [ok, r] { ok(r); };
      } catch (const std::exception& e) {
        observe_since(duration, began);
        return [fail, what = call + ": " + e.what()]() mutable { fail(what); };
      }
    });
    if (!started)
      fail(call + ": " + std::to_string(cfg.max_control_calls) + " control calls already in flight");
  };

  // Kept by pause(abort|wait) until the streams it ended are relayed.
  struct pause_wait {
    caf::typed_response_promise<pause_report> rp;
    pause_report report;
    std::set<std::uint64_t> streams;
    std::uint64_t seq;
  };
  auto waiting_pause = std::make_shared<std::optional<pause_wait>>();
  auto deliver_pause_if_done = [waiting_pause] {
    if (*waiting_pause && (*waiting_pause)->streams.empty()) {
      (*waiting_pause)->rp.deliver((*waiting_pause)->report);
      waiting_pause->reset();
    }
  };

  // Ends a stream's request with `r` (unanswered only): its promise answered,
  // the worker told to stop.
  auto close_stream = [self, sample, waiting_pause, deliver_pause_if_done](std::uint64_t stream,
                                                                          std::optional<finish_reason> reason,
                                                                          caf::error err) {
    auto& st = self->state;
    auto it = st.streams.find(stream);
    if (it == st.streams.end() || it->second.answered)
      return;
    auto& s = it->second;
    s.answered = true;
    s.cancel->store(true);
    st.stream_of.erase(s.request.request_id);
    if (reason) {
      s.result.reason = *reason;
      s.promise.deliver(std::move(s.result));
    } else {
      s.promise.deliver(std::move(err));
    }
    if (*waiting_pause) { // the pause's reply follows the last of the streams it waits for
      (*waiting_pause)->streams.erase(stream);
      deliver_pause_if_done();
    }
    sample();
  };

  // The server is gone or restarted: its streams fail (the router reroutes
  // them), and whatever it serves now is its initial weights.
  auto server_lost = [self, close_stream, say, name, waiting_pause](const std::string& why) {
    auto& st = self->state;
    if (*waiting_pause) { // what it waits for ends with the server, not with the pause
      auto wp = std::move(**waiting_pause);
      waiting_pause->reset();
      wp.rp.deliver(make_error(errc::round_aborted, name + ": pause: the server is lost: " + why));
    }
    std::vector<std::uint64_t> open;
    for (auto& [id, stream] : st.stream_of)
      open.push_back(stream);
    for (auto s : open)
      close_stream(s, std::nullopt, make_error(errc::engine_dirty, name + ": the server is lost: " + why));
    if (!open.empty())
      say("failed " + std::to_string(open.size()) + " running requests: " + why);
    st.version = 0;
    st.dirty = false;
    st.finished_label.clear();
    st.session.reset();
    st.session_dir.clear();
    st.sched = scheduler_state::unpaused;
    ++st.phase_seq; // a pause or finish in flight answers for a server that is gone
    ++st.transfer_seq; // and so does a transfer
  };

  self->set_down_handler([self, close_stream](caf::down_msg& dm) {
    // A sink that went down (the router closed the attempt's relay): nobody
    // would see the tokens, so the stream closes.
    std::vector<std::uint64_t> orphans;
    for (auto& [n, s] : self->state.streams)
      if (!s.answered && s.sink.address() == dm.source)
        orphans.push_back(n);
    for (auto n : orphans)
      close_stream(n, finish_reason::aborted, caf::error{});
  });

  // Starts the health poller.
  self->spawn<caf::detached>(run_health, self->address(), conn, ms(cfg.health_interval_ms),
                             ms(cfg.health_timeout_ms), st0.stopped);
  sample();

  return {
    // The adapter's own workers (local only: these types never cross the network).
    [=](vllm_job_atom, std::shared_ptr<vllm_job_done> job) {
      if (!from_here(self))
        return;
      --self->state.control_calls;
      if (job && job->apply)
        job->apply();
    },
    [=](vllm_health_atom, std::shared_ptr<vllm_health_report> r) {
      auto& st = self->state;
      if (!r || !from_here(self))
        return;
      if (!r->healthy) {
        if (st.healthy)
          say("the server is unhealthy (" + r->why + "): heartbeats unanswered until it answers again");
        st.healthy = false;
        server_lost(r->why);
        sample();
        return;
      }
      bool recovered = false;
      if (!st.healthy) {
        // A fresh (or restarted) server: open its disk weight-transfer
        // backend, as vLLM's clients do once ({} is the disk backend's init_info).
        run_job(self, cfg.max_control_calls, [=]() -> std::function<void()> {
          std::string problem;
          try {
            auto r = conn.call(ms(cfg.start_deadline_ms), "POST", "/init_weight_transfer_engine",
                               R"({"init_info": {}})");
            if (!ok_status(r.status))
              problem = http_failure("POST /init_weight_transfer_engine", r);
          } catch (const std::exception& e) {
            problem = std::string("POST /init_weight_transfer_engine: ") + e.what();
          }
          return [=] {
            if (!problem.empty())
              say(problem + " (weight updates may fail)");
          };
        });
        recovered = st.ever_healthy;
        if (recovered)
          say("the server answers again: a restarted server holds its initial weights, version 0 until a sync");
        st.healthy = st.ever_healthy = true;
      } else if (!st.finished_label.empty() && !r->label.empty() && r->label != st.finished_label
                 && st.control_calls == 0 && r->started > st.last_change) {
        // No update of ours in flight, yet another label: the server restarted between two polls.
        say("the server reports weight version '" + r->label + "', not '" + st.finished_label
            + "': it restarted; version 0 until a sync");
        server_lost("the server restarted");
        recovered = true;
      }
      if (recovered) {
        sample();
        if (cfg.on_recovered)
          cfg.on_recovered();
      }
    },
    [=](vllm_stream_atom, std::shared_ptr<vllm_stream_update> u) {
      auto& st = self->state;
      if (!u || !from_here(self))
        return;
      auto it = st.streams.find(u->stream);
      if (it == st.streams.end())
        return;
      auto& s = it->second;
      if (!s.answered) {
        s.seen = true;
        if (!u->completion_id.empty())
          s.completion_id = u->completion_id.substr(0, max_name_bytes);
        const auto lie = lie_in(*u, s, cfg.model.vocab_size);
        if (s.sends_top == false && !std::exchange(st.said_no_top, true))
          say("the server sends no top log-probabilities keyed by token id (does it ignore "
              "return_tokens_as_token_ids?): requests get none");
        if (!lie.empty()) {
          say("request " + std::to_string(s.request.request_id) + ": " + lie);
          close_stream(u->stream, std::nullopt, make_error(errc::not_routable, name + ": " + lie));
          u->tokens.clear();
        }
        for (std::size_t k = 0; k < u->tokens.size() && !s.answered; ++k) {
          token_event ev;
          ev.request_id = s.request.request_id;
          ev.index = static_cast<std::uint32_t>(s.request.generated.size() + s.result.tokens.size());
          ev.token = u->tokens[k];
          ev.version = st.version;
          if (s.request.sampling.logprobs) { // one each: checked above
            ev.logprob = u->logprobs[k];
            s.result.logprobs.push_back(ev.logprob);
            if (k < u->top.size())
              for (std::size_t t = 0; t < u->top[k].size() && t < s.request.sampling.top_logprobs; ++t) {
                ev.top_tokens.push_back(u->top[k][t].first);
                ev.top_logprobs.push_back(u->top[k][t].second);
              }
            s.result.top_tokens.insert(s.result.top_tokens.end(), ev.top_tokens.begin(), ev.top_tokens.end());
            s.result.top_logprobs.insert(s.result.top_logprobs.end(), ev.top_logprobs.begin(), ev.top_logprobs.end());
          }
          auto local = static_cast<std::uint32_t>(s.result.tokens.size());
          if (s.result.spans.empty() || s.result.spans.back().version != ev.version)
            s.result.spans.push_back({ev.version, local, local + 1});
          else
            s.result.spans.back().end = local + 1;
          s.result.tokens.push_back(ev.token);
          ++st.tokens_generated;
          self->send(s.sink, token_atom::value, ev);
        }
        if (u->spans && !s.answered) {
          // The server's own account of which version made which token, where it can be believed.
          if (auto spans = vllm::server_versions(*u->spans, s.opened_at, st.version, s.result.tokens.size()))
            s.result.spans = std::move(*spans);
        }
        if (s.answered) {
          // failed above
        } else if (u->finish) {
          close_stream(u->stream, *u->finish, caf::error{});
        } else if (u->ended) {
          auto why = u->error.empty() ? std::string("the stream ended early") : u->error;
          say("request " + std::to_string(s.request.request_id) + " failed: " + why);
          close_stream(u->stream, std::nullopt, make_error(stream_failure(u->refused_with), name + ": " + why));
        }
      }
      if (u->ended) {
        --st.workers;
        st.streams.erase(u->stream);
        sample();
      }
    },
    authorized(self, guard, [=](pause_atom, const pause_request& req) -> caf::result<pause_report> {
      if (auto why = check(req); !why.empty())
        return make_error(errc::malformed, why);
      auto& st = self->state;
      if (*waiting_pause) { // a newer pause supersedes one still in flight
        (*waiting_pause)->rp.deliver(make_error(errc::pause_in_flight, name + ": superseded by a newer pause"));
        waiting_pause->reset();
      }
      auto rp = self->make_response_promise<pause_report>();
      auto seq = ++st.phase_seq;
      std::set<std::uint64_t> at_send;
      for (auto& [id, stream] : st.stream_of)
        at_send.insert(stream);
      auto deadline = clock_type::now() + ms(cfg.pause_deadline_ms);
      http_phase(rp, "POST", vllm::pause_target(req.mode, req.clear_cache), "{}", cfg.pause_deadline_ms,
                 [=](const http::client_response&) mutable {
                   auto& st = self->state;
                   st.sched = req.mode == pause_mode::keep ? scheduler_state::paused_all : scheduler_state::paused_new;
                   pause_report report;
                   report.engine = name;
                   report.version = st.version;
                   report.state = st.sched;
                   // Counted as sent (the server may have ended them already).
                   std::set<std::uint64_t> open;
                   for (auto stream : at_send)
                     if (auto it = st.streams.find(stream); it != st.streams.end() && !it->second.answered)
                       open.insert(stream);
                   if (req.mode == pause_mode::abort) {
                     // Aborted here too: one that had not reached the server
                     // yet would wait in its queue, not end. Tokens still on
                     // the wire are dropped with it (a continuation makes them again).
                     report.aborted = static_cast<std::uint32_t>(at_send.size());
                     for (auto stream : open)
                       close_stream(stream, finish_reason::aborted, caf::error{});
                     open.clear();
                   } else if (req.mode == pause_mode::wait) {
                     // Waited for: those the server runs (a chunk came); the
                     // others wait in its queue until the resume, as queued
                     // requests do in a built-in engine.
                     for (auto i = open.begin(); i != open.end();)
                       i = st.streams.at(*i).seen ? std::next(i) : open.erase(i);
                     report.waited = static_cast<std::uint32_t>(open.size());
                   } else {
                     report.frozen = static_cast<std::uint32_t>(at_send.size());
                   }
                   sample();
                   if (req.mode == pause_mode::keep || open.empty() || seq != st.phase_seq) {
                     rp.deliver(report);
                     return;
                   }
                   // The server ended them (abort) or lets them finish (wait):
                   // the reply follows their last tokens.
                   *waiting_pause = pause_wait{rp, report, std::move(open), seq};
                   auto left = std::max(remaining(deadline), ms(1));
                   self->delayed_send(self, left, vllm_job_atom::value,
                                      std::make_shared<vllm_job_done>(vllm_job_done{[=] {
                                        ++self->state.control_calls; // balanced by the job handler
                                        if (*waiting_pause && (*waiting_pause)->seq == seq) {
                                          auto wp = std::move(**waiting_pause);
                                          waiting_pause->reset();
                                          self->state.dirty = true;
                                          say("pause: requests still running at the deadline");
                                          wp.rp.deliver(make_error(errc::round_aborted,
                                                                   name + ": pause: " + std::to_string(wp.streams.size())
                                                                     + " requests still running at the deadline"));
                                        }
                                      }}));
                 });
      return rp;
    }),
    authorized(self, guard, [=](flush_atom) -> caf::result<phase_ack> {
      auto rp = self->make_response_promise<phase_ack>();
      http_phase(rp, "POST", "/reset_prefix_cache", "{}", cfg.flush_deadline_ms,
                 [=](const http::client_response&) mutable { rp.deliver(ack()); });
      return rp;
    }),
    authorized(self, guard, [=](start_atom, std::uint64_t version) -> caf::result<phase_ack> {
      if (self->state.transfer_in_flight)
        return make_error(errc::malformed, name + ": a transfer is in flight");
      auto rp = self->make_response_promise<phase_ack>();
      http_phase(rp, "POST", "/start_weight_update", R"({"is_checkpoint_format": true})", cfg.start_deadline_ms,
                 [=](const http::client_response&) mutable {
                   self->state.session = version;
                   self->state.session_dir.clear();
                   rp.deliver(ack());
                 },
                 metrics ? &metrics->start_seconds : nullptr);
      return rp;
    }),
    authorized(self, guard, [=](update_atom, const weight_bucket&) -> caf::result<std::uint64_t> {
      return make_error(errc::malformed, name + ": inline buckets do not reach a vLLM server; "
                                                "the adapter pulls whole tensors over the data plane (transfer)");
    }),
    authorized(self, guard, [=](transfer_atom, const transfer_order& order,
                                const std::vector<trainer_actor>& producers) -> caf::result<transfer_report> {
      auto& st = self->state;
      if (auto why = check(order); !why.empty())
        return make_error(errc::malformed, why);
      if (producers.size() != order.producers.size())
        return make_error(errc::malformed, name + ": the transfer order names " + std::to_string(order.producers.size())
                                             + " producers but carries " + std::to_string(producers.size()) + " handles");
      std::vector<std::shared_ptr<transfer::producer_link>> order_links;
      if (!order.producers.empty()) {
        if (!cfg.producer_puller)
          return make_error(errc::malformed, name + ": no data plane to pull from trainer ranks (backend '"
                                               + order.backend + "')");
        try {
          order_links = transfer::links_for(*links, order.producers, name, [&](std::size_t i) {
            return cfg.producer_puller(order.producers[i], producers[i]);
          });
        } catch (const std::exception& e) {
          return make_error(errc::malformed, name + ": " + e.what());
        }
      } else if (!cfg.puller) {
        return make_error(errc::malformed, name + ": no data plane for backend '" + order.backend + "'");
      }
      if (st.session != order.version)
        return make_error(errc::no_session, name + ": transfer of version " + std::to_string(order.version)
                                              + " outside its session");
      if (st.transfer_in_flight)
        return make_error(errc::malformed, name + ": a transfer is already in flight");
      if (st.control_calls >= cfg.max_control_calls)
        return make_error(errc::queue_full, name + ": control calls in flight");
      auto rp = self->make_response_promise<transfer_report>();
      st.transfer_in_flight = true;
      auto seq = st.transfer_seq;
      if (metrics)
        metrics->operations_in_flight.inc();
      auto began = clock_type::now();
      auto until = began + ms(cfg.transfer_deadline_ms);
      run_job(self, cfg.max_control_calls, [=, puller = cfg.puller, model = cfg.model,
                                            weights_dir = cfg.weights_dir]() -> std::function<void()> {
        auto out = std::make_shared<transfer_outcome>();
        try {
          vllm::version_dir_writer writer(weights_dir, order.version, model, grouped->group_count());
          transfer::group_sink sink;
          // Written as each group arrives: the disk keeps pace with the pull.
          sink.on_group = [&](int, std::uint32_t g, const std::uint8_t* bytes, std::size_t size) {
            writer.write_group(g, whole_tensors(*grouped, g, bytes, size));
          };
          sink.on_full_group = [&](int, std::uint32_t g, const std::vector<tensor_view>& views) {
            std::vector<tensor_view> kept;
            for (const auto& t : views)
              if (!ignored_weight(model, t.name))
                kept.push_back(t);
            writer.write_group(g, kept);
          };
          transfer_report report;
          if (order_links.empty())
            report = transfer::pull_engine(*puller, name, 1, order.version, order.mode, sink, until);
          else
            report = transfer::pull_from_holders(model, {name, order.version, order.mode, until}, {worker_plan},
                                                 order_links, sink);
          out->dir = writer.commit(tensors);
          json body = {{"update_info", {{"path", out->dir}}}};
          auto r = conn.call(remaining(until), "POST", "/update_weights", body.dump());
          if (!ok_status(r.status))
            throw std::runtime_error(http_failure("POST /update_weights", r));
          report.engine = name;
          report.version = order.version;
          report.duration_ns = static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - began).count());
          out->report = report;
        } catch (const transfer::transfer_error& e) {
          out->code = to_errc(e.failure);
          out->what = e.what();
        } catch (const std::exception& e) {
          out->what = e.what();
        }
        return [=]() mutable {
          auto& st = self->state;
          if (metrics) {
            observe_since(&metrics->update_seconds, began);
            metrics->operations_in_flight.dec();
          }
          st.transfer_in_flight = false; // only now: its files are no longer being written
          if (seq != st.transfer_seq) { // a resume or a lost server ended the round
            rp.deliver(make_error(errc::round_aborted, name + ": the round was aborted"));
            return;
          }
          if (!out->report) {
            st.dirty = true;
            say("transfer of version " + std::to_string(order.version) + " failed: " + out->what);
            sample();
            rp.deliver(make_error(out->code, name + ": " + out->what));
            return;
          }
          st.session_dir = out->dir;
          rp.deliver(*out->report);
        };
      });
      return rp;
    }),
    authorized(self, guard, [=](finish_atom, std::uint64_t version) -> caf::result<phase_ack> {
      auto& st = self->state;
      if (st.transfer_in_flight)
        return make_error(errc::malformed, name + ": a transfer is in flight");
      auto rp = self->make_response_promise<phase_ack>();
      bool ours = st.session == version && !st.session_dir.empty();
      auto label = vllm::version_label(version);
      auto seq = ++st.phase_seq;
      json body = {{"weight_version", label}};
      http_phase(rp, "POST", "/finish_weight_update", body.dump(), cfg.finish_deadline_ms,
                 [=, weights_dir = cfg.weights_dir](const http::client_response&) mutable {
                   auto& st = self->state;
                   st.session.reset();
                   st.session_dir.clear();
                   st.last_change = clock_type::now();
                   if (!ours || seq != st.phase_seq) {
                     // The server published weights the adapter did not write for this version.
                     st.dirty = true;
                     st.finished_label = label;
                     say("finish of version " + std::to_string(version) + " without its transfer here: dirty");
                     sample();
                     rp.deliver(make_error(errc::update_incomplete,
                                           name + ": finish of version " + std::to_string(version)
                                             + " without a complete transfer of it"));
                     return;
                   }
                   st.version = version;
                   st.dirty = false;
                   st.finished_label = label;
                   sample();
                   rp.deliver(ack());
                   // Older versions go off the (tmpfs) disk, off the actor's thread.
                   run_job(self, cfg.max_control_calls, [=]() -> std::function<void()> {
                     auto problems = vllm::remove_other_versions(weights_dir, version);
                     return [=] {
                       for (auto& problem : problems)
                         say(problem);
                     };
                   });
                 },
                 metrics ? &metrics->finish_seconds : nullptr);
      return rp;
    }),
    authorized(self, guard, [=](resume_atom) -> caf::result<phase_ack> {
      auto& st = self->state;
      if (*waiting_pause)
        return make_error(errc::pause_in_flight, name + ": resume while a pause is in flight");
      auto rp = self->make_response_promise<phase_ack>();
      bool close_session = st.session.has_value();
      if (close_session) {
        // Continue without finish: the round was aborted. The server's
        // session is closed by a finish without a label; if it loaded a
        // version meanwhile that publishes it, so the engine stays dirty.
        ++st.phase_seq;
        ++st.transfer_seq; // a transfer still running answers "aborted"
        st.session.reset();
        st.session_dir.clear();
      }
      bool started = run_job(self, cfg.max_control_calls, [=]() -> std::function<void()> {
        auto until = clock_type::now() + ms(cfg.resume_deadline_ms);
        bool published = false;
        std::string failure;
        try {
          if (close_session) {
            auto f = conn.call(remaining(until), "POST", "/finish_weight_update", "{}");
            published = ok_status(f.status); // an error: nothing was loaded, the session is dropped
          }
          auto r = conn.call(remaining(until), "POST", "/resume", "{}");
          if (!ok_status(r.status))
            failure = http_failure("POST /resume", r);
        } catch (const std::exception& e) {
          failure = std::string("POST /resume: ") + e.what();
        }
        return [=]() mutable {
          auto& st = self->state;
          if (published) {
            st.dirty = true;
            st.finished_label.clear(); // unknown now; no restart detection by label until the next finish
            st.last_change = clock_type::now();
          }
          if (!failure.empty()) {
            st.dirty = true;
            say(failure);
            sample();
            rp.deliver(make_error(errc::round_aborted, name + ": " + failure));
            return;
          }
          st.sched = scheduler_state::unpaused;
          sample();
          rp.deliver(ack());
        };
      });
      if (!started)
        return make_error(errc::queue_full, name + ": control calls in flight");
      return rp;
    }),
    authorized(self, guard, [=](generate_atom, generate_request req,
                                token_sink_actor sink) -> caf::result<generate_result> {
      auto& st = self->state;
      if (auto why = check(req); !why.empty())
        return make_error(errc::malformed, why);
      if (!st.healthy)
        return make_error(errc::engine_dirty, name + ": the server is not healthy");
      if (st.dirty && !st.session)
        return make_error(errc::engine_dirty, name + ": the server may hold a partial update");
      auto id = req.request_id;
      // The same request again is a newer attempt (a reroute whose abort was lost): the old one ends.
      if (auto old = st.stream_of.find(id); old != st.stream_of.end())
        close_stream(old->second, finish_reason::aborted, caf::error{});
      if (st.workers >= cfg.max_streams)
        return make_error(errc::queue_full, name + ": " + std::to_string(cfg.max_streams) + " streams already open");
      if (req.generated.size() >= req.sampling.max_tokens) {
        generate_result done;
        done.request_id = id;
        done.reason = finish_reason::length;
        done.engine = name;
        return done;
      }
      std::string body;
      try {
        body = vllm::completion_body(req, cfg.served_model);
      } catch (const std::exception& e) {
        return make_error(errc::malformed, name + ": " + e.what());
      }
      auto n = st.next_stream++;
      vllm_stream s;
      s.request = std::move(req);
      s.sink = sink;
      s.promise = self->make_response_promise<generate_result>();
      s.result.request_id = id;
      s.result.engine = name;
      s.opened_at = st.version;
      s.cancel = std::make_shared<std::atomic<bool>>(false);
      auto rp = s.promise;
      auto cancel = s.cancel;
      st.streams.emplace(n, std::move(s));
      st.stream_of[id] = n;
      ++st.workers;
      self->monitor(sink);
      if (metrics)
        metrics->prompt_tokens.inc(static_cast<double>(st.streams.at(n).request.prompt.size()
                                                       + st.streams.at(n).request.generated.size()));
      self->spawn<caf::detached>(run_stream, self->address(), conn, n, std::move(body), cancel, st.stopped,
                                 ms(cfg.stream_idle_ms));
      sample();
      return rp;
    }),
    authorized(self, guard, [=](abort_atom, std::uint64_t request_id) -> caf::result<bool> {
      auto& st = self->state;
      auto it = st.stream_of.find(request_id);
      if (it == st.stream_of.end())
        return false;
      auto n = it->second;
      auto cid = st.streams.at(n).completion_id;
      close_stream(n, finish_reason::aborted, caf::error{});
      if (!cid.empty()) // closing the stream ends it on the server too; this ends it at once
        run_job(self, cfg.max_control_calls, [=]() -> std::function<void()> {
          try {
            json body = {{"request_ids", {cid, cid + "-0"}}};
            conn.call(ms(cfg.abort_deadline_ms), "POST", "/abort_requests", body.dump());
          } catch (const std::exception&) {
            // best effort: the closed stream aborts it as well
          }
          return [] {};
        });
      return true;
    }),
    authorized(self, guard, [=](status_atom) -> caf::result<engine_status> { return status(); }),
    authorized(self, guard, [=](heartbeat_atom, const heartbeat& hb) -> caf::result<heartbeat> {
      if (!self->state.healthy) // unanswered: the coordinator declares the engine failed
        return self->make_response_promise<heartbeat>();
      return heartbeat{name, hb.seq};
    }),
    authorized(self, guard, [=](route_atom, const heartbeat_actor& router) {
      if (vouched && !vouched(self->current_sender(), router.address()))
        guard->refuse(self->current_sender(), "route", "only the coordinator vouches for a router");
    }),
    authorized(self, guard, [=](phase_atom, const phase_order& order) {
      serve_phase_order(self, self->state.phase_orders, order);
    }),
    authorized(self, guard, [=](nccl_dead_atom, std::uint64_t, const std::string&) {
      // It joins no communicator (below): nothing of it waits on one.
    }),
    authorized(self, guard, [=](nccl_join_atom, const nccl_rendezvous_msg&) -> caf::result<std::uint64_t> {
      // The vLLM server holds the weights: rlsync's NCCL links end in this
      // process, where nothing reads them. (vLLM's own NCCL path is its
      // update_weights_nccl route, not wired here.)
      return make_error(errc::unknown_name, "engine " + name + " (vllm) joins no rlsync nccl communicator: "
                                            "the server's GPUs are not this process's");
    }),
    authorized(self, guard, [=](digest_atom) -> caf::result<weight_digest> {
      auto& st = self->state;
      weight_digest d;
      d.engine = name;
      d.version = st.version;
      d.dirty = st.dirty;
      if (st.version == 0 || st.dirty)
        return d; // nothing the adapter wrote is served
      auto rp = self->make_response_promise<weight_digest>();
      auto dir = (std::filesystem::path(cfg.weights_dir) / vllm::version_label(st.version)).string();
      bool started = run_job(self, cfg.max_control_calls, [=, model = cfg.model, tp = cfg.server_tp]() mutable
                             -> std::function<void()> {
        std::string problem;
        bool mismatch = false;
        try {
          // What the server's loader makes of the files the adapter wrote,
          // sharded as the server shards: the trainer's side computes the same.
          auto ckpt = checkpoint::open(dir);
          std::vector<const tensor_view*> views;
          for (const auto& e : ckpt.tensors())
            if (!ignored_weight(model, e.tensor->name))
              views.push_back(e.tensor);
          auto set = engine::weight_set::make(model, tp, checkpoint_dtype(ckpt));
          engine::load_weights(views, *set);
          json baseline = json::object();
          for (std::size_t w = 0; w < set->workers.size(); ++w)
            for (const auto& p : set->workers[w].params())
              baseline["dp0:pp0:pcp0:tp" + std::to_string(w) + ":" + p.name] =
                sha256_hex(p.bytes.data(), p.bytes.size());
          for (auto& [param, sum] : engine::weight_checksums(*set)) {
            d.names.push_back(param);
            d.checksums.push_back(sum);
          }
          json body = {{"action", "compare"}, {"baseline", baseline}};
          auto r = conn.call(ms(cfg.digest_deadline_ms), "POST", "/weight_checker", body.dump());
          if (!ok_status(r.status))
            throw std::runtime_error(http_failure("POST /weight_checker", r) + " (cannot cross-check the server)");
          auto j = vllm_calls::parse_answer(r.body);
          if (j.is_discarded() || !j.is_object() || !j.contains("match") || !j["match"].is_boolean())
            throw std::runtime_error("POST /weight_checker: an answer without \"match\"");
          if (!j["match"].get<bool>()) {
            std::vector<std::string> keys, unknown;
            if (j.contains("mismatches") && j["mismatches"].is_array())
              for (auto& k : j["mismatches"])
                if (k.is_string())
                  (baseline.contains(k.get<std::string>()) ? keys : unknown).push_back(k.get<std::string>());
            std::string listed;
            for (std::size_t i = 0; i < keys.size() && i < 8; ++i)
              listed += (i ? ", " : "") + keys[i];
            if (!unknown.empty() || keys.empty())
              problem = "the server's weight_checker names shards the adapter does not know (" +
                        (unknown.empty() ? std::string("none listed") : unknown.front()) +
                        ", ...): not an rlsync server? Weights unverified";
            else {
              mismatch = true;
              problem = "the server's weights differ from version " + std::to_string(d.version) + " as written: "
                        + std::to_string(keys.size()) + " shards (" + listed + (keys.size() > 8 ? ", ..." : "") + ")";
            }
          }
        } catch (const std::exception& e) {
          problem = e.what();
        }
        return [=]() mutable {
          if (!problem.empty()) {
            say("digest: " + problem);
            d.names.clear(); // never claim what the server did not confirm
            d.checksums.clear();
            if (mismatch) {
              d.dirty = true;
              if (self->state.version == d.version) {
                self->state.dirty = true; // a full sync fixes it
                sample();
              }
            }
          }
          rp.deliver(std::move(d));
        };
      });
      if (!started)
        return make_error(errc::queue_full, name + ": control calls in flight");
      return rp;
    }),
  };
}

rollout_engine_actor spawn_vllm_engine(caf::actor_system& sys, vllm_engine_config cfg) {
  vllm::parse_server_url(cfg.url); // throws for a bad one, before anything runs
  if (cfg.name.empty())
    throw std::invalid_argument("vllm engine: no name");
  if (cfg.weights_dir.empty())
    throw std::invalid_argument("vllm engine " + cfg.name + ": no weights_dir");
  if (cfg.server_tp < 1)
    throw std::invalid_argument("vllm engine " + cfg.name + ": server_tp " + std::to_string(cfg.server_tp));
  for (auto [value, what] : {std::pair{cfg.pause_deadline_ms, "pause_deadline_ms"}, {cfg.flush_deadline_ms, "flush_deadline_ms"},
                              {cfg.start_deadline_ms, "start_deadline_ms"}, {cfg.transfer_deadline_ms, "transfer_deadline_ms"},
                              {cfg.finish_deadline_ms, "finish_deadline_ms"}, {cfg.resume_deadline_ms, "resume_deadline_ms"},
                              {cfg.abort_deadline_ms, "abort_deadline_ms"}, {cfg.digest_deadline_ms, "digest_deadline_ms"},
                              {cfg.health_interval_ms, "health_interval_ms"}, {cfg.health_timeout_ms, "health_timeout_ms"},
                              {cfg.stream_idle_ms, "stream_idle_ms"}})
    if (value == 0)
      throw std::invalid_argument("vllm engine " + cfg.name + ": " + what + " must be positive");
  if (cfg.max_streams == 0 || cfg.max_control_calls == 0)
    throw std::invalid_argument("vllm engine " + cfg.name + ": max_streams and max_control_calls must be positive");
  return caf::actor_cast<rollout_engine_actor>(sys.spawn(vllm_engine, std::move(cfg)));
}

} // namespace rlsync
