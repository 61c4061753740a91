#include "runtime/control/routing.hpp"

#include "runtime/base/checksum.hpp"

#include <algorithm>

namespace rlsync {

router_config router_config_from(const topology& t) {
  router_config cfg;
  cfg.policy = t.router.policy;
  cfg.queue_limit = static_cast<std::size_t>(std::max<std::int64_t>(t.router.queue_limit, 0));
  cfg.staleness = static_cast<std::uint64_t>(std::max<std::int64_t>(t.sync.staleness, 0));
  return cfg;
}

std::uint64_t reference_version(const routing_rules& rules) {
  return std::max(rules.newest_version, rules.published_version);
}

bool is_current(const replica_load& r, const routing_rules& rules) {
  // The first comparison keeps the subtraction from wrapping.
  auto reference = reference_version(rules);
  return r.routable && (r.version >= reference || reference - r.version <= rules.staleness);
}

bool can_serve(const replica_load& r, const routing_rules& rules, std::uint64_t min_version) {
  return is_current(r, rules) && r.version >= min_version;
}

std::uint64_t prefix_hash(const std::vector<std::int32_t>& prompt, std::size_t k) {
  checksum64_stream h;
  auto n = std::min(k, prompt.size());
  for (std::size_t i = 0; i < n; ++i) {
    // Little-endian bytes, so the hash does not depend on the host.
    auto v = static_cast<std::uint32_t>(prompt[i]);
    unsigned char b[4] = {static_cast<unsigned char>(v), static_cast<unsigned char>(v >> 8),
                          static_cast<unsigned char>(v >> 16), static_cast<unsigned char>(v >> 24)};
    h.update(b, sizeof b);
  }
  return h.digest();
}

std::uint64_t affinity_score(std::uint64_t prefix, std::string_view replica) {
  return checksum64(replica.data(), replica.size(), prefix);
}

namespace {

constexpr auto none = static_cast<std::size_t>(-1);

bool avoided(const replica_load& r, const route_query& q) {
  return q.avoid && std::find(q.avoid->begin(), q.avoid->end(), r.name) != q.avoid->end();
}

/// Whether `r` may take this request: it can serve it and the request did not just leave it.
bool eligible(const replica_load& r, const routing_rules& rules, const route_query& q) {
  return can_serve(r, rules, q.min_version) && !avoided(r, q);
}

std::optional<std::size_t> least_outstanding(const std::vector<replica_load>& rs,
                                             const routing_rules& rules, const route_query& q) {
  auto best = none;
  for (std::size_t i = 0; i < rs.size(); ++i) {
    if (!eligible(rs[i], rules, q))
      continue;
    if (best == none || rs[i].outstanding < rs[best].outstanding
        || (rs[i].outstanding == rs[best].outstanding && rs[i].name < rs[best].name))
      best = i;
  }
  return best == none ? std::nullopt : std::optional<std::size_t>{best};
}

std::optional<std::size_t> round_robin(const std::vector<replica_load>& rs,
                                       const routing_rules& rules, const route_query& q,
                                       std::string& cursor) {
  auto after = none; // smallest name > cursor
  auto first = none; // smallest name overall, for the wrap-around
  for (std::size_t i = 0; i < rs.size(); ++i) {
    if (!eligible(rs[i], rules, q))
      continue;
    if (first == none || rs[i].name < rs[first].name)
      first = i;
    if (rs[i].name > cursor && (after == none || rs[i].name < rs[after].name))
      after = i;
  }
  auto pick = after != none ? after : first;
  if (pick == none)
    return std::nullopt;
  cursor = rs[pick].name;
  return pick;
}

std::optional<std::size_t> prefix_affinity(const std::vector<replica_load>& rs,
                                           const routing_rules& rules, const route_query& q) {
  auto preferred = none;
  std::uint64_t best_score = 0;
  for (std::size_t i = 0; i < rs.size(); ++i) {
    if (!rs[i].routable || avoided(rs[i], q))
      continue;
    auto s = affinity_score(q.prefix, rs[i].name);
    if (preferred == none || s > best_score || (s == best_score && rs[i].name < rs[preferred].name)) {
      preferred = i;
      best_score = s;
    }
  }
  if (preferred != none && can_serve(rs[preferred], rules, q.min_version))
    return preferred;
  return least_outstanding(rs, rules, q);
}

} // namespace

std::optional<std::size_t> choose_replica(const std::vector<replica_load>& replicas,
                                          const routing_rules& rules, const route_query& q,
                                          std::string& cursor) {
  switch (rules.policy) {
    case router_policy::least_outstanding: return least_outstanding(replicas, rules, q);
    case router_policy::round_robin: return round_robin(replicas, rules, q, cursor);
    case router_policy::prefix_affinity: return prefix_affinity(replicas, rules, q);
  }
  return least_outstanding(replicas, rules, q);
}

} // namespace rlsync
