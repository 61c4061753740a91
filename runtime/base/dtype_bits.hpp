#pragma once
// The bit-level bf16/f16 <-> f32 conversions, shared by the CPU path
// (dtype.cpp's bulk loops) and the CUDA kernels (gpu/), so that a weight
// converted on either side has the same bits.
//
// They are written branch-free on 32-bit integers (selects, not jumps) so
// that the bulk loops auto-vectorise; they do not depend on the FPU's
// rounding mode except for the f16 subnormal path, which relies on
// round-to-nearest-even (the default on CPUs and for CUDA's plain float
// add; rlsync never changes it and never builds with fast-math).
#include "runtime/base/host_device.hpp"

#include <cstdint>
#include <cstring>

namespace rlsync::dtype_bits {

RLSYNC_HD inline std::uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

RLSYNC_HD inline float float_of(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// All ones when `c`, else zero: selects by masking keep the loops free of
// branches, which the vectoriser needs (it will not if-convert float code).
RLSYNC_HD inline std::uint32_t mask(bool c) { return 0u - static_cast<std::uint32_t>(c); }

RLSYNC_HD inline float bf16_to_f32_inline(std::uint16_t h) { return float_of(std::uint32_t(h) << 16); }

RLSYNC_HD inline std::uint16_t f32_to_bf16_inline(float value) {
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
RLSYNC_HD inline float f16_to_f32_inline(std::uint16_t h) {
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
RLSYNC_HD inline std::uint16_t f32_to_f16_inline(float value) {
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

} // namespace rlsync::dtype_bits
