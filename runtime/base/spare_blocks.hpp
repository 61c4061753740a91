#pragma once
// Memory kept for reuse once its last user lets go. A source that publishes
// one version after another recycles the memory of the versions it drops:
// fresh pages cost a fault each at first touch, and on VMs whose hypervisor
// faults pages in, that costs more than filling them (README, "Trainer").
// Two limits bound what is kept, a count and a byte total; a block given back
// that would pass either makes room by freeing the spares given back longest
// ago (a spare that fits no later request would otherwise hold its place for
// good, and the newest memory is likeliest to fit the next version), or is
// freed itself when it alone passes the byte limit. Copies of a pool share its
// spares; a block given back after every copy is gone is freed.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace rlsync {

template <class Block>
class spare_blocks {
public:
  using block_ptr = std::unique_ptr<Block>;

  explicit spare_blocks(std::size_t max_blocks, std::uint64_t max_bytes = std::numeric_limits<std::uint64_t>::max())
      : state_(std::make_shared<state>()) {
    state_->max_blocks = max_blocks;
    state_->max_bytes = max_bytes;
  }
  // Copies share the spares; no move, so that no pool is ever left empty.
  spare_blocks(const spare_blocks&) = default;
  spare_blocks& operator=(const spare_blocks&) = default;

  /// The smallest spare of at least `bytes` and at most twice that (a small
  /// request must not take the memory a large one will want), or nullptr.
  /// Returns it with its size.
  std::pair<block_ptr, std::uint64_t> take(std::uint64_t bytes) const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto it = state_->free.lower_bound(bytes);
    if (it == state_->free.end() || it->first - bytes > bytes)
      return {nullptr, 0};
    std::pair<block_ptr, std::uint64_t> taken{std::move(it->second.block), it->first};
    state_->free_bytes -= it->first;
    state_->free.erase(it);
    return taken;
  }

  /// `block` (of `size` bytes), shared: when its last owner lets go it comes
  /// back as a spare if a copy of this pool lives and the block fits the
  /// limits (the oldest spares freed to make room), else it is freed. Memory
  /// is freed outside the lock. The deleter cannot throw.
  std::shared_ptr<Block> share(block_ptr block, std::uint64_t size) const {
    std::weak_ptr<state> back = state_;
    return std::shared_ptr<Block>(block.release(), [back, size](typename block_ptr::pointer p) noexcept {
      block_ptr owned(p);
      std::vector<block_ptr> evicted; // destroyed after the lock is released
      try {
        if (auto s = back.lock()) {
          std::lock_guard<std::mutex> lock(s->mutex);
          if (s->max_blocks == 0 || size > s->max_bytes)
            return;
          // free_bytes <= max_bytes always, so the subtraction cannot wrap.
          while (s->free.size() >= s->max_blocks || size > s->max_bytes - s->free_bytes) {
            auto oldest = std::min_element(s->free.begin(), s->free.end(), [](const auto& a, const auto& b) {
              return a.second.given_back < b.second.given_back;
            });
            evicted.push_back(std::move(oldest->second.block));
            s->free_bytes -= oldest->first;
            s->free.erase(oldest);
          }
          s->free.emplace(size, spare{std::move(owned), s->given_back++});
          s->free_bytes += size;
        }
      } catch (...) { // a lock, a vector or a map node that failed: not kept
      }
    });
  }

  /// Raises the byte limit to `bytes`; it never shrinks.
  void raise_byte_limit(std::uint64_t bytes) const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->max_bytes = std::max(state_->max_bytes, bytes);
  }

  /// Frees every spare: when fresh memory is short, they may be what is missing.
  void clear() const {
    std::multimap<std::uint64_t, spare> dropped;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      dropped.swap(state_->free);
      state_->free_bytes = 0;
    }
  }

  std::uint64_t bytes() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->free_bytes;
  }
  std::size_t count() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->free.size();
  }

private:
  struct spare {
    block_ptr block;
    std::uint64_t given_back = 0; // order of return: the smallest is the oldest
  };
  struct state {
    std::mutex mutex;
    std::multimap<std::uint64_t, spare> free; // by size
    std::uint64_t given_back = 0;
    std::uint64_t free_bytes = 0;
    std::size_t max_blocks = 0;
    std::uint64_t max_bytes = 0;
  };
  std::shared_ptr<state> state_;
};

} // namespace rlsync
