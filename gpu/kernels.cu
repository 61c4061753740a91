// The CUDA side of kernels.hpp. Each kernel walks its elements with a grid
// stride; the per-element arithmetic comes from headers the CPU path uses
// too (flat_view.hpp, dtype_bits.hpp, int8_bits.hpp, mixsum.hpp), which is
// what makes the two paths agree bit for bit.
#include "gpu/cuda_ipc.hpp"
#include "gpu/kernels.hpp"
#include "gpu/mixsum.hpp"
#include "runtime/base/dtype_bits.hpp"
#include "runtime/engine/int8_bits.hpp"

#include <cuda_runtime.h>

#include <cstring>

namespace rlsync::gpu {
namespace {

constexpr int threads_per_block = 256;
constexpr int max_blocks = 4096;

int blocks_for(std::int64_t n) {
  std::int64_t b = (n + threads_per_block - 1) / threads_per_block;
  return static_cast<int>(b < 1 ? 1 : (b > max_blocks ? max_blocks : b));
}

void check(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess)
    return;
  // The runtime also keeps the error as the thread's last one, which
  // PyTorch (sharing libcudart in a trainer's process) would read at its
  // next launch check and raise for: an error rlsync handles is cleared.
  cudaGetLastError();
  throw gpu_error(what + ": " + cudaGetErrorString(e));
}

/// A launch's errors come back at launch (bad configuration) or at the
/// synchronisation (a fault inside the kernel).
void finish_launch(const char* kernel) {
  check(cudaGetLastError(), std::string("launching ") + kernel);
  check(cudaDeviceSynchronize(), std::string("running ") + kernel);
}

__device__ std::int64_t global_thread() { return blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; }
__device__ std::int64_t grid_threads() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

template <class T>
__global__ void gather_kernel(flat_view v, const T* source, T* packed) {
  for (std::int64_t i = global_thread(); i < v.numel; i += grid_threads())
    packed[i] = source[source_index(v, i)];
}

template <class T>
__global__ void scatter_kernel(flat_view v, const T* packed, T* target) {
  for (std::int64_t i = global_thread(); i < v.numel; i += grid_threads())
    target[source_index(v, i)] = packed[i];
}

template <template <class> class Kernel, class... Args>
void launch_by_size(const char* name, std::size_t element_size, std::int64_t n, const void* a, void* b, Args... args) {
  const int blocks = blocks_for(n);
  switch (element_size) {
  case 2:
    Kernel<std::uint16_t>::run(blocks, args..., static_cast<const std::uint16_t*>(a), static_cast<std::uint16_t*>(b));
    break;
  case 4:
    Kernel<std::uint32_t>::run(blocks, args..., static_cast<const std::uint32_t*>(a), static_cast<std::uint32_t*>(b));
    break;
  default:
    throw std::invalid_argument(std::string(name) + ": element size " + std::to_string(element_size)
                                + " (2 or 4 expected)");
  }
  finish_launch(name);
}

template <class T>
struct gather_launch {
  static void run(int blocks, const flat_view& v, const T* a, T* b) {
    gather_kernel<T><<<blocks, threads_per_block>>>(v, a, b);
  }
};
template <class T>
struct scatter_launch {
  static void run(int blocks, const flat_view& v, const T* a, T* b) {
    scatter_kernel<T><<<blocks, threads_per_block>>>(v, a, b);
  }
};

__device__ float load_as_f32(dtype t, const void* p, std::int64_t i) {
  switch (t) {
  case dtype::bf16: return dtype_bits::bf16_to_f32_inline(static_cast<const std::uint16_t*>(p)[i]);
  case dtype::f16: return dtype_bits::f16_to_f32_inline(static_cast<const std::uint16_t*>(p)[i]);
  case dtype::f32: return static_cast<const float*>(p)[i];
  }
  return 0.0f;
}

__global__ void to_f32_kernel(dtype from, const void* source, float* target, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    target[i] = load_as_f32(from, source, i);
}

__global__ void from_f32_kernel(dtype to, const float* source, std::uint16_t* target, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    target[i] = to == dtype::bf16 ? dtype_bits::f32_to_bf16_inline(source[i]) : dtype_bits::f32_to_f16_inline(source[i]);
}

/// One block per row: the block reduces the row's |max| and finiteness in
/// shared memory, then quantizes the row with the shared scale.
__global__ void quantize_kernel(dtype type, const void* matrix, std::int64_t cols, float* scales, std::int8_t* q) {
  __shared__ float amax_of[threads_per_block];
  __shared__ int finite_of[threads_per_block];
  const std::int64_t row = blockIdx.x;
  const std::int64_t base = row * cols;
  float amax = 0.0f;
  int finite = 1;
  for (std::int64_t k = threadIdx.x; k < cols; k += blockDim.x) {
    const float x = load_as_f32(type, matrix, base + k);
    finite &= isfinite(x) ? 1 : 0;
    amax = fmaxf(amax, fabsf(x));
  }
  amax_of[threadIdx.x] = amax;
  finite_of[threadIdx.x] = finite;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) {
      amax_of[threadIdx.x] = fmaxf(amax_of[threadIdx.x], amax_of[threadIdx.x + half]);
      finite_of[threadIdx.x] &= finite_of[threadIdx.x + half];
    }
    __syncthreads();
  }
  const bool row_finite = finite_of[0] != 0;
  const float scale = row_finite ? engine::int8_bits::row_scale(amax_of[0]) : __int_as_float(0x7fc00000);
  if (threadIdx.x == 0)
    scales[row] = scale;
  for (std::int64_t k = threadIdx.x; k < cols; k += blockDim.x)
    q[base + k] = row_finite ? engine::int8_bits::quantize(load_as_f32(type, matrix, base + k), scale) : 0;
}

__device__ std::uint64_t load_word(const unsigned char* p, std::size_t bytes, std::int64_t word) {
  const std::size_t at = static_cast<std::size_t>(word) * 8;
  std::uint64_t w = 0;
  for (int b = 0; b < 8 && at + b < bytes; ++b)
    w |= static_cast<std::uint64_t>(p[at + b]) << (8 * b);
  return w;
}

__global__ void mixsum_kernel(const unsigned char* data, std::size_t bytes, unsigned long long* sum) {
  __shared__ unsigned long long part[threads_per_block];
  const std::int64_t words = static_cast<std::int64_t>((bytes + 7) / 8);
  const bool aligned = (reinterpret_cast<std::uintptr_t>(data) % 8) == 0;
  std::uint64_t s = 0;
  for (std::int64_t i = global_thread(); i < words; i += grid_threads()) {
    const bool whole = static_cast<std::size_t>(i + 1) * 8 <= bytes;
    const std::uint64_t w = aligned && whole ? reinterpret_cast<const std::uint64_t*>(data)[i] : load_word(data, bytes, i);
    s += mixsum_term(w, static_cast<std::uint64_t>(i));
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half)
      part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    atomicAdd(sum, part[0]); // wraps mod 2^64, as the host sum does
}

} // namespace

// Frees run where the last pointer drops, a trainer's Python thread among
// them: an error is cleared, not left for PyTorch's next launch check.
void free_device::operator()(void* p) const noexcept {
  if (cudaFree(p) != cudaSuccess)
    cudaGetLastError();
}
void free_pinned::operator()(void* p) const noexcept { cudaFreeHost(p); }
void close_ipc::operator()(void* p) const noexcept { cudaIpcCloseMemHandle(p); }

device_buffer::device_buffer(std::size_t bytes) {
  void* p = nullptr;
  if (bytes > 0)
    check(cudaMalloc(&p, bytes), "cudaMalloc(" + std::to_string(bytes) + " bytes)");
  adopt(p, bytes);
}

std::shared_ptr<void> register_host(void* p, std::size_t bytes) {
  check(cudaHostRegister(p, bytes, cudaHostRegisterDefault), "cudaHostRegister(" + std::to_string(bytes) + " bytes)");
  return {p, [](void* q) {
            if (cudaHostUnregister(q) != cudaSuccess)
              cudaGetLastError();
          }};
}

pinned_buffer::pinned_buffer(std::size_t bytes) {
  void* p = nullptr;
  if (bytes > 0)
    check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc(" + std::to_string(bytes) + " bytes)");
  adopt(p, bytes);
}

// Set and restored only when it differs from the thread's current device.
device_guard::device_guard(int device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (device != previous_) {
    check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
    restore_ = true;
  }
  ok_ = true;
}

device_guard::device_guard(int device, std::nothrow_t) noexcept {
  if (cudaGetDevice(&previous_) != cudaSuccess)
    return;
  if (device == previous_) {
    ok_ = true;
    return;
  }
  ok_ = cudaSetDevice(device) == cudaSuccess;
  restore_ = ok_;
}

device_guard::~device_guard() {
  if (restore_)
    cudaSetDevice(previous_);
}

void copy(void* dst, const void* src, std::size_t bytes, copy_kind kind) {
  const cudaMemcpyKind k = kind == copy_kind::host_to_device   ? cudaMemcpyHostToDevice
                           : kind == copy_kind::device_to_host ? cudaMemcpyDeviceToHost
                                                               : cudaMemcpyDeviceToDevice;
  check(cudaMemcpy(dst, src, bytes, k), "cudaMemcpy(" + std::to_string(bytes) + " bytes)");
  // From pageable host memory cudaMemcpy may return once the bytes are
  // staged, before they reach the device; another process reading them
  // (cuda_ipc) must see them all, so the copy ends here.
  if (kind != copy_kind::device_to_host)
    check(cudaStreamSynchronize(0), "cudaStreamSynchronize after cudaMemcpy");
}

void gather(const flat_view& v, const void* source, std::size_t element_size, void* packed) {
  if (v.numel > 0)
    launch_by_size<gather_launch>("gather", element_size, v.numel, source, packed, v);
}

void scatter(const flat_view& v, const void* packed, std::size_t element_size, void* target) {
  if (!one_to_one(v))
    throw std::invalid_argument("scatter into a view whose elements overlap (a stride of 0, or dims that interleave)");
  if (v.numel > 0)
    launch_by_size<scatter_launch>("scatter", element_size, v.numel, packed, target, v);
}

void convert(dtype from, const void* source, dtype to, void* target, std::size_t count) {
  if (count == 0)
    return;
  const auto n = static_cast<std::int64_t>(count);
  if (from == to) {
    copy(target, source, count * dtype_size(from), copy_kind::device_to_device);
  } else if (to == dtype::f32) {
    to_f32_kernel<<<blocks_for(n), threads_per_block>>>(from, source, static_cast<float*>(target), n);
    finish_launch("convert to f32");
  } else if (from == dtype::f32) {
    from_f32_kernel<<<blocks_for(n), threads_per_block>>>(to, static_cast<const float*>(source),
                                                         static_cast<std::uint16_t*>(target), n);
    finish_launch("convert from f32");
  } else {
    throw std::invalid_argument("convert: bf16 <-> f16 is not supported");
  }
}

void quantize_int8(dtype type, const void* matrix, std::int64_t rows, std::int64_t cols, float* scales,
                   std::int8_t* q) {
  if (rows <= 0 || cols <= 0)
    return;
  if (rows > 0x7fffffff)
    throw std::invalid_argument("quantize_int8: " + std::to_string(rows) + " rows (at most 2^31 - 1)");
  quantize_kernel<<<static_cast<unsigned>(rows), threads_per_block>>>(type, matrix, cols, scales, q);
  finish_launch("quantize_int8");
}

std::uint64_t mixsum64_device(const void* data, std::size_t bytes) {
  if (bytes == 0)
    return mixsum_finish(0, 0);
  device_buffer sum(sizeof(unsigned long long));
  check(cudaMemset(sum.data(), 0, sizeof(unsigned long long)), "cudaMemset");
  const auto words = static_cast<std::int64_t>((bytes + 7) / 8);
  mixsum_kernel<<<blocks_for(words), threads_per_block>>>(static_cast<const unsigned char*>(data), bytes,
                                                          static_cast<unsigned long long*>(sum.data()));
  finish_launch("mixsum64");
  unsigned long long host = 0;
  copy(&host, sum.data(), sizeof host, copy_kind::device_to_host);
  return mixsum_finish(host, bytes);
}

static_assert(sizeof(cudaIpcMemHandle_t) == ipc_handle_bytes, "CUDA_IPC_HANDLE_SIZE changed");

ipc_handle export_buffer(const device_buffer& buffer) {
  cudaIpcMemHandle_t raw;
  check(cudaIpcGetMemHandle(&raw, buffer.data()), "cudaIpcGetMemHandle");
  ipc_handle h;
  std::memcpy(h.data(), &raw, h.size());
  return h;
}

ipc_mapping::ipc_mapping(const ipc_handle& handle, std::size_t bytes) {
  cudaIpcMemHandle_t raw;
  std::memcpy(&raw, handle.data(), handle.size());
  void* p = nullptr;
  check(cudaIpcOpenMemHandle(&p, raw, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  adopt(p, bytes);
}

} // namespace rlsync::gpu
