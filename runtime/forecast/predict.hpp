#pragma once
// Predicting a sync of a planned cluster (forecast/layout.hpp) with the
// fluid model of its fabric (forecast/flow_model.hpp).
//
// Links: every GPU has a NIC (out and in) and an intra-node link (out and in);
// a flow between GPUs of one node crosses the intra-node links, any other
// the two NICs (the fabric between NICs is assumed full bisection).
//
// A sync is one phase per pipeline stage (pp serial: the stages' groups go
// one stage after another, as vLLM's layerwise reload needs) or a single
// phase (pp parallel). Within a phase:
// (the model tells one group in flight from several; more than two change
// memory, not time)
//   groups_in_flight >= 2   groups are pipelined: the phase's flows run as one
//                           fluid transfer, the trainer's tp gather of the next
//                           group overlaps it (the phase takes the longer of
//                           the two, plus the first group's gather)
//   groups_in_flight == 1   group after group: gather, transfer
// and every group adds its latency and the producer's packing work: each
// distinct slice it replays is one operation (the busiest producer of the
// group sets the time). Transfers run at `efficiency` of the datasheet
// bandwidths. The speed of light is the bytes over the bottleneck link's
// datasheet bandwidth, summed over serial phases.
#include "runtime/forecast/cluster.hpp"
#include "runtime/forecast/layout.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace rlsync::forecast {

/// The model's constants: the same for every scenario (README, "Planning a
/// cluster", derives them).
struct model_constants {
  /// Fraction of a link's datasheet bandwidth large transfers reach.
  double efficiency = 0.9;
  /// Per group: the pull request and the release signal (one round trip).
  double group_latency_s = 100e-6;
  /// One synchronous operation: a slice replayed and packed, one collective
  /// call, one per-tensor call into the engine. Calibrated once, on the
  /// Qwen3-235B pipelined sharded figure (3.49 s), and fixed.
  double op_s = 281e-6;
};

struct sync_knobs {
  plan_mode mode = plan_mode::sharded;
  std::int64_t groups_in_flight = 2;
  pp_order pp = pp_order::serial;
  /// The engines syncing (indices of engine replicas in cluster order); empty: all.
  std::vector<std::int64_t> engines;
};

struct phase_prediction {
  std::string name;            ///< "stage 3" or "all stages"
  double seconds = 0;
  double transfer_s = 0, gather_s = 0, overhead_s = 0;
  double light_s = 0;
  std::string bottleneck;      ///< the link that sets the phase's light
  double bottleneck_bytes = 0;
  std::uint64_t ops = 0;       ///< sum over groups of the busiest producer's operations
};

struct sync_prediction {
  sync_knobs knobs;
  double seconds = 0;
  double light_s = 0;          ///< for the knobs' pp order
  double bytes = 0;            ///< over the wire (every flow)
  std::string bottleneck;      ///< of the phase with the largest light
  std::uint64_t ops = 0;
  std::vector<phase_prediction> phases;
};

sync_prediction predict_sync(const cluster& c, const layout& l, const sync_knobs& k, const model_constants& mc = {});

/// The per-tensor NCCL broadcast baseline, as SkyRL runs it: every tensor of
/// the checkpoint is gathered whole onto trainer rank 0 (layout::group_gathers:
/// a collective across pp, and across ep for an expert or tp for a tp-split
/// dense tensor), broadcast to every engine worker (the ring runs at one NIC's
/// bandwidth) and loaded by the engine (one call), tensor after tensor.
struct baseline_prediction {
  double seconds = 0, gather_s = 0, broadcast_s = 0, overhead_s = 0;
  std::uint64_t tensors = 0;
  std::uint64_t operations = 0; ///< gathers, broadcasts and loads
};
baseline_prediction predict_nccl_broadcast(const cluster& c, const layout& l, const model_constants& mc = {});

/// Bytes and memory of one sync with the knobs' mode.
struct traffic_summary {
  struct side {
    std::uint64_t min = 0, max = 0, total = 0;
    std::size_t count = 0;
    std::string busiest; ///< place of the max
  };
  side per_producer, per_consumer;
  /// The busiest links of the whole sync: name, bytes, seconds at datasheet bandwidth.
  struct link_load {
    std::string name;
    double bytes = 0, light_s = 0;
  };
  std::vector<link_load> busiest_links;
  std::uint64_t largest_group = 0;     ///< the checkpoint's largest group
  std::uint32_t largest_group_index = 0;
  /// groups in flight (at most a phase's groups) x (the group held after the
  /// gather + its packed bytes) on the busiest producer
  std::uint64_t producer_memory = 0;
  std::uint64_t consumer_memory = 0;   ///< the same window x the largest group one worker receives
};
traffic_summary summarize(const cluster& c, const layout& l, const sync_knobs& k);

/// One wave plan: wave_size engines at a time (0: all).
struct wave_prediction {
  std::int64_t wave_size = 0;
  std::int64_t waves = 0;
  double total_s = 0;           ///< the waves one after another
  double max_stall_s = 0;       ///< the longest an engine is out of service
  std::int64_t serving = 0;     ///< engines generating while a wave syncs
  std::int64_t engines = 0;
};
wave_prediction predict_waves(const cluster& c, const layout& l, std::int64_t wave_size, const sync_knobs& k,
                              const model_constants& mc = {});

} // namespace rlsync::forecast
