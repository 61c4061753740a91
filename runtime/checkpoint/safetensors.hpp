#pragma once
// safetensors files exactly as Hugging Face writes them:
//   8 bytes  N, the header length, little-endian u64
//   N bytes  JSON: {"__metadata__": {"k": "v"},            (optional)
//                   "name": {"dtype": "BF16", "shape": [2, 3],
//                            "data_offsets": [begin, end]}, ...}
//            padded with spaces so that the data start at a multiple of 8
//   data     raw little-endian tensors; offsets are relative to its start
// Reading reads the file whole into memory (never maps it); writing streams it.
#include "runtime/base/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace rlsync {

/// Any problem with a checkpoint or safetensors file: malformed contents,
/// inconsistent shards, I/O errors. what() starts with the file's path and
/// names the tensor and field at fault.
struct checkpoint_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The validated contents of one safetensors image.
struct safetensors_layout {
  std::vector<tensor_view> tensors;            // in data order (ascending offsets)
  std::map<std::string, std::string> metadata; // "__metadata__"; empty when absent
  std::uint64_t header_size = 0;               // N: the JSON and its padding
};

/// Largest header accepted, as in Hugging Face's reader.
constexpr std::uint64_t safetensors_max_header = 100'000'000;

/// Parses and validates a whole safetensors image of `size` bytes at `data`
/// (a mapped file or any buffer); the views point into `data`. Never reads
/// outside [data, data + size). `source` names the image in messages.
/// Throws checkpoint_error "<source>: <problem>" for: a file too short, an
/// absurd header length, invalid JSON, a header that is not an object, a
/// tensor entry with a missing, unknown, duplicate or ill-typed field, an
/// unsupported dtype, bad shape or offsets, sizes that disagree with the
/// shape, ranges beyond the data, overlapping or leaving holes, duplicate
/// names, and a __metadata__ that is not an object of strings.
safetensors_layout parse_safetensors(const void* data, std::size_t size, const std::string& source);

/// The same checks on a file's first bytes alone, before its data are read:
/// `head` holds the first `head_size` bytes of a file of `file_size` bytes.
/// Needs the 8-byte length and the header it gives, where that length is
/// plausible (throws std::logic_error when `head` is shorter). The views
/// carry names, types, shapes and offsets, and no data (null). A file read
/// whole only once its header has passed cannot make its reader allocate the
/// size of a file that is not a checkpoint.
safetensors_layout parse_safetensors_header(const void* head, std::size_t head_size, std::uint64_t file_size,
                                            const std::string& source);

/// The layout of the safetensors file at `path` from its header alone (the
/// views carry no data): what a reader that needs names, types and shapes
/// reads instead of the whole file. Throws checkpoint_error as open() does.
safetensors_layout read_safetensors_header(const std::string& path);

/// Memory to read a file of `bytes` bytes into: at least that many, not
/// necessarily zeroed (every byte is read over), owned by what is returned.
/// It may hand out memory a dropped file held, so that reading a step does
/// not fault in fresh pages (README, "Trainer"). Null or empty:
/// fresh memory of the process's heap.
using file_memory = std::function<std::shared_ptr<std::byte>(std::size_t bytes)>;

/// A safetensors file read whole into memory this object owns (never mapped:
/// a writer truncating a mapped file would kill the reader with SIGBUS).
/// Movable; lets go of the memory on destruction (views into it then dangle).
class safetensors_file {
public:
  safetensors_file() = default;
  /// Reads and validates `path`, into `memory`'s (fresh memory when empty);
  /// throws checkpoint_error, also when the file is not a regular file or
  /// changes size while it is read.
  static safetensors_file open(const std::string& path, const file_memory& memory = {});

  safetensors_file(safetensors_file&& other) noexcept;
  safetensors_file& operator=(safetensors_file&& other) noexcept;
  safetensors_file(const safetensors_file&) = delete;
  safetensors_file& operator=(const safetensors_file&) = delete;
  ~safetensors_file();

  const std::string& path() const { return path_; }
  std::size_t file_size() const { return size_; }
  /// In data order (ascending offsets).
  const std::vector<tensor_view>& tensors() const { return layout_.tensors; }
  /// nullptr when the file holds no tensor of that name.
  const tensor_view* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return layout_.metadata; }

private:
  void close();

  std::string path_;
  std::shared_ptr<std::byte> data_;
  std::size_t size_ = 0;
  safetensors_layout layout_;
  std::unordered_map<std::string, std::size_t> by_name_;
};

/// Writes a safetensors file without holding it in memory: the constructor
/// writes the header for `tensors` (their data laid out in this order, no
/// gaps); write() then takes the data in that order, in chunks of any size
/// (a chunk may cross tensor boundaries); finish() checks that every byte
/// came, flushes and closes. A writer destroyed before finish() removes its
/// half-written file. Throws checkpoint_error naming the path.
class safetensors_writer {
public:
  /// Rejects empty, duplicate or reserved ("__metadata__") names, negative
  /// dimensions and sizes that overflow.
  safetensors_writer(std::string path, std::vector<tensor_spec> tensors,
                     std::map<std::string, std::string> metadata = {});
  safetensors_writer(const safetensors_writer&) = delete;
  safetensors_writer& operator=(const safetensors_writer&) = delete;
  ~safetensors_writer();

  void write(const void* data, std::size_t size);
  /// `durable`: fsync before closing, so that a rename that follows
  /// publishes complete data even across a power loss.
  void finish(bool durable = true);

  const std::vector<tensor_spec>& tensors() const { return tensors_; }
  std::uint64_t data_bytes() const { return data_bytes_; }   // all tensors
  std::uint64_t bytes_written() const { return written_; }  // data so far
  std::uint64_t file_bytes() const { return header_bytes_ + data_bytes_; }

private:
  void flush_buffer();
  void write_fully(const void* data, std::size_t size);

  std::string path_;
  std::vector<tensor_spec> tensors_;
  int fd_ = -1;
  std::uint64_t header_bytes_ = 0;
  std::uint64_t data_bytes_ = 0;
  std::uint64_t written_ = 0;
  std::vector<unsigned char> buffer_; // coalesces small writes
  std::size_t buffered_ = 0;
};

/// The first bytes of a safetensors file for these tensors laid out in order:
/// the 8-byte length and the JSON header padded with spaces to a multiple
/// of 8. Validates like safetensors_writer; `source` names the file.
std::string safetensors_header(const std::vector<tensor_spec>& tensors,
                               const std::map<std::string, std::string>& metadata,
                               const std::string& source);

/// A tensor held in memory, for write_safetensors: `data` has spec.bytes().
struct tensor_bytes {
  tensor_spec spec;
  const void* data = nullptr;
};

/// Writes a (small) safetensors file from tensors in memory.
void write_safetensors(const std::string& path, const std::vector<tensor_bytes>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

} // namespace rlsync
