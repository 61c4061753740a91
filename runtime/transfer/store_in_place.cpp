#include "runtime/transfer/store_in_place.hpp"

#include "runtime/base/checksum.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace rlsync::transfer {

std::vector<store_target> group_targets(const group_sink& sink, int worker, std::uint32_t group, std::size_t size) {
  if (!sink.targets || !sink.on_stored)
    return {};
  auto out = sink.targets(worker, group);
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
