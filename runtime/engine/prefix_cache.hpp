#pragma once
// The built-in engine's prefix cache (one per data-parallel rank):
// block-hashed, shared across requests. Block i of a context is keyed by a
// hash chained through blocks 0..i and the weight version, so a key names a
// whole prefix computed with one version. An entry points at a finished
// request's KV (shared by all its blocks) and keeps the block's tokens and
// where it ends, which a hit compares: a hash collision cannot make a hit
// longer than the KV behind it, and wrong KV would take two different
// prefixes whose 64-bit chained hashes collide with the same block at the
// same place.
//
// Bounded twice, LRU first out: by the block count, and by the positions of
// KV the entries keep alive. An entry pins its whole sequence, so without the
// second bound the hot prompt blocks of long completions (a GRPO group)
// would hold far more KV than their blocks: at most capacity × block
// positions stay alive (vector growth aside), and a longer sequence is cut
// to that before it is cached. A block cached again points at the newest
// sequence holding it, which lets older ones go.
#include "runtime/engine/kv_cache.hpp"

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rlsync::engine {

class block_prefix_cache {
public:
  block_prefix_cache(std::int64_t block_tokens, std::size_t capacity_blocks);

  /// The longest cached prefix of `context` (whole blocks, at most
  /// `max_tokens`) computed with `version`: its KV and length.
  std::pair<std::shared_ptr<const kv_sequence>, std::int64_t>
  lookup(const std::vector<std::int32_t>& context, std::int64_t max_tokens, std::uint64_t version);
  /// Makes every whole block of `kv` (positions of `context`) findable.
  void insert(const std::vector<std::int32_t>& context, std::shared_ptr<const kv_sequence> kv,
              std::uint64_t version);
  void clear();

  std::size_t blocks() const { return blocks_.size(); }
  /// Positions of KV kept alive by the entries (each sequence counted once).
  std::int64_t held_positions() const { return held_positions_; }
  std::uint64_t queries() const { return queries_; }
  std::uint64_t hits() const { return hits_; }

private:
  struct entry {
    std::shared_ptr<const kv_sequence> kv;
    std::vector<std::int32_t> tokens; ///< this block's tokens
    std::int64_t end = 0;             ///< the position after this block: a hit needs the same
    std::list<std::uint64_t>::iterator lru;
  };
  /// A sequence some entries point at: how many, and the length it was held with.
  struct kept {
    std::size_t entries = 0;
    std::int64_t positions = 0;
  };

  std::uint64_t key(std::uint64_t previous, const std::int32_t* tokens, std::uint64_t version) const;
  /// One more entry points at `kv` / one fewer does (counted once per sequence).
  void hold(const kv_sequence& kv);
  void release(const kv_sequence& kv);

  std::int64_t block_;
  std::size_t capacity_;
  std::int64_t max_positions_; ///< capacity × block
  std::unordered_map<std::uint64_t, entry> blocks_;
  std::list<std::uint64_t> lru_; ///< most recently used first
  std::unordered_map<const kv_sequence*, kept> kept_; ///< per sequence the entries point at
  std::int64_t held_positions_ = 0;
  std::uint64_t queries_ = 0;
  std::uint64_t hits_ = 0;
};

} // namespace rlsync::engine
