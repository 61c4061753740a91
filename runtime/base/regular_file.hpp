#pragma once
// Opening files rlsync did not write. Every reader goes through here, so
// that a FIFO, a device or a directory given where a file belongs is refused
// at once (opening a FIFO for reading blocks until a writer appears; reading
// /dev/zero never ends) and a file is never read past a size limit.
#include <cstddef>
#include <stdexcept>
#include <string>

namespace rlsync {

/// A file that cannot be opened or read, is not a regular file, or is larger
/// than its limit. what() starts with the path (escaped for echo).
struct file_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// An open descriptor of a regular file at `path` (O_RDONLY | O_CLOEXEC,
/// never blocking on a FIFO), and its size. The caller closes `fd`.
struct regular_file {
  int fd = -1;
  std::size_t size = 0;
};

/// Opens `path` for reading and checks it is a regular file (symbolic links
/// are followed). `what`, when not empty, names it in messages after the path
/// ("config.json").
/// Throws file_error "<path>: <what>: is a FIFO, not a regular file" and the
/// like.
regular_file open_regular_file(const std::string& path, const std::string& what = "");

/// The whole of the regular file at `path`, refused when larger than
/// `max_bytes` (checked before reading, and again while reading, in case it
/// grows). Throws file_error.
std::string read_regular_file(const std::string& path, std::size_t max_bytes, const std::string& what = "");

} // namespace rlsync
