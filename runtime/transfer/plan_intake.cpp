#include "runtime/transfer/plan_intake.hpp"

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/transfer/ucx/ucx_wire.hpp"

#include <algorithm>

namespace rlsync::transfer {

plan_intake::plan_intake(const weight_source& source) : config_(source.config()) {
  for (const auto& p : llama_parameter_specs(config_, dtype::f32))
    model_shapes_[p.name] = p.shape;
  full_group_bytes_.assign(plan::group_count(config_), 0);
  for (const auto& p : source.parameters()) {
    params_by_name_[p.name] = p;
    full_group_bytes_[plan::group_of(config_, p.name)] += p.bytes();
  }
}

std::shared_ptr<const plan::grouped_plan> plan_intake::accept(const std::uint8_t* data, std::size_t size) const {
  std::shared_ptr<const plan::grouped_plan> grouped;
  try {
    auto p = std::make_shared<const plan::worker_plan>(ucx_wire::decode_plan(data, size));
    check_against_model(*p);
    grouped = std::make_shared<const plan::grouped_plan>(config_, std::move(p));
  } catch (const ucx_wire::wire_error& e) {
    throw refusal(true, std::string("malformed plan: ") + e.what());
  } catch (const std::exception& e) {
    throw refusal(false, std::string("the plan does not fit this producer's model: ") + e.what());
  }
  for (std::uint32_t g = 0; g < grouped->group_count() && g < full_group_bytes_.size(); ++g)
    if (grouped->bytes(g) > 4 * std::max<std::uint64_t>(full_group_bytes_[g], 1))
      throw refusal(false, "the plan does not fit this producer's model: it packs " + std::to_string(grouped->bytes(g))
                             + " bytes for group " + std::to_string(g) + ", more than 4x the group's "
                             + std::to_string(full_group_bytes_[g]));
  return grouped;
}

void plan_intake::check_against_model(const plan::worker_plan& p) const {
  for (std::size_t i = 0; i < p.entries.size(); ++i) {
    const auto& e = p.entries[i];
    auto shape = model_shapes_.find(e.source);
    if (shape == model_shapes_.end())
      throw std::invalid_argument("plan entry " + std::to_string(i) + ": '" + e.source
                                  + "' is no parameter of the model");
    if (shape->second != e.source_shape)
      throw std::invalid_argument("plan entry " + std::to_string(i) + ": tensor '" + e.source + "' is "
                                  + shape_string(shape->second) + ", the plan was recorded for "
                                  + shape_string(e.source_shape));
    auto it = params_by_name_.find(e.source);
    if (it == params_by_name_.end())
      continue; // another rank's
    if (it->second.type != e.source_type || it->second.shape != e.source_shape)
      throw std::invalid_argument("plan entry " + std::to_string(i) + ": tensor '" + e.source + "' is "
                                  + std::string(safetensors_name(it->second.type)) + " "
                                  + shape_string(it->second.shape) + ", the plan was recorded for "
                                  + std::string(safetensors_name(e.source_type)) + " "
                                  + shape_string(e.source_shape));
  }
}

} // namespace rlsync::transfer
