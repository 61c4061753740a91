#include "actors/http/completions_route.hpp"

#include "runtime/http/vllm_errors.hpp"

#include <caf/all.hpp>

#include <chrono>
#include <ctime>
#include <random>

namespace rlsync {

namespace {

/// One HTTP request's answer in the making.
struct completion_job {
  std::vector<generate_request> requests; ///< request i is choice i
  std::vector<vllm::completion_choice> choices;
  vllm::response_options opts;
  bool stream = false;
  std::size_t prompt_tokens = 0;
  std::shared_ptr<http::responder> responder;
  completion_target target;
  std::chrono::milliseconds deadline{0};
  std::chrono::milliseconds liveness{0};
  std::chrono::milliseconds keepalive{0};
};

using completion_actor = token_sink_actor::extend<caf::reacts_to<caf::tick_atom>>;

struct completion_state {
  std::shared_ptr<completion_job> job;
  std::vector<std::uint32_t> received; ///< per choice: tokens taken so far
  std::size_t open = 0;                ///< choices not finished
  bool answered = false;
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  static inline const char* name = "completion";
};

using completion_self = completion_actor::stateful_pointer<completion_state>;

/// An engine refusal as the HTTP status vLLM would answer.
unsigned status_of(const caf::error& err) {
  if (is(err, errc::malformed))
    return 400;
  if (is(err, errc::queue_full) || is(err, errc::engine_dirty) || is(err, errc::not_routable))
    return 503;
  return 500;
}

/// The token events of `res` from index `from` on (those the sink never
/// saw: the result can overtake them only on another path, but a lost one
/// must not leave the choice short).
std::vector<token_event> events_from(const generate_result& res, std::uint32_t from) {
  std::vector<token_event> out;
  for (std::uint32_t i = from; i < res.tokens.size(); ++i) {
    token_event ev;
    ev.request_id = res.request_id;
    ev.index = i;
    ev.token = res.tokens[i];
    for (auto& s : res.spans)
      if (i >= s.begin && i < s.end)
        ev.version = s.version;
    if (i < res.logprobs.size())
      ev.logprob = res.logprobs[i];
    if (!res.logprobs.empty() && !res.tokens.empty()) {
      auto k = res.top_tokens.size() / res.tokens.size();
      for (std::size_t j = i * k; j < (i + 1) * k && j < res.top_tokens.size(); ++j) {
        ev.top_tokens.push_back(res.top_tokens[j]);
        ev.top_logprobs.push_back(res.top_logprobs[j]);
      }
    }
    out.push_back(std::move(ev));
  }
  return out;
}

void write_or_quit(completion_self self, std::string chunk) {
  self->state.last_write = std::chrono::steady_clock::now();
  if (!self->state.job->responder->write(std::move(chunk)))
    self->quit(); // the client is gone or stopped reading: the engine aborts what is left
}

/// Streams what choice i has not sent yet.
void flush_choice(completion_self self, std::size_t i) {
  auto& job = *self->state.job;
  if (!job.stream)
    return;
  if (auto delta = job.choices[i].take_delta(job.opts))
    write_or_quit(self, vllm::stream_chunk(job.opts, std::move(*delta)));
}

void answer_if_done(completion_self self) {
  auto& st = self->state;
  auto& job = *st.job;
  if (st.open > 0 || st.answered)
    return;
  st.answered = true;
  if (job.stream) {
    if (job.opts.include_usage)
      job.responder->write(vllm::usage_chunk(job.opts, job.choices, job.prompt_tokens));
    job.responder->write(vllm::stream_done);
    job.responder->finish();
  } else {
    // Dumped here: nlohmann::json would sort the keys vLLM's order lists.
    auto body = vllm::completion_response(job.opts, job.choices, job.prompt_tokens)
                  .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    job.responder->reply(http::response{200, "application/json", std::move(body), {}});
  }
  self->quit();
}

void finish_choice(completion_self self, std::size_t i, finish_reason why) {
  auto& choice = self->state.job->choices[i];
  if (choice.finished())
    return; // a stop string ended it already
  choice.finish(why);
  flush_choice(self, i);
  if (self->state.open > 0)
    --self->state.open;
  answer_if_done(self);
}

/// Takes one token of choice i; a stop string ends the choice (and its
/// engine request, when the target can abort).
void take_token(completion_self self, std::size_t i, const token_event& ev) {
  auto& st = self->state;
  auto& job = *st.job;
  auto& choice = job.choices[i];
  if (ev.index < st.received[i] || choice.finished())
    return; // a duplicate, or past a stop string
  st.received[i] = ev.index + 1;
  bool stopped = choice.add(ev);
  flush_choice(self, i);
  if (stopped) {
    if (job.target.engine)
      self->request(*job.target.engine, std::chrono::seconds(10), abort_atom_v, job.requests[i].request_id)
        .then([](bool) {}, [](caf::error&) {});
    if (st.open > 0)
      --st.open;
    answer_if_done(self);
  }
}

completion_actor::behavior_type completion(completion_self self, std::shared_ptr<completion_job> job) {
  auto& st = self->state;
  st.job = job;
  st.received.assign(job->choices.size(), 0);
  st.open = job->choices.size();
  if (job->stream && !job->responder->start_stream("text/event-stream")) {
    self->quit();
    return {[](token_atom, const token_event&) {}, [](caf::tick_atom) {}};
  }
  auto sink = caf::actor_cast<token_sink_actor>(self);
  for (std::size_t i = 0; i < job->requests.size(); ++i) {
    self->request(job->target.generator, job->deadline, generate_atom_v, job->requests[i], sink)
      .then(
        [self, i](generate_result& res) {
          if (self->state.job->choices[i].finished())
            return; // ended on a stop string; this is the abort's echo
          for (auto& ev : events_from(res, self->state.received[i]))
            take_token(self, i, ev);
          finish_choice(self, i, res.reason);
        },
        [self, i](caf::error& err) {
          auto& job = *self->state.job;
          if (job.choices[i].finished())
            return;
          bool timeout = err == caf::sec::request_timeout;
          if (!job.stream && !timeout) {
            // Nothing was sent yet: the whole request fails as the engine refused it.
            self->state.answered = true;
            job.responder->reply(http::error_envelope(status_of(err), self->system().render(err)));
            self->quit();
            return;
          }
          if (job.stream && !timeout)
            write_or_quit(self, "data: "
                                  + vllm::error_body({static_cast<int>(status_of(err)), self->system().render(err), ""})
                                      .dump()
                                  + "\n\n");
          finish_choice(self, i, finish_reason::aborted);
        });
  }
  self->delayed_send(self, job->liveness, caf::tick_atom_v);
  return {
    [self](token_atom, const token_event& ev) {
      auto& job = *self->state.job;
      auto first = job.requests.front().request_id;
      if (ev.request_id < first || ev.request_id - first >= job.requests.size())
        return;
      take_token(self, static_cast<std::size_t>(ev.request_id - first), ev);
    },
    [self](caf::tick_atom) {
      auto& job = *self->state.job;
      if (job.responder->client_gone()) {
        self->quit(); // its sink is down: the engine aborts the requests
        return;
      }
      // A stream waiting for its first token (queued while paused) writes
      // an SSE comment now and then: a write is what finds a closed client.
      if (job.stream && std::chrono::steady_clock::now() - self->state.last_write >= job.keepalive)
        write_or_quit(self, ": keep-alive\n\n");
      self->delayed_send(self, self->state.job->liveness, caf::tick_atom_v);
    },
  };
}

std::uint64_t fresh_entropy() {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  return gen();
}

} // namespace

completion_target target_of(const rollout_engine_actor& engine) {
  return {caf::actor_cast<generator_actor>(engine), engine};
}

completion_target target_of(const router_actor& router) {
  return {caf::actor_cast<generator_actor>(router), std::nullopt};
}

completions_route::completions_route(caf::actor_system& sys, completions_route_config cfg, completion_target target)
    : sys_(sys), cfg_(std::move(cfg)), target_(std::move(target)), next_id_(cfg_.first_request_id) {}

void completions_route::mount(http::server& srv) {
  srv.route("POST", "/v1/completions",
            [this](const http::request& rq, std::shared_ptr<http::responder> r) { handle(rq, std::move(r)); });
}

void completions_route::set_target(completion_target target) {
  std::lock_guard<std::mutex> lock(mu_);
  target_ = std::move(target);
}

void completions_route::handle(const http::request& rq, std::shared_ptr<http::responder> r) {
  auto parsed = vllm::parse_completion_request(rq.body, cfg_.limits);
  if (auto* e = std::get_if<vllm::api_error>(&parsed)) {
    r->reply(http::error_envelope(static_cast<unsigned>(e->status), e->message, e->param));
    return;
  }
  auto& req = std::get<vllm::completion_request>(parsed);
  if (!req.model.empty() && req.model != cfg_.served_model) {
    r->reply(http::error_envelope(404, "The model `" + req.model + "` does not exist.", "model"));
    return;
  }
  const std::uint64_t choices = req.prompts.size() * req.n;
  auto made = vllm::make_generate_requests(req, cfg_.model, next_id_.fetch_add(choices), fresh_entropy());
  if (auto* e = std::get_if<vllm::api_error>(&made)) {
    r->reply(http::error_envelope(static_cast<unsigned>(e->status), e->message, e->param));
    return;
  }
  if (auto e = vllm::check_answer_size(req, std::get<std::vector<generate_request>>(made), cfg_.limits)) {
    r->reply(http::error_envelope(static_cast<unsigned>(e->status), e->message, e->param));
    return;
  }
  auto job = std::make_shared<completion_job>();
  job->requests = std::move(std::get<std::vector<generate_request>>(made));
  for (std::size_t i = 0; i < job->requests.size(); ++i)
    job->choices.emplace_back(static_cast<std::uint32_t>(i), req, job->requests[i].prompt);
  for (auto& p : req.prompts)
    job->prompt_tokens += p.size();
  job->opts.id = vllm::completion_id(fresh_entropy(), fresh_entropy());
  job->opts.created = static_cast<std::int64_t>(std::time(nullptr));
  job->opts.model = cfg_.served_model;
  job->opts.strict = cfg_.strict;
  job->opts.return_token_ids = req.return_token_ids;
  job->opts.tokens_as_ids = req.tokens_as_ids;
  job->opts.include_usage = req.stream && req.include_usage;
  job->opts.label = cfg_.label;
  job->stream = req.stream;
  job->responder = std::move(r);
  job->deadline = cfg_.request_deadline;
  job->liveness = cfg_.liveness_interval;
  job->keepalive = cfg_.stream_keepalive;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job->target = target_;
  }
  std::vector<std::uint64_t> ids;
  for (auto& g : job->requests)
    ids.push_back(g.request_id);
  if (cfg_.on_start)
    cfg_.on_start(job->opts.id, ids);
  auto actor = sys_.spawn(completion, job);
  if (cfg_.on_end)
    actor->attach_functor([on_end = cfg_.on_end, id = job->opts.id, ids] { on_end(id, ids); });
}

} // namespace rlsync
