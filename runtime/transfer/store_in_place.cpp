#include "runtime/transfer/store_in_place.hpp"

#include "runtime/base/checked.hpp"
#include "runtime/base/checksum.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/base/dtype.hpp"
#include "runtime/base/tensor.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace rlsync::transfer {

namespace {

// `out`, refused when a target is null or they do not take `size` bytes
// (`what` they are, for the message).
std::vector<store_target> checked(std::vector<store_target> out, int worker, std::uint32_t group, std::size_t size,
                                  const char* what = "packed bytes") {
  std::size_t total = 0;
  for (const auto& t : out) {
    if (!t.at && t.bytes > 0)
      throw std::invalid_argument("group " + std::to_string(group) + " of worker " + std::to_string(worker)
                                  + ": a null store target");
    total += t.bytes; // each bounded by the worker's staging size: no overflow
  }
  if (!out.empty() && total != size)
    throw std::invalid_argument("group " + std::to_string(group) + " of worker " + std::to_string(worker) + ": "
                                + std::to_string(size) + " " + what + " for targets of " + std::to_string(total));
  return out;
}

// A group's tensors by name: their place in the plan's eyes, and their bytes.
using tensors_by_name = std::unordered_map<std::string, std::pair<const tensor_spec*, const std::uint8_t*>>;

// The pieces plan `p` keeps of the tensors in `by_name`, in packed order.
std::vector<source_piece> pieces_kept(const plan::worker_plan& p, const tensors_by_name& by_name) {
  std::vector<source_piece> out;
  for (const auto& e : p.entries) {
    auto it = by_name.find(e.source);
    if (it == by_name.end())
      continue; // another group's
    const tensor_spec& t = *it->second.first;
    if (t.type != e.source_type || t.shape != e.source_shape)
      throw std::invalid_argument("with tensor '" + printable(t.name) + "' " + std::string(safetensors_name(t.type))
                                  + " " + shape_string(t.shape) + ", the plan was recorded for "
                                  + std::string(safetensors_name(e.source_type)) + " " + shape_string(e.source_shape));
    append_entry_pieces(e, it->second.second, out); // the plan keeps its views inside the tensor
  }
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
  tensors_by_name by_name;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    std::optional<std::uint64_t> bytes = dtype_size(t.type);
    for (auto d : t.shape)
      if (d < 0 || !(bytes = checked_mul<std::uint64_t>(*bytes, static_cast<std::uint64_t>(d))))
        throw std::invalid_argument("with tensor '" + printable(t.name) + "' of shape " + shape_string(t.shape));
    if (offsets[i] > memory_bytes || *bytes > memory_bytes - offsets[i])
      throw std::invalid_argument("with tensor '" + printable(t.name) + "' at byte " + std::to_string(offsets[i])
                                  + ", not inside the " + std::to_string(memory_bytes) + " bytes of its memory");
    if (!by_name.emplace(t.name, std::make_pair(&t, memory + offsets[i])).second)
      throw std::invalid_argument("naming tensor '" + printable(t.name) + "' twice");
  }
  std::vector<source_piece> out;
  if (whole) {
    for (std::size_t i = 0; i < tensors.size(); ++i)
      out.push_back({memory + offsets[i], static_cast<std::size_t>(tensors[i].bytes())});
  } else {
    out = pieces_kept(p, by_name);
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

std::vector<source_piece> kept_pieces(const plan::worker_plan& p, const std::vector<tensor_view>& views) {
  tensors_by_name by_name;
  for (const auto& v : views)
    by_name.emplace(v.name, std::make_pair(&v, reinterpret_cast<const std::uint8_t*>(v.data)));
  return pieces_kept(p, by_name);
}

std::vector<store_target> broadcast_targets(const group_sink& sink, const plan::worker_plan& p, int worker,
                                            std::uint32_t group, const std::vector<tensor_view>& views,
                                            std::vector<source_piece>& kept) {
  if (!sink.targets || !sink.on_stored)
    return {};
  auto targets = sink.targets(worker, group);
  if (targets.empty())
    return {};
  kept = kept_pieces(p, views);
  std::size_t bytes = 0;
  for (const auto& k : kept)
    bytes += k.bytes; // inside the group: no overflow
  return checked(std::move(targets), worker, group, bytes, "bytes kept of the tensors sent");
}

std::uint64_t store_kept(const std::vector<source_piece>& whole, const std::vector<source_piece>& kept,
                         const std::vector<store_target>& targets, bool corrupt) {
  // The copies, each from inside one piece of `whole` to one target: split
  // where a kept piece or a target ends, then ordered as `whole` is read.
  struct copy {
    std::size_t piece;  // of whole
    std::size_t offset; // in it
    std::uint8_t* to;
    std::size_t bytes;
  };
  // Kept across calls (cleared, not freed): a group's copies can take
  // hundreds of kilobytes, which fresh each time would fault in again.
  thread_local std::vector<std::size_t> by_address;
  thread_local std::vector<copy> copies;
  by_address.resize(whole.size());
  copies.clear();
  for (std::size_t i = 0; i < whole.size(); ++i)
    by_address[i] = i;
  // By address, then size: an empty tensor shares its address with the
  // next one, and must not hide it.
  const std::less<const std::uint8_t*> before; // pointers into unrelated buffers
  std::sort(by_address.begin(), by_address.end(), [&](auto a, auto b) {
    return whole[a].at != whole[b].at ? before(whole[a].at, whole[b].at) : whole[a].bytes < whole[b].bytes;
  });
  std::size_t last = whole.size(); // the piece the previous copy came from: most do
  auto holds = [&](std::size_t i, const std::uint8_t* at) {
    const auto& w = whole[i];
    return !before(at, w.at) && before(at, w.at + w.bytes);
  };
  // The piece of `whole` that byte `at` lies in.
  auto piece_of = [&](const std::uint8_t* at) {
    if (last < whole.size() && holds(last, at))
      return last;
    auto it = std::upper_bound(by_address.begin(), by_address.end(), at,
                               [&](const std::uint8_t* x, std::size_t i) { return before(x, whole[i].at); });
    if (it != by_address.begin() && holds(*std::prev(it), at))
      return last = *std::prev(it);
    throw std::invalid_argument("a kept byte lies outside the group sent");
  };
  std::size_t ki = 0, ko = 0, kept_total = 0, target_total = 0;
  for (const auto& k : kept)
    kept_total += k.bytes; // each inside the group: no overflow
  for (const auto& t : targets)
    target_total += t.bytes;
  if (kept_total != target_total)
    throw std::invalid_argument("kept pieces of " + std::to_string(kept_total) + " bytes for targets of "
                                + std::to_string(target_total));
  for (const auto& t : targets) {
    for (std::size_t done = 0; done < t.bytes;) {
      while (kept[ki].bytes == ko)
        ++ki, ko = 0;
      const std::uint8_t* from = kept[ki].at + ko;
      const std::size_t piece = piece_of(from);
      const auto offset = static_cast<std::size_t>(from - whole[piece].at);
      // Cut where a target, a kept piece or the piece of `whole` ends.
      const std::size_t n = std::min({t.bytes - done, kept[ki].bytes - ko, whole[piece].bytes - offset});
      copies.push_back({piece, offset, t.at + done, n});
      done += n;
      ko += n;
    }
  }
  const auto read_order = [](const copy& a, const copy& b) {
    return a.piece != b.piece ? a.piece < b.piece : a.offset < b.offset;
  };
  if (!std::is_sorted(copies.begin(), copies.end(), read_order)) // a plan follows its tensors: mostly sorted
    std::sort(copies.begin(), copies.end(), read_order);

  thread_local checksum64_stream sum;
  thread_local std::vector<std::uint8_t> altered;
  sum.reset();
  std::size_t next = 0;
  for (std::size_t i = 0; i < whole.size(); ++i) {
    for (std::size_t at = 0; at < whole[i].bytes;) {
      const std::size_t end = std::min(whole[i].bytes, at + store_piece_bytes);
      if (corrupt) { // the drill: this window checksummed with a byte flipped
        altered.assign(whole[i].at + at, whole[i].at + end);
        altered[0] ^= 0x5a;
        sum.update(altered.data(), altered.size());
        corrupt = false;
      } else {
        sum.update(whole[i].at + at, end - at);
      }
      // The kept bytes of this window, while it is in cache.
      for (; next < copies.size() && copies[next].piece == i && copies[next].offset < end; ++next) {
        auto& c = copies[next];
        const std::size_t n = std::min(c.bytes, end - c.offset);
        std::memcpy(c.to, whole[i].at + c.offset, n);
        if (n < c.bytes) { // the rest in the next window
          c.offset += n;
          c.to += n;
          c.bytes -= n;
          break;
        }
      }
      at = end;
    }
  }
  return sum.digest();
}

} // namespace rlsync::transfer
