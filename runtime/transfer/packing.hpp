#pragma once
// The producer's side of a group: the bytes it packs for a worker (sharded:
// its plan entries replayed from the full tensors; broadcast: the full
// tensors laid out as plan::full_group_layout says). Every backend's
// producer packs through these.
#include "runtime/plan/grouped_plan.hpp"
#include "runtime/transfer/weight_source.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rlsync::transfer {

/// Producer, sharded: replays group `g`'s entries on `s`'s full tensors into
/// `out` (p.bytes(g) bytes). Throws std::invalid_argument naming the tensor
/// when `s` does not hold it or holds it with another dtype or shape than
/// the plan recorded.
void pack_group(const plan::grouped_plan& p, std::uint32_t g, const weight_snapshot& s, std::uint8_t* out);

/// Producer, broadcast: copies `tensors` into `out` as `layout` says.
void pack_full_group(const std::vector<tensor_view>& tensors, const plan::full_group_layout& layout, std::uint8_t* out);

/// Bytes packed between two checksum updates: small enough that a piece is
/// still in the core's cache when it is hashed right after being written.
inline constexpr std::size_t checksum_piece_bytes = std::size_t(256) << 10;

/// As pack_group, and returns checksum64 of the `p.bytes(g)` bytes written,
/// folded into the same pass: each piece of at most about
/// checksum_piece_bytes is hashed right after it is written, while it is
/// still in cache, instead of a second pass over the whole group.
std::uint64_t pack_group_checksummed(const plan::grouped_plan& p, std::uint32_t g, const weight_snapshot& s,
                                     std::uint8_t* out);
/// As pack_full_group, with the checksum of the layout's bytes folded in.
std::uint64_t pack_full_group_checksummed(const std::vector<tensor_view>& tensors,
                                          const plan::full_group_layout& layout, std::uint8_t* out);
} // namespace rlsync::transfer
