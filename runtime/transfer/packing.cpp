#include "runtime/transfer/packing.hpp"

#include <cstring>
#include <stdexcept>

namespace rlsync::transfer {

void pack_group(const plan::grouped_plan& p, std::uint32_t g, const weight_snapshot& s, std::uint8_t* out) {
  for (const auto* e : p.entries(g)) {
    const tensor_view* t = s.find(e->source);
    if (!t)
      throw std::invalid_argument("pack group " + std::to_string(g) + " for worker " + std::to_string(p.worker())
                                  + " of " + std::to_string(p.tp()) + ": version " + std::to_string(s.version())
                                  + " holds no tensor '" + e->source + "'");
    if (t->type != e->source_type || t->shape != e->source_shape)
      throw std::invalid_argument("pack group " + std::to_string(g) + ": tensor '" + e->source + "' is "
                                  + std::string(safetensors_name(t->type)) + " " + shape_string(t->shape)
                                  + ", the plan was recorded for "
                                  + std::string(safetensors_name(e->source_type)) + " "
                                  + shape_string(e->source_shape));
    plan::replay_into(*e, t->data, t->type, out);
    out += e->bytes();
  }
}

void pack_full_group(const std::vector<tensor_view>& tensors, const plan::full_group_layout& layout, std::uint8_t* out) {
  if (tensors.size() != layout.specs.size())
    throw std::invalid_argument("pack full group: layout of " + std::to_string(layout.specs.size()) + " tensors, "
                                + std::to_string(tensors.size()) + " given");
  std::uint64_t end = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].size != layout.specs[i].bytes())
      throw std::invalid_argument("pack full group: tensor '" + tensors[i].name + "' does not fit its layout");
    std::memset(out + end, 0, static_cast<std::size_t>(layout.offsets[i] - end)); // alignment padding
    std::memcpy(out + layout.offsets[i], tensors[i].data, tensors[i].size);
    end = layout.offsets[i] + tensors[i].size;
  }
}

} // namespace rlsync::transfer
