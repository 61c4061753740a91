#include "runtime/plan/groups.hpp"

#include "runtime/base/checked.hpp"

#include <algorithm>
#include <stdexcept>

namespace rlsync::plan {

std::uint32_t group_count(const model_config& c) {
  return c.num_hidden_layers > 0 ? static_cast<std::uint32_t>(c.num_hidden_layers) : 0;
}

std::uint32_t group_of(const model_config& c, const std::string& name) {
  const std::uint32_t L = group_count(c);
  if (L == 0)
    throw std::invalid_argument("parameter groups: '" + name + "': the model has no layers");
  if (name == "model.embed_tokens.weight")
    return 0;
  if (name == "model.norm.weight" || name == "lm_head.weight")
    return L - 1;
  static const std::string prefix = "model.layers.";
  if (name.compare(0, prefix.size(), prefix) == 0) {
    std::size_t i = prefix.size();
    std::uint64_t layer = 0;
    std::size_t digits = 0;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 10) {
      layer = layer * 10 + static_cast<std::uint64_t>(name[i++] - '0');
      ++digits;
    }
    // "model.layers.N." followed by at least one character; no leading zeros.
    const bool well_formed = digits > 0 && i + 1 < name.size() && name[i] == '.'
                             && !(digits > 1 && name[prefix.size()] == '0');
    if (well_formed && layer < L)
      return static_cast<std::uint32_t>(layer);
    if (well_formed)
      throw std::invalid_argument("parameter groups: '" + name + "': layer " + std::to_string(layer)
                                  + " beyond the model's " + std::to_string(L) + " layers");
  }
  throw std::invalid_argument("parameter groups: '" + name + "': not a parameter of a Llama model");
}

std::vector<tensor_spec> group_members(const model_config& c, const std::vector<tensor_spec>& specs,
                                       std::uint32_t g) {
  if (g >= group_count(c))
    throw std::out_of_range("parameter groups: group " + std::to_string(g) + " of a model with "
                            + std::to_string(group_count(c)) + " groups");
  std::vector<tensor_spec> out;
  for (const auto& s : specs)
    if (group_of(c, s.name) == g)
      out.push_back(s);
  return out;
}

std::optional<std::int64_t> expert_of(const std::string& name) {
  static const std::string marker = ".mlp.experts.";
  if (name.compare(0, 13, "model.layers.") != 0)
    return std::nullopt;
  const auto at = name.find(marker);
  if (at == std::string::npos)
    return std::nullopt;
  std::size_t i = at + marker.size(), digits = 0;
  std::int64_t e = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 9) {
    e = e * 10 + (name[i++] - '0');
    ++digits;
  }
  if (digits == 0 || i >= name.size() || name[i] != '.')
    return std::nullopt; // "mlp.experts.gate_up_proj": fused, every expert
  return e;
}

std::vector<std::uint32_t> groups_of_layers(const model_config& c, const std::vector<std::int64_t>& layers) {
  std::vector<std::uint32_t> out;
  for (auto l : layers) {
    if (l < 0 || l >= c.num_hidden_layers)
      throw std::out_of_range("parameter groups: layer " + std::to_string(l) + " outside the model's "
                              + std::to_string(c.num_hidden_layers) + " layers");
    out.push_back(static_cast<std::uint32_t>(l));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::uint64_t largest_group_bytes(const model_config& c, const std::vector<tensor_spec>& specs, dtype element) {
  std::vector<std::uint64_t> group_bytes(group_count(c), 0);
  for (const auto& spec : specs) {
    const auto bytes = checked_mul(static_cast<std::uint64_t>(spec.numel()), static_cast<std::uint64_t>(dtype_size(element)));
    auto& sum = group_bytes[group_of(c, spec.name)];
    const auto grown = bytes ? checked_add(sum, *bytes) : std::nullopt;
    if (!grown)
      throw std::overflow_error("parameter groups: the group of '" + spec.name + "' holds more than 2^64 bytes");
    sum = *grown;
  }
  return group_bytes.empty() ? 0 : *std::max_element(group_bytes.begin(), group_bytes.end());
}

} // namespace rlsync::plan
