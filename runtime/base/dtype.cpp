// dtype names and bf16/f16 <-> f32 conversions (the per-element bit
// arithmetic lives in dtype_bits.hpp, shared with the CUDA kernels).
#include "runtime/base/dtype.hpp"
#include "runtime/base/dtype_bits.hpp"

#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace rlsync {

namespace {

using namespace dtype_bits;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// F16C converts 8 halves per instruction, bit-identical to dtype_bits.hpp
// (round to nearest even, NaN quieted, subnormals exact); chosen at run
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
