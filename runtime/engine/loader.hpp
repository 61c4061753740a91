#pragma once
// The engine's weight loader: one function per checkpoint parameter (Hugging
// Face Llama names), written once against weight_view, so that the same code
// loads real bytes and records sharding plans (recording.hpp).
//
// For each checkpoint tensor it walks the weight lifecycle for one worker:
//   (1) fuse       q/k/v land in one qkv_proj, gate/up in one gate_up_proj,
//                  at their row offsets in the fused parameter
//   (2) relayout   HF Linear weights are [out, in], the engine's layout too;
//                  q/k/v are viewed per head to select whole heads
//   (3) select     a mixture-of-experts layer's tensor goes to its expert;
//                  with expert parallelism only to the worker holding it
//   (4) shard      narrow to this worker's heads / intermediate / vocab slice
//   (5)-(7)        copy_into: stage, convert to the engine's storage dtype
//                  (a copy when the checkpoint's agrees), store in the parameter
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/engine/weight_view.hpp"
#include "runtime/engine/weights.hpp"

#include <memory>
#include <string>
#include <vector>

namespace rlsync {
class checkpoint;
}

namespace rlsync::engine {

/// Loads checkpoint tensor src.name() into worker `dst` (steps 1-7).
/// Throws std::invalid_argument for a name the model does not have or a
/// shape that disagrees with the config.
void load_weight(const weight_view& src, worker_weights& dst);

/// Loads every tensor into every worker of `set` (one thread per worker),
/// skipping ignored ones. Throws std::invalid_argument naming any tensor the
/// model needs that is not among `tensors`, or any unknown one.
void load_weights(const std::vector<const rlsync::tensor_view*>& tensors, weight_set& set);
void load_weights(const std::vector<rlsync::tensor_view>& tensors, weight_set& set);

/// Every tensor of an opened checkpoint into `set`.
void load_checkpoint(const rlsync::checkpoint& ckpt, weight_set& set);
/// Opens the checkpoint directory `dir` (config.json + safetensors) and
/// loads it into a new set for `tp` workers (experts placed whole when
/// `expert_parallel`), stored in the checkpoint's dtype. The set's version is 0.
std::shared_ptr<weight_set> load_checkpoint(const std::string& dir, int tp, bool expert_parallel = false);

} // namespace rlsync::engine
