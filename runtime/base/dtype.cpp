// dtype names and bf16/f16 <-> f32 conversions.
//
// The conversions are written branch-free on 32-bit integers (selects, not
// jumps) so that the bulk loops below auto-vectorise; they must not depend on
// the FPU being in round-to-nearest-even mode except for the f16 subnormal
// path, which relies on it (the default; rlsync never changes it).
#include "runtime/base/dtype.hpp"

#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace rlsync {

namespace {

inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// All ones when `c`, else zero: selects by masking keep the loops free of
// branches, which the vectoriser needs (it will not if-convert float code).
inline std::uint32_t mask(bool c) { return 0u - static_cast<std::uint32_t>(c); }

inline float bf16_to_f32_inline(std::uint16_t h) { return float_of(std::uint32_t(h) << 16); }

inline std::uint16_t f32_to_bf16_inline(float value) {
  std::uint32_t u = bits_of(value);
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit.
  // Finite values that round past the largest bf16 become infinity, as they
  // should. NaN would be rounded into infinity (or flip sign) by the same
  // add, so keep its sign and top payload bits and force the quiet bit.
  std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  std::uint32_t nan = (u >> 16) | 0x0040u;
  bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<std::uint16_t>(is_nan ? nan : rounded);
}

// Half -> float after F. Giesen's "half_to_float_fast": shift exponent and
// mantissa into place and fix up the exponent; subnormals are renormalised
// with one float subtraction (exact), inf/NaN get the maximal exponent.
inline float f16_to_f32_inline(std::uint16_t h) {
  constexpr std::uint32_t shifted_exp = 0x7c00u << 13; // f16 exponent mask, moved to f32 place
  std::uint32_t o = (std::uint32_t(h) & 0x7fffu) << 13;
  std::uint32_t exp = shifted_exp & o;
  o += (127u - 15u) << 23; // rebias exponent
  // Inf/NaN: maximal exponent; a NaN is made quiet, as F16C hardware does.
  std::uint32_t inf_nan = (o + ((128u - 16u) << 23)) | (mask((o & 0x7fffffu) != 0) & 0x400000u);
  // Subnormal (or zero): bump the exponent by one and subtract 2^-14 exactly.
  float sub = float_of(o + (1u << 23)) - float_of(113u << 23);
  std::uint32_t is_inf_nan = mask(exp == shifted_exp), is_sub = mask(exp == 0);
  o = (inf_nan & is_inf_nan) | (bits_of(sub) & is_sub) | (o & ~(is_inf_nan | is_sub));
  return float_of(o | ((std::uint32_t(h) & 0x8000u) << 16));
}

// Float -> half, round to nearest even, after F. Giesen's
// "float_to_half_fast3_rtne". Values at or above 65520 round to infinity
// (the largest half is 65504); NaN keeps its sign and top payload bits and
// is made quiet.
inline std::uint16_t f32_to_f16_inline(float value) {
  std::uint32_t u = bits_of(value);
  std::uint32_t sign = u & 0x80000000u;
  u ^= sign;
  constexpr std::uint32_t f32_inf = 255u << 23;
  constexpr std::uint32_t f16_max = (127u + 16u) << 23; // 65536.0f: everything above is inf/NaN
  constexpr std::uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  std::uint32_t inf_nan = u > f32_inf ? (0x7e00u | ((u >> 13) & 0x3ffu)) : 0x7c00u;
  // Subnormal half: adding the magic number aligns the 10 mantissa bits at
  // the bottom; the FPU rounds to nearest even for us.
  std::uint32_t sub = bits_of(float_of(u) + float_of(denorm_magic)) - denorm_magic;
  // Normal half: rebias, then round with 0xfff plus the lowest kept bit.
  std::uint32_t mant_odd = (u >> 13) & 1u;
  std::uint32_t normal = (u + ((15u - 127u) << 23) + 0xfffu + mant_odd) >> 13;
  std::uint32_t is_inf_nan = mask(u >= f16_max), is_sub = mask(u < (113u << 23));
  std::uint32_t o = (inf_nan & is_inf_nan) | (sub & is_sub & ~is_inf_nan) | (normal & ~(is_inf_nan | is_sub));
  return static_cast<std::uint16_t>(o | (sign >> 16));
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// F16C converts 8 halves per instruction, bit-identical to the functions
// above (round to nearest even, NaN quieted, subnormals exact); chosen at run
// time so that the binary still runs on CPUs without it.
#define RLSYNC_HAVE_F16C_PATH 1

// CPUID leaf 1: ECX bit 27 OSXSAVE, 28 AVX, 29 F16C; XGETBV: the OS saves
// the YMM registers. (clang 14's __builtin_cpu_supports lacks "f16c".)
bool cpu_has_f16c() {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d))
      return false;
    constexpr unsigned need = (1u << 27) | (1u << 28) | (1u << 29);
    if ((c & need) != need)
      return false;
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6u) == 6u;
  }();
  return yes;
}

__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const unsigned char* in, float* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i))));
  for (; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = f16_to_f32_inline(h);
  }
}

__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* in, unsigned char* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) {
    std::uint16_t h = f32_to_f16_inline(in[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}
#endif

} // namespace

std::string_view safetensors_name(dtype t) {
  switch (t) {
  case dtype::bf16: return "BF16";
  case dtype::f16: return "F16";
  case dtype::f32: return "F32";
  }
  return "?";
}

std::string_view short_name(dtype t) {
  switch (t) {
  case dtype::bf16: return "bf16";
  case dtype::f16: return "f16";
  case dtype::f32: return "f32";
  }
  return "?";
}

std::optional<dtype> parse_safetensors_dtype(std::string_view s) {
  if (s == "BF16")
    return dtype::bf16;
  if (s == "F16")
    return dtype::f16;
  if (s == "F32")
    return dtype::f32;
  return std::nullopt;
}

std::optional<dtype> parse_short_dtype(std::string_view s) {
  if (s == "bf16")
    return dtype::bf16;
  if (s == "f16")
    return dtype::f16;
  if (s == "f32")
    return dtype::f32;
  return std::nullopt;
}

float bf16_to_f32(std::uint16_t bits) { return bf16_to_f32_inline(bits); }
std::uint16_t f32_to_bf16(float value) { return f32_to_bf16_inline(value); }
float f16_to_f32(std::uint16_t bits) { return f16_to_f32_inline(bits); }
std::uint16_t f32_to_f16(float value) { return f32_to_f16_inline(value); }

// The bulk loops copy through memcpy-sized locals so that unaligned or
// aliasing buffers are fine; compilers turn them into plain vector loads.
void convert_to_f32(dtype from, const void* src, float* dst, std::size_t count) {
  const auto* in = static_cast<const unsigned char*>(src);
  switch (from) {
  case dtype::f32:
    if (count > 0) // memmove's pointers must be valid even for 0 bytes
      std::memmove(dst, src, count * sizeof(float));
    return;
  case dtype::bf16:
    for (std::size_t i = 0; i < count; ++i) {
      std::uint16_t h;
      std::memcpy(&h, in + 2 * i, 2);
      dst[i] = bf16_to_f32_inline(h);
    }
    return;
  case dtype::f16:
#ifdef RLSYNC_HAVE_F16C_PATH
    if (cpu_has_f16c())
      return f16_to_f32_f16c(in, dst, count);
#endif
    for (std::size_t i = 0; i < count; ++i) {
      std::uint16_t h;
      std::memcpy(&h, in + 2 * i, 2);
      dst[i] = f16_to_f32_inline(h);
    }
    return;
  }
}

void convert_from_f32(dtype to, const float* src, void* dst, std::size_t count) {
  auto* out = static_cast<unsigned char*>(dst);
  switch (to) {
  case dtype::f32:
    if (count > 0) // memmove's pointers must be valid even for 0 bytes
      std::memmove(dst, src, count * sizeof(float));
    return;
  case dtype::bf16:
    for (std::size_t i = 0; i < count; ++i) {
      std::uint16_t h = f32_to_bf16_inline(src[i]);
      std::memcpy(out + 2 * i, &h, 2);
    }
    return;
  case dtype::f16:
#ifdef RLSYNC_HAVE_F16C_PATH
    if (cpu_has_f16c())
      return f32_to_f16_f16c(src, out, count);
#endif
    for (std::size_t i = 0; i < count; ++i) {
      std::uint16_t h = f32_to_f16_inline(src[i]);
      std::memcpy(out + 2 * i, &h, 2);
    }
    return;
  }
}

} // namespace rlsync
