#include "runtime/base/tensor.hpp"

#include <algorithm>

namespace rlsync {

std::int64_t numel(const std::vector<std::int64_t>& shape) {
  // A zero dimension first: the other dimensions of an empty tensor need
  // not have a product that fits ([2^32, 2^32, 0] is a valid empty shape).
  if (std::find(shape.begin(), shape.end(), 0) != shape.end())
    return 0;
  std::int64_t n = 1;
  for (auto d : shape)
    n *= d;
  return n;
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

} // namespace rlsync
