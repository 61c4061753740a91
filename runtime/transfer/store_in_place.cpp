#include "runtime/transfer/store_in_place.hpp"

#include "runtime/base/checksum.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

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
  // One streaming state per thread: pullers run one thread per worker.
  thread_local checksum64_stream sum;
  sum.reset();
  for (const auto& t : targets) {
    for (std::size_t done = 0; done < t.bytes;) {
      const std::size_t piece = std::min(store_piece_bytes, t.bytes - done);
      std::memcpy(t.at + done, packed + done, piece);
      if (corrupt) {
        t.at[done] ^= 0x5a;
        corrupt = false;
      }
      sum.update(t.at + done, piece);
      done += piece;
    }
    packed += t.bytes;
  }
  return sum.digest();
}

} // namespace rlsync::transfer
