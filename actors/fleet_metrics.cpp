#include "actors/fleet_metrics.hpp"

#include <chrono>
#include <map>
#include <mutex>

namespace rlsync {

const std::vector<double>& weight_update_buckets() {
  static const std::vector<double> b{0.01, 0.1, 1, 10, 30, 60, 120, 300, 600};
  return b;
}

const std::vector<double>& sync_phase_buckets() {
  static const std::vector<double> b{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600};
  return b;
}

namespace {

metrics::histogram& operation(metrics::registry& r, const std::string& engine, const char* op) {
  return r
    .histograms("vllm:rl_weight_update_operation_duration_seconds",
                "Duration of weight-update operations (init, start, update, finish), failed ones included",
                weight_update_buckets(), {"engine", "operation"})
    .with({engine, op});
}

/// Raises `c` by what `now` grew past `seen`; a figure that went down
/// (the engine restarted) counts from 0 again.
void follow(metrics::counter& c, std::uint64_t now, std::uint64_t& seen) {
  c.inc(static_cast<double>(now >= seen ? now - seen : now));
  seen = now;
}

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

} // namespace

engine_metrics::engine_metrics(metrics::registry& r, const std::string& engine)
  : init_seconds(operation(r, engine, "init")),
    start_seconds(operation(r, engine, "start")),
    update_seconds(operation(r, engine, "update")),
    finish_seconds(operation(r, engine, "finish")),
    operations_in_flight(r.gauges("vllm:rl_weight_update_operations_in_flight",
                                  "Weight-update operations in progress", {"engine"})
                           .with({engine})),
    requests_running(
      r.gauges("vllm:num_requests_running", "Requests in the running batch", {"engine"}).with({engine})),
    requests_waiting(r.gauges("vllm:num_requests_waiting", "Requests waiting to run", {"engine"}).with({engine})),
    prompt_tokens(r.counters("vllm:prompt_tokens_total", "Prompt tokens admitted", {"engine"}).with({engine})),
    generation_tokens(
      r.counters("vllm:generation_tokens_total", "Tokens generated", {"engine"}).with({engine})),
    prefix_cache_queries(
      r.counters("vllm:prefix_cache_queries_total", "Prefix-cache lookups", {"engine"}).with({engine})),
    prefix_cache_hits(r.counters("vllm:prefix_cache_hits_total", "Prefix-cache hits", {"engine"}).with({engine})),
    weight_version(
      r.gauges("rlsync_engine_weight_version", "Weight version the engine serves", {"engine"}).with({engine})) {}

void engine_metrics::sample(const engine_status& s) {
  // Frozen requests (a pause that keeps them) still hold their batch slot.
  requests_running.set(static_cast<double>(s.running) + static_cast<double>(s.frozen));
  requests_waiting.set(static_cast<double>(s.waiting));
  weight_version.set(static_cast<double>(s.version));
  follow(generation_tokens, s.tokens_generated, tokens_seen_);
  follow(prefix_cache_queries, s.prefix_cache_queries, queries_seen_);
  follow(prefix_cache_hits, s.prefix_cache_hits, hits_seen_);
}

router_metrics::router_metrics(metrics::registry& r)
  : queued(r.gauges("rlsync_router_queued_requests", "Requests waiting for a routable engine").only()),
    outstanding(r.gauges("rlsync_router_outstanding_requests", "Requests sent to engines, not yet finished").only()),
    routable(r.gauges("rlsync_router_routable_engines", "Engines the router may send requests to now").only()),
    reroutes(r.counters("rlsync_router_reroutes_total", "Requests moved to another engine after a failure").only()),
    completed(r.counters("rlsync_router_completed_total", "Requests answered").only()),
    rejected(r.counters("rlsync_router_rejected_total", "Requests refused or timed out").only()) {}

void router_metrics::sample(const router_status& s) {
  queued.set(s.queued);
  outstanding.set(s.outstanding);
  routable.set(s.routable);
  follow(reroutes, s.rerouted, rerouted_seen_);
  follow(completed, s.completed, completed_seen_);
  follow(rejected, s.rejected, rejected_seen_);
}

std::shared_ptr<engine_metrics> engine_metrics_in(const std::shared_ptr<metrics::registry>& r,
                                                  const std::string& engine) {
  return r ? std::make_shared<engine_metrics>(*r, engine) : nullptr;
}

void instrument_router(metrics::registry& r, router_config& cfg) {
  auto m = std::make_shared<router_metrics>(r);
  cfg.on_status = [m, next = cfg.on_status](const router_status& s) {
    m->sample(s);
    if (next)
      next(s);
  };
}

std::string eviction_reason_label(const std::string& why) {
  if (starts_with(why, "no answer within"))
    return "deadline";
  if (starts_with(why, "unreachable"))
    return "unreachable";
  if (starts_with(why, "down"))
    return "down";
  if (starts_with(why, "deregistered"))
    return "left";
  if (starts_with(why, "replaced"))
    return "replaced";
  if (starts_with(why, "finished version") || starts_with(why, "transferred version"))
    return "version_mismatch";
  return "error";
}

namespace {

/// What the coordinator's hooks share; they run on the coordinator's thread
/// (a restarted coordinator's too), the mutex only guards a restart's overlap.
struct coordinator_recorder {
  explicit coordinator_recorder(metrics::registry& r)
    : phase_seconds(r.histograms("rlsync_sync_phase_seconds",
                                 "Duration of each phase of a sync round's waves (sent to the next phase sent)",
                                 sync_phase_buckets(), {"phase"})),
      rounds(r.counters("rlsync_sync_rounds_total", "Sync rounds by outcome (complete, partial, aborted)",
                        {"outcome"})),
      bytes(r.counters("rlsync_sync_bytes_total", "Weight bytes received by engine workers in sync rounds").only()),
      stall(r.histograms("rlsync_sync_stall_seconds", "Time engines stood paused per round", sync_phase_buckets())
              .only()),
      evictions(r.counters("rlsync_evictions_total", "Engines evicted from a round, by phase and reason",
                           {"phase", "reason"})),
      engines(r.gauges("rlsync_engines", "Registered engines by state", {"state"})),
      synced_version(r.gauges("rlsync_synced_version", "Version of the last completed round").only()),
      pinned_version(
        r.gauges("rlsync_pinned_version", "Version the round in progress transfers (0: no round)").only()),
      trainer_ranks(r.gauges("rlsync_trainer_ranks", "Trainer ranks the topology names").only()) {
    for (const char* s : states)
      engines.with({s}).set(0);
  }

  static constexpr const char* states[] = {"syncing", "serving", "evicted", "dirty", "unreachable", "retired"};

  void phase_sent(std::uint64_t round, sync_phase phase, std::uint64_t version) {
    std::lock_guard<std::mutex> lock(mutex);
    auto now = std::chrono::steady_clock::now();
    close_phase(round, now);
    open_round = round;
    open_phase = phase;
    opened = now;
    pinned_version.set(static_cast<double>(version));
  }

  void round_ended(const sync_report& rep) {
    std::lock_guard<std::mutex> lock(mutex);
    close_phase(open_round, std::chrono::steady_clock::now());
    open_round = 0;
    pinned_version.set(0);
    rounds.with({rep.aborted ? "aborted" : rep.evicted.empty() ? "complete" : "partial"}).inc();
    bytes.inc(static_cast<double>(rep.bytes));
    stall.observe(static_cast<double>(rep.stall_ns) / 1e9);
    if (!rep.aborted && rep.version > synced_version.value())
      synced_version.set(static_cast<double>(rep.version));
  }

  void member(const std::string& engine, const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex);
    const char* to = nullptr;
    if (what == "registered" || what == "reachable")
      to = "syncing"; // unroutable until its next round completes
    else if (what == "routable")
      to = "serving";
    else if (what == "evicted" || what == "dirty" || what == "unreachable" || what == "retired")
      to = what == "evicted" ? "evicted" : what == "dirty" ? "dirty" : what == "unreachable" ? "unreachable" : "retired";
    auto i = state_of.find(engine);
    if (i != state_of.end())
      engines.with({i->second}).dec();
    if (what == "left" || !to) {
      if (i != state_of.end())
        state_of.erase(i);
      return;
    }
    state_of[engine] = to;
    engines.with({to}).inc();
  }

  void evicted(std::optional<sync_phase> phase, const std::string& why) {
    evictions.with({phase ? std::string{to_string(*phase)} : std::string{"before_wave"}, eviction_reason_label(why)})
      .inc();
  }

  /// The phase open in `round` ends now.
  void close_phase(std::uint64_t round, std::chrono::steady_clock::time_point now) {
    if (open_round == 0 || open_round != round)
      return;
    phase_seconds.with({std::string{to_string(open_phase)}})
      .observe(std::chrono::duration<double>(now - opened).count());
  }

  std::mutex mutex;
  metrics::histogram_family& phase_seconds;
  metrics::counter_family& rounds;
  metrics::counter& bytes;
  metrics::histogram& stall;
  metrics::counter_family& evictions;
  metrics::gauge_family& engines;
  metrics::gauge& synced_version;
  metrics::gauge& pinned_version;
  metrics::gauge& trainer_ranks;
  /// Each registered engine's state (names come from the topology: bounded).
  std::map<std::string, const char*> state_of;
  std::uint64_t open_round = 0;
  sync_phase open_phase = sync_phase::pause;
  std::chrono::steady_clock::time_point opened;
};

} // namespace

void instrument_coordinator(metrics::registry& r, coordinator_config& cfg) {
  auto rec = std::make_shared<coordinator_recorder>(r);
  rec->trainer_ranks.set(cfg.trainer_ranks);
  rec->synced_version.set(cfg.restored ? static_cast<double>(cfg.restored->synced_version) : 0.0);
  cfg.on_phase = [rec, next = cfg.on_phase](std::uint64_t round, std::uint64_t version, sync_phase phase,
                                            const std::vector<std::string>& engines) {
    rec->phase_sent(round, phase, version);
    if (next)
      next(round, version, phase, engines);
  };
  cfg.on_report = [rec, next = cfg.on_report](const sync_report& rep) {
    rec->round_ended(rep);
    if (next)
      next(rep);
  };
  cfg.on_member = [rec, next = cfg.on_member](const std::string& engine, const std::string& what) {
    rec->member(engine, what);
    if (next)
      next(engine, what);
  };
  cfg.on_evict = [rec, next = cfg.on_evict](const std::string& engine, std::optional<sync_phase> phase,
                                            const std::string& why) {
    rec->evicted(phase, why);
    if (next)
      next(engine, phase, why);
  };
}

} // namespace rlsync
