#pragma once
// What this build of rlsync was compiled with, for validation to refuse
// what it cannot run (gpu/CMakeLists.txt sets the definition when nvcc was
// found, on build_features.cpp alone).

namespace rlsync {

/// gpu/ was built by nvcc: the CUDA data planes exist in this binary.
bool cuda_compiled_in();
/// ... and NCCL was found and linked: the nccl data plane exists too.
bool nccl_compiled_in();

} // namespace rlsync
