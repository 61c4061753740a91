// The kernels for x86-64 with AVX2, FMA and F16C; compiled with -mavx2 -mfma
// -mf16c (runtime/CMakeLists.txt) and only called when the CPU has AVX2 and
// FMA (every such CPU has F16C). Fused multiply-adds are explicit, so no
// result depends on what the compiler chooses to contract.
#include "runtime/engine/kernels.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace rlsync::engine::kernels::avx2 {

using vec = __m256;

#include "runtime/engine/kernels_widen.inl"

inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
// bf16 is the top half of an fp32: zero-extend to 32 bits and shift.
inline vec vload(const bf16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline vec vload(const f16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// int8: sign-extend 8 bytes to 32 bits, convert (exact).
inline vec vload(const std::int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vmadd(vec a, vec b, vec acc) { return _mm256_fmadd_ps(a, b, acc); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline float madd(float a, float b, float acc) { return std::fma(a, b, acc); }

#include "runtime/engine/kernels_impl.inl"

} // namespace rlsync::engine::kernels::avx2
