// Built when nvcc is absent: every GPU entry point reports "unavailable".
#include "gpu/device.hpp"

namespace rlsync::gpu {

device_info query_devices() {
  device_info info;
  info.detail = "rlsync was built without CUDA";
  return info;
}

bool bf16_to_f32(const std::uint16_t*, float*, std::size_t, std::string& why) {
  why = "rlsync was built without CUDA";
  return false;
}

} // namespace rlsync::gpu
