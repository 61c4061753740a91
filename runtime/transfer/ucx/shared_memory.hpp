#pragma once
// Packed groups in shared memory (ucx_transfer.hpp, "Shared memory"): the
// host a consumer and a producer share, and a consumer's read-only mapping
// of one of the producer's shareable buffers (host_buffer.hpp).
#include "runtime/transfer/ucx/ucx_wire.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace rlsync::transfer::ucx_detail {

/// This host's kernel boot id: two processes that see the same one share
/// a kernel (and so can share memory); empty when it cannot be read.
std::string this_host_id();

/// A read-only mapping of a producer's shareable buffer, opened through
/// /proc/<pid>/fd/<fd> (the access CMA needs too) and checked against the
/// id its header page carries.
class shared_mapping {
public:
  shared_mapping() = default;
  /// Maps `r`; on failure the mapping is empty and `why` says why.
  shared_mapping(const ucx_wire::shared_region& r, std::string& why);
  shared_mapping(shared_mapping&& o) noexcept;
  shared_mapping& operator=(shared_mapping&& o) noexcept;
  shared_mapping(const shared_mapping&) = delete;
  shared_mapping& operator=(const shared_mapping&) = delete;
  ~shared_mapping();

  explicit operator bool() const { return base_ != nullptr; }
  /// The data: past the header page, data_bytes() long.
  const std::uint8_t* data() const { return base_ + ucx_wire::shared_header_bytes; }
  std::size_t data_bytes() const { return bytes_ - ucx_wire::shared_header_bytes; }
  std::size_t mapped_bytes() const { return bytes_; }
  /// The mapping's length: mapped_bytes() in whole pages of the memfd.
  std::size_t length() const { return length_; }
  /// The memfd's page size: 4 KiB, or 2 MiB for huge pages.
  std::size_t page_bytes() const { return page_; }

private:
  void reset();
  const std::uint8_t* base_ = nullptr;
  std::size_t bytes_ = 0;  // as named: what data() and the header cover
  std::size_t length_ = 0; // as mapped: whole pages of the memfd
  std::size_t page_ = 4096;
};

} // namespace rlsync::transfer::ucx_detail
