#pragma once
// Sharding plans: the contract both ends of the wire share. A worker's plan
// lists, for every destination slice of an engine parameter, the source
// tensor and op chain that fill it and the same slice as one strided view
// into the source — the executable form the trainer replays to pack exactly
// the bytes one worker keeps. The engine records plans by running its own
// loader on recording views (engine/recording.hpp); the trainer replays them
// (here) and never needs the engine.
#include "runtime/base/dtype.hpp"
#include "runtime/base/tensor.hpp"
#include "runtime/plan/strided.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rlsync::plan {

/// One destination slice: `numel()` elements written contiguously into
/// `param` from `dst_offset`, taken row-major from `view` of `source`.
struct plan_entry {
  std::string source;                     ///< checkpoint tensor name
  dtype source_type = dtype::bf16;
  std::vector<std::int64_t> source_shape; ///< the full source tensor
  std::vector<std::string> ops;           ///< the loader's op chain, e.g. "narrow(0, 16, 16)"
  strided view;                           ///< the same slice, in source elements
  std::string param;                      ///< engine parameter (worker-local)
  std::int64_t dst_offset = 0;            ///< element offset in `param`

  std::int64_t numel() const { return view.numel(); }
  /// Packed bytes in the source dtype.
  std::uint64_t bytes() const { return static_cast<std::uint64_t>(numel()) * dtype_size(source_type); }
  /// "model.layers.0.self_attn.k_proj.weight.view([2, 16, 64]).narrow(0, 1, 1)...
  ///  -> model.layers.0.self_attn.qkv_proj.weight[2048 +1024]"
  std::string describe() const;
};

/// Everything one worker needs, in loader order (source tensor by tensor).
struct worker_plan {
  int tp = 1;
  int worker = 0;
  std::vector<plan_entry> entries;
};

/// Trainer side: packs the elements of `e` from the full source tensor's
/// bytes (`source`, of dtype `type`) into `packed` (e.numel() elements of
/// `type`; e.bytes() when type is the recorded dtype).
void replay_into(const plan_entry& e, const void* source, dtype type, void* packed);
std::vector<std::uint8_t> replay(const plan_entry& e, const void* source, dtype type);

/// "source.op1.op2": how plans and their errors name a slice.
std::string op_chain(const std::string& source, const std::vector<std::string>& ops);

/// Bytes the worker receives: the sum of its entries' packed bytes.
std::uint64_t bytes_per_worker(const worker_plan& p);

} // namespace rlsync::plan
