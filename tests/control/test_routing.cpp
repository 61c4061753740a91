// The router's policies as pure functions, row by row: which replica may
// serve, and which one each policy picks.
#include "runtime/control/routing.hpp"

#include <doctest/doctest.h>

#include <map>
#include <set>

using namespace rlsync;

namespace {

replica_load rep(std::string name, std::uint64_t version, bool routable, std::uint32_t outstanding) {
  return {std::move(name), version, routable, outstanding};
}

/// The name picked, or "-" for none.
std::string pick(const std::vector<replica_load>& rs, const routing_rules& rules,
                 const route_query& q, std::string& cursor) {
  auto i = choose_replica(rs, rules, q, cursor);
  return i ? rs[*i].name : "-";
}

std::string pick(const std::vector<replica_load>& rs, const routing_rules& rules,
                 const route_query& q = {}) {
  std::string cursor;
  return pick(rs, rules, q, cursor);
}

} // namespace

TEST_CASE("can_serve: routable, within staleness of the newest version, at least min_version") {
  struct row {
    replica_load r;
    std::uint64_t newest, staleness, min_version;
    bool current, serves;
  };
  const row rows[] = {
    {rep("a", 5, true, 0), 5, 0, 0, true, true},
    {rep("a", 5, false, 0), 5, 0, 0, false, false},  // not routable
    {rep("a", 4, true, 0), 5, 0, 0, false, false},   // one behind, no staleness allowed
    {rep("a", 4, true, 0), 5, 1, 0, true, true},     // one behind, one allowed
    {rep("a", 3, true, 0), 5, 1, 0, false, false},   // two behind, one allowed
    {rep("a", 5, true, 0), 5, 0, 6, true, false},    // below the request's min_version
    {rep("a", 5, true, 0), 5, 0, 5, true, true},
    {rep("a", 0, true, 0), 0, 0, 0, true, true},     // nothing published yet
    {rep("a", 7, true, 0), 5, 0, 0, true, true},     // ahead of what the router knows: no wrap
  };
  for (auto& x : rows) {
    CAPTURE(x.r.version);
    CAPTURE(x.newest);
    CAPTURE(x.staleness);
    CAPTURE(x.min_version);
    routing_rules rules{router_policy::least_outstanding, x.newest, x.staleness};
    CHECK(is_current(x.r, rules) == x.current);
    CHECK(can_serve(x.r, rules, x.min_version) == x.serves);
  }
}

TEST_CASE("staleness is measured against the trainer's newest published version") {
  struct row {
    const char* why;
    std::uint64_t version;   // the replica's
    std::uint64_t routable;  // newest version any replica was routed at
    std::uint64_t published; // the trainer's newest, as reported (0: not yet)
    std::uint64_t staleness;
    std::uint64_t reference;
    bool current;
  };
  const row rows[] = {
    {"nothing reported: the newest routable version stands in", 4, 5, 0, 1, 5, true},
    {"nothing reported, two behind the newest routable", 3, 5, 0, 1, 5, false},
    {"every replica one behind the trainer, one allowed", 4, 4, 5, 1, 5, true},
    {"every replica two behind the trainer, one allowed", 3, 3, 5, 1, 5, false},
    {"staleness 0: only the trainer's newest", 4, 4, 5, 0, 5, false},
    {"staleness 0, at the trainer's newest", 5, 5, 5, 0, 5, true},
    {"a report older than the newest routable version", 5, 6, 4, 0, 6, false},
    {"within a wide bound", 2, 2, 9, 7, 9, true},
    {"just outside a wide bound", 1, 2, 9, 7, 9, false},
    {"ahead of the report: no wrap", 7, 7, 5, 0, 7, true},
  };
  for (auto& x : rows) {
    CAPTURE(x.why);
    routing_rules rules{router_policy::least_outstanding, x.routable, x.staleness, x.published};
    CHECK(reference_version(rules) == x.reference);
    CHECK(is_current(rep("a", x.version, true, 0), rules) == x.current);
    CHECK_FALSE(is_current(rep("a", x.version, false, 0), rules)); // never without the coordinator's word
    // No replica current: every policy leaves the request to the queue.
    for (auto policy : {router_policy::least_outstanding, router_policy::round_robin,
                        router_policy::prefix_affinity}) {
      rules.policy = policy;
      CHECK(pick({rep("a", x.version, true, 0)}, rules) == (x.current ? "a" : "-"));
    }
  }
}

TEST_CASE("least_outstanding: fewest outstanding, ties by name, only replicas that can serve") {
  routing_rules rules{router_policy::least_outstanding, 3, 0};
  struct row {
    std::vector<replica_load> rs;
    std::uint64_t min_version;
    std::string expected;
  };
  const row rows[] = {
    {{rep("a", 3, true, 2), rep("b", 3, true, 1), rep("c", 3, true, 3)}, 0, "b"},
    {{rep("c", 3, true, 1), rep("b", 3, true, 1), rep("a", 3, true, 1)}, 0, "a"}, // tie: by name
    {{rep("a", 3, false, 0), rep("b", 3, true, 9)}, 0, "b"},                    // a not routable
    {{rep("a", 2, true, 0), rep("b", 3, true, 9)}, 0, "b"},                     // a stale
    {{rep("a", 3, true, 0)}, 4, "-"},                                           // below min_version
    {{rep("a", 3, false, 0), rep("b", 2, true, 0)}, 0, "-"},
    {{}, 0, "-"},
  };
  for (auto& x : rows) {
    CAPTURE(x.expected);
    CHECK(pick(x.rs, rules, {x.min_version, 0}) == x.expected);
  }
}

TEST_CASE("every policy passes over the replicas a request just left") {
  const std::vector<replica_load> rs = {rep("a", 3, true, 0), rep("b", 3, true, 5), rep("c", 3, true, 9)};
  struct row {
    router_policy policy;
    std::vector<std::string> avoid;
    std::string expected;
  };
  const row rows[] = {
    {router_policy::least_outstanding, {}, "a"},
    {router_policy::least_outstanding, {"a"}, "b"},
    {router_policy::least_outstanding, {"a", "b"}, "c"},
    {router_policy::least_outstanding, {"a", "b", "c"}, "-"},
    {router_policy::round_robin, {"a"}, "b"},
    {router_policy::round_robin, {"a", "b", "c"}, "-"},
    {router_policy::prefix_affinity, {"a", "b", "c"}, "-"},
  };
  for (auto& x : rows) {
    CAPTURE(to_string(x.policy));
    CAPTURE(x.avoid.size());
    routing_rules rules{x.policy, 3, 0};
    route_query q;
    q.avoid = &x.avoid;
    CHECK(pick(rs, rules, q) == x.expected);
  }
  // prefix_affinity: the preferred replica left, the next best by score, not by load.
  routing_rules affinity{router_policy::prefix_affinity, 3, 0};
  route_query q;
  q.prefix = prefix_hash({1, 2, 3}, 32);
  const std::string first = pick(rs, affinity, q);
  std::vector<std::string> left = {first};
  q.avoid = &left;
  const std::string second = pick(rs, affinity, q);
  CHECK(second != first);
  CHECK(second != "-");
  std::string best;
  std::uint64_t best_score = 0;
  for (auto& r : rs)
    if (r.name != first && (best.empty() || affinity_score(q.prefix, r.name) > best_score)) {
      best = r.name;
      best_score = affinity_score(q.prefix, r.name);
    }
  CHECK(second == best);
}

TEST_CASE("round_robin: cycles by name, skips what cannot serve, survives joins and leaves") {
  routing_rules rules{router_policy::round_robin, 1, 0};
  std::vector<replica_load> rs = {rep("b", 1, true, 0), rep("a", 1, true, 5), rep("c", 1, true, 0)};
  std::string cursor;
  std::vector<std::string> got;
  for (int i = 0; i < 7; ++i)
    got.push_back(pick(rs, rules, {}, cursor));
  CHECK(got == std::vector<std::string>{"a", "b", "c", "a", "b", "c", "a"});
  // b stops serving: the cycle skips it.
  rs[0].routable = false;
  got.clear();
  for (int i = 0; i < 3; ++i)
    got.push_back(pick(rs, rules, {}, cursor));
  CHECK(got == std::vector<std::string>{"c", "a", "c"});
  // a leaves while it was last; "ab" joins: the cycle continues after the cursor's name.
  rs.erase(rs.begin() + 1);
  rs.push_back(rep("ab", 1, true, 0));
  cursor = "a";
  got.clear();
  for (int i = 0; i < 3; ++i)
    got.push_back(pick(rs, rules, {}, cursor));
  CHECK(got == std::vector<std::string>{"ab", "c", "ab"});
  // Nothing can serve: no pick, cursor untouched.
  for (auto& r : rs)
    r.routable = false;
  CHECK(pick(rs, rules, {}, cursor) == "-");
  CHECK(cursor == "ab");
}

TEST_CASE("prefix_hash: the first k tokens only, and not the same for different prefixes") {
  std::vector<std::int32_t> p1 = {1, 2, 3, 4, 5};
  std::vector<std::int32_t> p2 = {1, 2, 3, 9, 9};
  CHECK(prefix_hash(p1, 3) == prefix_hash(p2, 3));
  CHECK(prefix_hash(p1, 4) != prefix_hash(p2, 4));
  CHECK(prefix_hash(p1, 100) == prefix_hash(p1, 5)); // shorter prompt: all of it
  CHECK(prefix_hash({1, 2}, 8) != prefix_hash({2, 1}, 8));
  // Fixed values: the hash must not change between builds or hosts. XXH3 (64-bit, seed 0)
  // of the tokens' little-endian int32 bytes, from xxhsum -H3:
  //   printf '\x01\0\0\0\x02\0\0\0\x03\0\0\0' | xxhsum -H3 -
  CHECK(prefix_hash({1, 2, 3}, 8) == 0x6bbf7429332bea48ull);
  CHECK(prefix_hash({}, 8) == 0x2d06800538d394c2ull); // nothing
}

TEST_CASE("prefix_affinity: stable for a prefix, spread over replicas, falls back") {
  routing_rules rules{router_policy::prefix_affinity, 2, 0};
  std::vector<replica_load> rs = {rep("a", 2, true, 0), rep("b", 2, true, 0), rep("c", 2, true, 0),
                                  rep("d", 2, true, 0)};
  // Stable: the same prefix picks the same replica, whatever the load or order.
  std::map<std::uint64_t, std::string> home;
  std::set<std::string> used;
  for (std::int32_t t = 0; t < 64; ++t) {
    auto prefix = prefix_hash({t, 7, 7}, 3);
    home[prefix] = pick(rs, rules, {0, prefix});
    used.insert(home[prefix]);
  }
  CHECK(used.size() == 4); // 64 prefixes land on every replica
  auto shuffled = rs;
  std::swap(shuffled[0], shuffled[3]);
  shuffled[1].outstanding = 50;
  for (auto& [prefix, name] : home)
    CHECK(pick(shuffled, rules, {0, prefix}) == name);

  // A replica that is no longer routable: only its own prefixes move.
  auto without_b = rs;
  without_b[1].routable = false;
  for (auto& [prefix, name] : home) {
    auto now = pick(without_b, rules, {0, prefix});
    if (name == "b")
      CHECK(now != "b");
    else
      CHECK(now == name);
  }

  // The preferred replica is routable but stale or too old for the request:
  // least outstanding among the rest.
  std::uint64_t prefix_of_a = 0;
  for (auto& [prefix, name] : home)
    if (name == "a")
      prefix_of_a = prefix;
  auto stale_a = rs;
  stale_a[0].version = 1;
  stale_a[1].outstanding = 3;
  stale_a[2].outstanding = 1;
  stale_a[3].outstanding = 2;
  CHECK(pick(stale_a, rules, {0, prefix_of_a}) == "c");
  auto old_a = rs;
  old_a[0].version = 1;
  routing_rules lax = rules;
  lax.staleness = 1; // a is current, but the request wants version 2
  old_a[1].outstanding = 1;
  old_a[2].outstanding = 1;
  CHECK(pick(old_a, lax, {1, prefix_of_a}) == "a");
  CHECK(pick(old_a, lax, {2, prefix_of_a}) == "d");
}

TEST_CASE("router_config_from: policy, queue limit and the sync staleness bound") {
  topology t;
  t.router.policy = router_policy::round_robin;
  t.router.queue_limit = 7;
  t.sync.staleness = 2;
  auto cfg = router_config_from(t);
  CHECK(cfg.policy == router_policy::round_robin);
  CHECK(cfg.queue_limit == 7);
  CHECK(cfg.staleness == 2);
}
