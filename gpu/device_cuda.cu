#include "gpu/device.hpp"

#include <cuda_runtime.h>

namespace rlsync::gpu {
namespace {

__global__ void bf16_to_f32_kernel(const std::uint16_t* src, float* dst, std::size_t n) {
  std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (; i < n; i += stride)
    dst[i] = __uint_as_float(static_cast<unsigned>(src[i]) << 16);
}

bool check(cudaError_t e, const char* what, std::string& why) {
  if (e == cudaSuccess)
    return true;
  why = std::string(what) + ": " + cudaGetErrorString(e);
  return false;
}

} // namespace

device_info query_devices() {
  device_info info;
  info.compiled_with_cuda = true;
#ifdef RLSYNC_HAVE_NCCL
  info.compiled_with_nccl = true;
#endif
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    info.detail = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return info;
  }
  info.device_count = n;
  if (n > 0) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
      info.detail = prop.name;
  } else {
    info.detail = "no CUDA device";
  }
  return info;
}

bool bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t count, std::string& why) {
  if (query_devices().device_count == 0) {
    why = "no CUDA device";
    return false;
  }
  std::uint16_t* d_src = nullptr;
  float* d_dst = nullptr;
  bool ok = check(cudaMalloc(&d_src, count * sizeof(std::uint16_t)), "cudaMalloc", why)
            && check(cudaMalloc(&d_dst, count * sizeof(float)), "cudaMalloc", why)
            && check(cudaMemcpy(d_src, src, count * sizeof(std::uint16_t), cudaMemcpyHostToDevice),
                     "cudaMemcpy", why);
  if (ok) {
    bf16_to_f32_kernel<<<256, 256>>>(d_src, d_dst, count);
    ok = check(cudaGetLastError(), "kernel launch", why)
         && check(cudaMemcpy(dst, d_dst, count * sizeof(float), cudaMemcpyDeviceToHost),
                  "cudaMemcpy", why);
  }
  cudaFree(d_src);
  cudaFree(d_dst);
  return ok;
}

} // namespace rlsync::gpu
