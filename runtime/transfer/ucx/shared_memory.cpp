#include "runtime/transfer/ucx/shared_memory.hpp"

#include "runtime/transfer/host_buffer.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace rlsync::transfer::ucx_detail {

static_assert(ucx_wire::shared_header_bytes == shared_header::bytes, "one header size on both sides");

std::string this_host_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  if (id.size() > ucx_wire::max_host_bytes)
    return {};
  return id;
}

shared_mapping::shared_mapping(const ucx_wire::shared_region& r, std::string& why) {
  const std::string path = "/proc/" + std::to_string(r.pid) + "/fd/" + std::to_string(r.fd);
  // Whatever the peer names: never block on it (a FIFO), never take a terminal.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    why = "cannot open " + path + ": " + std::strerror(errno);
    return;
  }
  struct stat st {};
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || seals < 0 || !(seals & F_SEAL_SHRINK)) {
    ::close(fd);
    why = path + " is not a memfd sealed against shrinking";
    return;
  }
  if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) < r.bytes) {
    ::close(fd);
    why = path + " is smaller than the " + std::to_string(r.bytes) + " bytes named";
    return;
  }
  // A memfd of huge pages (its block size) maps and unmaps in whole ones;
  // r.bytes <= st_size (bounded by the wire's limits), so the rounding
  // cannot overflow. Its pages must all be allocated (the producer writes
  // every buffer it lends): mapping a hole populates it at this process's
  // cost — a sparse terabyte named by a lying peer would take its memory —
  // and a huge page from an empty pool ends it (SIGBUS).
  const std::uint64_t page =
    std::max<std::uint64_t>(4096, static_cast<std::uint64_t>(std::max<blksize_t>(st.st_blksize, 0)));
  const std::uint64_t length = (r.bytes + page - 1) / page * page;
  // Every page of the file, so none of what is mapped can be a hole, on any
  // file system (hugetlbfs answers SEEK_HOLE with the file's end).
  const std::uint64_t file_pages = (static_cast<std::uint64_t>(st.st_size) + page - 1) / page * page;
  if (static_cast<std::uint64_t>(std::max<blkcnt_t>(st.st_blocks, 0)) * 512 < std::max(length, file_pages)) {
    ::close(fd);
    why = path + " is not allocated in full (pages of " + std::to_string(page) + " bytes): a hole would be populated at this process's cost";
    return;
  }
  void* p = ::mmap(nullptr, length, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int err = errno;
  ::close(fd); // the mapping keeps the memory
  if (p == MAP_FAILED) {
    why = "cannot map " + path + ": " + std::strerror(err);
    return;
  }
  base_ = static_cast<const std::uint8_t*>(p);
  bytes_ = r.bytes;
  length_ = length;
  page_ = static_cast<std::size_t>(page);
  shared_header h;
  std::memcpy(&h, base_, sizeof h);
  if (h.magic != shared_header::magic_value || h.id != r.id) {
    why = path + " is not the shared buffer named (another process, or gone)";
    reset();
  }
}

shared_mapping::shared_mapping(shared_mapping&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)),
      length_(std::exchange(o.length_, 0)), page_(std::exchange(o.page_, 4096)) {}

shared_mapping& shared_mapping::operator=(shared_mapping&& o) noexcept {
  if (this != &o) {
    reset();
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    length_ = std::exchange(o.length_, 0);
    page_ = std::exchange(o.page_, 4096);
  }
  return *this;
}

shared_mapping::~shared_mapping() { reset(); }

void shared_mapping::reset() {
  if (base_)
    ::munmap(const_cast<std::uint8_t*>(base_), length_);
  base_ = nullptr;
  bytes_ = 0;
  length_ = 0;
}

} // namespace rlsync::transfer::ucx_detail
