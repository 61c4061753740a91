// The prefix cache's two bounds (blocks, and positions of KV kept alive),
// its LRU order, and the cut of a sequence longer than the whole cache.
#include "runtime/engine/prefix_cache.hpp"
#include "tests/support/engine_fixtures.hpp"

#include <doctest/doctest.h>

#include <numeric>
#include <vector>

using namespace rlsync::engine;
using rlsync::test::tiny_config;

namespace {

/// A finished request's KV of `n` positions; key floats count up from `first`.
std::shared_ptr<const kv_sequence> sequence(std::int64_t n, float first = 0) {
  kv_sequence kv(tiny_config(), 1);
  kv.reserve(0, n);
  for (std::int64_t l = 0; l < tiny_config().num_hidden_layers; ++l)
    std::iota(kv.keys(0, l), kv.keys(0, l) + n * kv.row(), first);
  kv.set_length(n);
  return std::make_shared<const kv_sequence>(std::move(kv));
}

/// `prompt` followed by `n` tokens unique to `id`.
std::vector<std::int32_t> context(const std::vector<std::int32_t>& prompt, int id, int n) {
  auto c = prompt;
  for (int i = 0; i < n; ++i)
    c.push_back(1000 + id * 100 + i);
  return c;
}

} // namespace

TEST_CASE("prefix cache: a hit returns the longest whole-block prefix of the same version") {
  block_prefix_cache cache(4, 64);
  const std::vector<std::int32_t> prompt{1, 2, 3, 4, 5, 6, 7, 8};
  auto c = context(prompt, 1, 6); // 14 tokens: 3 whole blocks
  cache.insert(c, sequence(14), 7);
  CHECK(cache.blocks() == 3);
  CHECK(cache.held_positions() == 14);
  auto [kv, length] = cache.lookup(c, 14, 7);
  CHECK(length == 12);
  REQUIRE(static_cast<bool>(kv));
  CHECK(kv->length() == 14);
  CHECK(cache.lookup(c, 11, 7).second == 8);     // at most max_tokens, whole blocks
  CHECK(cache.lookup(c, 14, 8).second == 0);     // another version: no hit
  CHECK(cache.lookup(context(prompt, 2, 6), 14, 7).second == 8); // the shared prompt only
  CHECK(cache.queries() == 4);
  CHECK(cache.hits() == 3);
  cache.clear();
  CHECK(cache.blocks() == 0);
  CHECK(cache.held_positions() == 0);
  CHECK(cache.lookup(c, 14, 7).second == 0);
}

TEST_CASE("prefix cache: hot prompt blocks do not keep long completions alive") {
  // 8 blocks of 4 positions: at most 32 positions of KV, however many
  // requests share the prompt and however long their completions are.
  block_prefix_cache cache(4, 8);
  const std::vector<std::int32_t> prompt{1, 2, 3, 4};
  for (int id = 0; id < 20; ++id) {
    auto c = context(prompt, id, 20); // 24 positions each
    cache.insert(c, sequence(24), 1);
    CAPTURE(id);
    CHECK(cache.blocks() <= 8);
    CHECK(cache.held_positions() <= 32);
    // The hot prompt and the newest completion stay findable.
    CHECK(cache.lookup(context(prompt, 99, 4), 8, 1).second == 4);
    CHECK(cache.lookup(c, 24, 1).second == 24);
  }
}

TEST_CASE("prefix cache: a sequence longer than the whole cache is cut to it") {
  block_prefix_cache cache(4, 4); // 16 positions
  const std::vector<std::int32_t> prompt{1, 2, 3, 4};
  auto c = context(prompt, 1, 36); // 40 positions
  auto long_kv = sequence(40, 0.5f);
  cache.insert(c, long_kv, 1);
  CHECK(cache.blocks() == 4);
  CHECK(cache.held_positions() == 16);
  auto [kv, length] = cache.lookup(c, 40, 1);
  CHECK(length == 16);
  REQUIRE(static_cast<bool>(kv));
  CHECK(kv->length() == 16);
  CHECK((kv != long_kv)); // a copy: the long sequence is not pinned
  CHECK(kv->bytes() < long_kv->bytes());
  // The copy holds the same positions: a hit copied from it starts equal.
  kv_sequence from_cut(tiny_config(), 1);
  from_cut.copy_prefix(*kv, 16);
  kv_sequence from_long(tiny_config(), 1);
  from_long.copy_prefix(*long_kv, 16);
  for (std::int64_t l = 0; l < tiny_config().num_hidden_layers; ++l)
    CHECK(std::equal(from_cut.keys(0, l), from_cut.keys(0, l) + 16 * from_cut.row(), from_long.keys(0, l)));
}

TEST_CASE("prefix cache: capacity 0 caches nothing") {
  block_prefix_cache cache(4, 0);
  std::vector<std::int32_t> c{1, 2, 3, 4, 5, 6, 7, 8};
  cache.insert(c, sequence(8), 1);
  CHECK(cache.blocks() == 0);
  CHECK(cache.held_positions() == 0);
  CHECK(cache.lookup(c, 8, 1).second == 0);
}
