// XXH64 after the reference (https://github.com/Cyan4973/xxHash, XXH64 spec):
// four 64-bit lanes consume 32-byte stripes; the tail is mixed in 8, 4 and 1
// byte steps; a final avalanche. Little-endian loads via memcpy (any
// alignment; compiles to plain loads on x86 and arm64).
#include "runtime/base/checksum.hpp"

#include <algorithm>
#include <cstring>

namespace rlsync {

namespace {

constexpr std::uint64_t p1 = 0x9E3779B185EBCA87ull;
constexpr std::uint64_t p2 = 0xC2B2AE3D27D4EB4Full;
constexpr std::uint64_t p3 = 0x165667B19E3779F9ull;
constexpr std::uint64_t p4 = 0x85EBCA77C2B2AE63ull;
constexpr std::uint64_t p5 = 0x27D4EB2F165667C5ull;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "xxh64 loads assume a little-endian host");

inline std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline std::uint64_t load64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

inline std::uint32_t load32(const unsigned char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline std::uint64_t round(std::uint64_t acc, std::uint64_t input) {
  acc += input * p2;
  acc = rotl(acc, 31);
  return acc * p1;
}

inline std::uint64_t merge_round(std::uint64_t acc, std::uint64_t val) {
  acc ^= round(0, val);
  return acc * p1 + p4;
}

// Consumes whole 32-byte stripes from p (n bytes, n a multiple of 32).
inline void stripes(std::uint64_t acc[4], const unsigned char* p, std::size_t n) {
  std::uint64_t a = acc[0], b = acc[1], c = acc[2], d = acc[3];
  const unsigned char* end = p + n;
  while (p < end) {
    a = round(a, load64(p));
    b = round(b, load64(p + 8));
    c = round(c, load64(p + 16));
    d = round(d, load64(p + 24));
    p += 32;
  }
  acc[0] = a, acc[1] = b, acc[2] = c, acc[3] = d;
}

inline std::uint64_t converge(const std::uint64_t acc[4]) {
  std::uint64_t h = rotl(acc[0], 1) + rotl(acc[1], 7) + rotl(acc[2], 12) + rotl(acc[3], 18);
  for (int i = 0; i < 4; ++i)
    h = merge_round(h, acc[i]);
  return h;
}

// Mixes the last (< 32) bytes into h and avalanches.
inline std::uint64_t finalize(std::uint64_t h, const unsigned char* p, std::size_t len) {
  while (len >= 8) {
    h ^= round(0, load64(p));
    h = rotl(h, 27) * p1 + p4;
    p += 8;
    len -= 8;
  }
  if (len >= 4) {
    h ^= std::uint64_t(load32(p)) * p1;
    h = rotl(h, 23) * p2 + p3;
    p += 4;
    len -= 4;
  }
  while (len > 0) {
    h ^= (*p) * p5;
    h = rotl(h, 11) * p1;
    ++p;
    --len;
  }
  h ^= h >> 33;
  h *= p2;
  h ^= h >> 29;
  h *= p3;
  h ^= h >> 32;
  return h;
}

inline void init_lanes(std::uint64_t acc[4], std::uint64_t seed) {
  acc[0] = seed + p1 + p2;
  acc[1] = seed + p2;
  acc[2] = seed;
  acc[3] = seed - p1;
}

} // namespace

std::uint64_t xxh64(const void* data, std::size_t size, std::uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h;
  std::size_t body = size & ~std::size_t(31);
  if (size >= 32) {
    std::uint64_t acc[4];
    init_lanes(acc, seed);
    stripes(acc, p, body);
    h = converge(acc);
  } else {
    h = seed + p5;
  }
  h += static_cast<std::uint64_t>(size);
  return finalize(h, p + body, size - body);
}

void xxh64_state::reset(std::uint64_t seed) {
  seed_ = seed;
  total_ = 0;
  init_lanes(acc_, seed);
  buffered_ = 0;
}

void xxh64_state::update(const void* data, std::size_t size) {
  if (size == 0) // data may be null then; memcpy must not see it
    return;
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += size;
  if (buffered_ > 0) { // top up the partial stripe first
    std::size_t take = std::min<std::size_t>(32 - buffered_, size);
    std::memcpy(buf_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    size -= take;
    if (buffered_ < 32)
      return;
    stripes(acc_, buf_, 32);
    buffered_ = 0;
  }
  std::size_t body = size & ~std::size_t(31);
  stripes(acc_, p, body);
  std::memcpy(buf_, p + body, size - body);
  buffered_ = size - body;
}

std::uint64_t xxh64_state::digest() const {
  std::uint64_t h = total_ >= 32 ? converge(acc_) : seed_ + p5;
  h += total_;
  return finalize(h, buf_, buffered_);
}

} // namespace rlsync
