// dtype names and conversions: exhaustive over all 16-bit patterns, ties at
// every midpoint, bulk loops against the scalar functions.
#include "runtime/base/dtype.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

using namespace rlsync;

namespace {

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::uint32_t to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

bool f16_is_nan(std::uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool bf16_is_nan(std::uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0; }

// Reference value of a half, computed with ldexp rather than bit tricks.
double f16_reference(std::uint16_t h) {
  int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return (h & 0x8000) ? -v : v;
}

} // namespace

TEST_CASE("dtype names parse both spellings and reject others") {
  for (dtype t : {dtype::bf16, dtype::f16, dtype::f32}) {
    CHECK(parse_safetensors_dtype(safetensors_name(t)) == t);
    CHECK(parse_short_dtype(short_name(t)) == t);
  }
  CHECK(safetensors_name(dtype::bf16) == "BF16");
  CHECK(short_name(dtype::f16) == "f16");
  CHECK(!parse_safetensors_dtype("bf16"));
  CHECK(!parse_safetensors_dtype("I8"));
  CHECK(!parse_short_dtype("BF16"));
  CHECK(!parse_short_dtype(""));
  CHECK(dtype_size(dtype::bf16) == 2);
  CHECK(dtype_size(dtype::f32) == 4);
}

TEST_CASE("bf16: every pattern round-trips through f32, NaN stays NaN") {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    auto h = static_cast<std::uint16_t>(b);
    float f = bf16_to_f32(h);
    CHECK(to_bits(f) == (b << 16)); // bf16 is the top half of f32
    if (bf16_is_nan(h)) {
      REQUIRE(std::isnan(f));
      REQUIRE(bf16_is_nan(f32_to_bf16(f)));
    } else {
      REQUIRE(f32_to_bf16(f) == h);
    }
  }
}

TEST_CASE("bf16: round to nearest, ties to even, overflow to infinity") {
  for (std::uint32_t b = 0; b < 0x7f80; ++b) { // every finite non-negative bf16
    std::uint32_t u = b << 16;
    std::uint16_t even = (b & 1) ? static_cast<std::uint16_t>(b + 1) : static_cast<std::uint16_t>(b);
    REQUIRE(f32_to_bf16(from_bits(u | 0x7fff)) == b);       // just below the midpoint
    REQUIRE(f32_to_bf16(from_bits(u | 0x8000)) == even);    // the midpoint: to even
    REQUIRE(f32_to_bf16(from_bits(u | 0x8001)) == b + 1);   // just above
    REQUIRE(f32_to_bf16(-from_bits(u | 0x8001)) == ((b + 1) | 0x8000));
  }
  CHECK(f32_to_bf16(std::numeric_limits<float>::max()) == 0x7f80); // rounds past the largest bf16
  CHECK(f32_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(f32_to_bf16(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
  CHECK(f32_to_bf16(-0.0f) == 0x8000);
  // NaN whose payload sits only in the discarded bits must not become inf.
  CHECK(bf16_is_nan(f32_to_bf16(from_bits(0x7f800001))));
  CHECK(bf16_is_nan(f32_to_bf16(from_bits(0xffffffff))));
  CHECK((f32_to_bf16(from_bits(0xff800001)) & 0x8000) == 0x8000); // sign kept
}

TEST_CASE("f16: every pattern has its exact value and round-trips") {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    auto h = static_cast<std::uint16_t>(b);
    float f = f16_to_f32(h);
    if ((h & 0x7c00) == 0x7c00) {
      if (h & 0x3ff) {
        REQUIRE(std::isnan(f));
        REQUIRE(f16_is_nan(f32_to_f16(f)));
      } else {
        REQUIRE(std::isinf(f));
        REQUIRE(std::signbit(f) == bool(h & 0x8000));
        REQUIRE(f32_to_f16(f) == h);
      }
      continue;
    }
    REQUIRE(static_cast<double>(f) == f16_reference(h));
    REQUIRE(std::signbit(f) == bool(h & 0x8000)); // -0 stays -0
    REQUIRE(f32_to_f16(f) == h);
  }
  CHECK(f16_to_f32(0x3c00) == 1.0f);
  CHECK(f16_to_f32(0x7bff) == 65504.0f);
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24)); // smallest subnormal
  CHECK(f16_to_f32(0x0400) == std::ldexp(1.0f, -14)); // smallest normal
}

TEST_CASE("f16: round to nearest, ties to even, at every midpoint") {
  // Midpoints of consecutive non-negative halves are exact in f32 (11 bits).
  for (std::uint32_t b = 0; b < 0x7c00; ++b) {
    double lo = f16_reference(static_cast<std::uint16_t>(b));
    double hi = b + 1 < 0x7c00 ? f16_reference(static_cast<std::uint16_t>(b + 1)) : 65536.0;
    float mid = static_cast<float>((lo + hi) / 2);
    REQUIRE(static_cast<double>(mid) == (lo + hi) / 2);
    std::uint16_t even = (b & 1) ? static_cast<std::uint16_t>(b + 1) : static_cast<std::uint16_t>(b);
    REQUIRE(f32_to_f16(mid) == even);
    REQUIRE(f32_to_f16(std::nextafter(mid, 0.0f)) == b);
    REQUIRE(f32_to_f16(std::nextafter(mid, 1e9f)) == b + 1);
    REQUIRE(f32_to_f16(-std::nextafter(mid, 1e9f)) == ((b + 1) | 0x8000));
  }
  CHECK(f32_to_f16(65519.99f) == 0x7bff);
  CHECK(f32_to_f16(65520.0f) == 0x7c00); // the midpoint to "65536" rounds to even: inf
  CHECK(f32_to_f16(1e10f) == 0x7c00);
  CHECK(f32_to_f16(-1e10f) == 0xfc00);
  CHECK(f32_to_f16(std::ldexp(1.0f, -26)) == 0);      // below half the smallest subnormal
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0);      // exactly half: ties to even (0)
  CHECK(f32_to_f16(std::ldexp(1.5f, -25)) == 0x0001); // above half
  CHECK(f32_to_f16(-0.0f) == 0x8000);
  CHECK(f16_is_nan(f32_to_f16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(f16_is_nan(f32_to_f16(from_bits(0x7f800001)))); // payload only in dropped bits
}

TEST_CASE("bulk conversions equal the scalar ones, unaligned and any count") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (dtype t : {dtype::bf16, dtype::f16, dtype::f32}) {
    for (std::size_t count : {0u, 1u, 7u, 10u, 64u, 1001u}) {
      // Special values first (NaNs of both kinds, infinities, subnormals,
      // the f16 overflow edge), then random bit patterns.
      const std::uint32_t specials[] = {0x7fc00000, 0xffc00001, 0x7f800001, 0x7f800000, 0xff800000,
                                        0x00000001, 0x80000000, 0x33800000, 0x477ff000, 0x387fc000};
      std::vector<float> src(count);
      for (std::size_t i = 0; i < count; ++i)
        src[i] = from_bits(i < std::size(specials) ? specials[i] : bits(rng));
      // Offset by one byte: the bulk loops must not assume alignment.
      std::vector<unsigned char> packed(count * dtype_size(t) + 1);
      convert_from_f32(t, src.data(), packed.data() + 1, count);
      std::vector<float> back(count);
      convert_to_f32(t, packed.data() + 1, back.data(), count);
      for (std::size_t i = 0; i < count; ++i) {
        std::uint16_t h;
        std::memcpy(&h, packed.data() + 1 + i * 2, 2);
        if (t == dtype::bf16) {
          REQUIRE(h == f32_to_bf16(src[i]));
          REQUIRE(to_bits(back[i]) == to_bits(bf16_to_f32(h)));
        } else if (t == dtype::f16) {
          REQUIRE(h == f32_to_f16(src[i]));
          REQUIRE(to_bits(back[i]) == to_bits(f16_to_f32(h)));
        } else {
          REQUIRE(to_bits(back[i]) == to_bits(src[i]));
        }
      }
    }
  }
}

TEST_CASE("bulk f16 -> f32 equals the scalar conversion for every pattern, NaNs included") {
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t b = 0; b <= 0xffff; ++b)
    all[b] = static_cast<std::uint16_t>(b);
  std::vector<float> out(all.size());
  convert_to_f32(dtype::f16, all.data(), out.data(), all.size());
  for (std::uint32_t b = 0; b <= 0xffff; ++b)
    REQUIRE(to_bits(out[b]) == to_bits(f16_to_f32(all[b])));
  std::vector<std::uint16_t> back(all.size());
  convert_from_f32(dtype::f16, out.data(), back.data(), out.size());
  for (std::uint32_t b = 0; b <= 0xffff; ++b)
    REQUIRE(back[b] == f32_to_f16(out[b]));
}
