#pragma once
// Packing a worker's shard on the producer's device (nccl, sharded): the
// rank copies each version it serves to device memory once
// (device_snapshot), and every worker's group is then gathered there,
// straight into the link's staging, with its checksum after it:
//
//   layout_group()   plan entries of one group -> pieces (source tensor,
//                    flat_view, offset in the packed bytes): pure, checked
//                    as transfer::pack_group checks, every view bounded
//   pack_device      where the copy lives and the gathers run: CUDA's
//                    (gpu::gather per piece, mixsum64_device) or host
//                    memory for the CPU tests; both write the packed bytes
//                    and then mixsum64 of them in 8 little-endian bytes
//                    (the device cannot compute XXH3; the receiver
//                    verifies mixsum64 on the host)
//
// The packed bytes equal transfer::pack_group's bit for bit.
#include "gpu/flat_view.hpp"
#include "runtime/plan/grouped_plan.hpp"
#include "runtime/transfer/external_source.hpp"
#include "runtime/transfer/weight_source.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace rlsync::gpu {

/// One plan entry's elements: from tensor `tensor` (its index in the
/// snapshot's tensors()), `view` of it, to `out_offset` bytes into the pack.
struct pack_piece {
  std::size_t tensor = 0;
  flat_view view;
  std::size_t element_size = 0;
  std::uint64_t out_offset = 0;
};

struct pack_layout {
  std::vector<pack_piece> pieces;
  std::uint64_t bytes = 0; ///< packed bytes, without the 8-byte checksum after them
};

/// Group `g` of worker plan `p` over the tensors of `s`. Throws
/// std::invalid_argument naming the tensor when `s` lacks one, holds it in
/// another dtype or shape than the plan recorded, or a view does not fit it.
pack_layout layout_group(const plan::grouped_plan& p, std::uint32_t g, const transfer::weight_snapshot& s);
/// As above, over one whole group's `tensors` (pieces index into them): an
/// engine packing a group it received whole, as its plan would have packed it.
pack_layout layout_group(const plan::grouped_plan& p, std::uint32_t g, const std::vector<tensor_view>& tensors);

/// Device memory and the pack kernels.
class pack_device {
public:
  virtual ~pack_device() = default;
  /// The CUDA device its memory and kernels are on (for host memory: the
  /// one it stands for).
  virtual int ordinal() const = 0;
  /// `bytes` of device memory, freed with the pointer. Throws gpu_error.
  virtual std::shared_ptr<void> allocate(std::size_t bytes) = 0;
  /// Copies `n` host bytes to device memory at `to`.
  virtual void upload(void* to, const void* from, std::size_t n) = 0;
  /// Copies `n` bytes of device memory at `from` to host memory.
  virtual void download(void* to, const void* from, std::size_t n) = 0;
  /// Gathers `layout` from `sources` (device pointers, one per tensor) into
  /// `out` (device memory of layout.bytes + 8), then writes mixsum64 of the
  /// packed bytes after them. Finished when it returns.
  virtual void pack(const pack_layout& layout, const std::vector<const void*>& sources, void* out) = 0;
  /// Copies `pieces` (device memory: whole tensors of the copy) to `out`
  /// back to back, device to device. Finished when it returns.
  struct piece {
    const void* data = nullptr;
    std::size_t bytes = 0;
  };
  virtual void concat(const std::vector<piece>& pieces, void* out) = 0;
};

/// CUDA's, on device `device` (the trainer rank's link's, so that the
/// gathers read and write one device). Built without CUDA every call
/// throws gpu_error.
std::shared_ptr<pack_device> cuda_pack_device(int device = 0);
/// Host memory and the CPU replays (gather_host, mixsum64): what the CPU
/// tests run the nccl plane with, over the fake NCCL world. It stands for
/// device `ordinal` there (device 0 adopts the copies a fake tensor_device
/// made "on" it; never use it beside real CUDA copies).
std::shared_ptr<pack_device> host_pack_device(int ordinal = 0);

/// One version's tensors in device memory, each aligned as
/// transfer::device_copy_aligned lays them out, shared by every worker's
/// pack: uploaded once from the host bytes, or, for a version pushed from
/// the pack device's own device (s.on_device()), that copy, adopted as it is.
class device_snapshot {
public:
  /// Uploads `s`. Throws gpu_error (out of device memory) or what `device` throws.
  device_snapshot(const transfer::weight_snapshot& s, pack_device& device);
  /// The copy `s` was pushed with, when its source still holds it and it
  /// lies on `device`'s own device; nullptr otherwise (never an upload).
  static std::shared_ptr<const device_snapshot> adopt(const transfer::weight_snapshot& s, const pack_device& device);
  /// Whether the snapshot adopted the version's device copy (no upload).
  bool adopted() const { return adopted_; }
  std::uint64_t version() const { return version_; }
  std::uint64_t bytes() const { return bytes_; }
  /// Device pointers, one per tensor of the snapshot, in its order.
  const std::vector<const void*>& sources() const { return sources_; }

private:
  std::uint64_t version_ = 0;
  std::uint64_t bytes_ = 0;
  device_snapshot() = default;
  void adopt_from(const transfer::weight_snapshot& s, std::shared_ptr<const transfer::device_resident> resident);

  std::shared_ptr<const void> memory_;
  std::vector<const void*> sources_;
  bool adopted_ = false;
};

/// Reads a PyTorch trainer's CUDA tensors for transfer::external_source
/// (device to host, device to device), with cudaMemcpy on the calling
/// thread. Built without CUDA every call throws gpu_error.
std::shared_ptr<transfer::tensor_device> cuda_tensor_device();

} // namespace rlsync::gpu
