#pragma once
// What moves for one group (DESIGN §5), shared by producers and consumers of
// every backend:
//   sharded    a worker's plan entries of the group, replayed from the full
//              tensors and packed back to back in plan order: exactly the
//              bytes that worker keeps (pack_group); the engine applies them
//              entry by entry (apply_group).
//   broadcast  the group's full tensors back to back, each aligned to its
//              element size (full_group_layout); the engine slices them
//              itself with its loader.
#include "runtime/engine/plan.hpp"
#include "runtime/model_config.hpp"
#include "runtime/safetensors.hpp"
#include "runtime/transfer/weight_source.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace rlsync::transfer {

/// A worker's sharding plan (recorded by the engine with engine::make_plan)
/// split by parameter group, plan order kept within each group.
class grouped_plan {
public:
  /// Throws std::invalid_argument for an entry whose source is in no group.
  grouped_plan(const model_config& c, std::shared_ptr<const engine::plan> p);

  const engine::plan& plan() const { return *plan_; }
  int tp() const { return plan_->tp; }
  int worker() const { return plan_->worker; }
  std::uint32_t group_count() const { return static_cast<std::uint32_t>(entries_.size()); }
  /// Entries of group `g`, in plan order (empty for g out of range).
  const std::vector<const engine::plan_entry*>& entries(std::uint32_t g) const;
  /// Packed bytes of group `g`.
  std::uint64_t bytes(std::uint32_t g) const;
  /// Every group: engine::bytes_per_worker(plan()).
  std::uint64_t total_bytes() const { return total_; }

private:
  std::shared_ptr<const engine::plan> plan_;
  std::vector<std::vector<const engine::plan_entry*>> entries_;
  std::vector<std::uint64_t> bytes_;
  std::uint64_t total_ = 0;
};

/// Producer, sharded: replays group `g`'s entries on `s`'s full tensors into
/// `out` (p.bytes(g) bytes). Throws std::invalid_argument naming the tensor
/// when `s` does not hold it or holds it with another dtype or shape than
/// the plan recorded.
void pack_group(const grouped_plan& p, std::uint32_t g, const weight_snapshot& s, std::uint8_t* out);

/// Engine, sharded: stores the packed bytes of group `g` into `dst`
/// (engine::apply_packed for each entry, in plan order). Throws
/// std::invalid_argument when `size` is not p.bytes(g).
void apply_group(const grouped_plan& p, std::uint32_t g, const std::uint8_t* bytes, std::size_t size,
                 engine::worker_weights& dst);

/// Broadcast: where each full tensor of a group lies in its buffer.
struct full_group_layout {
  std::vector<tensor_spec> specs;
  std::vector<std::uint64_t> offsets;
  std::uint64_t bytes = 0;

  static full_group_layout of(const std::vector<tensor_view>& tensors);
};

/// Producer, broadcast: copies `tensors` into `out` as `layout` says.
void pack_full_group(const std::vector<tensor_view>& tensors, const full_group_layout& layout, std::uint8_t* out);
/// Consumer, broadcast: views of the tensors in a received buffer.
std::vector<tensor_view> view_full_group(const full_group_layout& layout, const std::uint8_t* bytes);

} // namespace rlsync::transfer
