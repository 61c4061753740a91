#pragma once
// The tensor vocabulary every layer shares: a tensor's name, element type
// and shape (tensor_spec), where its bytes are (tensor_view), and the shape
// arithmetic on them. No I/O: checkpoint/ reads and writes files of these.
#include "runtime/base/dtype.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rlsync {

/// Product of the dimensions (1 for a scalar). Assumes it fits: every
/// shape that reaches here was checked where it was read.
std::int64_t numel(const std::vector<std::int64_t>& shape);

/// "[2, 3]"
std::string shape_string(const std::vector<std::int64_t>& shape);

/// A tensor's name, element type and shape; no data.
struct tensor_spec {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::int64_t> shape; // empty: a scalar (one element)

  /// Product of the dimensions (1 for a scalar). Assumes it fits, which the
  /// reader and writer check.
  std::int64_t numel() const { return rlsync::numel(shape); }
  std::uint64_t bytes() const { return static_cast<std::uint64_t>(numel()) * dtype_size(type); }
};

/// A tensor and where its bytes are: in a mapped file or a buffer.
struct tensor_view : tensor_spec {
  const std::byte* data = nullptr; // into the mapped file or caller's buffer
  std::size_t size = 0;            // bytes; equals bytes()
  std::uint64_t offset = 0;        // data_offsets[0], relative to the data section
};

} // namespace rlsync
