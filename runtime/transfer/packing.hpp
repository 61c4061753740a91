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

/// Bytes a group's packed order reads from one place: where a version's
/// memory can be read by its consumers (a shareable snapshot, lent in place:
/// ucx_transfer.hpp), the pieces stand for the packed group, which is never
/// written.
struct source_piece {
  const std::uint8_t* at = nullptr;
  std::size_t bytes = 0;
};

/// Appends the pieces entry `e` packs from its source tensor, whose bytes
/// start at `tensor`, in packed order (runs that continue one another
/// merged): plan::gather over them writes e.bytes() bytes.
void append_entry_pieces(const plan::plan_entry& e, const std::uint8_t* tensor, std::vector<source_piece>& out);

/// The shortest run worth gathering from where a version lies: a group with
/// shorter ones (a transposed slice reads one element per run) is cheaper
/// packed once by plan::gather than copied run by run by every consumer.
inline constexpr std::size_t min_lent_run_bytes = 64;

/// Whether every entry of group `g` reads runs of at least
/// min_lent_run_bytes (plan::run_bytes), without listing them.
bool lends_in_runs(const plan::grouped_plan& p, std::uint32_t g);
/// ... for every group of `p`: a consumer may gather the whole plan from
/// where a version lies (UCX lends a session in place only then).
bool lends_in_runs(const plan::grouped_plan& p);

/// Producer, sharded: group `g`'s packed bytes as pieces of `s`'s memory.
/// Throws as pack_group.
std::vector<source_piece> group_pieces(const plan::grouped_plan& p, std::uint32_t g, const weight_snapshot& s);

/// Broadcast, lent in place: the group's full tensors as they lie in `s`'s
/// memory, one piece each, in group order (no alignment padding between).
std::vector<source_piece> full_group_pieces(const weight_snapshot& s, std::uint32_t g);

/// The bytes of `source`'s largest full group as broadcast lays it out
/// (plan::full_group_layout, alignment included): what a buffer must hold
/// to pack any full group. 0 without parameters.
std::uint64_t largest_full_group_bytes(const weight_source& source);

/// checksum64 of the pieces back to back, read only: for a group it equals
/// what packing it checksummed would return.
std::uint64_t checksum_pieces(const std::vector<source_piece>& pieces);
} // namespace rlsync::transfer
