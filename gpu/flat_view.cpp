#include "gpu/flat_view.hpp"

#include "runtime/base/checked.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace rlsync::gpu {

flat_view flatten(const plan::strided& v, std::int64_t source_numel) {
  const std::size_t dims = v.shape.size();
  if (dims > static_cast<std::size_t>(max_view_dims))
    throw std::invalid_argument("a view of " + std::to_string(dims) + " dims; the device replay takes at most "
                                + std::to_string(max_view_dims));
  if (v.strides.size() != dims)
    throw std::invalid_argument("a view with " + std::to_string(dims) + " extents but "
                                + std::to_string(v.strides.size()) + " strides");
  flat_view out;
  out.ndim = static_cast<std::int32_t>(dims);
  out.offset = v.offset;
  std::int64_t numel = 1, last = v.offset; // `last`: the largest source index the view reaches
  for (std::size_t d = 0; d < dims; ++d) {
    if (v.shape[d] < 0 || v.strides[d] < 0)
      throw std::invalid_argument("dim " + std::to_string(d) + " has extent " + std::to_string(v.shape[d])
                                  + " and stride " + std::to_string(v.strides[d]) + "; both must be >= 0");
    out.shape[d] = v.shape[d];
    out.strides[d] = v.strides[d];
    auto n = checked_mul(numel, v.shape[d]);
    if (!n)
      throw std::invalid_argument("the view's element count overflows 64 bits");
    numel = *n;
    if (v.shape[d] > 0) {
      auto reach = checked_mul(v.shape[d] - 1, v.strides[d]);
      auto sum = reach ? checked_add(last, *reach) : std::nullopt;
      if (!sum)
        throw std::invalid_argument("the view's extent overflows 64 bits");
      last = *sum;
    }
  }
  out.numel = numel;
  if (numel > 0 && (v.offset < 0 || last >= source_numel))
    throw std::invalid_argument("the view reaches source elements [" + std::to_string(v.offset) + ", "
                                + std::to_string(last) + "] of a tensor of " + std::to_string(source_numel));
  return out;
}

bool one_to_one(const flat_view& v) {
  std::vector<std::int64_t> order; // the dims that move, by stride
  for (int d = 0; d < v.ndim; ++d)
    if (v.shape[d] > 1)
      order.push_back(d);
  std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return v.strides[a] < v.strides[b]; });
  std::int64_t span = 1; // elements the dims so far cover, in strides of the smallest
  for (const std::int64_t d : order) {
    if (v.strides[d] < span)
      return false;
    span = v.strides[d] * v.shape[d]; // no overflow: flatten() checked the reach
  }
  return true;
}

void gather_host(const flat_view& v, const void* source, std::size_t element_size, void* packed) {
  const auto* src = static_cast<const unsigned char*>(source);
  auto* dst = static_cast<unsigned char*>(packed);
  for (std::int64_t i = 0; i < v.numel; ++i)
    std::memcpy(dst + static_cast<std::size_t>(i) * element_size,
                src + static_cast<std::size_t>(source_index(v, i)) * element_size, element_size);
}

void scatter_host(const flat_view& v, const void* packed, std::size_t element_size, void* target) {
  if (!one_to_one(v))
    throw std::invalid_argument("scatter into a view whose elements overlap (a stride of 0, or dims that interleave)");
  const auto* src = static_cast<const unsigned char*>(packed);
  auto* dst = static_cast<unsigned char*>(target);
  for (std::int64_t i = 0; i < v.numel; ++i)
    std::memcpy(dst + static_cast<std::size_t>(source_index(v, i)) * element_size,
                src + static_cast<std::size_t>(i) * element_size, element_size);
}

} // namespace rlsync::gpu
