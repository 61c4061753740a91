#include "runtime/engine/prefix_cache.hpp"

#include "runtime/base/checksum.hpp"

#include <algorithm>
#include <limits>

namespace rlsync::engine {

block_prefix_cache::block_prefix_cache(std::int64_t block_tokens, std::size_t capacity_blocks)
    : block_(std::max<std::int64_t>(1, block_tokens)), capacity_(capacity_blocks) {
  // Both are bounded by validation; saturate anyway rather than wrap.
  const auto limit = std::numeric_limits<std::int64_t>::max() / block_;
  max_positions_ = capacity_ > static_cast<std::uint64_t>(limit) ? std::numeric_limits<std::int64_t>::max()
                                                                 : static_cast<std::int64_t>(capacity_) * block_;
}

std::uint64_t block_prefix_cache::key(std::uint64_t previous, const std::int32_t* tokens,
                                      std::uint64_t version) const {
  return checksum64(tokens, static_cast<std::size_t>(block_) * sizeof(std::int32_t),
                    previous * 0x9E3779B97F4A7C15ull + version);
}

std::pair<std::shared_ptr<const kv_sequence>, std::int64_t>
block_prefix_cache::lookup(const std::vector<std::int32_t>& context, std::int64_t max_tokens, std::uint64_t version) {
  ++queries_;
  std::shared_ptr<const kv_sequence> found;
  std::int64_t length = 0;
  std::uint64_t h = 0;
  max_tokens = std::min<std::int64_t>(max_tokens, static_cast<std::int64_t>(context.size()));
  for (std::int64_t end = block_; end <= max_tokens; end += block_) {
    const std::int32_t* tokens = context.data() + (end - block_);
    h = key(h, tokens, version);
    auto it = blocks_.find(h);
    // A hash collision must not serve wrong KV: the same tokens, at the same place.
    if (it == blocks_.end() || it->second.end != end
        || !std::equal(it->second.tokens.begin(), it->second.tokens.end(), tokens))
      break;
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    found = it->second.kv;
    length = end;
  }
  if (length > 0)
    ++hits_;
  return {found, length};
}

void block_prefix_cache::insert(const std::vector<std::int32_t>& context, std::shared_ptr<const kv_sequence> kv,
                                std::uint64_t version) {
  if (capacity_ == 0 || !kv)
    return;
  const std::int64_t known = std::min<std::int64_t>(kv->length(), static_cast<std::int64_t>(context.size()));
  const std::int64_t whole = std::min(known / block_ * block_, max_positions_ / block_ * block_);
  if (whole == 0)
    return;
  if (kv->length() > max_positions_) // would pin more than the whole cache may
    kv = std::make_shared<const kv_sequence>(kv->prefix(whole));
  std::uint64_t h = 0;
  for (std::int64_t end = block_; end <= whole; end += block_) {
    const std::int32_t* tokens = context.data() + (end - block_);
    h = key(h, tokens, version);
    auto it = blocks_.find(h);
    if (it == blocks_.end()) {
      lru_.push_front(h);
      blocks_.emplace(h, entry{kv, std::vector<std::int32_t>(tokens, tokens + block_), end, lru_.begin()});
      hold(*kv);
      continue;
    }
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    // The same block (same tokens, version and prefix: the same KV) now
    // points at the newest sequence, so a hot prompt does not keep an old
    // sequence, and its completion's blocks, alive. Not on a hash collision.
    auto& e = it->second;
    if (e.kv != kv && e.end == end && std::equal(e.tokens.begin(), e.tokens.end(), tokens)) {
      release(*e.kv);
      e.kv = kv;
      hold(*kv);
    }
  }
  // Oldest first. Terminates: this sequence's entries are the newest, and
  // once only they are left it alone is held, at most max_positions_ long in
  // at most capacity_ blocks.
  while (blocks_.size() > capacity_ || held_positions_ > max_positions_) {
    auto oldest = blocks_.find(lru_.back());
    release(*oldest->second.kv);
    blocks_.erase(oldest);
    lru_.pop_back();
  }
}

void block_prefix_cache::hold(const kv_sequence& kv) {
  auto& k = kept_[&kv];
  if (k.entries++ == 0) {
    k.positions = kv.length();
    held_positions_ += k.positions;
  }
}

void block_prefix_cache::release(const kv_sequence& kv) {
  auto k = kept_.find(&kv);
  if (--k->second.entries == 0) {
    held_positions_ -= k->second.positions; // as held: the count never drifts
    kept_.erase(k);
  }
}

void block_prefix_cache::clear() {
  blocks_.clear();
  lru_.clear();
  kept_.clear();
  held_positions_ = 0;
}

} // namespace rlsync::engine
