// The body of the kernels, included once per instruction-set build inside a
// namespace of its own (kernels_baseline.cpp, kernels_avx2.cpp).
//
// Every dot product keeps `lanes` independent partial sums over k = l
// (mod lanes), adds them in a fixed tree, then adds the tail in order: one
// sequence of operations per element, whatever the blocking and whatever
// the dtype the weights are stored in (they are widened exactly on load).

// Provided by the including file: `vec` (8 floats), vload(const float*),
// vload(const bf16_t*), vload(const f16_t*) (unaligned; the 16-bit ones
// widen), vzero(), vmadd(a, b, acc), vstore(float*, vec), the scalar
// madd(a, b, acc), and scalar widen1(float | bf16_t | f16_t).
constexpr int lanes = 8;

inline float sum_lanes(vec v) {
  alignas(32) float s[lanes];
  vstore(s, v);
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

// R activation rows times C weight rows: the register-blocked core. The
// accumulators are R * C vectors, few enough to live in registers (4 x 3
// leaves room for 3 weight vectors and 1 activation vector in AVX2's 16;
// 1 x 6 gives a batch-1 decode six independent chains to hide the FMA
// latency behind while it streams weights).
template <int R, int C, class W>
inline void micro(const float* a, std::int64_t lda, const W* w, std::int64_t ldw, float* out, std::int64_t ldo,
                  std::int64_t depth) {
  vec acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      acc[r][c] = vzero();
  const std::int64_t body = depth - depth % lanes;
  // A batch-1 decode streams the weights once: fetch the next block's rows
  // (they follow these in memory) two cache lines per step, ahead of need.
  const char* next = reinterpret_cast<const char*>(w + C * ldw);
  for (std::int64_t k = 0; k < body; k += lanes) {
    if constexpr (R == 1 && C > 1) {
      __builtin_prefetch(next + k * 16, 0, 3);
      __builtin_prefetch(next + k * 16 + 64, 0, 3);
    }
    vec wv[C];
    for (int c = 0; c < C; ++c)
      wv[c] = vload(w + c * ldw + k);
    for (int r = 0; r < R; ++r) {
      const vec av = vload(a + r * lda + k);
      for (int c = 0; c < C; ++c)
        acc[r][c] = vmadd(av, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = sum_lanes(acc[r][c]);
      for (std::int64_t k = body; k < depth; ++k)
        s = madd(a[r * lda + k], widen1(w[c * ldw + k]), s);
      out[r * ldo + c] = s;
    }
}

template <int R, class W>
inline void row_block(const float* a, std::int64_t lda, const W* w, std::int64_t ldw, float* out,
                      std::int64_t ldo, std::int64_t j0, std::int64_t j1, std::int64_t depth) {
  std::int64_t j = j0;
  if constexpr (R == 1)
    for (; j + 6 <= j1; j += 6)
      micro<1, 6>(a, lda, w + j * ldw, ldw, out + j, ldo, depth);
  for (; j + 3 <= j1; j += 3)
    micro<R, 3>(a, lda, w + j * ldw, ldw, out + j, ldo, depth);
  for (; j < j1; ++j)
    micro<R, 1>(a, lda, w + j * ldw, ldw, out + j, ldo, depth);
}

template <class W>
void matmul_nt_typed(const float* a, std::int64_t lda, const W* w, std::int64_t ldw, float* out, std::int64_t ldo,
                     std::int64_t rows, std::int64_t n, std::int64_t depth) {
  // Weight rows in blocks of about 64 KiB (a multiple of 6 rows) stay in L2
  // while every activation row passes over them; the activations (at most a
  // few hundred KiB for a decode batch) stream from L2 as well.
  const std::int64_t row_bytes = std::max<std::int64_t>(1, depth * static_cast<std::int64_t>(sizeof(W)));
  const std::int64_t block = std::max<std::int64_t>(6, (64 << 10) / row_bytes / 6 * 6);
  for (std::int64_t j0 = 0; j0 < n; j0 += block) {
    const std::int64_t j1 = std::min(n, j0 + block);
    std::int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
      row_block<4>(a + r * lda, lda, w, ldw, out + r * ldo, ldo, j0, j1, depth);
    switch (rows - r) {
    case 3: row_block<3>(a + r * lda, lda, w, ldw, out + r * ldo, ldo, j0, j1, depth); break;
    case 2: row_block<2>(a + r * lda, lda, w, ldw, out + r * ldo, ldo, j0, j1, depth); break;
    case 1: row_block<1>(a + r * lda, lda, w, ldw, out + r * ldo, ldo, j0, j1, depth); break;
    default: break;
    }
  }
}

void matmul_nt_impl(const float* a, std::int64_t lda, const void* w, rlsync::dtype type, std::int64_t ldw,
                    float* out, std::int64_t ldo, std::int64_t rows, std::int64_t n, std::int64_t depth) {
  switch (type) {
  case rlsync::dtype::f32:
    matmul_nt_typed(a, lda, static_cast<const float*>(w), ldw, out, ldo, rows, n, depth);
    break;
  case rlsync::dtype::bf16:
    matmul_nt_typed(a, lda, static_cast<const bf16_t*>(w), ldw, out, ldo, rows, n, depth);
    break;
  case rlsync::dtype::f16:
    matmul_nt_typed(a, lda, static_cast<const f16_t*>(w), ldw, out, ldo, rows, n, depth);
    break;
  }
}

// int8 weights: the same sums over the widened q (exact), each output
// scaled by its row's scale once.
void matmul_nt_i8_impl(const float* a, std::int64_t lda, const std::int8_t* w, const float* row_scales,
                       std::int64_t ldw, float* out, std::int64_t ldo, std::int64_t rows, std::int64_t n,
                       std::int64_t depth) {
  matmul_nt_typed(a, lda, w, ldw, out, ldo, rows, n, depth);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < n; ++j)
      out[r * ldo + j] *= row_scales[j];
}

float dot_impl(const float* a, const float* b, std::int64_t depth) {
  float out;
  micro<1, 1>(a, 0, b, 0, &out, 0, depth);
  return out;
}
