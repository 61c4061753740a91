#pragma once
// The built-in engine on a CUDA device (engine option `device: cuda`):
// each served version is copied to device memory as fp32 (16-bit weights
// widened there by gpu::convert, bit-exact; int8 weights as scale * q), and
// every matrix product of a forward step runs as one cuBLAS SGEMM over that
// copy, with the step's activations copied in and the products copied out.
// Its landings (runtime/engine/device_gemm.hpp) widen the runs a GPU data
// plane hands them into the next version's copy, which then skips their
// upload.
// cuBLAS sums in its own order, so the logits agree with the CPU kernels to
// rounding, not bit for bit, and tp no longer leaves the bits unchanged; two
// runs on one device do agree bit for bit (the default math mode, no TF32).
//
// Built without CUDA, make_engine_device throws gpu_error "rlsync was built
// without CUDA".
#include "runtime/engine/device_gemm.hpp"

#include <memory>

namespace rlsync::gpu {

/// A backend on CUDA device `device`. Throws gpu_error when the build has
/// no CUDA or the machine no such device (the message names it).
std::shared_ptr<engine::device_backend> make_engine_device(int device = 0);

} // namespace rlsync::gpu
