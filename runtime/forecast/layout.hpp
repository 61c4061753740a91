#pragma once
// Who sends what to whom in one sync of a planned cluster, from the
// runtime's own code: each engine worker's plan is recorded by the engine's
// loader on shape-only views (engine::make_plan on a shard_spec, experts over
// dp x tp workers where the engine has them), and every plan entry's
// producer is chosen by the data plane's holder rule (plan::choose_holders)
// over what each trainer rank holds. Nothing is allocated but the plans.
//
// A planning assumption that differs from the runtime: every engine worker
// (each of dp x tp GPUs) pulls its own plan, and the holder rule turns on its
// index among the engine's GPUs (dp rank x tp + tp worker), so data-parallel
// ranks spread over the holders as tp workers do. The built-in engine's dp
// ranks instead share one copy, pulled once per engine.
#include "runtime/forecast/cluster.hpp"
#include "runtime/plan/plan.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace rlsync::forecast {

/// A GPU: node index (trainer nodes first, then engine nodes) and slot.
struct gpu_place {
  std::int64_t node = 0;
  std::int64_t gpu = 0;
};

struct producer {
  std::uint32_t rank = 0;
  gpu_place place;
  std::int64_t stage = 0;
  std::int64_t tp_rank = 0;
};

struct consumer {
  std::size_t engine = 0;  ///< index into cluster::engines
  std::int64_t replica = 0;
  std::int64_t replica_index = 0; ///< among every engine replica of the cluster, in order
  std::int64_t dp_rank = 0;
  std::int64_t worker = 0; ///< tp worker
  gpu_place place;
  std::size_t plan = 0;    ///< index into layout::plans (replicas share one)
};

/// What one worker takes from one producer for one group.
struct plan_share {
  std::uint32_t group = 0;
  std::size_t producer = 0;
  std::uint64_t bytes = 0;
  /// What the producer does for it: the slices it packs (sharded) or the
  /// tensors it sends (broadcast), each an id so that equal work for several
  /// workers (replicas, a dp rank's dense tensors) counts once.
  std::vector<std::uint32_t> work;
};

struct recorded_plan {
  std::size_t engine = 0;
  std::int64_t dp_rank = 0, worker = 0;
  std::uint64_t entries = 0, bytes = 0;
  std::vector<plan_share> shares;    ///< sharded: the plan's entries by group, then producer
  /// Broadcast: every tensor of every group, whole (the engine slices them
  /// itself), each from the holder the same rule picks for this worker.
  std::vector<plan_share> broadcast;
};

struct layout {
  std::vector<producer> producers;
  std::vector<consumer> consumers;
  std::vector<recorded_plan> plans;
  std::uint32_t groups = 0;
  std::uint64_t tensors = 0;          ///< checkpoint tensors of the model
  std::uint64_t model_bytes = 0;      ///< the whole checkpoint
  std::vector<std::uint64_t> group_bytes;       ///< per group: the checkpoint's bytes
  std::vector<std::uint64_t> group_dense_bytes; ///< per group: the bytes that are not experts
  std::vector<std::uint64_t> group_tensors;     ///< per group: checkpoint tensors
  std::vector<std::int64_t> group_stage;        ///< per group: the pipeline stage holding it
  /// Per group: the collectives that gather its tensors whole on one rank
  /// (per tensor: one across pp when pp > 1, one across ep for an expert when
  /// ep > 1, one across tp for a tp-split dense tensor when tp > 1).
  std::vector<std::uint64_t> group_gathers;
  /// Per producer and group: bytes it holds after the tp gather.
  std::vector<std::vector<std::uint64_t>> held_bytes;
  double record_seconds = 0; ///< wall time spent recording plans
};

/// Builds the layout. Throws what the loader and holder choice throw (a
/// tensor no trainer rank holds names it).
layout build_layout(const cluster& c);

/// "t3.gpu5" / "e0.gpu2" for a place (trainer nodes t*, engine nodes e*).
std::string place_name(const cluster& c, const gpu_place& p);

} // namespace rlsync::forecast
