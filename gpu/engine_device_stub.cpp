#include "gpu/engine_device.hpp"
#include "gpu/kernels.hpp"

namespace rlsync::gpu {

std::shared_ptr<engine::device_backend> make_engine_device(int) {
  throw gpu_error("engine device: rlsync was built without CUDA");
}

} // namespace rlsync::gpu
