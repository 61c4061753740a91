#include "gpu/device.hpp"

#include <nccl.h>

namespace rlsync::gpu {

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess)
    return {};
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "."
         + std::to_string(v % 100);
}

} // namespace rlsync::gpu
