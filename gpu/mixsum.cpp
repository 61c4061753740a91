#include "gpu/mixsum.hpp"

#include <cstring>

namespace rlsync::gpu {

std::uint64_t mixsum_partial(const void* data, std::size_t bytes, std::uint64_t first_word) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t sum = 0;
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8); // little-endian hosts only, as every platform rlsync builds for
    sum += mixsum_term(w, first_word + i / 8);
  }
  if (i < bytes) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + i, bytes - i);
    sum += mixsum_term(w, first_word + i / 8);
  }
  return sum;
}

std::uint64_t mixsum64(const void* data, std::size_t bytes) {
  return mixsum_finish(bytes ? mixsum_partial(data, bytes) : 0, bytes);
}

} // namespace rlsync::gpu
