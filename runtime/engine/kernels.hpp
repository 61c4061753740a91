#pragma once
// The engine's numeric kernels, fp32 arithmetic on the CPU. Each result
// element is computed by one fixed sequence of operations that depends only
// on the reduction length, never on how rows are blocked or which worker
// runs it: that is what makes tensor-parallel outputs bit-identical across tp.
//
// Weights come in the dtype the engine stores them in (bf16, f16 or f32)
// and are widened to fp32 in registers as they are loaded. Widening is
// exact, so a bf16 matrix gives bit for bit what its fp32 copy gives, and a
// memory-bound decode step reads half the bytes.
//
// Two builds of the same source (kernels_impl.inl): a baseline one, and on
// x86-64 one for AVX2+FMA (+F16C, which every AVX2 CPU has) chosen at
// startup when the CPU has it. A process uses one of them throughout.
#include "runtime/base/dtype.hpp"

#include <cstdint>

namespace rlsync::engine::kernels {

/// Elements of a stored weight tensor: their address and dtype, or (the
/// engine's int8 process step) int8 elements whose row j is scaled by
/// row_scales[j]: w[j][k] = row_scales[j] * q[j][k].
struct typed_ptr {
  const void* data = nullptr;
  dtype type = dtype::f32;        ///< ignored when int8()
  const float* row_scales = nullptr;

  bool int8() const { return row_scales != nullptr; }
  /// The element `elements` further on: a column offset for int8 weights
  /// (the rows, hence their scales, stay the same).
  typed_ptr operator+(std::int64_t elements) const {
    const std::int64_t size = int8() ? 1 : static_cast<std::int64_t>(dtype_size(type));
    return {static_cast<const unsigned char*>(data) + elements * size, type, row_scales};
  }
};

/// The 16-bit storage types, as the kernel builds see them.
struct bf16_t {
  std::uint16_t bits;
};
struct f16_t {
  std::uint16_t bits;
};

/// out[r * ldo + j] = sum_k a[r * lda + k] * w[j * ldw + k] for r < rows,
/// j < n, k < depth: activations times a weight matrix stored [out, in].
/// int8 weights: the sum over q, times row_scales[j] once at the end.
void matmul_nt(const float* a, std::int64_t lda, typed_ptr w, std::int64_t ldw, float* out, std::int64_t ldo,
               std::int64_t rows, std::int64_t n, std::int64_t depth);
/// The same with fp32 weights.
inline void matmul_nt(const float* a, std::int64_t lda, const float* w, std::int64_t ldw, float* out,
                      std::int64_t ldo, std::int64_t rows, std::int64_t n, std::int64_t depth) {
  matmul_nt(a, lda, typed_ptr{w, dtype::f32}, ldw, out, ldo, rows, n, depth);
}

/// sum_k a[k] * b[k], with the same per-element operations as matmul_nt.
float dot(const float* a, const float* b, std::int64_t depth);

/// out[i] = src[i] as fp32 for i < count (exact). Not for int8 weights
/// (std::invalid_argument): the process step quantizes matrices only.
void widen(typed_ptr src, float* out, std::int64_t count);

/// "avx2+fma" or "baseline" (RLSYNC_KERNELS=baseline forces the latter).
const char* variant();

} // namespace rlsync::engine::kernels
