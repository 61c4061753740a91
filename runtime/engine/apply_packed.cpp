#include "runtime/engine/apply_packed.hpp"
#include "runtime/engine/weight_view.hpp"

#include <stdexcept>
#include <string>

namespace rlsync::engine {

void apply_packed(const plan::plan_entry& e, const void* packed, dtype type, worker_weights& dst) {
  store_packed(packed, type, e.numel(), dst.at(e.param), e.dst_offset);
}


void apply_group(const plan::grouped_plan& p, std::uint32_t g, const std::uint8_t* bytes, std::size_t size,
                 worker_weights& dst) {
  if (size != p.bytes(g))
    throw std::invalid_argument("apply group " + std::to_string(g) + " to worker " + std::to_string(p.worker())
                                + ": " + std::to_string(size) + " bytes, its plan packs "
                                + std::to_string(p.bytes(g)));
  for (const auto* e : p.entries(g)) {
    apply_packed(*e, bytes, e->source_type, dst);
    bytes += e->bytes();
  }
}

} // namespace rlsync::engine
