#pragma once
// Buckets for the CAF inline path (update_atom, the trainer's pull_atom):
// a group's full tensors, or a worker's packed bytes, cut into
// weight_buckets of at most bucket_bytes, each checksummed (checksum64 of its
// data). A tensor larger than the room left is cut into pieces: a piece's
// entry has a flat shape {elements} and says where it starts in the whole
// tensor (bucket_entry::tensor_offset); a whole tensor keeps its shape.
#include "runtime/base/dtype.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/control/protocol.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rlsync::transfer {

/// The tensor name of bucketize_packed's entries.
inline constexpr const char* packed_entry_name = "<packed>";

/// Full tensors in order. Throws std::invalid_argument when bucket_bytes is
/// smaller than an element.
std::vector<weight_bucket> bucketize(std::uint64_t version, std::uint32_t group,
                                     const std::vector<tensor_view>& tensors, std::uint64_t bucket_bytes);

/// A packed byte stream of elements of `type` (one worker's group), as
/// pieces of one tensor called packed_entry_name of shape {size / element}.
std::vector<weight_bucket> bucketize_packed(std::uint64_t version, std::uint32_t group, dtype type,
                                            const std::uint8_t* bytes, std::size_t size,
                                            std::uint64_t bucket_bytes);

/// Whether the bucket's data hash to its checksum.
bool verify_bucket(const weight_bucket& b);

/// A collective broadcast's bucket is a group's bytes followed by their
/// checksum64 as 8 little-endian bytes (known only once the group is packed).
inline constexpr std::size_t checksum_trailer_bytes = 8;
/// The trailer's 8 bytes, written at `to` and read from `at`: the one
/// encoding of it (the GPU pack writes a mixsum64 the same way).
void write_checksum_trailer(std::uint64_t sum, std::uint8_t* to);
std::uint64_t read_checksum_trailer(const std::uint8_t* at);
/// Appends checksum64 of `bytes`' current contents to it.
void append_checksum(std::vector<std::uint8_t>& bytes);
/// The bytes before the trailer and the checksum it holds. Throws
/// std::invalid_argument when fewer than 8 bytes came.
std::pair<std::vector<std::uint8_t>, std::uint64_t> split_checksum(const std::uint8_t* bytes, std::size_t size);
/// The same in place: drops the trailer from `bytes` and returns it.
std::uint64_t pop_checksum(std::vector<std::uint8_t>& bytes);

/// Views of the whole tensors a (checked) bucket carries, into its data.
/// Throws std::invalid_argument naming the tensor for a piece of a split one.
std::vector<tensor_view> whole_tensor_views(const weight_bucket& b);

/// Receiver side: puts buckets of expected tensors back together.
class bucket_assembler {
public:
  explicit bucket_assembler(std::vector<tensor_spec> expected);

  /// Checks the bucket (protocol check() and checksum) and copies its pieces
  /// into place. Throws transfer_error(checksum_mismatch) for bad bytes,
  /// std::invalid_argument for an unknown tensor, a dtype or shape that
  /// disagrees, or a piece outside its tensor or received twice.
  void add(const weight_bucket& b);
  /// Every byte of every expected tensor arrived.
  bool complete() const;
  std::uint64_t bytes_received() const { return received_; }
  /// Views of the assembled tensors (valid while this lives), in expected
  /// order. Throws std::logic_error unless complete().
  std::vector<tensor_view> tensors() const;

private:
  struct slot {
    tensor_spec spec;
    std::vector<std::uint8_t> bytes;
    std::map<std::uint64_t, std::uint64_t> pieces; // begin -> end
    std::uint64_t filled = 0;
  };
  std::vector<slot> slots_;
  std::map<std::string, std::size_t> index_;
  std::uint64_t received_ = 0;
};

} // namespace rlsync::transfer
