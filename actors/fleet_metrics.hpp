#pragma once
// The fleet's metrics: what the coordinator, the router and each rollout
// engine record into a process's metrics registry (served on GET /metrics).
//
// Engines use vLLM's names where vLLM has one, so that dashboards built for
// vLLM read rlsync's engines too; the label `engine` is the replica name
// (one process may host several). rlsync's own are prefixed `rlsync_`.
//
// Everything here is updated from one actor's thread at a time; the
// registry's series are atomic, so a scrape from any thread is safe.
#include "actors/coordinator.hpp"
#include "runtime/control/protocol.hpp"
#include "runtime/control/routing.hpp"
#include "runtime/metrics/registry.hpp"

#include <memory>
#include <string>
#include <vector>

namespace rlsync {

/// vLLM's buckets for vllm:rl_weight_update_operation_duration_seconds.
const std::vector<double>& weight_update_buckets();
/// Buckets of rlsync_sync_phase_seconds and rlsync_sync_stall_seconds.
const std::vector<double>& sync_phase_buckets();

/// One engine's series.
struct engine_metrics {
  engine_metrics(metrics::registry& r, const std::string& engine);

  /// vLLM's weight-update operations: init (the engine's first weights),
  /// start, update (a transfer or an inline bucket), finish; each observed
  /// whether it succeeded or failed.
  metrics::histogram& init_seconds;
  metrics::histogram& start_seconds;
  metrics::histogram& update_seconds;
  metrics::histogram& finish_seconds;
  metrics::gauge& operations_in_flight;
  metrics::gauge& requests_running;
  metrics::gauge& requests_waiting;
  metrics::counter& prompt_tokens;
  metrics::counter& generation_tokens;
  metrics::counter& prefix_cache_queries;
  metrics::counter& prefix_cache_hits;
  metrics::gauge& weight_version;

  /// Follows the engine's own figures: gauges set, counters raised by what
  /// grew since the last call (a restarted engine's figures start at 0 again).
  void sample(const engine_status& s);

private:
  std::uint64_t tokens_seen_ = 0;
  std::uint64_t queries_seen_ = 0;
  std::uint64_t hits_seen_ = 0;
};

/// The router's series.
struct router_metrics {
  explicit router_metrics(metrics::registry& r);

  metrics::gauge& queued;
  metrics::gauge& outstanding;
  metrics::gauge& routable;
  metrics::counter& reroutes;
  metrics::counter& completed;
  metrics::counter& rejected;

  /// Gauges set from `s`, counters raised by what grew since the last call.
  void sample(const router_status& s);

private:
  std::uint64_t rerouted_seen_ = 0;
  std::uint64_t completed_seen_ = 0;
  std::uint64_t rejected_seen_ = 0;
};

/// Engine `engine`'s series in `r`; nullptr when `r` is (metrics off).
std::shared_ptr<engine_metrics> engine_metrics_in(const std::shared_ptr<metrics::registry>& r,
                                                  const std::string& engine);

/// Sets the router's on_status (keeping one already set) so that its
/// queue, requests out and reroutes are recorded in `r`.
void instrument_router(metrics::registry& r, router_config& cfg);

/// Why an engine was evicted, as a bounded label: "deadline" (no answer in
/// time), "unreachable", "down" (its process or link died), "left",
/// "replaced" (a newer incarnation registered), "version_mismatch" (it
/// answered for another version), else "error".
std::string eviction_reason_label(const std::string& why);

/// Wraps the coordinator's hooks (on_phase, on_report, on_member, on_evict),
/// keeping the ones already set, so that every round and membership change
/// is recorded in `r`: per-phase durations, rounds by outcome, bytes, stalls,
/// evictions by phase and reason, engines by state, the synced and pinned
/// versions and the trainer ranks configured.
void instrument_coordinator(metrics::registry& r, coordinator_config& cfg);

} // namespace rlsync
