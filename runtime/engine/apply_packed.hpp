#pragma once
// The engine's side of a transfer: packed bytes (a worker's plan entries,
// replayed by the producer) stored into the staging weights, steps 5-7 of
// the weight lifecycle (stage, convert to the stored dtype, store). When the
// engine keeps the dtype it is sent, a group's entries are plain byte ranges
// of its parameters (group_destinations): the data plane copies them there.
#include "runtime/engine/weights.hpp"
#include "runtime/plan/grouped_plan.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rlsync::engine {

/// Engine side, steps 5-7 from packed bytes: converts them to fp32 and stores
/// them in the entry's parameter of `dst` at its offset.
void apply_packed(const plan::plan_entry& e, const void* packed, dtype type, worker_weights& dst);

/// One entry's packed bytes, kept unchanged: where they go in a parameter.
struct byte_range {
  std::uint8_t* at = nullptr;
  std::size_t bytes = 0;
};

/// Where each entry of group `g` lies in `dst`, in plan order, when every one
/// is stored in the dtype it is packed in (a copy, no conversion); empty when
/// any is converted or does not fit its parameter (apply_group then says why).
std::vector<byte_range> group_destinations(const plan::grouped_plan& p, std::uint32_t g, worker_weights& dst);

/// Stores the packed bytes of group `g` into `dst` (apply_packed for each
/// entry, in plan order). Throws std::invalid_argument when `size` is not
/// p.bytes(g).
void apply_group(const plan::grouped_plan& p, std::uint32_t g, const std::uint8_t* bytes, std::size_t size,
                 worker_weights& dst);

} // namespace rlsync::engine
