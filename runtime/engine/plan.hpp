#pragma once
// Sharding plans by recording (DESIGN §5). make_plan runs the engine's own
// loader (loader.hpp) on recording views: shape and dtype, no data. Every
// copy_into becomes a plan entry: the destination slice of an engine
// parameter, the source tensor and op chain that fill it, and the same
// slice as one strided view into the source — the executable form the
// trainer replays to pack exactly the bytes one worker keeps.
//
// The plan is correct by construction because it comes from the loader; an
// op a strided view cannot express (a view() of non-contiguous elements)
// throws at plan time, naming the tensor and the op chain.
#include "runtime/dtype.hpp"
#include "runtime/engine/weight_view.hpp"
#include "runtime/engine/weights.hpp"
#include "runtime/model_config.hpp"
#include "runtime/safetensors.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rlsync::engine {

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
struct plan {
  int tp = 1;
  int worker = 0;
  std::vector<plan_entry> entries;
};

/// A recording view over a tensor of `type` and `shape` called `name`;
/// copy_into appends to `sink`.
weight_ptr recording_weight(std::string name, dtype type, std::vector<std::int64_t> shape,
                            std::shared_ptr<std::vector<plan_entry>> sink);

/// The plan of worker `worker` of `tp` for a whole checkpoint of `c` in
/// `source` dtype. Checks that it writes every element of every parameter
/// exactly once (std::logic_error otherwise). Throws what the loader throws.
plan make_plan(const model_config& c, int tp, int worker, dtype source = dtype::bf16);
/// The plan for the tensors `sources` only (a trainer rank holding some
/// layers); ignored names are skipped. No coverage check.
plan make_plan(const model_config& c, int tp, int worker, const std::vector<tensor_spec>& sources);

/// Problems with the coverage of the worker's parameters: elements written
/// twice or never. Empty when the plan fills every parameter exactly once.
std::vector<std::string> check_coverage(const plan& p, const model_config& c);

/// Trainer side: packs the elements of `e` from the full source tensor's
/// bytes (`source`, of dtype `type`) into `packed` (e.numel() elements of
/// `type`; e.bytes() when type is the recorded dtype).
void replay_into(const plan_entry& e, const void* source, dtype type, void* packed);
std::vector<std::uint8_t> replay(const plan_entry& e, const void* source, dtype type);

/// Engine side, steps 5-7 from packed bytes: converts them to fp32 and stores
/// them in the entry's parameter of `dst` at its offset.
void apply_packed(const plan_entry& e, const void* packed, dtype type, worker_weights& dst);

/// Bytes the worker receives: the sum of its entries' packed bytes.
std::uint64_t bytes_per_worker(const plan& p);

} // namespace rlsync::engine
