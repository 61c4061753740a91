// GPU checks: run on a machine with a CUDA device, skip (exit 77) elsewhere.
#include "gpu/device.hpp"

#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  auto info = rlsync::gpu::query_devices();
  if (!info.compiled_with_cuda || info.device_count == 0) {
    std::printf("skipping gpu tests: %s\n", info.detail.c_str());
    return 77;
  }
  std::printf("device: %s\n", info.detail.c_str());
  // bf16 -> fp32 on the device must equal the bit-shift definition on the host.
  std::vector<std::uint16_t> src(1 << 20);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<std::uint16_t>(i * 2654435761u >> 7);
  std::vector<float> dst(src.size());
  std::string why;
  if (!rlsync::gpu::bf16_to_f32(src.data(), dst.data(), src.size(), why)) {
    std::printf("FAIL: bf16_to_f32: %s\n", why.c_str());
    return 1;
  }
  for (size_t i = 0; i < src.size(); ++i) {
    std::uint32_t bits = static_cast<std::uint32_t>(src[i]) << 16;
    float expect;
    std::memcpy(&expect, &bits, 4);
    if (std::memcmp(&expect, &dst[i], 4) != 0) {
      std::printf("FAIL: element %zu differs\n", i);
      return 1;
    }
  }
  std::printf("ok: bf16_to_f32 on %zu elements\n", src.size());
  return 0;
}
