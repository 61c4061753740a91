#include "runtime/config/build_features.hpp"

#include <atomic>

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

// Bit 0: CUDA allowed, bit 1: NCCL allowed. Atomic so that a validation on
// another thread never reads a torn value; tests narrow it on one thread.
constexpr unsigned all_features = 3;
std::atomic<unsigned> allowed{all_features};

unsigned bits(build_features f) { return (f.cuda ? 1u : 0u) | (f.nccl ? 2u : 0u); }

} // namespace

build_features validated_features() {
  const unsigned a = allowed.load();
  build_features f{cuda_compiled_in() && (a & 1u), nccl_compiled_in() && (a & 2u)};
  f.nccl = f.nccl && f.cuda; // NCCL is linked only into a CUDA build
  return f;
}

scoped_build_features::scoped_build_features(build_features narrowed)
  : previous_(allowed.exchange(allowed.load() & bits(narrowed))) {}

scoped_build_features::~scoped_build_features() { allowed.store(previous_); }

const char* why_no_cuda() {
  return "gpu/ was configured without nvcc: none found, or -DRLSYNC_WITH_CUDA=OFF";
}

} // namespace rlsync
