#pragma once
// Parameter groups: the unit the data plane moves, packs,
// checksums and pipelines. A group is one transformer block:
//   group g in [0, L)  model.layers.g.*
//   group 0            also model.embed_tokens.weight
//   group L-1          also model.norm.weight and lm_head.weight
// so that a trainer rank holding a pipeline stage holds whole groups (the
// first stage has the embeddings, the last the head). Pure functions.
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/config/model_config.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rlsync::plan {

/// Number of groups: the model's layers (L).
std::uint32_t group_count(const model_config& c);

/// The group of checkpoint tensor `name`. Throws std::invalid_argument
/// naming it for anything else than model.layers.N.* (N < L),
/// model.embed_tokens.weight, model.norm.weight and lm_head.weight.
std::uint32_t group_of(const model_config& c, const std::string& name);

/// The members of `specs` in group `g`, in their order in `specs`.
/// Throws what group_of throws, and std::out_of_range for g >= L.
std::vector<tensor_spec> group_members(const model_config& c, const std::vector<tensor_spec>& specs,
                                       std::uint32_t g);

/// The expert whose tensor `name` is (model.layers.N.mlp.experts.E.*, the
/// separate layout); nullopt for every other name, fused expert tensors
/// included (they hold every expert of their layer).
std::optional<std::int64_t> expert_of(const std::string& name);

/// The bytes of the largest group of `specs` with every element `element`
/// wide (f32 bounds any checkpoint's dtype): what a whole-group transfer
/// may carry at most. 0 for a model without layers. Throws what group_of
/// throws, and std::overflow_error for sizes that do not fit 64 bits.
std::uint64_t largest_group_bytes(const model_config& c, const std::vector<tensor_spec>& specs, dtype element);

/// The groups a trainer rank holding pipeline layers `layers` holds: layer l
/// is group l. Sorted, duplicates removed; throws std::out_of_range for a
/// layer outside [0, L).
std::vector<std::uint32_t> groups_of_layers(const model_config& c, const std::vector<std::int64_t>& layers);

} // namespace rlsync::plan
