// Built when NCCL is absent.
#include "gpu/device.hpp"

namespace rlsync::gpu {

std::string nccl_version() { return {}; }

} // namespace rlsync::gpu
