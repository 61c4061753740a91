#pragma once
// Device memory and the kernels the GPU data planes run: replay plan
// entries into a packed buffer (gather) and back (scatter), convert dtypes,
// quantize for the int8 process step, checksum. Every kernel runs on the
// calling thread's current device and default stream and has finished when
// the call returns (the pipelined transports will take streams).
//
// Built without CUDA (kernels_stub.cpp) every entry point throws gpu_error
// "rlsync was built without CUDA": nothing pretends to have run.
#include "gpu/flat_view.hpp"
#include "runtime/base/dtype.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

namespace rlsync::gpu {

struct gpu_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// `size` bytes at `data` that `Release` gives back on destruction (cudaFree,
/// cudaFreeHost, cudaIpcCloseMemHandle). Move-only.
template <class Release>
class owned_memory {
public:
  owned_memory() = default;
  ~owned_memory() { reset(); }
  owned_memory(owned_memory&& other) noexcept : data_(other.data_), size_(other.size_) {
    other.data_ = nullptr;
    other.size_ = 0;
  }
  owned_memory& operator=(owned_memory&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = other.data_;
      size_ = other.size_;
      other.data_ = nullptr;
      other.size_ = 0;
    }
    return *this;
  }
  owned_memory(const owned_memory&) = delete;
  owned_memory& operator=(const owned_memory&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }

protected:
  void adopt(void* data, std::size_t size) {
    reset();
    data_ = data;
    size_ = size;
  }

private:
  void reset() {
    if (data_)
      Release{}(data_);
    data_ = nullptr;
    size_ = 0;
  }
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

struct free_device {
  void operator()(void* p) const noexcept;
};
struct free_pinned {
  void operator()(void* p) const noexcept;
};

/// `bytes` of device memory (cudaMalloc).
class device_buffer : public owned_memory<free_device> {
public:
  device_buffer() = default;
  explicit device_buffer(std::size_t bytes); ///< throws gpu_error
};

/// `bytes` of page-locked host memory (cudaHostAlloc), which H2D/D2H copies
/// and NCCL's proxies read at full speed.
class pinned_buffer : public owned_memory<free_pinned> {
public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t bytes); ///< throws gpu_error
};

/// Page-locks `bytes` of host memory the caller owns at `p`
/// (cudaHostRegister), so device-to-host copies into it run at full speed;
/// unlocked when the returned pointer is dropped, which must happen before
/// the memory is freed. Throws gpu_error.
std::shared_ptr<void> register_host(void* p, std::size_t bytes);

/// Makes `device` the calling thread's current CUDA device for its
/// lifetime and restores the one before: the nccl plane's links run on
/// whatever thread polls them (a sender's, a puller's, an actor's), each
/// on its own device. Throws gpu_error (or, built without CUDA, that).
class device_guard {
public:
  explicit device_guard(int device);
  /// Never throws (for aborts and destructors): ok() says whether `device`
  /// is current.
  device_guard(int device, std::nothrow_t) noexcept;
  ~device_guard();
  bool ok() const { return ok_; }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

private:
  int previous_ = 0;
  bool ok_ = false;
  bool restore_ = false;
};

enum class copy_kind { host_to_device, device_to_host, device_to_device };
/// cudaMemcpy, then a check of the result; the bytes are on the device (or
/// host) when it returns, for every process. Throws gpu_error.
void copy(void* dst, const void* src, std::size_t bytes, copy_kind kind);

/// packed[i] = source[source_index(v, i)], `element_size` bytes each
/// (2 or 4), device pointers. Throws gpu_error.
void gather(const flat_view& v, const void* source, std::size_t element_size, void* packed);
/// target[source_index(v, i)] = packed[i]; std::invalid_argument when
/// !one_to_one(v) (threads would race on one element).
void scatter(const flat_view& v, const void* packed, std::size_t element_size, void* target);

/// `count` elements from `from` to `to` (bf16/f16 <-> f32, or a copy when
/// equal), bit-identical to convert_to_f32/convert_from_f32 on the host.
/// bf16 <-> f16 is refused (std::invalid_argument): no plane needs it.
void convert(dtype from, const void* source, dtype to, void* target, std::size_t count);

/// The int8 process step of a [rows, cols] matrix of `type` on the device:
/// scales[j] and q[j * cols + k] as engine::process_weights computes them
/// (a row holding NaN or infinity gets a NaN scale and zeros).
void quantize_int8(dtype type, const void* matrix, std::int64_t rows, std::int64_t cols, float* scales,
                   std::int8_t* q);

/// mixsum64 (mixsum.hpp) of `bytes` bytes of device memory.
std::uint64_t mixsum64_device(const void* data, std::size_t bytes);

} // namespace rlsync::gpu
