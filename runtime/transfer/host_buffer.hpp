#pragma once
// The page-aligned, pre-touched buffers that packed groups (producers of
// both backends) and received groups (UCX consumers) live in.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include <sys/mman.h>

namespace rlsync::transfer {

// Page-aligned memory, touched once when allocated: copying into freshly
// mapped pages runs at 1.5 GB/s (6.6 GB/s with huge pages) here, against
// 17 GB/s into pages already touched. Huge pages where the kernel gives
// them. Reused for the life of a producer or a consumer connection.
class host_buffer {
public:
  host_buffer() = default;
  explicit host_buffer(std::size_t size) {
    if (size == 0)
      return;
    constexpr std::size_t huge = std::size_t(2) << 20;
    const std::size_t align = size >= huge ? huge : 4096;
    const std::size_t rounded = (size + align - 1) / align * align;
    void* p = nullptr;
    if (posix_memalign(&p, align, rounded) != 0)
      throw std::bad_alloc();
    if (align == huge)
      madvise(p, rounded, MADV_HUGEPAGE); // advisory: ignore failure
    std::memset(p, 0, rounded);
    data_.reset(static_cast<std::uint8_t*>(p));
    capacity_ = rounded;
  }
  std::uint8_t* data() const { return data_.get(); }
  std::size_t capacity() const { return capacity_; }

private:
  struct freer {
    void operator()(std::uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<std::uint8_t, freer> data_;
  std::size_t capacity_ = 0;
};

} // namespace rlsync::transfer
