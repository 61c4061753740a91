#pragma once
// CUDA IPC handles, for the cuda_ipc backend (a trainer and engines on the
// same host's GPUs): the producer exports its device buffer once per
// session, each consumer maps it once and unmaps it when the session ends
// (ipc_session.hpp keeps the books). Built without CUDA these throw
// gpu_error.
#include "gpu/kernels.hpp"

#include <array>
#include <cstddef>
#include <cstdint>

namespace rlsync::gpu {

/// cudaIpcMemHandle_t's bytes (CUDA_IPC_HANDLE_SIZE).
inline constexpr std::size_t ipc_handle_bytes = 64;
using ipc_handle = std::array<std::uint8_t, ipc_handle_bytes>;

/// cudaIpcGetMemHandle of the buffer's allocation.
ipc_handle export_buffer(const device_buffer& buffer);

struct close_ipc {
  void operator()(void* p) const noexcept;
};

/// Another process's exported buffer mapped into this one
/// (cudaIpcOpenMemHandle); unmapped on destruction.
class ipc_mapping : public owned_memory<close_ipc> {
public:
  ipc_mapping() = default;
  /// Maps `handle`; `bytes` is what the producer says the buffer holds
  /// (CUDA cannot tell a consumer its size; the session's chunk checks
  /// keep reads within it). Throws gpu_error.
  ipc_mapping(const ipc_handle& handle, std::size_t bytes);
};

} // namespace rlsync::gpu
