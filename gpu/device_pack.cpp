#include "gpu/device_pack.hpp"

#include "gpu/kernels.hpp"
#include "gpu/mixsum.hpp"
#include "runtime/transfer/bucket.hpp"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace rlsync::gpu {

namespace {

/// The pieces of group `g`'s entries, over `tensors` found by `find`;
/// `held` names what holds them, for errors ("version 3").
template <class Find>
pack_layout layout_over(const plan::grouped_plan& p, std::uint32_t g, const std::vector<tensor_view>& tensors,
                        const Find& find, const std::string& held) {
  pack_layout out;
  for (const auto* e : p.entries(g)) {
    const tensor_view* t = find(e->source);
    if (!t)
      throw std::invalid_argument("device pack of group " + std::to_string(g) + ": " + held + " holds no tensor '"
                                  + e->source + "'");
    if (t->type != e->source_type || t->shape != e->source_shape)
      throw std::invalid_argument("device pack of group " + std::to_string(g) + ": tensor '" + e->source
                                  + "' is held in another dtype or shape than the plan recorded");
    pack_piece piece;
    piece.tensor = static_cast<std::size_t>(t - tensors.data());
    piece.element_size = dtype_size(t->type);
    const auto numel = static_cast<std::int64_t>(t->size / piece.element_size);
    try {
      piece.view = flatten(e->view, numel);
    } catch (const std::invalid_argument& why) {
      throw std::invalid_argument("device pack of group " + std::to_string(g) + ": " + e->describe() + ": "
                                  + why.what());
    }
    piece.out_offset = out.bytes;
    if (piece.out_offset % piece.element_size != 0) // the kernels move whole elements, aligned
      throw std::invalid_argument("device pack of group " + std::to_string(g) + ": " + e->describe()
                                  + " would start at byte " + std::to_string(piece.out_offset)
                                  + ", not a multiple of its element size");
    out.bytes += static_cast<std::uint64_t>(piece.view.numel) * piece.element_size; // bounded by the source
    out.pieces.push_back(piece);
  }
  return out;
}

} // namespace

pack_layout layout_group(const plan::grouped_plan& p, std::uint32_t g, const transfer::weight_snapshot& s) {
  return layout_over(p, g, s.tensors(), [&](const std::string& name) { return s.find(name); },
                     "version " + std::to_string(s.version()));
}

pack_layout layout_group(const plan::grouped_plan& p, std::uint32_t g, const std::vector<tensor_view>& tensors) {
  auto find = [&](const std::string& name) -> const tensor_view* {
    for (const auto& t : tensors) // a group's few tensors
      if (t.name == name)
        return &t;
    return nullptr;
  };
  return layout_over(p, g, tensors, find, "the group");
}

namespace {

class host_device final : public pack_device {
public:
  explicit host_device(int ordinal) : ordinal_(ordinal) {}
  int ordinal() const override { return ordinal_; }
  std::shared_ptr<void> allocate(std::size_t bytes) override {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (!p)
      throw gpu_error("host pack device: cannot allocate " + std::to_string(bytes) + " bytes");
    return {p, [](void* q) { std::free(q); }};
  }
  void upload(void* to, const void* from, std::size_t n) override { std::memcpy(to, from, n); }
  void download(void* to, const void* from, std::size_t n) override { std::memcpy(to, from, n); }
  void pack(const pack_layout& layout, const std::vector<const void*>& sources, void* out) override {
    auto* bytes = static_cast<std::uint8_t*>(out);
    for (const auto& piece : layout.pieces)
      gather_host(piece.view, sources.at(piece.tensor), piece.element_size, bytes + piece.out_offset);
    transfer::write_checksum_trailer(mixsum64(bytes, layout.bytes), bytes + layout.bytes);
  }
  void concat(const std::vector<piece>& pieces, void* out) override {
    auto* at = static_cast<std::uint8_t*>(out);
    for (const auto& p : pieces) {
      if (p.bytes > 0)
        std::memcpy(at, p.data, p.bytes);
      at += p.bytes;
    }
  }

private:
  int ordinal_;
};

class cuda_device final : public pack_device {
public:
  explicit cuda_device(int device) : device_(device) {}
  int ordinal() const override { return device_; }
  std::shared_ptr<void> allocate(std::size_t bytes) override {
    device_guard on(device_);
    auto buffer = std::make_shared<device_buffer>(bytes == 0 ? 1 : bytes);
    // Freed by whichever thread drops the last pointer (the trainer's actor,
    // a sender's thread): on this device, whatever that thread's current one.
    return {buffer->data(), [buffer, device = device_](void*) mutable {
              device_guard back(device, std::nothrow);
              buffer.reset();
            }};
  }
  void upload(void* to, const void* from, std::size_t n) override {
    device_guard on(device_);
    copy(to, from, n, copy_kind::host_to_device);
  }
  void download(void* to, const void* from, std::size_t n) override {
    device_guard on(device_);
    copy(to, from, n, copy_kind::device_to_host);
  }
  void pack(const pack_layout& layout, const std::vector<const void*>& sources, void* out) override {
    device_guard on(device_);
    auto* bytes = static_cast<std::uint8_t*>(out);
    for (const auto& piece : layout.pieces)
      gather(piece.view, sources.at(piece.tensor), piece.element_size, bytes + piece.out_offset);
    std::uint8_t trailer[transfer::checksum_trailer_bytes];
    transfer::write_checksum_trailer(mixsum64_device(bytes, layout.bytes), trailer);
    copy(bytes + layout.bytes, trailer, sizeof trailer, copy_kind::host_to_device);
  }
  void concat(const std::vector<piece>& pieces, void* out) override {
    device_guard on(device_);
    auto* at = static_cast<std::uint8_t*>(out);
    for (const auto& p : pieces) {
      copy(at, p.data, p.bytes, copy_kind::device_to_device);
      at += p.bytes;
    }
  }

private:
  int device_;
};

} // namespace

std::shared_ptr<pack_device> cuda_pack_device(int device) { return std::make_shared<cuda_device>(device); }
std::shared_ptr<pack_device> host_pack_device(int ordinal) { return std::make_shared<host_device>(ordinal); }

namespace {

class cuda_tensors final : public transfer::tensor_device {
public:
  std::shared_ptr<void> pin_host(void* p, std::size_t n) override { return register_host(p, n); }
  void to_host(void* to, const void* from, std::size_t n, int device) override {
    device_guard on(device);
    copy(to, from, n, copy_kind::device_to_host);
  }
  std::shared_ptr<void> allocate(std::size_t bytes, int device) override { return cuda_pack_device(device)->allocate(bytes); }
  void device_to_device(void* to, int to_device, const void* from, std::size_t n) override {
    device_guard on(to_device); // unified addressing: the source may be on another device
    copy(to, from, n, copy_kind::device_to_device);
  }
};

} // namespace

std::shared_ptr<transfer::tensor_device> cuda_tensor_device() { return std::make_shared<cuda_tensors>(); }

void device_snapshot::adopt_from(const transfer::weight_snapshot& s,
                                 std::shared_ptr<const transfer::device_resident> resident) {
  version_ = s.version();
  bytes_ = resident->bytes;
  for (const auto& t : s.tensors())
    sources_.push_back(resident->tensors.at(t.name)); // every tensor: weight_snapshot checked
  memory_ = std::shared_ptr<const void>(std::move(resident), nullptr); // holds the copy while this lives
  adopted_ = true;
}

std::shared_ptr<const device_snapshot> device_snapshot::adopt(const transfer::weight_snapshot& s,
                                                              const pack_device& device) {
  auto resident = s.on_device(); // locked once: the source may drop it meanwhile
  if (!resident || resident->device != device.ordinal())
    return nullptr;
  std::shared_ptr<device_snapshot> out(new device_snapshot);
  out->adopt_from(s, std::move(resident));
  return out;
}

device_snapshot::device_snapshot(const transfer::weight_snapshot& s, pack_device& device) : version_(s.version()) {
  std::vector<std::uint64_t> offsets;
  for (const auto& t : s.tensors()) { // each tensor below 2^62 bytes (a snapshot holds them in memory)
    offsets.push_back(bytes_);
    bytes_ = transfer::device_copy_aligned(bytes_ + t.size);
  }
  auto memory = device.allocate(static_cast<std::size_t>(bytes_));
  auto* base = static_cast<std::uint8_t*>(memory.get());
  memory_ = std::move(memory);
  for (std::size_t i = 0; i < s.tensors().size(); ++i) {
    const auto& t = s.tensors()[i];
    device.upload(base + offsets[i], t.data, t.size);
    sources_.push_back(base + offsets[i]);
  }
}

} // namespace rlsync::gpu
