#include "runtime/engine/engine_core.hpp"
#include "runtime/engine/process.hpp"

#include "runtime/base/checksum.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/engine/apply_packed.hpp"
#include "runtime/engine/device_gemm.hpp"
#include "runtime/engine/loader.hpp"
#include "runtime/engine/prefix_cache.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/engine/sampling.hpp"
#include "runtime/engine/weight_view.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace rlsync::engine {

// -- one request ------------------------------------------------------------------

struct engine_core::request {
  generate_request req;
  request_callbacks cb;
  std::vector<std::int32_t> context;  ///< prompt, then every generated token
  std::uint32_t prior = 0;            ///< tokens generated before this engine (a reroute)
  std::vector<std::int32_t> produced; ///< tokens generated here
  std::vector<version_span> spans;    ///< over `produced`
  std::uint32_t stale_tokens = 0;
  std::vector<float> logprobs; ///< over `produced`, with sampling.logprobs
  std::vector<std::int32_t> top_tokens;
  std::vector<float> top_logprobs;
  kv_sequence kv;
  /// Oldest weight version among the cached KV positions (meaningless when
  /// the cache is empty): a token sampled with newer weights over them is
  /// produced over stale KV.
  std::uint64_t kv_version = 0;
  bool admitted = false;

  std::uint32_t generated() const { return prior + static_cast<std::uint32_t>(produced.size()); }
};

// -- the prefix cache ---------------------------------------------------------------

struct engine_core::prefix_cache : block_prefix_cache {
  using block_prefix_cache::block_prefix_cache;
};

// -- one data-parallel rank -------------------------------------------------------------

// Its own requests, queue and prefix cache; its tp workers are its part of
// the engine's model, which steps every rank's batch in lockstep.
struct engine_core::scheduler_rank {
  int index;
  std::unordered_map<std::uint64_t, std::unique_ptr<request>> requests;
  std::deque<std::uint64_t> waiting;  ///< FIFO of ids not yet admitted
  std::vector<std::uint64_t> running; ///< admitted (running or frozen), admission order
  prefix_cache cache;

  scheduler_rank(int i, const engine_options& o)
    : index(i), cache(o.block_tokens, o.prefix_cache_blocks) {}

  std::size_t outstanding() const { return requests.size(); }
};

namespace {

/// Closes and forgets `w`'s landing, freeing what it holds on the device.
void drop_landing(weight_set& w) {
  if (w.landed)
    w.landed->close();
  w.landed.reset();
}

} // namespace

// -- construction and weights ------------------------------------------------------

engine_core::engine_core(const model_config& c, engine_options opts)
  : opts_(std::move(opts)), rank_pause_(std::max(1, opts_.dp)) {
  if (opts_.max_batch == 0 || opts_.queue_limit == 0 || opts_.prefill_chunk <= 0)
    throw std::invalid_argument("engine options: max_batch, queue_limit and prefill_chunk must be positive");
  // Ranks beyond the topology's bound are a configuration error, not a request for threads.
  if (opts_.dp < 1 || opts_.dp > topology_limits::max_dp)
    throw std::invalid_argument("engine options: dp must be 1.." + std::to_string(topology_limits::max_dp) + ", got "
                                + std::to_string(opts_.dp));
  net_ = std::make_unique<model>(c, opts_.tp, opts_.source_dtype, opts_.expert_parallel, opts_.dp);
  net_->set_device(opts_.device);
  for (int r = 0; r < opts_.dp; ++r)
    ranks_.push_back(std::make_unique<scheduler_rank>(r, opts_));
  for (int w = 0; w < opts_.tp; ++w)
    plans_.push_back(make_plan(c, opts_.tp, w, opts_.source_dtype, opts_.expert_parallel));
  if (opts_.preallocate_staging) { // now, not on the engine's thread in the middle of a round
    spare_ = primary().make_weights();
    reserve_ = primary().make_weights();
  }
}

engine_core::~engine_core() = default;

const model_config& engine_core::config() const { return primary().config(); }
model& engine_core::primary() { return *net_; }
const model& engine_core::primary() const { return *net_; }

void engine_core::load(std::shared_ptr<weight_set> weights, std::uint64_t version) {
  session_.reset();
  serve(std::move(weights), version);
}

void engine_core::serve(std::shared_ptr<weight_set> weights, std::uint64_t version) {
  weights->version = version;
  // Step (6), from what arrived, before any step reads it (unless the
  // pulling thread already did it for these bytes).
  if (!(opts_.weights == weight_format::int8 && weights->processed))
    process_weights(*weights, opts_.weights);
  net_->set_weights(weights); // every rank serves the one set: fanned out by reference
  drop_landing(*weights);      // taken by the device's copy, or not needed
  if (serving_) { // the first load keeps the spare made at construction
    if (serving_->processed && serving_.use_count() == 1)
      process_weights(*serving_, weight_format::received); // a spare holds no int8 form
    spare_ = std::move(serving_);
  }
  serving_ = std::move(weights);
  released_ = false;
  version_ = version;
  dirty_ = false;
  for (auto& rank : ranks_)
    rank->cache.clear(); // cached KV belongs to the old weights
}

std::shared_ptr<const weight_set> engine_core::weights() const { return primary().weights(); }

std::variant<std::uint64_t, engine_error> engine_core::release_weights() {
  if (state_ == scheduler_state::unpaused || pause_in_flight() || running_count() > 0)
    return engine_error{errc::not_paused, opts_.name + ": releasing the weights needs a paused engine with no "
                                                     "request admitted"};
  if (session_)
    return engine_error{errc::malformed, opts_.name + ": a weight-update session is open"};
  std::uint64_t bytes = 0;
  if (serving_)
    for (const auto& w : serving_->workers)
      for (const auto& p : w.params())
        bytes += p.bytes.size();
  net_->clear_weights();
  for (auto& rank : ranks_)
    rank->cache.clear();
  serving_.reset();
  spare_.reset();
  reserve_.reset();
  released_ = true;
  return bytes;
}

// -- requests --------------------------------------------------------------------------

std::optional<engine_error> engine_core::add(generate_request req, request_callbacks cb) {
  if (auto why = check(req); !why.empty())
    return engine_error{errc::malformed, why};
  const auto& c = config();
  for (const auto* tokens : {&req.prompt, &req.generated})
    for (auto t : *tokens)
      if (t >= c.vocab_size)
        return engine_error{errc::malformed, "token " + std::to_string(t) + " outside the vocabulary ("
                                               + std::to_string(c.vocab_size) + ")"};
  auto context_size = static_cast<std::int64_t>(req.prompt.size() + req.generated.size());
  if (context_size >= c.max_position_embeddings)
    return engine_error{errc::malformed, "prompt of " + std::to_string(context_size)
                                           + " tokens leaves no room below max_position_embeddings ("
                                           + std::to_string(c.max_position_embeddings) + ")"};
  if (rank_of(req.request_id))
    return engine_error{errc::malformed, "request " + std::to_string(req.request_id) + " already exists"};
  if (dirty_ && !session_)
    return engine_error{errc::engine_dirty, opts_.name + " holds no complete weights"};
  auto* chosen = choose_rank(req);
  if (!chosen)
    return engine_error{errc::queue_full, opts_.name + ": " + std::to_string(opts_.queue_limit)
                                            + " requests already waiting"
                                            + (opts_.dp > 1 ? " on each of its " + std::to_string(opts_.dp) + " ranks"
                                                            : "")};
  auto& rank = *chosen;
  auto r = std::make_unique<request>();
  r->context = req.prompt;
  r->context.insert(r->context.end(), req.generated.begin(), req.generated.end());
  r->prior = static_cast<std::uint32_t>(req.generated.size());
  r->kv = net_->new_sequence();
  r->req = std::move(req);
  r->cb = std::move(cb);
  auto id = r->req.request_id;
  rank.requests.emplace(id, std::move(r));
  rank.waiting.push_back(id);
  return std::nullopt;
}

engine_core::scheduler_rank* engine_core::choose_rank(const generate_request& req) {
  // Only ranks whose queue has room; the first of equals: the lowest rank.
  scheduler_rank* least = nullptr;
  for (auto& r : ranks_)
    if (r->waiting.size() < opts_.queue_limit && (!least || r->outstanding() < least->outstanding()))
      least = r.get();
  if (least && opts_.balance == dp_balance::prefix_affinity && !req.prompt.empty()) {
    auto block = std::min<std::size_t>(static_cast<std::size_t>(opts_.block_tokens), req.prompt.size());
    auto h = checksum64(req.prompt.data(), block * sizeof(std::int32_t), 0);
    auto& preferred = *ranks_[static_cast<std::size_t>(h % ranks_.size())];
    if (preferred.waiting.size() < opts_.queue_limit
        && preferred.outstanding() <= least->outstanding() + opts_.max_batch)
      return &preferred;
  }
  return least;
}

std::optional<int> engine_core::rank_of(std::uint64_t request_id) const {
  for (const auto& rank : ranks_)
    if (rank->requests.count(request_id))
      return rank->index;
  return std::nullopt;
}

std::pair<std::uint32_t, std::uint32_t> engine_core::rank_load(int rank) const {
  const auto& r = *ranks_.at(static_cast<std::size_t>(rank));
  return {static_cast<std::uint32_t>(r.running.size()), static_cast<std::uint32_t>(r.waiting.size())};
}

void engine_core::kill_worker(int rank, int worker) {
  if (rank < 0 || rank >= opts_.dp)
    throw std::out_of_range(opts_.name + ": no data-parallel rank " + std::to_string(rank));
  if (worker < 0 || worker >= opts_.tp)
    throw std::out_of_range(opts_.name + ": no tp worker " + std::to_string(worker));
  net_->kill_worker(rank * opts_.tp + worker);
}

std::optional<std::string> engine_core::failure() const {
  if (auto w = net_->dead_worker(); w >= 0)
    return opts_.name + ": data-parallel rank " + std::to_string(w / opts_.tp) + ", tp worker "
           + std::to_string(w % opts_.tp) + " died";
  return std::nullopt;
}

bool engine_core::abort(std::uint64_t request_id) {
  auto at = rank_of(request_id);
  if (!at)
    return false;
  auto& rank = *ranks_[static_cast<std::size_t>(*at)];
  finish(rank, *rank.requests.at(request_id), finish_reason::aborted);
  finish_paused_wait_if_idle();
  return true;
}

std::size_t engine_core::running_count() const {
  std::size_t n = 0;
  for (const auto& rank : ranks_)
    n += rank->running.size();
  return n;
}

void engine_core::admit(scheduler_rank& rank) {
  while (rank.running.size() < opts_.max_batch && !rank.waiting.empty()) {
    auto id = rank.waiting.front();
    rank.waiting.pop_front();
    auto& r = *rank.requests.at(id);
    r.admitted = true;
    rank.running.push_back(id);
    if (r.generated() >= r.req.sampling.max_tokens) { // a continuation with nothing left to generate
      finish(rank, r, finish_reason::length);
      continue;
    }
    // At least one token must be fed to get logits: look up all but the last.
    auto max_hit = static_cast<std::int64_t>(r.context.size()) - 1;
    auto [kv, length] = rank.cache.lookup(r.context, max_hit, version_);
    if (length > 0) {
      r.kv.copy_prefix(*kv, length);
      r.kv_version = version_;
    }
  }
}

std::size_t engine_core::step() {
  if (dirty_ || state_ == scheduler_state::paused_all)
    return 0;
  // Every rank's batch in one lockstep forward (a rank with nothing to run
  // takes part with an empty one: with expert parallelism its workers
  // compute their experts for the other ranks' tokens).
  std::vector<rank_batch> work(ranks_.size());
  std::vector<std::vector<forward_item>> batches(ranks_.size());
  bool any = false;
  for (std::size_t d = 0; d < ranks_.size(); ++d) {
    gather(*ranks_[d], batches[d], work[d]);
    any |= !batches[d].empty();
  }
  std::size_t produced = 0;
  if (any) {
    std::vector<forward_output> outs;
    net_->forward_ranks(batches, outs);
    for (std::size_t d = 0; d < ranks_.size(); ++d)
      produced += deliver(*ranks_[d], batches[d], work[d], outs[d]);
  }
  finish_paused_wait_if_idle();
  return produced;
}

void engine_core::gather(scheduler_rank& rank, std::vector<forward_item>& batch, rank_batch& work) {
  if (state_ == scheduler_state::unpaused)
    admit(rank);
  for (auto id : rank.running) {
    auto& r = *rank.requests.at(id);
    auto start = r.kv.length();
    auto end = std::min<std::int64_t>(static_cast<std::int64_t>(r.context.size()), start + opts_.prefill_chunk);
    if (start == 0)
      r.kv_version = version_;
    forward_item item;
    item.seq = &r.kv;
    item.start = start;
    item.tokens.assign(r.context.begin() + start, r.context.begin() + end);
    batch.push_back(std::move(item));
    work.order.push_back(id);
    work.samples.push_back(end == static_cast<std::int64_t>(r.context.size()));
  }
}

std::size_t engine_core::deliver(scheduler_rank& rank, const std::vector<forward_item>& batch,
                                 const rank_batch& work, const forward_output& out) {
  const auto& order = work.order;
  const auto& samples = work.samples;

  std::size_t produced = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    // Looked up again: a callback of an earlier delivery may have ended it.
    auto found = rank.requests.find(order[i]);
    if (found == rank.requests.end() || &found->second->kv != batch[i].seq)
      continue;
    auto& r = *found->second;
    // Stale: positions cached before this step were computed with older weights.
    bool stale = batch[i].start > 0 && r.kv_version < out.version;
    r.kv_version = std::min(r.kv_version, out.version);
    if (!samples[i])
      continue;
    const float* logits = out.last(i);
    if (!std::all_of(logits, logits + config().vocab_size, [](float x) { return std::isfinite(x); })) {
      // Sampling from NaN picks an arbitrary token: end the request as an error instead.
      ++nonfinite_logits_;
      finish(rank, r, finish_reason::failed);
      continue;
    }
    const auto& sampling = r.req.sampling;
    auto token = sample(logits, config().vocab_size, sampling, r.generated());
    std::optional<token_logprobs> lp; // only when asked: a pass over the vocabulary
    if (sampling.logprobs)
      lp = logprobs_of(logits, config().vocab_size, token, sampling.top_logprobs);
    emit(r, token, out.version, stale, lp ? &*lp : nullptr);
    ++produced;
    if (ends_as_eos(sampling, token))
      finish(rank, r, finish_reason::eos);
    else if (r.generated() >= r.req.sampling.max_tokens
             || static_cast<std::int64_t>(r.context.size()) >= config().max_position_embeddings)
      finish(rank, r, finish_reason::length);
  }
  return produced;
}

void engine_core::emit(request& r, std::int32_t token, std::uint64_t version, bool stale,
                       const token_logprobs* lp) {
  token_event ev;
  ev.request_id = r.req.request_id;
  ev.index = r.generated();
  ev.token = token;
  ev.version = version;
  ev.stale_kv = stale;
  if (lp) {
    ev.logprob = lp->logprob;
    ev.top_tokens = lp->top_tokens;
    ev.top_logprobs = lp->top_logprobs;
    r.logprobs.push_back(lp->logprob);
    r.top_tokens.insert(r.top_tokens.end(), lp->top_tokens.begin(), lp->top_tokens.end());
    r.top_logprobs.insert(r.top_logprobs.end(), lp->top_logprobs.begin(), lp->top_logprobs.end());
  }
  if (stale)
    ++r.stale_tokens;
  auto local = static_cast<std::uint32_t>(r.produced.size());
  if (r.spans.empty() || r.spans.back().version != version)
    r.spans.push_back({version, local, local + 1});
  else
    r.spans.back().end = local + 1;
  r.produced.push_back(token);
  r.context.push_back(token);
  ++tokens_generated_;
  if (dirty_)
    ++dirty_tokens_;
  if (r.cb.on_token)
    r.cb.on_token(ev);
}

void engine_core::finish(scheduler_rank& rank, request& r, finish_reason why) {
  generate_result res;
  res.request_id = r.req.request_id;
  res.tokens = std::move(r.produced);
  res.spans = std::move(r.spans);
  res.reason = why;
  res.engine = opts_.name;
  res.stale_kv_tokens = r.stale_tokens;
  res.logprobs = std::move(r.logprobs);
  res.top_tokens = std::move(r.top_tokens);
  res.top_logprobs = std::move(r.top_logprobs);
  auto id = r.req.request_id;
  // Keep the KV for later requests with the same prefix when it was all
  // computed with the weights served now.
  if (r.kv.length() > 0 && r.kv_version == version_ && !dirty_)
    rank.cache.insert(r.context, std::make_shared<const kv_sequence>(std::move(r.kv)), version_);
  auto cb = std::move(r.cb.on_finish);
  if (r.admitted)
    rank.running.erase(std::find(rank.running.begin(), rank.running.end(), id));
  else
    rank.waiting.erase(std::find(rank.waiting.begin(), rank.waiting.end(), id));
  rank.requests.erase(id);
  if (cb)
    cb(std::move(res));
}

bool engine_core::has_work() const {
  if (dirty_ || state_ == scheduler_state::paused_all)
    return false;
  for (const auto& rank : ranks_)
    if (!rank->running.empty() || (state_ == scheduler_state::unpaused && !rank->waiting.empty()))
      return true;
  return false;
}

// -- pause and resume ---------------------------------------------------------------------

void engine_core::pause(const pause_request& req) {
  pending_pause p;
  p.req = req;
  // A dirty engine steps nothing, so running requests could never finish:
  // a wait-pause holds them as keep does (else neither resume nor a new
  // session could follow it).
  if (req.mode == pause_mode::wait && dirty_)
    p.req.mode = pause_mode::keep;
  p.report.engine = opts_.name;
  completed_pause_.reset();
  rank_pause_.begin(p.req.mode);
  // Every rank, in one call: no rank keeps stepping while another pauses.
  for (auto& rank : ranks_) {
    if (req.clear_cache)
      rank->cache.clear();
    switch (p.req.mode) {
      case pause_mode::abort: {
        state_ = scheduler_state::paused_new;
        // Every request known now, admitted first (vLLM aborts them all).
        std::vector<std::uint64_t> ids(rank->running.begin(), rank->running.end());
        ids.insert(ids.end(), rank->waiting.begin(), rank->waiting.end());
        for (auto id : ids)
          finish(*rank, *rank->requests.at(id), finish_reason::aborted);
        p.report.aborted += static_cast<std::uint32_t>(ids.size());
        break;
      }
      case pause_mode::wait:
        state_ = scheduler_state::paused_new;
        p.report.waited += static_cast<std::uint32_t>(rank->running.size());
        break;
      case pause_mode::keep:
        state_ = scheduler_state::paused_all;
        p.report.frozen += static_cast<std::uint32_t>(rank->running.size());
        if (req.clear_cache)
          for (auto id : rank->running)
            rank->requests.at(id)->kv.clear(); // recomputed with the new weights on resume
        break;
    }
  }
  pause_ = p;
  finish_paused_wait_if_idle();
}

void engine_core::finish_paused_wait_if_idle() {
  if (!pause_ || completed_pause_)
    return;
  // A rank reaches the pause condition at once for abort and keep; for wait
  // once its running requests have finished.
  for (const auto& rank : ranks_)
    if (pause_->req.mode != pause_mode::wait || rank->running.empty())
      rank_pause_.reached(rank->index);
  if (rank_pause_.now() != rank_pause::phase::paused)
    return;
  auto report = pause_->report;
  report.version = version_;
  report.state = state_;
  completed_pause_ = report;
}

std::optional<pause_report> engine_core::poll_pause() {
  auto r = completed_pause_;
  completed_pause_.reset();
  return r;
}

bool engine_core::pause_in_flight() const {
  return pause_ && rank_pause_.now() == rank_pause::phase::pausing;
}

std::optional<engine_error> engine_core::resume() {
  if (released_)
    return engine_error{errc::engine_dirty, opts_.name + ": no weights to serve (released by a level-2 sleep; "
                                                       "wake up or load a version first)"};
  if (!rank_pause_.resume()) // refused while any rank is still on its way to the pause
    return engine_error{errc::pause_in_flight, opts_.name + ": a wait-pause still has "
                                                 + std::to_string(running_count()) + " running requests"
                                                 + (opts_.dp > 1 ? " on " + std::to_string(rank_pause_.outstanding())
                                                                     + " of " + std::to_string(opts_.dp) + " ranks"
                                                                 : "")};
  // Every rank restarts in this call: none steps while another is still paused.
  state_ = scheduler_state::unpaused;
  pause_.reset();
  completed_pause_.reset();
  return std::nullopt;
}

void engine_core::flush() {
  for (auto& rank : ranks_)
    rank->cache.clear();
}

// -- weight-update session -------------------------------------------------------------

bool engine_core::nothing_arrived() const {
  return session_ && std::all_of(session_->arrived.begin(), session_->arrived.end(),
                                 [](const auto& a) { return a.empty(); });
}

std::optional<engine_error> engine_core::start_update(std::uint64_t version) {
  if (state_ == scheduler_state::unpaused || pause_in_flight())
    return engine_error{errc::not_paused, opts_.name + ": start_update needs a paused, idle engine"};
  // The same version again is a full re-sync (a replica that rejoins holding
  // it; one that is clean may keep its set, keep_served); only going
  // backwards is refused.
  if (version < version_ || version == 0)
    return engine_error{errc::version_mismatch, opts_.name + " holds version " + std::to_string(version_)
                                                  + ", refuses to go to " + std::to_string(version)};
  // A new start supersedes an open session; one that received nothing did
  // not make the engine dirty, so what it was before that session carries over.
  const bool was_dirty = session_ && nothing_arrived() ? session_->was_dirty : dirty_;
  abort_update();
  session s;
  s.version = version;
  // Reuse the replaced set unless a step still holds it; finish_update
  // checks that every parameter gets overwritten.
  if (spare_ && spare_.use_count() == 1)
    s.staging = std::move(spare_);
  else if (reserve_)
    s.staging = std::move(reserve_);
  else
    s.staging = primary().make_weights();
  spare_.reset();
  s.staging->processed = false; // its bytes are about to change
  drop_landing(*s.staging);     // nothing of this session landed yet
  s.arrived.resize(static_cast<std::size_t>(opts_.tp));
  s.was_dirty = was_dirty;
  session_ = std::move(s);
  dirty_ = true;
  return std::nullopt;
}

std::optional<engine_error> engine_core::apply_packed(int worker, const std::set<std::string>& sources,
                                                      const std::uint8_t* bytes, std::size_t size) {
  if (!session_)
    return engine_error{errc::no_session, opts_.name + ": apply without start_update"};
  if (worker < 0 || worker >= opts_.tp)
    return engine_error{errc::malformed, "worker " + std::to_string(worker) + " out of range"};
  const auto& p = plans_[static_cast<std::size_t>(worker)];
  std::uint64_t expected = 0;
  std::set<std::string> seen;
  for (const auto& e : p.entries)
    if (sources.count(e.source)) {
      expected += e.bytes();
      seen.insert(e.source);
    }
  if (seen.size() != sources.size())
    return engine_error{errc::malformed, "packed group names tensors worker " + std::to_string(worker)
                                           + "'s plan does not have"};
  if (expected != size)
    return engine_error{errc::malformed, "packed group for worker " + std::to_string(worker) + " has "
                                           + std::to_string(size) + " bytes, the plan expects "
                                           + std::to_string(expected)};
  session_->staging->processed = false;
  drop_landing(*session_->staging); // bytes the device copy will not have
  auto& dst = session_->staging->workers[static_cast<std::size_t>(worker)];
  const std::uint8_t* at = bytes;
  for (const auto& e : p.entries)
    if (sources.count(e.source)) {
      engine::apply_packed(e, at, e.source_type, dst);
      at += e.bytes();
    }
  session_->arrived[static_cast<std::size_t>(worker)].insert(sources.begin(), sources.end());
  return std::nullopt;
}

std::optional<engine_error> engine_core::apply_tensor(const rlsync::tensor_view& t) {
  if (!session_)
    return engine_error{errc::no_session, opts_.name + ": apply without start_update"};
  if (ignored_weight(config(), t.name))
    return std::nullopt;
  session_->staging->processed = false;
  drop_landing(*session_->staging); // bytes the device copy will not have
  try {
    auto view = real_weight(t.name, t.type, t.shape, t.data);
    for (auto& w : session_->staging->workers)
      load_weight(*view, w);
  } catch (const std::exception& e) {
    return engine_error{errc::malformed, t.name + ": " + e.what()};
  }
  for (auto& arrived : session_->arrived)
    arrived.insert(t.name);
  return std::nullopt;
}

std::optional<engine_error> engine_core::finish_update(std::uint64_t version) {
  if (!session_)
    return engine_error{errc::no_session, opts_.name + ": finish without start_update"};
  if (version != session_->version)
    return engine_error{errc::version_mismatch, opts_.name + ": finish(" + std::to_string(version)
                                                  + ") in the session of version "
                                                  + std::to_string(session_->version)};
  if (session_->keeps_served && nothing_arrived()) {
    // The set served now holds the version's bytes: it only changes its name.
    spare_ = std::move(session_->staging);
    session_.reset();
    serving_->version = version;
    version_ = version;
    dirty_ = false;
    for (auto& rank : ranks_)
      rank->cache.clear(); // as after any update: a flush may have been skipped
    return std::nullopt;
  }
  for (int w = 0; w < opts_.tp; ++w) {
    const auto& arrived = session_->arrived[static_cast<std::size_t>(w)];
    for (const auto& e : plans_[static_cast<std::size_t>(w)].entries)
      if (!arrived.count(e.source)) {
        abort_update(); // the engine stays dirty until a complete update
        return engine_error{errc::update_incomplete, opts_.name + ": worker " + std::to_string(w)
                                                       + " never received " + e.source};
      }
  }
  auto staging = std::move(session_->staging);
  session_.reset();
  try {
    serve(staging, version);
  } catch (const std::exception& e) {
    // The device's copy of the version failed (device_gemm.hpp): the old
    // set is still served, and the engine stays dirty as after any
    // incomplete update.
    if (staging->processed)
      process_weights(*staging, weight_format::received);
    drop_landing(*staging);
    spare_ = std::move(staging);
    return engine_error{errc::update_incomplete, opts_.name + ": version " + std::to_string(version)
                                                   + " could not be served: " + e.what()};
  }
  return std::nullopt;
}

std::optional<std::uint64_t> engine_core::session_version() const {
  if (!session_)
    return std::nullopt;
  return session_->version;
}

std::shared_ptr<weight_set> engine_core::session_staging() const {
  return session_ ? session_->staging : nullptr;
}

std::shared_ptr<device_landing> engine_core::open_landing() {
  if (!session_ || !opts_.device || opts_.weights != weight_format::received)
    return nullptr;
  drop_landing(*session_->staging); // a second pull of the session: its own landing
  try {
    session_->staging->landed = opts_.device->landing(*session_->staging);
  } catch (const std::exception&) {
    return nullptr; // no room on the device for the copy now: finish uploads it, or says it cannot
  }
  return session_->staging->landed;
}

std::optional<engine_error> engine_core::mark_received(int worker, const std::set<std::string>& sources,
                                                       std::uint64_t version) {
  if (!session_ || session_->version != version)
    return engine_error{errc::no_session, opts_.name + ": no open session for version " + std::to_string(version)};
  if (worker < 0 || worker >= opts_.tp)
    return engine_error{errc::malformed, "worker " + std::to_string(worker) + " out of range"};
  session_->arrived[static_cast<std::size_t>(worker)].insert(sources.begin(), sources.end());
  return std::nullopt;
}

bool engine_core::keep_served(std::uint64_t same_since) {
  if (!session_ || session_->was_dirty || !serving_ || released_ || same_since == 0)
    return false;
  if (version_ < same_since || version_ > session_->version || !nothing_arrived())
    return false;
  session_->keeps_served = true;
  return true;
}

void engine_core::abort_update() {
  if (session_) {
    drop_landing(*session_->staging); // a pull still running lands nothing more
    spare_ = std::move(session_->staging); // partly written; the next session overwrites it all
  }
  session_.reset();
}

bool engine_core::abandon_update(bool bytes_in_flight) {
  if (!session_)
    return dirty_;
  bool touched = bytes_in_flight;
  for (const auto& arrived : session_->arrived)
    touched = touched || !arrived.empty();
  bool was_dirty = session_->was_dirty;
  abort_update();
  if (!touched) // the serving weights were never written: as before the session
    dirty_ = was_dirty;
  return dirty_;
}

// -- status ----------------------------------------------------------------------------------

engine_status engine_core::status() const {
  engine_status s;
  s.name = opts_.name;
  s.version = version_;
  s.dirty = dirty_;
  s.state = state_;
  auto admitted = static_cast<std::uint32_t>(running_count());
  (state_ == scheduler_state::paused_all ? s.frozen : s.running) = admitted;
  for (const auto& rank : ranks_) {
    s.waiting += static_cast<std::uint32_t>(rank->waiting.size());
    s.prefix_cache_hits += rank->cache.hits();
    s.prefix_cache_queries += rank->cache.queries();
  }
  s.tokens_generated = tokens_generated_;
  s.dirty_tokens = dirty_tokens_;
  return s;
}

std::map<std::string, std::uint64_t> weight_checksums(const weight_set& ws) {
  std::map<std::string, std::uint64_t> out;
  for (std::size_t w = 0; w < ws.workers.size(); ++w)
    for (const auto& p : ws.workers[w].params())
      out[std::to_string(w) + "/" + p.name] = checksum64(p.bytes.data(), p.bytes.size());
  return out;
}

std::map<std::string, std::uint64_t> engine_core::weight_checksums() const {
  auto ws = primary().weights();
  return ws ? engine::weight_checksums(*ws) : std::map<std::string, std::uint64_t>{};
}

} // namespace rlsync::engine
