#pragma once
// The page-aligned, pre-touched buffers that packed groups (producers of
// both backends) and received groups (UCX consumers) live in.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace rlsync::transfer {

/// A shareable buffer starts with this header page: other processes of
/// the host map the buffer's memfd and check that it is the buffer named.
struct shared_header {
  static constexpr std::uint64_t magic_value = 0x48535f434e59534cULL; // "LSYNC_SH"
  static constexpr std::size_t bytes = 4096;                         // the data starts a page in
  std::uint64_t magic = 0;
  std::uint64_t id = 0;
};

struct shareable_t {};
constexpr shareable_t shareable{};

/// The page size a shareable buffer asks for.
enum class shared_pages { normal, huge };
inline constexpr std::size_t huge_page_bytes = std::size_t(2) << 20;

// Page-aligned memory, touched once when allocated: copying into freshly
// mapped pages runs at 1.5 GB/s (6.6 GB/s with huge pages) here, against
// 17 GB/s into pages already touched. Huge pages where the kernel gives
// them. Reused for the life of a producer or a consumer connection.
//
// A shareable buffer lives in a memfd instead (MAP_SHARED, after a header
// page naming it), so that engine processes on the same host can map it
// and copy from it straight into their staging weights: the UCX producer's
// packed groups (ucx_transfer.hpp, "Shared memory"). Asked for huge pages,
// the memfd comes from the kernel's hugetlb pool (vm.nr_hugepages; shared
// memory takes no transparent huge pages where shmem_enabled is never):
// a fresh mapping then costs a fault per 2 MiB instead of per 4 KiB, which
// on this VM is most of what a consumer's first read of a buffer costs
// (0.3-0.6 ms per MB against under 0.01), and copies run with fewer TLB
// misses.
class host_buffer {
public:
  host_buffer() = default;
  /// The capacity a buffer made for `size` bytes gets (what it holds of
  /// memory, the header page of a shareable one aside): whole pages, whole
  /// huge pages from 2 MiB on for a private one, and whole huge pages with
  /// the header page for a shareable one in huge pages.
  static std::size_t capacity_for(std::size_t size, bool shareable, shared_pages pages = shared_pages::normal) {
    constexpr std::size_t huge = huge_page_bytes;
    if (shareable && pages == shared_pages::huge) // the mapping, header page included, is whole huge pages
      return (std::max<std::size_t>(size, 1) + shared_header::bytes + huge - 1) / huge * huge - shared_header::bytes;
    if (shareable)
      return (std::max<std::size_t>(size, 1) + 4095) / 4096 * 4096;
    if (size == 0)
      return 0;
    const std::size_t align = size >= huge ? huge : 4096;
    return (size + align - 1) / align * align;
  }
  explicit host_buffer(std::size_t size) {
    if (size == 0)
      return;
    constexpr std::size_t huge = std::size_t(2) << 20;
    const std::size_t align = size >= huge ? huge : 4096;
    const std::size_t rounded = capacity_for(size, false);
    void* p = nullptr;
    if (posix_memalign(&p, align, rounded) != 0)
      throw std::bad_alloc();
    if (align == huge)
      madvise(p, rounded, MADV_HUGEPAGE); // advisory: ignore failure
    std::memset(p, 0, rounded);
    data_ = std::unique_ptr<std::uint8_t, region>(static_cast<std::uint8_t*>(p), region{});
    capacity_ = rounded;
  }
  /// A shareable buffer of at least `size` bytes (throws std::runtime_error
  /// when the memfd cannot be made or mapped: for huge pages, also when
  /// the pool has too few free).
  host_buffer(std::size_t size, shareable_t, shared_pages pages = shared_pages::normal) {
    const std::size_t rounded = capacity_for(size, true, pages);
    // MFD_HUGE_2MB (linux/memfd.h, which clashes with glibc's MFD_*): log2(2 MiB) << 26.
    const unsigned huge_flags = pages == shared_pages::huge ? MFD_HUGETLB | (21u << 26) : 0;
    const int fd = ::memfd_create("rlsync-packed", MFD_CLOEXEC | MFD_ALLOW_SEALING | huge_flags);
    if (fd < 0)
      throw std::runtime_error("memfd_create failed: " + std::string(std::strerror(errno)));
    const std::size_t total = shared_header::bytes + rounded;
    void* p = MAP_FAILED;
    // Sealed at its size: a consumer that maps it can never be cut short
    // (no SIGBUS), and checks the seal to know it maps a memfd. Huge pages
    // are allocated here, not at first touch: a pool or cgroup limit that
    // has none fails this call rather than the first write with SIGBUS
    // (MAP_POPULATE ignores a failed fault).
    if (::ftruncate(fd, static_cast<off_t>(total)) == 0
        && (pages != shared_pages::huge || ::fallocate(fd, 0, 0, static_cast<off_t>(total)) == 0)
        && ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
      p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw std::runtime_error("cannot map a shared buffer of " + std::to_string(total)
                               + " bytes: " + std::strerror(err));
    }
    auto* base = static_cast<std::uint8_t*>(p);
    shared_header h;
    h.magic = shared_header::magic_value;
    h.id = next_id();
    std::memcpy(base, &h, sizeof h);
    data_ = std::unique_ptr<std::uint8_t, region>(base + shared_header::bytes,
                                                  region{base, total, fd, h.id, pages == shared_pages::huge});
    capacity_ = rounded;
  }
  host_buffer(host_buffer&& o) noexcept
      : data_(std::exchange(o.data_, std::unique_ptr<std::uint8_t, region>(nullptr, region{}))),
        capacity_(std::exchange(o.capacity_, 0)) {}
  host_buffer& operator=(host_buffer&& o) noexcept {
    if (this != &o) {
      data_ = std::exchange(o.data_, std::unique_ptr<std::uint8_t, region>(nullptr, region{}));
      capacity_ = std::exchange(o.capacity_, 0);
    }
    return *this;
  }
  host_buffer(const host_buffer&) = delete;
  host_buffer& operator=(const host_buffer&) = delete;
  ~host_buffer() = default;

  std::uint8_t* data() const { return data_.get(); }
  std::size_t capacity() const { return capacity_; }
  bool shared() const { return data_ && data_.get_deleter().base; }
  /// Shareable buffers: the memfd, its length (header included) and the id in its header.
  int fd() const { return shared() ? data_.get_deleter().fd : -1; }
  std::size_t mapped_bytes() const { return shared() ? data_.get_deleter().bytes : 0; }
  std::uint64_t id() const { return shared() ? data_.get_deleter().id : 0; }
  /// A shareable buffer in huge pages.
  bool huge() const { return shared() && data_.get_deleter().huge; }

private:
  static std::uint64_t next_id() {
    // Unique within the process and unlikely to repeat across processes:
    // a random start, then a counter (0 is "not shared").
    static std::atomic<std::uint64_t> next{std::random_device{}() | (std::uint64_t(std::random_device{}()) << 32)};
    std::uint64_t id;
    do
      id = next.fetch_add(1);
    while (id == 0);
    return id;
  }
  struct region { // shareable: the mapping and its memfd; else nothing (freed with free)
    std::uint8_t* base = nullptr;
    std::size_t bytes = 0;
    int fd = -1;
    std::uint64_t id = 0;
    bool huge = false;
    void operator()(std::uint8_t* p) const {
      if (!base) {
        std::free(p);
        return;
      }
      ::munmap(base, bytes);
      ::close(fd);
    }
  };
  std::unique_ptr<std::uint8_t, region> data_{nullptr, region{}};
  std::size_t capacity_ = 0;
};

} // namespace rlsync::transfer
