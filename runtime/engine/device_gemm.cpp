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

std::optional<matrix_index::location> matrix_index::find(const void* address) const {
  const auto* p = static_cast<const unsigned char*>(address);
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), p,
                             [](const unsigned char* q, const range& r) { return q < r.begin; });
  if (it != ranges_.begin()) {
    const range& r = *std::prev(it);
    if (p < r.end && (p - r.begin) % static_cast<std::ptrdiff_t>(r.element_size) == 0)
      return location{r.matrix, (p - r.begin) / static_cast<std::ptrdiff_t>(r.element_size)};
  }
  return std::nullopt;
}

matrix_index::location matrix_index::locate(const void* address) const {
  if (auto at = find(address))
    return *at;
  std::ostringstream why;
  why << "engine device: " << address << " is inside no mirrored matrix";
  throw std::logic_error(why.str());
}

device_landing::device_landing(const weight_set& w)
  : matrices_(matrices_of(w)), index_(matrices_), runs_(matrices_.size()) {
  if (w.processed)
    throw std::logic_error("engine device: a landing for a processed set (its matrices are the int8 form)");
}

bool device_landing::land(const std::uint8_t* host_at, const void* source, std::size_t bytes, int device) {
  const auto at = index_.find(host_at);
  if (!at || bytes == 0)
    return false;
  const auto& m = matrices_[at->matrix];
  const auto element = m.element_size();
  const auto elements = static_cast<std::uint64_t>(m.rows) * static_cast<std::uint64_t>(m.cols);
  const auto count = bytes / element;
  if (bytes % element != 0 || count > elements - static_cast<std::uint64_t>(at->element)) // whole elements, inside
    return false;
  if (!reads(device)) // before the lock: refusing waits for nobody's copy
    return false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_ || !copy_run(at->matrix, at->element, static_cast<std::int64_t>(count), source, device))
    return false;
  runs_[at->matrix].emplace_back(at->element, static_cast<std::int64_t>(count));
  return true;
}

bool device_landing::accepts(int device) const {
  if (!reads(device))
    return false;
  std::lock_guard<std::mutex> lock(mutex_);
  return !closed_;
}

void device_landing::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_)
    return;
  closed_ = true;
  for (auto& r : runs_)
    r.clear();
  release();
}

bool device_landing::complete(std::size_t m) const {
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_)
      return false;
    runs = runs_.at(m);
  }
  std::sort(runs.begin(), runs.end());
  std::int64_t next = 0; // the first element no run has covered yet
  for (const auto& [first, count] : runs) {
    if (first != next)
      return false; // a gap, or an overlap with the run before
    next += count;
  }
  return next == matrices_[m].rows * matrices_[m].cols;
}

bool matrix_landed(const weight_set& w, const std::vector<matrix_ref>& matrices, std::size_t m) {
  if (!w.landed || w.processed)
    return false;
  const auto& then = w.landed->matrices();
  if (then.size() != matrices.size() || m >= matrices.size())
    return false;
  const auto& a = then[m].ref;
  const auto& b = matrices[m].ref;
  return a.data == b.data && a.type == b.type && !a.int8() && !b.int8() && then[m].rows == matrices[m].rows
         && then[m].cols == matrices[m].cols && w.landed->complete(m);
}

} // namespace rlsync::engine
