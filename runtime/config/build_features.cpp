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

namespace {

bool narrowed = false;
build_features narrowed_to;

} // namespace

build_features validated_features() {
  build_features f{cuda_compiled_in(), nccl_compiled_in()};
  if (narrowed) {
    f.cuda = f.cuda && narrowed_to.cuda;
    f.nccl = f.nccl && narrowed_to.nccl;
  }
  f.nccl = f.nccl && f.cuda; // NCCL is linked only into a CUDA build
  return f;
}

scoped_build_features::scoped_build_features(build_features f) {
  narrowed = true;
  narrowed_to = f;
}

scoped_build_features::~scoped_build_features() { narrowed = false; }

const char* why_no_cuda() {
  return "gpu/ was configured without nvcc: none found, or -DRLSYNC_WITH_CUDA=OFF";
}

} // namespace rlsync
