#include "runtime/transfer/store_in_place.hpp"

#include "runtime/base/checked.hpp"
#include "runtime/base/checksum.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/base/dtype.hpp"
#include "runtime/base/tensor.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace rlsync::transfer {

namespace {

std::vector<store_target> checked(std::vector<store_target> out, int worker, std::uint32_t group, std::size_t size) {
  std::size_t total = 0;
  for (const auto& t : out) {
    if (!t.at && t.bytes > 0)
      throw std::invalid_argument("group " + std::to_string(group) + " of worker " + std::to_string(worker)
                                  + ": a null store target");
    total += t.bytes; // each bounded by the worker's staging size: no overflow
  }
  if (!out.empty() && total != size)
    throw std::invalid_argument("group " + std::to_string(group) + " of worker " + std::to_string(worker) + ": "
                                + std::to_string(size) + " packed bytes for targets of " + std::to_string(total));
  return out;
}

} // namespace

std::vector<store_target> group_targets(const group_sink& sink, int worker, std::uint32_t group, std::size_t size) {
  if (!sink.targets || !sink.on_stored)
    return {};
  return checked(sink.targets(worker, group), worker, group, size);
}

std::vector<store_target> landing_targets(const group_sink& sink, int worker, std::uint32_t group, std::size_t size) {
  if (!sink.on_device)
    return {};
  if (auto stored = group_targets(sink, worker, group, size); !stored.empty())
    return stored;
  if (!sink.land_targets)
    return {};
  return checked(sink.land_targets(worker, group), worker, group, size);
}

std::uint64_t store_group(const std::uint8_t* packed, const std::vector<store_target>& targets, bool corrupt) {
  std::size_t size = 0;
  for (const auto& t : targets)
    size += t.bytes; // each bounded by the worker's staging size: no overflow
  return store_pieces({{packed, size}}, targets, corrupt);
}

std::vector<source_piece> lent_pieces(const plan::worker_plan& p, const std::vector<tensor_spec>& tensors,
                                      const std::vector<std::uint64_t>& offsets, const std::uint8_t* memory,
                                      std::size_t memory_bytes, bool whole, std::uint64_t announced) {
  if (offsets.size() != tensors.size())
    throw std::invalid_argument("with " + std::to_string(offsets.size()) + " offsets for " + std::to_string(tensors.size())
                                + " tensors");
  std::unordered_map<std::string, std::size_t> by_name;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    std::optional<std::uint64_t> bytes = dtype_size(t.type);
    for (auto d : t.shape)
      if (d < 0 || !(bytes = checked_mul<std::uint64_t>(*bytes, static_cast<std::uint64_t>(d))))
        throw std::invalid_argument("with tensor '" + printable(t.name) + "' of shape " + shape_string(t.shape));
    if (offsets[i] > memory_bytes || *bytes > memory_bytes - offsets[i])
      throw std::invalid_argument("with tensor '" + printable(t.name) + "' at byte " + std::to_string(offsets[i])
                                  + ", not inside the " + std::to_string(memory_bytes) + " bytes of its memory");
    if (!by_name.emplace(t.name, i).second)
      throw std::invalid_argument("naming tensor '" + printable(t.name) + "' twice");
  }
  std::vector<source_piece> out;
  if (whole) {
    for (std::size_t i = 0; i < tensors.size(); ++i)
      out.push_back({memory + offsets[i], static_cast<std::size_t>(tensors[i].bytes())});
  } else {
    for (const auto& e : p.entries) {
      auto it = by_name.find(e.source);
      if (it == by_name.end())
        continue; // another group's
      const auto& t = tensors[it->second];
      if (t.type != e.source_type || t.shape != e.source_shape)
        throw std::invalid_argument("with tensor '" + printable(t.name) + "' " + std::string(safetensors_name(t.type))
                                    + " " + shape_string(t.shape) + ", the plan was recorded for "
                                    + std::string(safetensors_name(e.source_type)) + " "
                                    + shape_string(e.source_shape));
      append_entry_pieces(e, memory + offsets[it->second], out); // the plan keeps its views inside the tensor
    }
  }
  std::uint64_t total = 0;
  for (const auto& piece : out)
    total += piece.bytes; // each inside the memory, which bounds them
  if (total != announced)
    throw std::invalid_argument("with " + std::to_string(total) + " bytes to gather, " + std::to_string(announced)
                                + " announced");
  return out;
}

std::uint64_t store_pieces(const std::vector<source_piece>& pieces, const std::vector<store_target>& targets,
                           bool corrupt) {
  std::size_t from = 0, to = 0;
  for (const auto& p : pieces)
    from += p.bytes; // each inside a mapping: no overflow
  for (const auto& t : targets)
    to += t.bytes;
  if (from != to)
    throw std::invalid_argument("lent group of " + std::to_string(from) + " bytes for targets of " + std::to_string(to));
  thread_local checksum64_stream sum;
  sum.reset();
  // Two cursors: a copy ends where a piece or a target does. What landed
  // is checksummed a window of store_piece_bytes at a time, while in cache:
  // pieces may be rows of a kilobyte, too short to hash one by one.
  std::size_t pi = 0, po = 0;
  for (const auto& t : targets) {
    for (std::size_t done = 0, hashed = 0; done < t.bytes;) {
      while (pieces[pi].bytes == po) // pieces of 0 bytes, or one used up
        ++pi, po = 0;
      const std::size_t n = std::min({hashed + store_piece_bytes - done, t.bytes - done, pieces[pi].bytes - po});
      std::memcpy(t.at + done, pieces[pi].at + po, n);
      if (corrupt) { // the drill: after landing, before the checksum sees it
        t.at[done] ^= 0x5a;
        corrupt = false;
      }
      done += n;
      po += n;
      if (done - hashed == store_piece_bytes || done == t.bytes) {
        sum.update(t.at + hashed, done - hashed);
        hashed = done;
      }
    }
  }
  return sum.digest();
}

} // namespace rlsync::transfer
