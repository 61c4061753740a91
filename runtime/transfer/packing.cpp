#include "runtime/transfer/packing.hpp"

#include "runtime/transfer/groups.hpp"

#include <cstring>
#include <stdexcept>

namespace rlsync::transfer {

grouped_plan::grouped_plan(const model_config& c, std::shared_ptr<const engine::plan> p)
    : plan_(std::move(p)), entries_(transfer::group_count(c)), bytes_(transfer::group_count(c), 0) {
  if (!plan_)
    throw std::invalid_argument("grouped plan: no plan");
  for (const auto& e : plan_->entries) {
    const std::uint32_t g = group_of(c, e.source);
    entries_[g].push_back(&e);
    bytes_[g] += e.bytes();
    total_ += e.bytes();
  }
}

const std::vector<const engine::plan_entry*>& grouped_plan::entries(std::uint32_t g) const {
  static const std::vector<const engine::plan_entry*> none;
  return g < entries_.size() ? entries_[g] : none;
}

std::uint64_t grouped_plan::bytes(std::uint32_t g) const {
  return g < bytes_.size() ? bytes_[g] : 0;
}

void pack_group(const grouped_plan& p, std::uint32_t g, const weight_snapshot& s, std::uint8_t* out) {
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
    engine::replay_into(*e, t->data, t->type, out);
    out += e->bytes();
  }
}

void apply_group(const grouped_plan& p, std::uint32_t g, const std::uint8_t* bytes, std::size_t size,
                 engine::worker_weights& dst) {
  if (size != p.bytes(g))
    throw std::invalid_argument("apply group " + std::to_string(g) + " to worker " + std::to_string(p.worker())
                                + ": " + std::to_string(size) + " bytes, its plan packs "
                                + std::to_string(p.bytes(g)));
  for (const auto* e : p.entries(g)) {
    engine::apply_packed(*e, bytes, e->source_type, dst);
    bytes += e->bytes();
  }
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

void pack_full_group(const std::vector<tensor_view>& tensors, const full_group_layout& layout, std::uint8_t* out) {
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

} // namespace rlsync::transfer
