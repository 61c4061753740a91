#pragma once
// Strided views: the geometry of the loader's torch-like ops (narrow,
// transpose, view) over a source tensor, in elements. A plan entry stores
// its slice as one such view; the trainer gathers it to pack the bytes.
#include "runtime/base/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace rlsync::plan {

/// A strided view into a source tensor, in elements of the source dtype.
struct strided {
  std::int64_t offset = 0;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;

  /// The row-major view of a whole tensor of `shape`.
  static strided dense(const std::vector<std::int64_t>& shape);
  std::int64_t numel() const;
  bool contiguous() const;
};

// The geometry of the ops, shared by every view. narrow and transpose
// throw std::out_of_range for a bad dim or range.
strided narrow(const strided& v, int dim, std::int64_t start, std::int64_t length);
strided transpose(const strided& v, int d0, int d1);
/// torch's view(): the same elements under `shape` (one dim may be -1) as a
/// strided view, or nullopt when the elements are laid out so that no
/// strides can express it (a copy would be needed). Throws
/// std::invalid_argument when the element counts differ.
std::optional<strided> reshape(const strided& v, std::vector<std::int64_t> shape);
/// Calls `run(byte_offset, bytes)` for each contiguous run of `v`'s
/// elements in a source of `element_size`-byte elements, in row-major
/// order: one run for a contiguous view, one per row of the last dim when
/// that dim is dense, else one per element. The runs back to back are the
/// packed bytes of `v`.
template <class F>
void for_each_run(const strided& v, std::size_t element_size, F&& run) {
  const std::int64_t n = v.numel();
  if (n == 0)
    return;
  const auto es = static_cast<std::int64_t>(element_size);
  if (v.contiguous()) {
    run(v.offset * es, static_cast<std::size_t>(n * es));
    return;
  }
  // Rows of the last dim, an odometer over the others.
  const std::size_t rank = v.shape.size();
  const std::int64_t inner = v.shape[rank - 1], inner_stride = v.strides[rank - 1];
  const std::int64_t rows = n / inner;
  std::vector<std::int64_t> index(rank, 0);
  std::int64_t base = v.offset;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (inner_stride == 1)
      run(base * es, static_cast<std::size_t>(inner * es));
    else
      for (std::int64_t i = 0; i < inner; ++i)
        run((base + i * inner_stride) * es, element_size);
    for (std::size_t d = rank - 1; d-- > 0;) {
      // A dim of one element never moves: its stride is not bounded by the
      // view's span (a peer's plan may carry any), so it is never added.
      if (v.shape[d] == 1)
        continue;
      base += v.strides[d];
      if (++index[d] < v.shape[d])
        break;
      base -= v.strides[d] * v.shape[d];
      index[d] = 0;
    }
  }
}

/// The bytes of each run for_each_run calls back with (0 for an empty view):
/// what one copy of a gather from where `v` lies moves at most.
std::size_t run_bytes(const strided& v, std::size_t element_size);

/// Packs the elements of `v` (row-major order) from `source` into `packed`.
void gather(const strided& v, const void* source, std::size_t element_size, void* packed);

} // namespace rlsync::plan
