// The kernels for x86-64 with AVX2 and FMA; compiled with -mavx2 -mfma
// (runtime/CMakeLists.txt) and only called when the CPU has both. Fused
// multiply-adds are explicit, so no result depends on what the compiler
// chooses to contract.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace rlsync::engine::kernels::avx2 {

using vec = __m256;

inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vmadd(vec a, vec b, vec acc) { return _mm256_fmadd_ps(a, b, acc); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline float madd(float a, float b, float acc) { return std::fma(a, b, acc); }

#include "runtime/engine/kernels_impl.inl"

} // namespace rlsync::engine::kernels::avx2
