#pragma once
// The receiving side's one pass: a group's packed bytes copied straight to
// where the engine keeps them (its staging weights, in the dtype they were
// sent), each piece checksummed right after it lands, while it is still in
// cache. It replaces three passes (copy into a receive slot, checksum it,
// copy it into staging) wherever the engine stores what it is sent.
#include "runtime/transfer/packing.hpp"
#include "runtime/transfer/puller.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rlsync::transfer {

/// Bytes checksummed at a time: small enough to still be in L2 when read back.
inline constexpr std::size_t store_piece_bytes = std::size_t(64) << 10;

/// The sink's targets for group `group` of `worker`: empty when it offers
/// none (it takes the packed bytes through on_group). Throws
/// std::invalid_argument when they do not add up to `size`, the group's
/// packed bytes.
std::vector<store_target> group_targets(const group_sink& sink, int worker, std::uint32_t group, std::size_t size);

/// Where group `group`'s runs land on the engine's device (on_device): its
/// store targets, else its land_targets; empty when it lands nothing.
/// Throws as group_targets.
std::vector<store_target> landing_targets(const group_sink& sink, int worker, std::uint32_t group, std::size_t size);

/// Copies `packed` into `targets` in order and returns the checksum64 of the
/// bytes as they landed (equal to checksum64 over `packed` when nothing went
/// wrong). With `corrupt`, one landed byte is flipped before it is
/// checksummed (the drill).
std::uint64_t store_group(const std::uint8_t* packed, const std::vector<store_target>& targets, bool corrupt = false);

/// A group lent in place (ucx_transfer.hpp): the pieces of the producer's
/// version memory (`memory_bytes` at `memory`, mapped) that the consumer
/// gathers, in packed order, from the group's `tensors` that lie at
/// `offsets` there: with `whole` (broadcast) each tensor whole, else the
/// entries of plan `p` whose sources are among them. The placement is the
/// producer's word, so it is checked: std::invalid_argument, saying what is
/// wrong, for a tensor not inside the memory, named twice, of another dtype
/// or shape than the plan was recorded for, or pieces that do not add up to
/// `announced` bytes.
std::vector<source_piece> lent_pieces(const plan::worker_plan& p, const std::vector<tensor_spec>& tensors,
                                      const std::vector<std::uint64_t>& offsets, const std::uint8_t* memory,
                                      std::size_t memory_bytes, bool whole, std::uint64_t announced);

/// As store_group, gathering the packed bytes from `pieces` (a group lent in
/// place: read straight from the producer's version memory; store_group is
/// the case of one piece). Throws std::invalid_argument when the pieces and
/// the targets differ in total.
std::uint64_t store_pieces(const std::vector<source_piece>& pieces, const std::vector<store_target>& targets,
                           bool corrupt = false);

/// Broadcast: the pieces plan `p` keeps of a group whose full tensors are
/// `views` (where they lie), in packed order: the entries whose sources are
/// among them. Throws std::invalid_argument for a view of another dtype or
/// shape than the plan was recorded for.
std::vector<source_piece> kept_pieces(const plan::worker_plan& p, const std::vector<tensor_view>& views);

/// Broadcast into a sink that stores in place: its targets for group
/// `group` of `worker`, and in `kept` the pieces of `views` (the group's
/// full tensors where they lie) that plan `p` keeps (kept_pieces). Empty,
/// `kept` untouched, when the sink stores nothing in place (no targets, or
/// none for this group: an engine that converts). Throws
/// std::invalid_argument as kept_pieces, or when the tensors sent give
/// other than the bytes the targets take (a tensor missing from the group).
std::vector<store_target> broadcast_targets(const group_sink& sink, const plan::worker_plan& p, int worker,
                                            std::uint32_t group, const std::vector<tensor_view>& views,
                                            std::vector<source_piece>& kept);

/// Broadcast in one pass: returns the checksum64 of `whole` (the group's
/// bytes as sent, back to back) while copying the pieces the worker keeps,
/// `kept` (in packed order; a piece may run across tensors lying back to
/// back), into `targets` from the window just checksummed, still in cache.
/// Throws std::invalid_argument when `kept` and `targets` differ in total
/// or a kept byte lies in no piece of `whole`. With `corrupt`, the
/// checksum sees one byte flipped (the drill); what is stored is not.
std::uint64_t store_kept(const std::vector<source_piece>& whole, const std::vector<source_piece>& kept,
                         const std::vector<store_target>& targets, bool corrupt = false);

} // namespace rlsync::transfer
