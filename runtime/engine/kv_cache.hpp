#pragma once
// The KV cache of one sequence: for every tensor-parallel worker and layer,
// the keys and values of that worker's kv heads at every position so far,
// fp32, laid out [position][local kv head][head_dim] so that appending a
// token appends one contiguous row.
//
// The scheduler owns sequences; the model only appends to them in forward().
// Positions [0, length()) are valid. Truncating keeps memory for reuse;
// clear() gives it back (pause with clear_cache drops frozen requests' KV).
#include "runtime/config/model_config.hpp"

#include <cstdint>
#include <vector>

namespace rlsync::engine {

class kv_sequence {
public:
  kv_sequence() = default;
  /// An empty cache shaped for `c` sharded `tp` ways.
  kv_sequence(const model_config& c, int tp);

  std::int64_t length() const { return length_; }
  /// Keeps the first `n` positions (n <= length()).
  void truncate(std::int64_t n);
  /// Drops every position and frees the memory.
  void clear();
  /// Becomes a copy of the first `n` positions of `from` (same shape; n <=
  /// from.length()): a prefix-cache hit.
  void copy_prefix(const kv_sequence& from, std::int64_t n);
  /// A new sequence holding a copy of the first `n` positions (n <= length()),
  /// with no spare capacity.
  kv_sequence prefix(std::int64_t n) const;
  /// Bytes of KV held (capacity, all workers).
  std::uint64_t bytes() const;

  bool compatible(const model_config& c, int tp) const;

  // -- for the model ----------------------------------------------------------
  /// Floats per position of one worker and layer: local kv heads * head_dim.
  std::int64_t row() const { return row_; }
  /// Makes room for `positions` positions in worker `w`'s layers; called by
  /// that worker only, so workers grow their own storage in parallel.
  void reserve(int w, std::int64_t positions);
  float* keys(int w, std::int64_t layer) { return k_[slot(w, layer)].data(); }
  float* values(int w, std::int64_t layer) { return v_[slot(w, layer)].data(); }
  void set_length(std::int64_t n) { length_ = n; }

private:
  std::size_t slot(int w, std::int64_t layer) const {
    return static_cast<std::size_t>(w * layers_ + layer);
  }

  int tp_ = 0;
  std::int64_t layers_ = 0;
  std::int64_t row_ = 0;
  std::int64_t length_ = 0;
  std::vector<std::vector<float>> k_, v_; // [worker * layers + layer]
};

} // namespace rlsync::engine
