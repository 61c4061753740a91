#pragma once
// What moves for one group, as both ends see it:
//   sharded    a worker's plan entries of the group, in plan order: packed
//              back to back by the producer, applied entry by entry by the
//              engine (grouped_plan says which entries and how many bytes);
//   broadcast  the group's full tensors back to back, each aligned to its
//              element size (full_group_layout); the engine slices them
//              itself with its loader.
#include "runtime/base/tensor.hpp"
#include "runtime/config/model_config.hpp"
#include "runtime/plan/plan.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

namespace rlsync::plan {

/// A worker's sharding plan (recorded by the engine)
/// split by parameter group, plan order kept within each group.
class grouped_plan {
public:
  /// Throws std::invalid_argument for an entry whose source is in no group.
  grouped_plan(const model_config& c, std::shared_ptr<const worker_plan> p);

  const worker_plan& plan() const { return *plan_; }
  int tp() const { return plan_->tp; }
  int worker() const { return plan_->worker; }
  std::uint32_t group_count() const { return static_cast<std::uint32_t>(entries_.size()); }
  /// Entries of group `g`, in plan order (empty for g out of range).
  const std::vector<const plan_entry*>& entries(std::uint32_t g) const;
  /// Packed bytes of group `g`.
  std::uint64_t bytes(std::uint32_t g) const;
  /// Every group: bytes_per_worker(plan()).
  std::uint64_t total_bytes() const { return total_; }
  /// The shortest run (run_bytes) any entry of group `g` reads from where
  /// its source lies; the most a uint64 holds for a group with none.
  std::uint64_t shortest_run_bytes(std::uint32_t g) const;
  /// ... of any group: computed once, as a plan is asked at every open.
  std::uint64_t shortest_run_bytes() const { return shortest_run_; }

private:
  std::shared_ptr<const worker_plan> plan_;
  std::vector<std::vector<const plan_entry*>> entries_;
  std::vector<std::uint64_t> bytes_;
  std::vector<std::uint64_t> shortest_runs_;
  std::uint64_t total_ = 0;
  std::uint64_t shortest_run_ = std::numeric_limits<std::uint64_t>::max();
};

/// Broadcast: where each full tensor of a group lies in its buffer.
struct full_group_layout {
  std::vector<tensor_spec> specs;
  std::vector<std::uint64_t> offsets;
  std::uint64_t bytes = 0;

  static full_group_layout of(const std::vector<tensor_view>& tensors);
};

/// Consumer, broadcast: views of the tensors in a received buffer.
std::vector<tensor_view> view_full_group(const full_group_layout& layout, const std::uint8_t* bytes);

} // namespace rlsync::plan
