#pragma once
// A plan entry's strided view in the fixed-size form a CUDA kernel takes by
// value: the same geometry as plan::strided, at most max_view_dims dims.
// The CPU reference (gather_host/scatter_host) and the device kernels
// (kernels.hpp) index through the one source_index() below, so the two
// replays agree by construction and the gpu tests check it on a device.
#include "runtime/base/host_device.hpp"
#include "runtime/plan/strided.hpp"

#include <cstddef>
#include <cstdint>

namespace rlsync::gpu {

/// torch tensors have at most 8 dims in every checkpoint rlsync has met;
/// views of more are refused by flatten().
inline constexpr int max_view_dims = 8;

struct flat_view {
  std::int64_t offset = 0; ///< first element, in source elements
  std::int64_t numel = 0;
  std::int32_t ndim = 0;
  std::int64_t shape[max_view_dims] = {};
  std::int64_t strides[max_view_dims] = {};
};

/// Source element index of the view's `linear`-th element in row-major
/// order; 0 <= linear < v.numel.
RLSYNC_HD inline std::int64_t source_index(const flat_view& v, std::int64_t linear) {
  std::int64_t at = v.offset;
  for (int d = v.ndim - 1; d >= 0; --d) {
    at += (linear % v.shape[d]) * v.strides[d];
    linear /= v.shape[d];
  }
  return at;
}

/// `v` as a flat_view over a source of `source_numel` elements. Throws
/// std::invalid_argument naming the problem when the view has more than
/// max_view_dims dims, a negative extent or stride, or reaches outside the
/// source (a plan is input from an engine: a kernel must never read or
/// write out of bounds on its word), all arithmetic overflow-checked.
flat_view flatten(const plan::strided& v, std::int64_t source_numel);

/// Whether distinct elements of `v` are distinct source elements (no
/// stride-0 or overlapping dims), which a scatter needs: two threads
/// writing one element would race. Sufficient test: sorted by stride,
/// every dim of extent > 1 steps past the whole of the dims below it.
bool one_to_one(const flat_view& v);

/// CPU reference of the device gather: packed[i] = source[source_index(v, i)].
void gather_host(const flat_view& v, const void* source, std::size_t element_size, void* packed);
/// The inverse: target[source_index(v, i)] = packed[i]. Throws
/// std::invalid_argument when !one_to_one(v).
void scatter_host(const flat_view& v, const void* packed, std::size_t element_size, void* target);

} // namespace rlsync::gpu
