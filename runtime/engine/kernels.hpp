#pragma once
// The engine's numeric kernels, fp32 on the CPU. Each result element is
// computed by one fixed sequence of operations that depends only on the
// reduction length, never on how rows are blocked or which worker runs it:
// that is what makes tensor-parallel outputs bit-identical across tp.
//
// Two builds of the same source (kernels_impl.inl): a baseline one, and on
// x86-64 one for AVX2+FMA chosen at startup when the CPU has it. A process
// uses one of them throughout.
#include <cstdint>

namespace rlsync::engine::kernels {

/// out[r * ldo + j] = sum_k a[r * lda + k] * w[j * ldw + k] for r < rows,
/// j < n, k < depth: activations times a weight matrix stored [out, in].
void matmul_nt(const float* a, std::int64_t lda, const float* w, std::int64_t ldw, float* out,
               std::int64_t ldo, std::int64_t rows, std::int64_t n, std::int64_t depth);

/// sum_k a[k] * b[k], with the same per-element operations as matmul_nt.
float dot(const float* a, const float* b, std::int64_t depth);

/// "avx2+fma" or "baseline" (RLSYNC_KERNELS=baseline forces the latter).
const char* variant();

} // namespace rlsync::engine::kernels
