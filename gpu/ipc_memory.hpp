#pragma once
// The device half of the cuda_ipc backend behind an interface: a producer
// allocates one buffer it exports, consumers in other processes map it and
// read from it. cuda_ipc_memory() is the CUDA one (device memory on the
// current device, cudaIpcGetMemHandle / cudaIpcOpenMemHandle, cudaMemcpy);
// the CPU tests run the whole protocol over a host-memory fake
// (tests/gpu/fake_ipc_memory.hpp), so only the copies themselves need a GPU.
#include "gpu/cuda_ipc.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>

namespace rlsync::gpu {
class pack_device; // gpu/device_pack.hpp
}

namespace rlsync::gpu {

class ipc_memory {
public:
  virtual ~ipc_memory() = default;

  /// The producer's exported buffer.
  class buffer {
  public:
    virtual ~buffer() = default;
    virtual const ipc_handle& handle() const = 0;
    virtual std::size_t size() const = 0;
    /// Copies `n` host bytes to [offset, offset + n). Throws gpu_error, or
    /// std::out_of_range past size().
    virtual void write(std::size_t offset, const std::uint8_t* from, std::size_t n) = 0;
    /// Copies `n` bytes of this process's memory from packer() (the
    /// producer's device copy of a version) to [offset, offset + n),
    /// device to device. Throws as write().
    virtual void write_from_device(std::size_t offset, const void* from, std::size_t n) = 0;
  };
  /// A consumer's view of another process's buffer.
  class mapping {
  public:
    virtual ~mapping() = default;
    /// Copies [offset, offset + n) to host memory. Throws gpu_error, or
    /// std::out_of_range past the size the mapping was opened with.
    virtual void read(std::size_t offset, std::uint8_t* to, std::size_t n) const = 0;
    /// Where [offset, offset + n) lies in this process: device memory of
    /// the exporting device, mapped (readable from packer()'s device by
    /// unified addressing): a consumer that keeps the bytes on the device
    /// copies from there. Throws as read().
    virtual const void* at(std::size_t offset, std::size_t n) const = 0;
  };

  /// Throws gpu_error (no device, out of memory).
  virtual std::unique_ptr<buffer> allocate(std::size_t bytes) = 0;
  /// Maps a buffer another process exported, `bytes` long as its producer
  /// says. Throws gpu_error (a handle from another host, a stale one).
  virtual std::unique_ptr<mapping> map(const ipc_handle& handle, std::size_t bytes) = 0;
  /// Where the producer keeps its copy of each version it serves
  /// (device_pack.hpp), memory that write_from_device reads: CUDA's on the
  /// buffer's device, host memory in the fake.
  virtual std::shared_ptr<pack_device> packer() = 0;
};

/// The CUDA implementation. Throws gpu_error naming what is missing: a
/// build without CUDA, or no device visible at start-up.
std::shared_ptr<ipc_memory> cuda_ipc_memory();

/// Throws std::out_of_range unless [offset, offset + n) lies within `size`
/// (overflow-checked): the check every implementation makes first.
void check_range(std::size_t offset, std::size_t n, std::size_t size, const char* what);

} // namespace rlsync::gpu
