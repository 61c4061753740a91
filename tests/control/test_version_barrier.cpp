// The version barrier across trainer ranks, row by row: which version is
// syncable when ranks publish at different times, and which layouts and
// publications are errors naming the ranks (and the tensor).
#include "runtime/control/version_barrier.hpp"

#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

using namespace rlsync;

namespace {

/// Parameters "a", "b", "c"; rank 0 holds a and b, rank 1 b and c (b twice).
const std::vector<std::string> names = {"a", "b", "c"};

rank_info rank(std::uint32_t r, std::vector<std::string> held) {
  return rank_info{r, "node", 1, std::move(held)};
}

/// One publication: rank, version, group count, checksums of what it holds.
struct pub {
  std::uint32_t rank;
  std::uint64_t version;
  std::uint32_t groups = 4;
  std::vector<std::uint64_t> checksums = {};
};

bool any_error_has(const barrier_verdict& v, const std::string& text) {
  for (auto& e : v.errors)
    if (e.text.find(text) != std::string::npos)
      return true;
  return false;
}

} // namespace

TEST_CASE("version_barrier: the syncable version is the newest every rank published and still holds") {
  struct row {
    const char* what;
    std::vector<pub> published;
    std::optional<std::uint64_t> syncable;
    std::vector<std::string> errors; // substrings, one per expected error
  };
  std::vector<row> rows = {
    {"nothing published", {}, std::nullopt, {}},
    {"one rank published, the other not yet", {{0, 1}}, std::nullopt, {}},
    {"both at v1", {{0, 1}, {1, 1}}, 1, {}},
    {"rank 0 a step ahead: the common one", {{0, 1}, {1, 1}, {0, 2}}, 1, {}},
    {"rank 1 a step ahead", {{0, 3}, {1, 3}, {1, 4}}, 3, {}},
    {"both caught up", {{0, 3}, {1, 3}, {1, 4}, {0, 4}}, 4, {}},
    {"a repeat changes nothing", {{0, 2}, {1, 2}, {0, 2}}, 2, {}},
    {"past each other by more than the window of 2: named", {{0, 1}, {1, 5}}, std::nullopt,
     {"rank 1 at v5 is past rank 0 at v1"}},
    {"a rank that skipped versions (a catch-up) meets the others", {{0, 6}, {0, 7}, {1, 7}}, 7, {}},
    {"one version, two group counts: named, no round on it", {{0, 2, 4}, {1, 2, 5}}, std::nullopt,
     {"v2: rank 0 publishes 4 groups, rank 1 5"}},
    {"the shared tensor with the same bytes", {{0, 3, 4, {10, 20}}, {1, 3, 4, {20, 30}}}, 3, {}},
    {"the shared tensor with different bytes: ranks and tensor named", {{0, 3, 4, {10, 20}}, {1, 3, 4, {21, 30}}},
     std::nullopt, {"v3: rank 0 and rank 1 hold different bytes of 1 tensor: b"}},
    {"one rank without checksums: nothing to compare", {{0, 3, 4, {10, 20}}, {1, 3}}, 3, {}},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    version_barrier b{2, names, 2};
    REQUIRE(b.join(rank(0, {"a", "b"})).empty());
    REQUIRE(b.join(rank(1, {"b", "c"})).empty());
    barrier_verdict v;
    for (auto& p : r.published) {
      CHECK(b.publish(p.rank, version_info{p.version, p.groups, 100, p.checksums}).empty());
      v = b.evaluate();
    }
    CHECK(v.syncable.has_value() == r.syncable.has_value());
    if (v.syncable && r.syncable) {
      CHECK(v.syncable->version == *r.syncable);
      CHECK(v.syncable->total_bytes == 200); // both ranks' bytes
    }
    REQUIRE(v.errors.size() == r.errors.size());
    for (auto& text : r.errors) {
      CAPTURE(text);
      CHECK(any_error_has(v, text));
    }
  }
}

TEST_CASE("version_barrier: layouts") {
  struct row {
    const char* what;
    std::vector<rank_info> ranks;
    std::string refused; // a join refused with this, or empty
    std::string error;   // an evaluate error, or empty
  };
  std::vector<row> rows = {
    {"two ranks cover the model, b twice", {rank(0, {"a", "b"}), rank(1, {"b", "c"})}, "", ""},
    {"c held by nobody: the ranks and the tensor named", {rank(0, {"a", "b"}), rank(1, {"b"})}, "",
     "1 tensors held by no rank (ranks 0, 1 registered): c"},
    {"a name that is no parameter", {rank(0, {"a", "b", "zz"})}, "rank 0 holds zz, no parameter of the model", ""},
    {"a rank beyond the topology's", {rank(2, {"a"})}, "rank 2 is not a rank of the topology, which has 2 ranks", ""},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    version_barrier b{2, names, 2};
    std::string refused;
    for (auto& info : r.ranks)
      if (auto why = b.join(info); !why.empty())
        refused = why;
    CHECK(refused == r.refused);
    if (!r.refused.empty())
      continue;
    for (std::uint32_t k = 0; k < 2; ++k)
      CHECK(b.publish(k, version_info{1, 4, 100, {}}).empty());
    auto v = b.evaluate();
    if (r.error.empty()) {
      CHECK(v.errors.empty());
      CHECK(v.syncable.has_value());
    } else {
      REQUIRE(v.errors.size() == 1);
      CHECK(v.errors[0].text == r.error);
      CHECK(!v.syncable); // no round on a broken layout
    }
  }
}

TEST_CASE("version_barrier: never backwards, a restarted rank starts with nothing published") {
  version_barrier b{2, names, 2};
  REQUIRE(b.join(rank(0, {"a", "b"})).empty());
  REQUIRE(b.join(rank(1, {"b", "c"})).empty());
  for (std::uint64_t v : {4, 5})
    for (std::uint32_t r : {0u, 1u})
      CHECK(b.publish(r, version_info{v, 4, 1, {}}).empty());
  REQUIRE(b.evaluate().syncable);
  CHECK(b.evaluate().syncable->version == 5);
  CHECK(b.newest_published() == 5);
  // Rank 1 restarts: until it publishes, nothing is syncable.
  auto restarted = rank(1, {"b", "c"});
  restarted.incarnation = 2;
  REQUIRE(b.join(restarted).empty());
  CHECK(!b.evaluate().syncable);
  // It comes back at v1, far below: catching up, not an error.
  CHECK(b.publish(1, version_info{1, 4, 1, {}}).empty());
  CHECK(!b.evaluate().syncable);
  CHECK(b.evaluate().errors.empty());
  // Then at v4 (below the synced v5): common v4 is behind, refused.
  CHECK(b.publish(1, version_info{4, 4, 1, {}}).empty());
  auto v = b.evaluate();
  CHECK(!v.syncable);
  CHECK(v.errors.empty());
  // It catches up to the cluster's newest: v5 again.
  CHECK(b.publish(1, version_info{5, 4, 1, {}}).empty());
  REQUIRE(b.evaluate().syncable);
  CHECK(b.evaluate().syncable->version == 5);
}

TEST_CASE("version_barrier: the syncable version's bytes date from the latest any rank says") {
  struct row {
    const char* what;
    std::uint64_t rank0_since, rank1_since; // what each says of v4 (each published v1 to v4)
    std::uint64_t combined;
  };
  std::vector<row> rows = {
    {"both changed at v4", 4, 4, 4},
    {"neither changed since v2", 2, 2, 2},
    {"rank 1 changed at v3: the whole model dates from v3", 2, 3, 3},
    {"rank 0 did not say: not known", 0, 2, 0},
    {"rank 0 unchanged since v1, rank 1 since v2", 1, 2, 2},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    version_barrier b{2, names, 2};
    REQUIRE(b.join(rank(0, {"a", "b"})).empty());
    REQUIRE(b.join(rank(1, {"b", "c"})).empty());
    for (std::uint32_t k : {0u, 1u}) {
      for (std::uint64_t ver : {1, 2, 3})
        CHECK(b.publish(k, version_info{ver, 4, 1, {}}).empty());
      version_info v4{4, 4, 1, {}};
      v4.same_bytes_since = k == 0 ? r.rank0_since : r.rank1_since;
      CHECK(b.publish(k, v4).empty());
    }
    auto v = b.evaluate();
    REQUIRE(v.syncable);
    CHECK(v.syncable->version == 4);
    CHECK(v.syncable->same_bytes_since == r.combined);
  }
}

TEST_CASE("version_barrier: a restarted rank vouches for no version the cluster knew when it registered") {
  struct row {
    const char* what;
    std::uint64_t republished; // the version the new incarnation publishes first (the old one reached v10)
    std::uint64_t since;       // what its source says of v11
    std::uint64_t combined;    // of v11
  };
  const std::vector<row> rows = {
    {"it publishes v10 again, other bytes perhaps, and v11 the same as that", 10, 10, 11},
    {"it starts past the old numbers: v11 is its first", 11, 11, 11},
    {"v11 new bytes", 10, 11, 11},
  };
  for (const auto& r : rows) {
    CAPTURE(r.what);
    version_barrier b{2, names, 4};
    REQUIRE(b.join(rank(0, {"a", "b"})).empty());
    REQUIRE(b.join(rank(1, {"b", "c"})).empty());
    for (std::uint64_t ver : {9, 10})
      for (std::uint32_t k : {0u, 1u}) {
        version_info vi{ver, 4, 1, {}};
        vi.same_bytes_since = 9;
        CHECK(b.publish(k, vi).empty());
      }
    REQUIRE(b.evaluate().syncable);
    CHECK(b.evaluate().syncable->same_bytes_since == 9);
    auto restarted = rank(1, {"b", "c"});
    restarted.incarnation = 2;
    REQUIRE(b.join(restarted, 11).empty()); // the coordinator: one past the newest it knew (v10)
    for (std::uint64_t ver = r.republished; ver <= 11; ++ver) {
      version_info vi{ver, 4, 1, {}};
      vi.same_bytes_since = ver == 11 ? r.since : r.republished;
      CHECK(b.publish(1, vi).empty());
    }
    version_info v11{11, 4, 1, {}};
    v11.same_bytes_since = 9; // rank 0 changed nothing since v9
    CHECK(b.publish(0, v11).empty());
    auto v = b.evaluate();
    REQUIRE(v.syncable);
    CHECK(v.syncable->version == 11);
    CHECK(v.syncable->same_bytes_since == r.combined); // engines serving the old v10 pull v11
  }
  SUBCASE("a version below what it may vouch for is not known") {
    version_barrier b{1, {"a"}, 4};
    REQUIRE(b.join(rank_info{0, "node", 2, {"a"}}, 6).empty());
    version_info v5{5, 4, 1, {}};
    v5.same_bytes_since = 5;
    CHECK(b.publish(0, v5).empty());
    REQUIRE(b.evaluate().syncable);
    CHECK(b.evaluate().syncable->same_bytes_since == 0);
  }
}

TEST_CASE("version_barrier: refused publications name the rank") {
  version_barrier b{2, names, 2};
  CHECK(b.publish(0, version_info{1, 4, 1, {}}) == "rank 0 published v1 before registering");
  REQUIRE(b.join(rank(0, {"a", "b"})).empty());
  CHECK(b.publish(0, version_info{1, 4, 1, {7}}) == "rank 0 published v1 with 1 checksums for the 2 tensors it holds");
  CHECK(b.publish(0, version_info{1, 4, 1, {7, 8}}).empty());
}

TEST_CASE("version_barrier: holds(v) while every rank keeps v and it checks out") {
  version_barrier b{2, names, 2};
  REQUIRE(b.join(rank(0, {"a", "b"})).empty());
  CHECK(!b.holds(1)); // rank 1 missing
  REQUIRE(b.join(rank(1, {"b", "c"})).empty());
  CHECK(b.publish(0, version_info{1, 4, 1, {1, 2}}).empty());
  CHECK(!b.holds(1));
  CHECK(b.publish(1, version_info{1, 4, 1, {2, 3}}).empty());
  CHECK(b.holds(1));
  CHECK(b.publish(0, version_info{2, 4, 1, {1, 2}}).empty());
  CHECK(b.publish(1, version_info{2, 4, 1, {9, 3}}).empty()); // b differs at v2
  CHECK(!b.holds(2));
  CHECK(b.holds(1));
  CHECK(b.publish(0, version_info{3, 4, 1, {}}).empty()); // rank 0 dropped v1
  CHECK(!b.holds(1));
}

TEST_CASE("version_barrier: ranks left behind are named with the version to catch up to") {
  struct row {
    const char* what;
    std::vector<pub> published;
    std::vector<std::uint32_t> behind;
    std::uint64_t catch_up_to;
  };
  std::vector<row> rows = {
    {"in step: nobody behind", {{0, 3}, {1, 3}}, {}, 0},
    {"one step apart: a common version, nobody behind", {{0, 3}, {1, 3}, {0, 4}}, {}, 0},
    {"rank 0 joined late, far behind", {{1, 5}, {1, 6}, {0, 1}}, {0}, 6},
    {"rank 1 far behind", {{0, 1}, {0, 2}, {1, 1}, {0, 3}, {0, 4}}, {1}, 4},
    {"caught up: nobody behind", {{0, 4}, {1, 1}, {1, 4}}, {}, 0},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    version_barrier b{2, names, 2};
    REQUIRE(b.join(rank(0, {"a", "b"})).empty());
    REQUIRE(b.join(rank(1, {"b", "c"})).empty());
    barrier_verdict v;
    for (auto& p : r.published) {
      CHECK(b.publish(p.rank, version_info{p.version, p.groups, 100, p.checksums}).empty());
      v = b.evaluate();
    }
    CHECK(v.behind == r.behind);
    CHECK(v.catch_up_to == r.catch_up_to);
  }
}
