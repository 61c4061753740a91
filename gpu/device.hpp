#pragma once
// The GPU side of rlsync, behind an interface that compiles everywhere.
// With CUDA these functions run kernels; without it (stubs) they report
// "unavailable" and never pretend to have done work.
#include <cstddef>
#include <cstdint>
#include <string>

namespace rlsync::gpu {

/// What the build and the machine offer.
struct device_info {
  bool compiled_with_cuda = false; ///< gpu/ was built by nvcc
  bool compiled_with_nccl = false; ///< NCCL was found and linked
  int device_count = 0;            ///< CUDA devices visible now
  std::string detail;              ///< why none, or the first device's name
};

/// Queries the CUDA runtime (no-op in the stub build). Never throws.
device_info query_devices();

/// Converts `count` bf16 values to fp32 on device 0, round-tripping through
/// device memory. Returns false (and sets `why`) when no device is usable.
bool bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t count, std::string& why);

/// NCCL's version as "major.minor.patch", or empty without NCCL.
std::string nccl_version();

} // namespace rlsync::gpu
