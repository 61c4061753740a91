#pragma once
// A transfer::tensor_device over host memory: "device" pointers are host
// pointers, every copy a memcpy, a page lock a count. Made with
// make_shared: what it hands out keeps it alive. Counts what external_source asked of it and
// fails on request, so the device push is tested on the CPU.
#include "runtime/transfer/external_source.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <vector>

namespace rlsync::test {

class fake_tensor_device final : public transfer::tensor_device,
                                 public std::enable_shared_from_this<fake_tensor_device> {
public:
  std::atomic<int> to_host_calls{0};
  std::atomic<int> device_copies{0}; ///< device_to_device calls
  std::atomic<int> allocations{0};
  std::atomic<int> live{0}; ///< allocations not freed yet
  std::vector<int> read_from; ///< the device of each to_host call
  int allocated_on = -1;      ///< the device of the last allocation
  bool fail_allocate = false;
  bool fail_copy = false;

  std::atomic<int> pins{0};
  std::atomic<int> pinned{0}; ///< pins not dropped yet
  bool fail_pin = false;

  std::shared_ptr<void> pin_host(void* p, std::size_t) override {
    if (fail_pin)
      throw std::runtime_error("cudaHostRegister: out of memory (a memlock limit)");
    ++pins;
    ++pinned;
    return {p, [self = shared_from_this()](void*) { --self->pinned; }}; // counted even after its source is gone
  }
  void to_host(void* to, const void* from, std::size_t n, int device) override {
    ++to_host_calls;
    record(device);
    std::memcpy(to, from, n);
  }
  std::shared_ptr<void> allocate(std::size_t bytes, int device) override {
    if (fail_allocate)
      throw std::runtime_error("cudaMalloc: out of memory");
    ++allocations;
    ++live;
    allocated_on = device;
    return {std::malloc(bytes), [self = shared_from_this()](void* p) {
              --self->live;
              std::free(p);
            }};
  }
  void device_to_device(void* to, int, const void* from, std::size_t n) override {
    if (fail_copy)
      throw std::runtime_error("cudaMemcpy: an illegal memory access");
    ++device_copies;
    std::memcpy(to, from, n);
  }

private:
  std::mutex mutex_;
  void record(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    read_from.push_back(device);
  }
};

/// `s`'s tensors as a trainer's state_dict on CUDA device `device` (-1:
/// host memory): borrowed from `s`.
inline std::vector<transfer::tensor_input> state_dict_of(const transfer::weight_snapshot& s, int device) {
  std::vector<transfer::tensor_input> inputs;
  for (const auto& t : s.tensors())
    inputs.push_back({t.name, t.type, t.shape, t.data, t.size, device});
  return inputs;
}

/// The source of a PyTorch rank of model `c` (bf16) that reads device
/// tensors with `device` and keeps their copies on device 0.
inline std::shared_ptr<transfer::external_source> device_pushed_source(const model_config& c,
                                                                       std::shared_ptr<fake_tensor_device> device) {
  transfer::external_options o;
  o.config = c;
  o.type = dtype::bf16;
  o.device = std::move(device);
  o.device_copy_on = 0;
  return std::make_shared<transfer::external_source>(std::move(o));
}

} // namespace rlsync::test
