// mixsum64, the GPU planes' checksum: what it must detect and how partial
// sums combine. The device computes it with the same mixsum_term (gpu tests).
#include "gpu/mixsum.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

using namespace rlsync::gpu;

namespace {
std::vector<unsigned char> bytes_of(std::size_t n) {
  std::vector<unsigned char> b(n);
  for (std::size_t i = 0; i < n; ++i)
    b[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
  return b;
}
} // namespace

TEST_CASE("mixsum64 is the definition: mixed words summed, finished with the length") {
  // Two words and a 3-byte tail, summed by hand.
  const auto b = bytes_of(19);
  std::uint64_t w0, w1, w2 = 0;
  std::memcpy(&w0, b.data(), 8);
  std::memcpy(&w1, b.data() + 8, 8);
  std::memcpy(&w2, b.data() + 16, 3);
  const std::uint64_t sum = mixsum_term(w0, 0) + mixsum_term(w1, 1) + mixsum_term(w2, 2);
  CHECK(mixsum64(b.data(), b.size()) == mixsum_finish(sum, 19));
  CHECK(mixsum64(nullptr, 0) == mixsum_finish(0, 0));
  // splitmix64's finaliser, a known value: mix64(1).
  CHECK(mix64(1) == 0x5692161d100b05e5ull);
}

TEST_CASE("mixsum64 detects a flipped bit, swapped words, a dropped word and trailing zeros") {
  const auto b = bytes_of(4096 + 5);
  const std::uint64_t base = mixsum64(b.data(), b.size());
  for (std::size_t at : {std::size_t{0}, std::size_t{7}, std::size_t{2048}, b.size() - 1}) {
    for (int bit = 0; bit < 8; ++bit) {
      auto flipped = b;
      flipped[at] ^= static_cast<unsigned char>(1u << bit);
      CHECK(mixsum64(flipped.data(), flipped.size()) != base);
    }
  }
  auto swapped = b;
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
  CHECK(mixsum64(swapped.data(), swapped.size()) != base);
  std::vector<unsigned char> dropped(b.begin() + 8, b.end());
  CHECK(mixsum64(dropped.data(), dropped.size()) != base);
  auto padded = b;
  padded.push_back(0);
  CHECK(mixsum64(padded.data(), padded.size()) != base);
}

TEST_CASE("partial sums of 8-byte-aligned pieces add up to the whole, in any order") {
  const auto b = bytes_of(1000 + 3);
  const std::uint64_t whole = mixsum_partial(b.data(), b.size());
  for (std::size_t cut : {std::size_t{0}, std::size_t{8}, std::size_t{512}, std::size_t{1000}}) {
    CAPTURE(cut);
    const std::uint64_t tail = mixsum_partial(b.data() + cut, b.size() - cut, cut / 8);
    const std::uint64_t head = mixsum_partial(b.data(), cut);
    CHECK(head + tail == whole);
    CHECK(tail + head == whole);
  }
}
