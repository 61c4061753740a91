#include "runtime/engine/apply_packed.hpp"
#include "runtime/engine/weight_view.hpp"

#include <stdexcept>
#include <string>

namespace rlsync::engine {

void apply_packed(const plan::plan_entry& e, const void* packed, dtype type, worker_weights& dst) {
  store_packed(packed, type, e.numel(), dst.at(e.param), e.dst_offset);
}


std::vector<byte_range> group_destinations(const plan::grouped_plan& p, std::uint32_t g, worker_weights& dst) {
  std::vector<byte_range> out;
  for (const auto* e : p.entries(g)) {
    parameter* param = const_cast<parameter*>(dst.find(e->param));
    if (!param || param->type != e->source_type || e->dst_offset < 0 || e->numel() < 0
        || e->dst_offset + e->numel() > param->numel()
        || param->bytes.size() != static_cast<std::size_t>(param->numel()) * dtype_size(param->type))
      return {};
    out.push_back({param->bytes.data() + static_cast<std::size_t>(e->dst_offset) * dtype_size(param->type),
                   static_cast<std::size_t>(e->bytes())});
  }
  return out;
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
