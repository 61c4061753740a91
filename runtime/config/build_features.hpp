#pragma once
// What this build of rlsync was compiled with, for validation to refuse
// what it cannot run (gpu/CMakeLists.txt sets the definition when nvcc was
// found, on build_features.cpp alone).

namespace rlsync {

/// gpu/ was built by nvcc: the CUDA data planes exist in this binary.
bool cuda_compiled_in();
/// ... and NCCL was found and linked: the nccl data plane exists too.
bool nccl_compiled_in();

/// What validation takes the build to have. The compiled-in features,
/// unless a scoped_build_features narrows them: every build's tests check
/// the refusals a build without CUDA or NCCL gives, not only the stub's.
struct build_features {
  bool cuda = false;
  bool nccl = false;
};
build_features validated_features();

/// While alive, validation sees at most `narrowed` (never more than was
/// compiled in, nor than an enclosing one allows); its end restores what
/// was seen before. For tests.
class scoped_build_features {
public:
  explicit scoped_build_features(build_features narrowed);
  ~scoped_build_features();
  scoped_build_features(const scoped_build_features&) = delete;
  scoped_build_features& operator=(const scoped_build_features&) = delete;

private:
  unsigned previous_;
};

/// Why a build has no CUDA, for validation's refusals: "this build has none
/// (...)" names how it was configured.
const char* why_no_cuda();

} // namespace rlsync
