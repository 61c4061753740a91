#include "runtime/config/build_features.hpp"

namespace rlsync {

bool cuda_compiled_in() {
#if defined(RLSYNC_CUDA_COMPILED_IN)
  return true;
#else
  return false;
#endif
}

bool nccl_compiled_in() {
#if defined(RLSYNC_NCCL_COMPILED_IN)
  return true;
#else
  return false;
#endif
}

} // namespace rlsync
