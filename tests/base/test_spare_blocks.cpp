#include "runtime/base/spare_blocks.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <string>
#include <vector>

using namespace rlsync;

namespace {

/// A block that counts its live instances: what a pool frees is seen.
struct counted {
  static inline int alive = 0;
  counted() { ++alive; }
  ~counted() { --alive; }
  counted(const counted&) = delete;
  counted& operator=(const counted&) = delete;
};

/// Shares fresh blocks of `sizes` from `pool` and lets them all go.
void give_back(spare_blocks<std::byte[]>& pool, const std::vector<std::uint64_t>& sizes) {
  for (auto size : sizes)
    pool.share(std::unique_ptr<std::byte[]>(new std::byte[size]), size).reset();
}

} // namespace

TEST_CASE("spare_blocks keeps within both limits and takes the best fit up to twice the request") {
  struct row {
    std::string what;
    std::size_t max_blocks;
    std::uint64_t max_bytes;
    std::vector<std::uint64_t> given_back;
    std::uint64_t request;
    std::uint64_t taken; // 0: none fits
    std::uint64_t left;  // spare bytes after the take
  };
  const std::vector<row> rows = {
      {"exact size", 4, 10000, {1000}, 1000, 1000, 0},
      {"best fit among several", 4, 10000, {4000, 1200, 1000, 3000}, 900, 1000, 8200},
      {"more than twice the request: none", 4, 10000, {1000}, 499, 0, 1000},
      {"exactly twice the request fits", 4, 10000, {1000}, 500, 1000, 0},
      {"none large enough", 4, 10000, {1000, 2000}, 2001, 0, 3000},
      {"the count limit frees the oldest", 2, 10000, {100, 200, 300}, 100, 200, 300},
      {"the byte limit frees the oldest to make room", 4, 1500, {1000, 600, 500}, 1000, 0, 1100},
      {"the byte limit frees no more than it must", 4, 1500, {400, 500, 600, 300}, 400, 500, 900},
      {"a block alone past the byte limit is freed, the spares stay", 4, 1500, {1000, 2000}, 1000, 1000, 0},
      {"a zero limit keeps nothing", 4, 0, {1}, 1, 0, 0},
  };
  for (const auto& r : rows) {
    CAPTURE(r.what);
    spare_blocks<std::byte[]> pool(r.max_blocks, r.max_bytes);
    give_back(pool, r.given_back);
    auto [block, size] = pool.take(r.request);
    CHECK(size == r.taken);
    CHECK(static_cast<bool>(block) == (r.taken != 0));
    CHECK(pool.bytes() == r.left);
  }
}

TEST_CASE("spare_blocks: the byte limit only grows, clear frees every spare") {
  spare_blocks<std::byte[]> pool(8, 100);
  pool.raise_byte_limit(50); // never shrinks
  give_back(pool, {60, 40});
  CHECK(pool.bytes() == 100);
  CHECK(pool.count() == 2);
  pool.raise_byte_limit(300);
  give_back(pool, {200});
  CHECK(pool.bytes() == 300);
  pool.clear();
  CHECK(pool.bytes() == 0);
  CHECK(pool.count() == 0);
}

TEST_CASE("spare_blocks: a block taken and shared again returns to the pool, or is freed once it is gone") {
  spare_blocks<std::byte[]> pool(2);
  give_back(pool, {64});
  auto [block, size] = pool.take(64);
  REQUIRE(block);
  std::byte* const where = block.get();
  auto shared = pool.share(std::move(block), size);
  CHECK(pool.count() == 0);
  shared.reset();
  CHECK(pool.take(64).first.get() == where); // the same memory again
  std::shared_ptr<std::byte[]> outlives;
  {
    spare_blocks<std::byte[]> gone(2);
    auto copy = gone; // copies share their spares
    outlives = copy.share(std::unique_ptr<std::byte[]>(new std::byte[16]), 16);
    give_back(gone, {8});
    CHECK(copy.count() == 1);
  }
  outlives.reset(); // every copy of its pool is gone: freed, not kept
}

TEST_CASE("spare_blocks frees what it does not keep, and what comes back once the pool is gone") {
  REQUIRE(counted::alive == 0);
  std::shared_ptr<counted> outlives;
  {
    spare_blocks<counted> pool(3, 250);
    auto share = [&](std::uint64_t size) { return pool.share(std::make_unique<counted>(), size); };
    auto a = share(100), b = share(100), c = share(100), d = share(10);
    CHECK(counted::alive == 4);
    a.reset();
    b.reset(); // kept: 200 bytes
    c.reset(); // 300 bytes would pass the byte limit: a, the oldest, freed
    CHECK(counted::alive == 3);
    d.reset(); // kept: three blocks, 210 bytes
    share(1).reset(); // a fourth would pass the count limit: b freed
    CHECK(counted::alive == 3);
    CHECK(pool.count() == 3);
    CHECK(pool.bytes() == 111);
    auto [taken, size] = pool.take(100);
    REQUIRE(taken);
    CHECK(size == 100);
    auto e = pool.share(std::move(taken), size);
    pool.clear(); // the two spares left
    CHECK(counted::alive == 1);
    {
      const auto copy = pool; // copies share the spares
      e.reset();
      CHECK(copy.count() == 1);
    }
    CHECK(pool.count() == 1);
    CHECK(counted::alive == 1);
    outlives = share(1);
    CHECK(counted::alive == 2);
  } // the pool is gone: its spare freed
  CHECK(counted::alive == 1);
  outlives.reset(); // given back to no pool: freed
  CHECK(counted::alive == 0);
}
