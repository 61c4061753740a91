#pragma once
// XXH64 (xxHash, 64-bit variant; Yann Collet's algorithm, bit-exact with the
// reference implementation). Checksums tensors in checkpoints and every group
// of weights a transport moves.
#include <cstddef>
#include <cstdint>

namespace rlsync {

/// One-shot XXH64 of `size` bytes at `data`.
std::uint64_t xxh64(const void* data, std::size_t size, std::uint64_t seed = 0);

/// Streaming XXH64: update() any number of times with any chunk sizes, then
/// digest(); the result equals xxh64() over the concatenated input.
class xxh64_state {
public:
  explicit xxh64_state(std::uint64_t seed = 0) { reset(seed); }

  void reset(std::uint64_t seed = 0);
  void update(const void* data, std::size_t size);
  /// Does not modify the state: more update() calls may follow.
  std::uint64_t digest() const;

private:
  std::uint64_t seed_ = 0;
  std::uint64_t total_ = 0;  // bytes seen
  std::uint64_t acc_[4] = {};
  unsigned char buf_[32] = {}; // a partial 32-byte stripe
  std::size_t buffered_ = 0;
};

} // namespace rlsync
