// Built without nvcc: every kernel entry point throws, nothing pretends to run.
#include "gpu/cuda_ipc.hpp"
#include "gpu/kernels.hpp"

namespace rlsync::gpu {
namespace {
[[noreturn]] void unavailable() { throw gpu_error("rlsync was built without CUDA"); }
} // namespace

// Nothing is ever allocated without CUDA, so nothing is ever released.
void free_device::operator()(void*) const noexcept {}
void free_pinned::operator()(void*) const noexcept {}
void close_ipc::operator()(void*) const noexcept {}

device_buffer::device_buffer(std::size_t) { unavailable(); }
pinned_buffer::pinned_buffer(std::size_t) { unavailable(); }
std::shared_ptr<void> register_host(void*, std::size_t) { unavailable(); }

device_guard::device_guard(int) { unavailable(); }
device_guard::device_guard(int, std::nothrow_t) noexcept {}
device_guard::~device_guard() = default;
void copy(void*, const void*, std::size_t, copy_kind) { unavailable(); }
void gather(const flat_view&, const void*, std::size_t, void*) { unavailable(); }
void scatter(const flat_view&, const void*, std::size_t, void*) { unavailable(); }
void convert(dtype, const void*, dtype, void*, std::size_t) { unavailable(); }
void quantize_int8(dtype, const void*, std::int64_t, std::int64_t, float*, std::int8_t*) { unavailable(); }
std::uint64_t mixsum64_device(const void*, std::size_t) { unavailable(); }

ipc_handle export_buffer(const device_buffer&) { unavailable(); }
ipc_mapping::ipc_mapping(const ipc_handle&, std::size_t) { unavailable(); }

} // namespace rlsync::gpu
