#include "runtime/engine/device_gemm.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace rlsync::engine {

std::vector<matrix_ref> matrices_of(const weight_set& w) {
  std::vector<matrix_ref> out;
  for (std::size_t k = 0; k < w.workers.size(); ++k)
    for (const auto& p : w.workers[k].params())
      if (p.shape.size() == 2 && p.numel() > 0)
        out.push_back({p.ref(), p.shape[0], p.shape[1], std::to_string(k) + "/" + p.name});
  return out;
}

matrix_index::matrix_index(const std::vector<matrix_ref>& matrices) {
  ranges_.reserve(matrices.size());
  for (std::size_t i = 0; i < matrices.size(); ++i) {
    const auto* begin = static_cast<const unsigned char*>(matrices[i].ref.data);
    ranges_.push_back({begin, begin + matrices[i].bytes(), matrices[i].element_size(), i});
  }
  std::sort(ranges_.begin(), ranges_.end(), [](const range& a, const range& b) { return a.begin < b.begin; });
  for (std::size_t i = 1; i < ranges_.size(); ++i)
    if (ranges_[i].begin < ranges_[i - 1].end)
      throw std::logic_error("matrix index: two matrices overlap");
}

matrix_index::location matrix_index::locate(const void* address) const {
  const auto* p = static_cast<const unsigned char*>(address);
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), p,
                             [](const unsigned char* q, const range& r) { return q < r.begin; });
  if (it != ranges_.begin()) {
    const range& r = *std::prev(it);
    if (p < r.end && (p - r.begin) % static_cast<std::ptrdiff_t>(r.element_size) == 0)
      return {r.matrix, (p - r.begin) / static_cast<std::ptrdiff_t>(r.element_size)};
  }
  std::ostringstream why;
  why << "engine device: " << address << " is inside no mirrored matrix";
  throw std::logic_error(why.str());
}

} // namespace rlsync::engine
