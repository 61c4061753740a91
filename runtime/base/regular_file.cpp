#include "runtime/base/regular_file.hpp"

#include "runtime/base/printable.hpp"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace rlsync {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISSOCK(mode))
    return "a socket";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  return "not a regular file";
}

[[noreturn]] void fail(const std::string& path, const std::string& what, const std::string& why) {
  throw file_error(printable(path) + ": " + (what.empty() ? "" : what + ": ") + why);
}

} // namespace

regular_file open_regular_file(const std::string& path, const std::string& what) {
  // O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever.
  // It has no effect on reads of a regular file.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0)
    fail(path, what, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail(path, what, std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, what, std::string("is ") + kind_of(st.st_mode) + ", not a regular file");
  }
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0)
    ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return {fd, static_cast<std::size_t>(st.st_size)};
}

std::string read_regular_file(const std::string& path, std::size_t max_bytes, const std::string& what) {
  regular_file f = open_regular_file(path, what);
  auto too_large = [&] {
    ::close(f.fd);
    fail(path, what, "larger than the limit of " + std::to_string(max_bytes) + " bytes");
  };
  if (f.size > max_bytes)
    too_large();
  std::string text;
  text.reserve(f.size);
  char buffer[1 << 16];
  for (;;) {
    ssize_t n = ::read(f.fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      int err = errno;
      ::close(f.fd);
      fail(path, what, std::string("cannot read: ") + std::strerror(err));
    }
    if (n == 0)
      break;
    if (text.size() + static_cast<std::size_t>(n) > max_bytes)
      too_large();
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(f.fd);
  return text;
}

} // namespace rlsync
