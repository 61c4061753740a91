// XXH64 against the xxHash reference suite's sanity vectors
// (xsum_sanity_check.c) and well-known strings; streaming equals one-shot.
#include "runtime/base/checksum.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

using namespace rlsync;

namespace {

// The reference suite's input: bytes from a multiplicative generator.
std::vector<unsigned char> sanity_buffer(std::size_t n) {
  std::vector<unsigned char> b(n);
  std::uint64_t gen = 2654435761u;
  for (auto& x : b) {
    x = static_cast<unsigned char>(gen >> 56);
    gen *= 11400714785074694797ull;
  }
  return b;
}

constexpr std::uint64_t prime32 = 2654435761u;

} // namespace

TEST_CASE("xxh64 matches the reference sanity vectors") {
  struct vec {
    std::size_t len;
    std::uint64_t seed, want;
  };
  const vec vectors[] = {
    {0, 0, 0xEF46DB3751D8E999ull},   {0, prime32, 0xAC75FDA2929B17EFull}, {1, 0, 0xE934A84ADB052768ull},
    {1, prime32, 0x5014607643A9B4C3ull}, {4, 0, 0x9136A0DCA57457EEull},   {14, 0, 0x8282DCC4994E35C8ull},
    {14, prime32, 0xC3BD6BF63DEB6DF0ull}, {222, 0, 0xB641AE8CB691C174ull}, {222, prime32, 0x20CB8AB7AE10C14Aull},
  };
  auto buf = sanity_buffer(222);
  for (auto& v : vectors) {
    CAPTURE(v.len);
    CAPTURE(v.seed);
    CHECK(xxh64(buf.data(), v.len, v.seed) == v.want);
    xxh64_state s(v.seed);
    s.update(buf.data(), v.len);
    CHECK(s.digest() == v.want);
  }
}

TEST_CASE("xxh64 of well-known strings") {
  CHECK(xxh64("", 0) == 0xEF46DB3751D8E999ull);
  CHECK(xxh64("a", 1) == 0xD24EC4F1A98C6E5Bull);
  CHECK(xxh64("abc", 3) == 0x44BC2CF5AD770999ull);
  CHECK(xxh64("abc", 3, 1) != xxh64("abc", 3, 0));
  CHECK(xxh64(nullptr, 0) == 0xEF46DB3751D8E999ull); // empty tensors have no data pointer
  xxh64_state s;
  s.update(nullptr, 0);
  s.update("abc", 3);
  CHECK(s.digest() == 0x44BC2CF5AD770999ull);
}

TEST_CASE("xxh64 streaming equals one-shot for every split") {
  auto buf = sanity_buffer(300);
  for (std::uint64_t seed : {std::uint64_t(0), prime32, ~std::uint64_t(0)}) {
    for (std::size_t len : {0u, 3u, 31u, 32u, 33u, 64u, 100u, 300u}) {
      std::uint64_t want = xxh64(buf.data(), len, seed);
      for (std::size_t cut = 0; cut <= len; ++cut) {
        xxh64_state s(seed);
        s.update(buf.data(), cut);
        s.update(buf.data() + cut, len - cut);
        REQUIRE(s.digest() == want);
      }
      xxh64_state bytewise(seed); // many tiny updates cross every stripe edge
      for (std::size_t i = 0; i < len; ++i)
        bytewise.update(buf.data() + i, 1);
      REQUIRE(bytewise.digest() == want);
    }
  }
}

TEST_CASE("xxh64_state: digest does not disturb the state, reset starts over") {
  auto buf = sanity_buffer(100);
  xxh64_state s;
  s.update(buf.data(), 40);
  CHECK(s.digest() == xxh64(buf.data(), 40));
  s.update(buf.data() + 40, 60);
  CHECK(s.digest() == xxh64(buf.data(), 100));
  s.reset(prime32);
  s.update(buf.data(), 1);
  CHECK(s.digest() == 0x5014607643A9B4C3ull);
}

TEST_CASE("xxh64 reads unaligned input") {
  auto buf = sanity_buffer(1000);
  std::vector<unsigned char> shifted(buf.size() + 3);
  std::memcpy(shifted.data() + 3, buf.data(), buf.size());
  CHECK(xxh64(shifted.data() + 3, buf.size(), 5) == xxh64(buf.data(), buf.size(), 5));
}
