#pragma once
// Device memory for the cuda_ipc protocol, played in host memory: buffers
// are registered under a handle of their own, and a mapping reads the very
// bytes the producer wrote, as a consumer process reads the producer's
// device buffer through CUDA IPC. Shared by the gpu host tests and the
// actor tests of the cuda_ipc puller.
#include "gpu/device_pack.hpp"
#include "gpu/ipc_memory.hpp"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace rlsync::test {

struct fake_ipc_memory : gpu::ipc_memory, std::enable_shared_from_this<fake_ipc_memory> {
  using bytes = std::vector<std::uint8_t>;
  std::mutex mutex;
  std::map<gpu::ipc_handle, std::shared_ptr<bytes>> exported;
  int allocations = 0;
  int mappings_open = 0; ///< mapped now
  int mappings_made = 0;
  /// Set: every read flips the lowest bit of the first byte it returns
  /// (memory that changed under the consumer).
  bool corrupt_reads = false;
  bool fail_writes = false;      ///< set: writes throw as a failing device would
  bool fail_allocations = false; ///< set: allocations throw (out of device memory)

  struct buffer_impl final : gpu::ipc_memory::buffer {
    gpu::ipc_handle h{};
    std::shared_ptr<bytes> data;
    const bool* fail = nullptr;
    const gpu::ipc_handle& handle() const override { return h; }
    std::size_t size() const override { return data->size(); }
    void write(std::size_t offset, const std::uint8_t* from, std::size_t n) override {
      gpu::check_range(offset, n, data->size(), "a write to the exported buffer");
      if (*fail)
        throw gpu::gpu_error("cudaMemcpy: an illegal memory access was encountered");
      if (n > 0)
        std::memcpy(data->data() + offset, from, n);
    }
    void write_from_device(std::size_t offset, const void* from, std::size_t n) override {
      write(offset, static_cast<const std::uint8_t*>(from), n); // "device" memory is host memory here
    }
  };
  struct mapping_impl final : gpu::ipc_memory::mapping {
    std::shared_ptr<fake_ipc_memory> owner;
    std::shared_ptr<bytes> data;
    std::size_t said = 0; ///< the size the producer told
    ~mapping_impl() override {
      std::lock_guard<std::mutex> lock(owner->mutex);
      --owner->mappings_open;
    }
    void read(std::size_t offset, std::uint8_t* to, std::size_t n) const override {
      gpu::check_range(offset, n, std::min(said, data->size()), "a read from the mapped buffer");
      if (n == 0)
        return;
      std::memcpy(to, data->data() + offset, n);
      if (owner->corrupt_reads)
        to[0] ^= 1;
    }
    const void* at(std::size_t offset, std::size_t n) const override {
      gpu::check_range(offset, n, std::min(said, data->size()), "a read from the mapped buffer");
      return data->data() + offset;
    }
  };

  std::unique_ptr<buffer> allocate(std::size_t n) override {
    std::lock_guard<std::mutex> lock(mutex);
    if (fail_allocations)
      throw gpu::gpu_error("cudaMalloc(" + std::to_string(n) + " bytes): out of memory");
    auto b = std::make_unique<buffer_impl>();
    b->fail = &fail_writes;
    ++allocations;
    b->h[0] = static_cast<std::uint8_t>(allocations);
    b->h[1] = 0xa5;
    b->data = std::make_shared<bytes>(n);
    exported[b->h] = b->data;
    return b;
  }
  std::shared_ptr<gpu::pack_device> packer() override { return packs; }
  std::shared_ptr<gpu::pack_device> packs = gpu::host_pack_device();

  std::unique_ptr<mapping> map(const gpu::ipc_handle& h, std::size_t n) override {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = exported.find(h);
    if (it == exported.end())
      throw gpu::gpu_error("cudaIpcOpenMemHandle: invalid argument (no such buffer)");
    auto m = std::make_unique<mapping_impl>();
    m->owner = shared_from_this();
    m->data = it->second;
    m->said = n;
    ++mappings_open;
    ++mappings_made;
    return m;
  }
};

} // namespace rlsync::test
