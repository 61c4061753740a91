// Chooses the kernel build once per process.
#include "runtime/engine/kernels.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace rlsync::engine::kernels {

namespace baseline {
void matmul_nt_impl(const float*, std::int64_t, const void*, rlsync::dtype, std::int64_t, float*, std::int64_t,
                    std::int64_t, std::int64_t, std::int64_t);
void matmul_nt_i8_impl(const float*, std::int64_t, const std::int8_t*, const float*, std::int64_t, float*,
                       std::int64_t, std::int64_t, std::int64_t, std::int64_t);
float dot_impl(const float*, const float*, std::int64_t);
} // namespace baseline

#if defined(RLSYNC_KERNELS_AVX2)
namespace avx2 {
void matmul_nt_impl(const float*, std::int64_t, const void*, rlsync::dtype, std::int64_t, float*, std::int64_t,
                    std::int64_t, std::int64_t, std::int64_t);
void matmul_nt_i8_impl(const float*, std::int64_t, const std::int8_t*, const float*, std::int64_t, float*,
                       std::int64_t, std::int64_t, std::int64_t, std::int64_t);
float dot_impl(const float*, const float*, std::int64_t);
} // namespace avx2
#endif

namespace {

struct table {
  decltype(&baseline::matmul_nt_impl) matmul;
  decltype(&baseline::matmul_nt_i8_impl) matmul_i8;
  decltype(&baseline::dot_impl) dot;
  const char* name;
};

// RLSYNC_KERNELS=baseline forces the baseline build (to test it on a CPU
// that has AVX2, or to compare).
table choose() {
  const char* forced = std::getenv("RLSYNC_KERNELS");
  if (forced && std::strcmp(forced, "baseline") == 0)
    return {baseline::matmul_nt_impl, baseline::matmul_nt_i8_impl, baseline::dot_impl, "baseline"};
#if defined(RLSYNC_KERNELS_AVX2)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return {avx2::matmul_nt_impl, avx2::matmul_nt_i8_impl, avx2::dot_impl, "avx2+fma"};
#endif
  return {baseline::matmul_nt_impl, baseline::matmul_nt_i8_impl, baseline::dot_impl, "baseline"};
}

const table& active() {
  static const table t = choose();
  return t;
}

} // namespace

void matmul_nt(const float* a, std::int64_t lda, typed_ptr w, std::int64_t ldw, float* out, std::int64_t ldo,
               std::int64_t rows, std::int64_t n, std::int64_t depth) {
  if (w.int8())
    active().matmul_i8(a, lda, static_cast<const std::int8_t*>(w.data), w.row_scales, ldw, out, ldo, rows, n, depth);
  else
    active().matmul(a, lda, w.data, w.type, ldw, out, ldo, rows, n, depth);
}

void widen(typed_ptr src, float* out, std::int64_t count) {
  if (src.int8())
    throw std::invalid_argument("engine kernels: widen of int8 weights (only matrices are quantized)");
  convert_to_f32(src.type, src.data, out, static_cast<std::size_t>(count));
}

float dot(const float* a, const float* b, std::int64_t depth) { return active().dot(a, b, depth); }

const char* variant() { return active().name; }

} // namespace rlsync::engine::kernels
