#include "actors/workload.hpp"

#include "runtime/config/model_config.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/engine/tokenizer.hpp"

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <utility>

namespace rlsync {

namespace {

// Private to the driver: local messages only, so no type-ID registration.
using wl_stop_atom = caf::atom_constant<caf::atom("wl_stop")>;
using wl_retry_atom = caf::atom_constant<caf::atom("wl_retry")>;
using wl_router_atom = caf::atom_constant<caf::atom("wl_router")>;
using wl_orphan_atom = caf::atom_constant<caf::atom("wl_orphan")>;

constexpr std::size_t max_errors = 10;
constexpr std::chrono::milliseconds backoff_step{50};

/// One request the driver has sent and not yet counted.
struct pending_request {
  std::uint32_t attempts = 0;         ///< sends so far; answers to an earlier one are stale
  std::vector<std::int32_t> streamed; ///< tokens received as sink, in index order
  std::vector<std::uint64_t> streamed_versions; ///< the version of each
  std::size_t prefix = 0;             ///< streamed tokens the current attempt continues after
  bool stream_broken = false;         ///< a token came out of order, twice, or after a gap
  bool waiting_retry = false;         ///< refused; a retry timer is set
  bool orphaned = false;              ///< its router died: resent to the next router
  std::string last_error;
};

/// The driver's state and logic. The actor's handlers hold it by shared_ptr,
/// and so does its exit hook, which needs it after the behaviour is gone.
struct driver {
  caf::event_based_actor* self;
  router_actor router;
  workload_options opts;
  std::function<void(const workload_progress&)> on_progress;
  std::shared_ptr<std::promise<workload_result>> done;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  driver(caf::event_based_actor* self, router_actor router, workload_options opts,
         std::function<void(const workload_progress&)> on_progress,
         std::shared_ptr<std::promise<workload_result>> done)
    : self(self), router(std::move(router)), opts(opts), on_progress(std::move(on_progress)),
      done(std::move(done)) {}

  std::uint32_t next = 0; ///< requests handed out so far; the next id is next + 1
  bool stopping = false;
  bool router_down = false; ///< until set_workload_router names a new one
  bool delivered = false;
  std::map<std::uint64_t, pending_request> pending; ///< by request id
  workload_result res;
  workload_progress progress;

  std::uint32_t window() const {
    return std::max<std::uint32_t>(opts.concurrency, 1);
  }

  generate_request make_request(std::uint64_t id) const {
    auto i = static_cast<std::uint32_t>(id - 1);
    generate_request req;
    req.request_id = id;
    req.prompt = engine::encode(workload_prompt(i));
    req.sampling.temperature = opts.temperature;
    req.sampling.top_p = opts.top_p;
    req.sampling.max_tokens = opts.max_tokens;
    req.sampling.seed = opts.seed + i; // per request, so a rerun reproduces each result
    req.sampling.stop_at_eos = true;
    req.deadline_ms = static_cast<std::uint32_t>(
      std::clamp<std::int64_t>(opts.queue_deadline.count(), 0, max_request_deadline_ms));
    return req;
  }

  void note_error(std::string text) {
    if (res.errors.size() < max_errors)
      res.errors.push_back(std::move(text));
  }

  /// Sends new requests until the window is full, or delivers when all is done.
  void fill(const std::shared_ptr<driver>& me) {
    while (!stopping && !router_down && next < opts.prompts && pending.size() < window()) {
      auto id = std::uint64_t{++next};
      pending[id];
      ++progress.sent;
      dispatch(me, id);
    }
    if (pending.empty() && (stopping || next == opts.prompts))
      deliver();
  }

  /// One attempt of request `id`; each attempt is answered exactly once
  /// (result, refusal, or timeout at request_deadline).
  /// Every attempt continues after the tokens already streamed for the
  /// request (none at first; after its router died, what that one delivered).
  void dispatch(const std::shared_ptr<driver>& me, std::uint64_t id) {
    auto& p = pending[id];
    auto attempt = ++p.attempts;
    p.waiting_retry = false;
    p.orphaned = false;
    p.prefix = p.streamed.size();
    auto req = make_request(id);
    bool ended = p.prefix >= req.sampling.max_tokens
                 || (req.sampling.stop_at_eos && !p.streamed.empty() && p.streamed.back() == token_eos);
    if (ended) { // it was whole when its router died
      generate_result done;
      done.request_id = id;
      done.reason = p.prefix >= req.sampling.max_tokens ? finish_reason::length : finish_reason::eos;
      on_result(me, id, attempt, done);
      return;
    }
    req.generated = p.streamed;
    auto sink = caf::actor_cast<token_sink_actor>(self);
    // The router may hold it for its queue deadline before an engine starts on it.
    self->request(router, opts.request_deadline + opts.queue_deadline, generate_atom_v, std::move(req), sink)
      .then([me, id, attempt](generate_result& r) { me->on_result(me, id, attempt, r); },
            [me, id, attempt](caf::error& err) { me->on_error(me, id, attempt, err); });
  }

  /// The router died: every request it held is resent, as a continuation, to
  /// the next one (set_workload_router); failed if none comes in time.
  void on_router_down(const std::shared_ptr<driver>&) {
    router_down = true;
    for (auto& [id, p] : pending)
      if (!p.waiting_retry) {
        p.orphaned = true;
        ++p.attempts; // a late answer of the dead router's attempt is stale
      }
    self->delayed_send(self, opts.request_deadline, wl_orphan_atom::value);
  }

  void on_new_router(const std::shared_ptr<driver>& me, router_actor r) {
    router = std::move(r);
    router_down = false;
    self->monitor(router);
    std::vector<std::uint64_t> orphans;
    for (auto& [id, p] : pending)
      if (p.orphaned)
        orphans.push_back(id);
    for (auto id : orphans)
      dispatch(me, id);
    fill(me);
  }

  void on_orphan_deadline(const std::shared_ptr<driver>& me) {
    if (!router_down)
      return;
    std::vector<std::uint64_t> orphans;
    for (auto& [id, p] : pending)
      if (p.orphaned)
        orphans.push_back(id);
    for (auto id : orphans) {
      ++res.failed;
      note_error("request " + std::to_string(id) + ": its router died and no other came in time");
      finish(me, id);
    }
  }

  void on_token(const token_event& ev) {
    ++res.streamed_tokens;
    if (opts.on_token)
      opts.on_token(ev);
    auto it = pending.find(ev.request_id);
    if (it == pending.end() || it->second.waiting_retry)
      return; // a stray, or late after its result: the result was checked already
    auto& p = it->second;
    if (ev.index == p.streamed.size()) {
      p.streamed.push_back(ev.token);
      p.streamed_versions.push_back(ev.version);
    } else {
      p.stream_broken = true;
    }
  }

  void on_result(const std::shared_ptr<driver>& me, std::uint64_t id, std::uint32_t attempt,
                 const generate_result& r) {
    auto it = pending.find(id);
    if (it == pending.end() || it->second.attempts != attempt)
      return; // an attempt its dead router held: resent already
    auto& p = it->second;
    // The tokens streamed before this attempt, then the attempt's own.
    res.tokens += p.prefix + r.tokens.size();
    for (std::size_t k = 0; k < p.prefix; ++k)
      ++res.tokens_by_version[p.streamed_versions[k]];
    for (auto& s : r.spans)
      res.tokens_by_version[s.version] += s.end - s.begin;
    res.stale_kv_tokens += r.stale_kv_tokens;
    bool same = p.streamed.size() == p.prefix + r.tokens.size()
                && std::equal(r.tokens.begin(), r.tokens.end(), p.streamed.begin() + static_cast<std::ptrdiff_t>(p.prefix));
    if (p.stream_broken || !same)
      ++res.stream_mismatches;
    switch (r.reason) {
      case finish_reason::length:
      case finish_reason::eos:
        ++res.completed;
        break;
      case finish_reason::rejected:
        ++res.rejected;
        note_error("request " + std::to_string(id) + ": rejected");
        break;
      case finish_reason::aborted:
      case finish_reason::failed:
        ++res.failed;
        note_error("request " + std::to_string(id) + ": " + to_string(r.reason)
                   + (r.engine.empty() ? "" : " on " + r.engine));
        break;
    }
    finish(me, id);
  }

  void on_error(const std::shared_ptr<driver>& me, std::uint64_t id, std::uint32_t attempt, const caf::error& err) {
    auto it = pending.find(id);
    if (it == pending.end() || it->second.attempts != attempt)
      return; // an attempt its dead router held: resent already
    // The router died with this request unread in its mailbox: CAF bounces
    // such requests before it tells the monitors, so this error can come
    // before the router's down message. Like that message, it sends every
    // request the router held to the next one (a load-dependent race: under
    // load more requests wait in the router's mailbox when it dies).
    if (err == caf::sec::request_receiver_down && !router_down) {
      on_router_down(me);
      return;
    }
    auto& p = it->second;
    p.last_error = self->system().render(err);
    // A refusal means "nothing can take it now" (a sync round holds the
    // engines, or queues are full): worth another try after a pause.
    bool busy = is(err, errc::queue_full) || is(err, errc::not_routable);
    if (busy && !stopping && p.attempts <= opts.max_retries) {
      p.waiting_retry = true;
      self->delayed_send(self, backoff_step * p.attempts, wl_retry_atom::value, id);
      return;
    }
    if (busy || is(err, errc::malformed))
      ++res.rejected;
    else
      ++res.failed;
    note_error("request " + std::to_string(id) + ": " + p.last_error);
    finish(me, id);
  }

  void on_retry(const std::shared_ptr<driver>& me, std::uint64_t id) {
    auto it = pending.find(id);
    if (it == pending.end() || !it->second.waiting_retry)
      return; // stop() settles waiting requests, so none is left then
    if (router_down) { // it goes to the next router with the others
      it->second.waiting_retry = false;
      it->second.orphaned = true;
      return;
    }
    dispatch(me, id);
  }

  void stop(const std::shared_ptr<driver>& me) {
    if (stopping)
      return;
    stopping = true;
    res.not_sent = opts.prompts - next;
    next = opts.prompts; // nothing more goes out: a later exit counts none twice
    // Requests waiting for a retry are not resent: they stay refused.
    std::vector<std::uint64_t> waiting;
    for (auto& [id, p] : pending)
      if (p.waiting_retry)
        waiting.push_back(id);
    for (auto id : waiting) {
      ++res.rejected;
      note_error("request " + std::to_string(id) + ": " + pending[id].last_error
                 + " (stopped before a retry)");
      finish(me, id);
    }
    fill(me); // delivers at once when nothing is outstanding
  }

  /// Request `id` is counted: report progress and refill the window.
  void finish(const std::shared_ptr<driver>& me, std::uint64_t id) {
    pending.erase(id);
    progress.completed = res.completed;
    progress.failed = res.failed;
    progress.rejected = res.rejected;
    progress.tokens = res.tokens;
    if (on_progress)
      on_progress(progress);
    fill(me);
  }

  void deliver() {
    if (delivered)
      return;
    delivered = true;
    res.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    done->set_value(res);
    self->quit();
  }

  /// The actor is going away without having delivered (killed, or its
  /// handler threw): count what is left, so the waiter never blocks forever.
  void deliver_on_exit(const caf::error& reason) {
    if (delivered)
      return;
    res.not_sent += opts.prompts - next;
    next = opts.prompts;
    if (!pending.empty())
      note_error("driver stopped with " + std::to_string(pending.size())
                 + " requests outstanding: " + caf::to_string(reason));
    res.failed += static_cast<std::uint32_t>(pending.size());
    pending.clear();
    delivered = true;
    res.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    done->set_value(res);
  }
};

} // namespace

workload_options to_workload_options(const workload_spec& spec) {
  workload_options o;
  o.prompts = static_cast<std::uint32_t>(std::max<std::int64_t>(spec.prompts, 0));
  o.concurrency = static_cast<std::uint32_t>(std::max<std::int64_t>(spec.concurrency, 1));
  o.max_tokens = static_cast<std::uint32_t>(std::max<std::int64_t>(spec.max_tokens, 1));
  o.temperature = static_cast<float>(spec.temperature);
  o.top_p = static_cast<float>(spec.top_p);
  o.seed = spec.seed;
  o.queue_deadline = spec.request_deadline;
  return o;
}

std::string workload_prompt(std::uint32_t i) {
  // 8 subjects × 4 tasks, numbered so that every prompt differs while prompts
  // that share a task share a prefix (which exercises the prefix cache).
  static const char* const subjects[] = {
    "the tide",       "a prime number", "the compiler", "a red fox",
    "an old bridge",  "the weather",    "a chess opening", "the night sky",
  };
  static const char* const tasks[] = {
    "Describe ", "Write a short poem about ", "Explain to a child ", "List three facts about ",
  };
  return std::string(tasks[(i / 8) % 4]) + subjects[i % 8] + ". (#" + std::to_string(i) + ")\n";
}

caf::actor spawn_workload(caf::actor_system& sys, router_actor router, workload_options opts,
                          std::function<void(const workload_progress&)> on_progress,
                          std::shared_ptr<std::promise<workload_result>> done) {
  return sys.spawn([router = std::move(router), opts, on_progress = std::move(on_progress),
                    done = std::move(done)](caf::event_based_actor* self) -> caf::behavior {
    auto d = std::make_shared<driver>(self, router, opts, on_progress, done);
    self->attach_functor([d](const caf::error& reason) { d->deliver_on_exit(reason); });
    self->monitor(router);
    self->set_down_handler([d](caf::down_msg& dm) {
      if (dm.source == d->router.address())
        d->on_router_down(d);
    });
    d->fill(d);
    if (d->delivered)
      return {}; // nothing to send (prompts == 0): quit at once
    return {
      [d](token_atom, const token_event& ev) { d->on_token(ev); },
      [d](wl_retry_atom, std::uint64_t id) { d->on_retry(d, id); },
      [d](wl_stop_atom) { d->stop(d); },
      [d](wl_router_atom, router_actor& r) { d->on_new_router(d, std::move(r)); },
      [d](wl_orphan_atom) { d->on_orphan_deadline(d); },
    };
  });
}

void set_workload_router(const caf::actor& driver, router_actor router) {
  caf::anon_send(driver, wl_router_atom::value, std::move(router));
}

void stop_workload(const caf::actor& driver) {
  caf::anon_send(driver, wl_stop_atom::value);
}

} // namespace rlsync
