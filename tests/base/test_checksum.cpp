// checksum64 is XXH3 (64-bit): the xxHash reference suite's XXH3_64bits
// vectors (cli/xsum_sanity_check.c, XSUM_XXH3_testdata), whose seed-0 values
// agree with `xxhsum -H3` (xxhash 0.8.1) over the same bytes; well-known
// strings from `printf ... | xxhsum -H3 -`. Streaming equals one-shot at every
// split point, and seeds matter.
#include "runtime/base/checksum.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

using namespace rlsync;

namespace {

// The reference suite's input (XSUM_fillTestBuffer): the top byte of a
// multiplicative generator.
std::vector<unsigned char> sanity_buffer(std::size_t n) {
  std::vector<unsigned char> b(n);
  std::uint64_t gen = 2654435761u;
  for (auto& x : b) {
    x = static_cast<unsigned char>(gen >> 56);
    gen *= 11400714785074694797ull;
  }
  return b;
}

constexpr std::uint64_t prime64 = 11400714785074694797ull;

// Lengths on both sides of XXH3's internal boundaries: the 0-3, 4-8, 9-16,
// 17-128 and 129-240 byte cases, the 256-byte stream buffer, 64-byte stripes
// and 1024-byte blocks.
constexpr std::size_t edge_lengths[] = {0,   1,   3,   4,   8,   9,    16,   17,   128,  129,
                                        240, 241, 255, 256, 257, 1023, 1024, 1025, 2048, 2367};

} // namespace

TEST_CASE("checksum64 is XXH3 64-bit: the reference suite's vectors, one-shot and streaming") {
  struct vec {
    std::size_t len;
    std::uint64_t seed, want;
  };
  const vec vectors[] = {
    {0, 0, 0x2D06800538D394C2ull},    {0, prime64, 0xA8A6B918B2F0364Aull},
    {1, 0, 0xC44BDFF4074EECDBull},    {1, prime64, 0x032BE332DD766EF8ull},
    {6, 0, 0x27B56A84CD2D7325ull},    {6, prime64, 0x84589C116AB59AB9ull},
    {12, 0, 0xA713DAF0DFBB77E7ull},   {12, prime64, 0xE7303E1B2336DE0Eull},
    {24, 0, 0xA3FE70BF9D3510EBull},   {24, prime64, 0x850E80FC35BDD690ull},
    {48, 0, 0x397DA259ECBA1F11ull},   {48, prime64, 0xADC2CBAA44ACC616ull},
    {80, 0, 0xBCDEFBBB2C47C90Aull},   {80, prime64, 0xC6DD0CB699532E73ull},
    {195, 0, 0xCD94217EE362EC3Aull},  {195, prime64, 0xBA68003D370CB3D9ull},
    {403, 0, 0xCDEB804D65C6DEA4ull},  {403, prime64, 0x6259F6ECFD6443FDull},
    {512, 0, 0x617E49599013CB6Bull},  {512, prime64, 0x3CE457DE14C27708ull},
    {2048, 0, 0xDD59E2C3A5F038E0ull}, {2048, prime64, 0x66F81670669ABABCull},
    {2240, 0, 0x6E73A90539CF2948ull}, {2240, prime64, 0x757BA8487D1B5247ull},
    {2367, 0, 0xCB37AEB9E5D361EDull}, {2367, prime64, 0xD2DB3415B942B42Aull},
  };
  const auto buf = sanity_buffer(2367);
  for (const auto& v : vectors) {
    CAPTURE(v.len);
    CAPTURE(v.seed);
    CHECK(checksum64(buf.data(), v.len, v.seed) == v.want);
    checksum64_stream whole(v.seed);
    whole.update(buf.data(), v.len);
    CHECK(whole.digest() == v.want);
    checksum64_stream bytewise(v.seed);
    for (std::size_t i = 0; i < v.len; ++i)
      bytewise.update(buf.data() + i, 1);
    CHECK(bytewise.digest() == v.want);
  }
}

TEST_CASE("checksum64 of well-known strings (xxhsum -H3)") {
  CHECK(checksum64("", 0) == 0x2d06800538d394c2ull);
  CHECK(checksum64("a", 1) == 0xe6c632b61e964e1full);
  CHECK(checksum64("abc", 3) == 0x78af5f94892f3950ull);
  CHECK(checksum64(nullptr, 0) == 0x2d06800538d394c2ull); // empty tensors have no data pointer
  checksum64_stream s;
  s.update(nullptr, 0);
  s.update("a", 1);
  s.update(nullptr, 0);
  s.update("bc", 2);
  CHECK(s.digest() == 0x78af5f94892f3950ull);
}

TEST_CASE("checksum64_stream equals checksum64 for every split point") {
  const auto buf = sanity_buffer(2367);
  for (std::uint64_t seed : {std::uint64_t(0), prime64, ~std::uint64_t(0)}) {
    for (std::size_t len : edge_lengths) {
      CAPTURE(seed);
      CAPTURE(len);
      const std::uint64_t want = checksum64(buf.data(), len, seed);
      for (std::size_t cut = 0; cut <= len; ++cut) {
        checksum64_stream s(seed);
        s.update(buf.data(), cut);
        s.update(buf.data() + cut, len - cut);
        REQUIRE(s.digest() == want);
      }
      // Three pieces whose edges walk across the 256-byte stream buffer.
      for (std::size_t first = 0; first <= len; first += 61) {
        const std::size_t second = std::min<std::size_t>(len - first, 300);
        checksum64_stream s(seed);
        s.update(buf.data(), first);
        s.update(buf.data() + first, second);
        s.update(buf.data() + first + second, len - first - second);
        REQUIRE(s.digest() == want);
      }
    }
  }
}

TEST_CASE("checksum64: the seed changes the checksum at every length") {
  const auto buf = sanity_buffer(2367);
  for (std::size_t len : edge_lengths) {
    CAPTURE(len);
    const std::uint64_t unseeded = checksum64(buf.data(), len);
    CHECK(checksum64(buf.data(), len, 0) == unseeded); // the default seed is 0
    CHECK(checksum64(buf.data(), len, 1) != unseeded);
    CHECK(checksum64(buf.data(), len, prime64) != unseeded);
    CHECK(checksum64(buf.data(), len, 1) != checksum64(buf.data(), len, 2));
    checksum64_stream s(1);
    s.update(buf.data(), len);
    CHECK(s.digest() == checksum64(buf.data(), len, 1));
  }
}

TEST_CASE("checksum64: flipping any one bit changes the checksum") {
  auto buf = sanity_buffer(4096);
  const std::uint64_t clean = checksum64(buf.data(), buf.size());
  for (std::size_t byte : {std::size_t(0), std::size_t(1), std::size_t(255), std::size_t(1024), std::size_t(4095)}) {
    for (int bit = 0; bit < 8; ++bit) {
      CAPTURE(byte);
      CAPTURE(bit);
      buf[byte] ^= static_cast<unsigned char>(1u << bit);
      CHECK(checksum64(buf.data(), buf.size()) != clean);
      buf[byte] ^= static_cast<unsigned char>(1u << bit);
    }
  }
  CHECK(checksum64(buf.data(), buf.size()) == clean);
}

TEST_CASE("checksum64_stream: digest does not disturb the state, reset starts over, moves keep the state") {
  const auto buf = sanity_buffer(100);
  checksum64_stream s;
  s.update(buf.data(), 40);
  CHECK(s.digest() == checksum64(buf.data(), 40));
  s.update(buf.data() + 40, 60);
  CHECK(s.digest() == checksum64(buf.data(), 100));
  s.reset(prime64);
  s.update(buf.data(), 1);
  CHECK(s.digest() == 0x032BE332DD766EF8ull); // the reference vector for 1 byte, seed prime64

  checksum64_stream moved(std::move(s));
  moved.update(buf.data() + 1, 5);
  CHECK(moved.digest() == checksum64(buf.data(), 6, prime64));
  checksum64_stream assigned;
  assigned = std::move(moved);
  assigned.reset();
  CHECK(assigned.digest() == 0x2D06800538D394C2ull);
}

TEST_CASE("checksum64 reads unaligned input") {
  const auto buf = sanity_buffer(1000);
  std::vector<unsigned char> shifted(buf.size() + 3);
  std::memcpy(shifted.data() + 3, buf.data(), buf.size());
  CHECK(checksum64(shifted.data() + 3, buf.size(), 5) == checksum64(buf.data(), buf.size(), 5));
  checksum64_stream s(5);
  s.update(shifted.data() + 3, buf.size());
  CHECK(s.digest() == checksum64(buf.data(), buf.size(), 5));
}
