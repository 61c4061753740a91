#pragma once
// The int8 process step's per-element arithmetic (process.hpp), shared by
// the CPU path and the CUDA kernels (gpu/) so that both quantize a row to
// the same bits: scale = amax / 127, q = round(w / scale) ties to even,
// clamped to [-127, 127]; a zero row keeps scale 0 and q 0.
#include "runtime/base/host_device.hpp"

#include <cmath>
#include <cstdint>

namespace rlsync::engine::int8_bits {

RLSYNC_HD inline float row_scale(float amax) { return amax / 127.0f; }

RLSYNC_HD inline std::int8_t quantize(float w, float scale) {
  if (!(scale > 0))
    return 0;
#if defined(__CUDA_ARCH__)
  float v = rintf(w / scale);
#else
  float v = std::nearbyint(w / scale);
#endif
  v = v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v);
  return static_cast<std::int8_t>(v);
}

} // namespace rlsync::engine::int8_bits
