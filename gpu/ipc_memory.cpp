#include "gpu/ipc_memory.hpp"

#include "gpu/device.hpp"
#include "gpu/device_pack.hpp"

#include <stdexcept>
#include <string>

namespace rlsync::gpu {

void check_range(std::size_t offset, std::size_t n, std::size_t size, const char* what) {
  if (offset > size || n > size - offset)
    throw std::out_of_range(std::string(what) + " [" + std::to_string(offset) + ", +" + std::to_string(n)
                            + ") outside a buffer of " + std::to_string(size) + " bytes");
}

namespace {

class cuda_buffer final : public ipc_memory::buffer {
public:
  explicit cuda_buffer(std::size_t bytes) : memory_(bytes), handle_(export_buffer(memory_)) {}
  const ipc_handle& handle() const override { return handle_; }
  std::size_t size() const override { return memory_.size(); }
  void write(std::size_t offset, const std::uint8_t* from, std::size_t n) override {
    check_range(offset, n, memory_.size(), "a write to the exported buffer");
    copy(static_cast<std::uint8_t*>(memory_.data()) + offset, from, n, copy_kind::host_to_device);
  }
  void write_from_device(std::size_t offset, const void* from, std::size_t n) override {
    check_range(offset, n, memory_.size(), "a write to the exported buffer");
    copy(static_cast<std::uint8_t*>(memory_.data()) + offset, from, n, copy_kind::device_to_device);
  }

private:
  device_buffer memory_;
  ipc_handle handle_;
};

class cuda_mapping final : public ipc_memory::mapping {
public:
  cuda_mapping(const ipc_handle& handle, std::size_t bytes) : mapped_(handle, bytes) {}
  void read(std::size_t offset, std::uint8_t* to, std::size_t n) const override {
    copy(to, at(offset, n), n, copy_kind::device_to_host);
  }
  const void* at(std::size_t offset, std::size_t n) const override {
    check_range(offset, n, mapped_.size(), "a read from the mapped buffer");
    return static_cast<const std::uint8_t*>(mapped_.data()) + offset;
  }

private:
  ipc_mapping mapped_;
};

class cuda_memory final : public ipc_memory {
public:
  std::unique_ptr<buffer> allocate(std::size_t bytes) override { return std::make_unique<cuda_buffer>(bytes); }
  std::unique_ptr<mapping> map(const ipc_handle& handle, std::size_t bytes) override {
    return std::make_unique<cuda_mapping>(handle, bytes);
  }
  // The buffer lives on the current device, device 0 of what the process sees.
  std::shared_ptr<pack_device> packer() override { return packer_; }

private:
  std::shared_ptr<pack_device> packer_ = cuda_pack_device(0);
};

} // namespace

std::shared_ptr<ipc_memory> cuda_ipc_memory() {
  auto info = query_devices();
  if (!info.compiled_with_cuda)
    throw gpu_error("rlsync was built without CUDA");
  if (info.device_count == 0)
    throw gpu_error("no CUDA device is visible to this process" + (info.detail.empty() ? "" : " (" + info.detail + ")"));
  return std::make_shared<cuda_memory>();
}

} // namespace rlsync::gpu
