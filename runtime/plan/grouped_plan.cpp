#include "runtime/plan/grouped_plan.hpp"

#include "runtime/plan/groups.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace rlsync::plan {

grouped_plan::grouped_plan(const model_config& c, std::shared_ptr<const worker_plan> p)
    : plan_(std::move(p)), entries_(rlsync::plan::group_count(c)), bytes_(rlsync::plan::group_count(c), 0),
      shortest_runs_(rlsync::plan::group_count(c), std::numeric_limits<std::uint64_t>::max()) {
  if (!plan_)
    throw std::invalid_argument("grouped plan: no plan");
  for (const auto& e : plan_->entries) {
    const std::uint32_t g = group_of(c, e.source);
    entries_[g].push_back(&e);
    const auto n = e.bytes();
    if (n > std::numeric_limits<std::uint64_t>::max() - total_) // bytes_[g] <= total_: both fit
      throw std::invalid_argument("grouped plan: the entries of worker " + std::to_string(plan_->worker)
                                  + " add up to more than 2^64 bytes");
    bytes_[g] += n;
    total_ += n;
    if (e.view.numel() > 0) { // an empty entry reads nothing
      const std::uint64_t run = run_bytes(e.view, dtype_size(e.source_type));
      shortest_runs_[g] = std::min(shortest_runs_[g], run);
      shortest_run_ = std::min(shortest_run_, run);
    }
  }
}

std::uint64_t grouped_plan::shortest_run_bytes(std::uint32_t g) const {
  return g < shortest_runs_.size() ? shortest_runs_[g] : std::numeric_limits<std::uint64_t>::max();
}

const std::vector<const plan_entry*>& grouped_plan::entries(std::uint32_t g) const {
  static const std::vector<const plan_entry*> none;
  return g < entries_.size() ? entries_[g] : none;
}

std::uint64_t grouped_plan::bytes(std::uint32_t g) const {
  return g < bytes_.size() ? bytes_[g] : 0;
}

full_group_layout full_group_layout::of(const std::vector<tensor_view>& tensors) {
  full_group_layout l;
  for (const auto& t : tensors) {
    const std::uint64_t align = dtype_size(t.type);
    l.bytes = (l.bytes + align - 1) / align * align;
    l.specs.push_back(t);
    l.offsets.push_back(l.bytes);
    l.bytes += t.size;
  }
  return l;
}

std::vector<tensor_view> view_full_group(const full_group_layout& layout, const std::uint8_t* bytes) {
  std::vector<tensor_view> out;
  out.reserve(layout.specs.size());
  for (std::size_t i = 0; i < layout.specs.size(); ++i) {
    tensor_view v;
    static_cast<tensor_spec&>(v) = layout.specs[i];
    v.size = static_cast<std::size_t>(v.bytes());
    v.data = reinterpret_cast<const std::byte*>(bytes + layout.offsets[i]);
    v.offset = layout.offsets[i];
    out.push_back(std::move(v));
  }
  return out;
}

} // namespace rlsync::plan
