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
/// Packs the elements of `v` (row-major order) from `source` into `packed`.
void gather(const strided& v, const void* source, std::size_t element_size, void* packed);

} // namespace rlsync::plan
