// The kernels for the baseline instruction set, on GCC/Clang generic
// vectors of 4 floats (SSE2 on x86-64, NEON on arm64), two per `vec`.
#include "runtime/engine/kernels.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace rlsync::engine::kernels::baseline {

typedef float v4 __attribute__((vector_size(16)));
struct vec {
  v4 lo, hi;
};

#include "runtime/engine/kernels_widen.inl"

inline vec vload(const float* p) {
  vec v;
  std::memcpy(&v.lo, p, sizeof v.lo);
  std::memcpy(&v.hi, p + 4, sizeof v.hi);
  return v;
}
template <class W>
inline vec vload(const W* p) {
  float f[8];
  for (int i = 0; i < 8; ++i)
    f[i] = widen1(p[i]);
  return vload(f);
}
inline vec vzero() { return vec{v4{}, v4{}}; }
inline vec vmadd(vec a, vec b, vec acc) { return vec{acc.lo + a.lo * b.lo, acc.hi + a.hi * b.hi}; }
inline void vstore(float* p, vec v) {
  std::memcpy(p, &v.lo, sizeof v.lo);
  std::memcpy(p + 4, &v.hi, sizeof v.hi);
}
inline float madd(float a, float b, float acc) { return acc + a * b; }

#include "runtime/engine/kernels_impl.inl"

} // namespace rlsync::engine::kernels::baseline
