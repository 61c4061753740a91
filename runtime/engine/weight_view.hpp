#pragma once
// What the weight loader sees of a checkpoint tensor: an abstract view with
// torch-like ops. The loader is written once against it and runs on two
// implementations:
//   - real views (here): a pointer to the source bytes; copy_into copies,
//     converts and stores into an engine parameter;
//   - recording views (recording.hpp): shape and dtype only; copy_into
//     records a plan entry, the executable form of what the real copy would do.
//
// (Named weight_view, not tensor_view, because rlsync::tensor_view is the
// safetensors reader's {spec, bytes} struct.)
#include "runtime/base/dtype.hpp"
#include "runtime/engine/weights.hpp"
#include "runtime/plan/strided.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rlsync::engine {

/// Steps 6 and 7 of the weight lifecycle (process, store): converts `count` packed elements of `type` to
/// the parameter's dtype (a copy when they agree, exact widening into f32) and stores them in `dst` at
/// element `dst_offset`. Throws std::invalid_argument when that would round (f32 into bf16, f16 <-> bf16). Throws
/// std::out_of_range when they do not fit, std::logic_error when `dst` holds
/// no data (a shape-only parameter).
void store_packed(const void* packed, dtype type, std::int64_t count, parameter& dst, std::int64_t dst_offset);

class weight_view;
using weight_ptr = std::shared_ptr<const weight_view>;

class weight_view {
public:
  virtual ~weight_view() = default;

  /// The checkpoint tensor this views.
  virtual const std::string& name() const = 0;
  virtual dtype type() const = 0;
  virtual const std::vector<std::int64_t>& shape() const = 0;

  /// Elements [start, start + length) along `dim`.
  virtual weight_ptr narrow(int dim, std::int64_t start, std::int64_t length) const = 0;
  /// The same elements under another shape (one dim may be -1).
  virtual weight_ptr view(std::vector<std::int64_t> shape) const = 0;
  virtual weight_ptr transpose(int d0, int d1) const = 0;
  /// Writes the viewed elements, row-major, into `dst` from element
  /// `dst_offset` on (steps 5-7: stage, convert to fp32, store).
  virtual void copy_into(parameter& dst, std::int64_t dst_offset) const = 0;
};

/// A real view over `data`, which must outlive it and every view made from
/// it. A view() that strides cannot express is materialised into a copy the
/// view owns (torch's reshape); recording views refuse it instead.
weight_ptr real_weight(std::string name, dtype type, std::vector<std::int64_t> shape, const void* data);

} // namespace rlsync::engine
