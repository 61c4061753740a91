#pragma once
// mixsum64: the checksum the GPU data planes put on the groups they move,
// computed the same way on the host and on a device. XXH3 (base/checksum)
// folds its input block after block, which a GPU cannot spread over its
// threads; mixsum64 is a sum of independently mixed words, so every thread
// hashes its own words and one reduction adds them:
//
//   word i   = bytes [8i, 8i + 8) little-endian (the last one zero-padded)
//   term i   = mix(word i XOR mix(i + golden))        mix: splitmix64's finaliser
//   mixsum64 = mix(sum of terms mod 2^64  XOR  mix(byte count))
//
// Mixing the index into each term makes moved, swapped or dropped words
// change the sum; the byte count separates inputs that differ only by
// trailing zeros. Like XXH3 it detects corruption, not an adversary (TLS
// does that). Partial sums of 8-byte-aligned pieces add up, so a chunked
// transfer checksums each chunk where it lands.
#include "runtime/base/host_device.hpp"

#include <cstddef>
#include <cstdint>

namespace rlsync::gpu {

RLSYNC_HD inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

RLSYNC_HD inline std::uint64_t mixsum_term(std::uint64_t word, std::uint64_t index) {
  return mix64(word ^ mix64(index + 0x9e3779b97f4a7c15ull));
}

RLSYNC_HD inline std::uint64_t mixsum_finish(std::uint64_t sum, std::uint64_t bytes) {
  return mix64(sum ^ mix64(bytes));
}

/// The sum of the terms of `bytes` bytes at `data`, numbering words from
/// `first_word` (a piece that starts at byte 8 * first_word of the whole).
std::uint64_t mixsum_partial(const void* data, std::size_t bytes, std::uint64_t first_word = 0);

/// mixsum64 of `bytes` bytes at `data` (null allowed when bytes is 0).
std::uint64_t mixsum64(const void* data, std::size_t bytes);

} // namespace rlsync::gpu
