#pragma once
// 64-bit checksums of byte ranges: XXH3 (64-bit) from the system libxxhash.
// Checksums tensors in checkpoints, every group of weights a transport moves,
// sharding plans and routing prefixes. The algorithm is part of the wire
// format: both ends of a transfer must hash the same way.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

// libxxhash's streaming state (xxhash.h: typedef struct XXH3_state_s
// XXH3_state_t); declared here so that callers need not include xxhash.h.
struct XXH3_state_s;

namespace rlsync {

/// Name of the algorithm, as `rlsync checkpoint inspect` labels its checksums.
inline constexpr const char* checksum_algorithm = "xxh3";

/// One-shot checksum of `size` bytes at `data` (XXH3_64bits_withSeed; seed 0
/// is plain XXH3_64bits). `data` may be null when `size` is 0.
std::uint64_t checksum64(const void* data, std::size_t size, std::uint64_t seed = 0);

/// A checksum (or plan digest) as people and logs see it: 16 hex digits.
std::string checksum_hex(std::uint64_t x);

/// Streaming checksum: update() any number of times with any chunk sizes,
/// then digest(); the result equals checksum64() over the concatenated input.
/// Owns a libxxhash state on the heap (XXH3_createState).
/// Movable, not copyable; a moved-from object may only be destroyed or
/// assigned to.
class checksum64_stream {
public:
  /// Throws std::bad_alloc when the state cannot be allocated.
  explicit checksum64_stream(std::uint64_t seed = 0);

  void reset(std::uint64_t seed = 0);
  /// `data` may be null when `size` is 0.
  void update(const void* data, std::size_t size);
  /// Does not modify the state: more update() calls may follow.
  std::uint64_t digest() const;

private:
  struct free_state {
    void operator()(XXH3_state_s* s) const noexcept;
  };
  std::unique_ptr<XXH3_state_s, free_state> state_;
};

} // namespace rlsync
