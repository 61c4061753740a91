#include "actors/jobs/status.hpp"

#include "actors/gatekeeper.hpp"
#include "actors/jobs/job_report.hpp"
#include "actors/tls.hpp"
#include "runtime/base/version.hpp"
#include "runtime/control/round_figures.hpp"

#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

namespace rlsync::jobs {

namespace {

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::string state_of(const engine_info& m, const coordinator_status& c, bool evicted_before) {
  if (contains(c.unreachable, m.name))
    return "unreachable";
  if (contains(c.routable, m.name))
    return "serving";
  if (m.dirty && evicted_before)
    return "dirty";
  if (evicted_before)
    return "evicted";
  return m.dirty && m.version != 0 ? "dirty" : "syncing";
}

} // namespace

fleet_view fleet_view_of(const coordinator_status& c, const std::optional<router_status>& r) {
  fleet_view v;
  v.version = c.version;
  v.rounds = c.rounds;
  v.live = c.live;
  v.below_min_live_events = c.below_min_live_events;
  v.router = r;
  v.nccl_epoch = c.nccl_epoch;
  v.nccl_members = c.nccl_members;
  v.nccl_rebuilds = c.nccl_rebuilds;
  v.nccl_healthy = c.nccl_healthy;
  if (!c.history.empty())
    v.last_round = c.history.back();
  std::set<std::string> seen;
  for (const auto& m : c.members) {
    fleet_engine e;
    e.name = m.name;
    e.node = m.node;
    e.version = m.version;
    e.incarnation = m.incarnation;
    if (auto i = c.last_evictions.find(m.name); i != c.last_evictions.end())
      e.last_eviction = i->second;
    e.state = state_of(m, c, !e.last_eviction.empty());
    if (r) {
      auto i = r->outstanding_by_engine.find(m.name);
      e.outstanding = i == r->outstanding_by_engine.end() ? 0 : i->second;
    }
    seen.insert(m.name);
    v.engines.push_back(std::move(e));
  }
  for (const auto& name : c.retired) // no longer members: known by name only
    if (seen.insert(name).second) {
      fleet_engine e;
      e.name = name;
      e.state = "retired";
      if (auto i = c.last_evictions.find(name); i != c.last_evictions.end())
        e.last_eviction = i->second;
      v.engines.push_back(std::move(e));
    }
  std::sort(v.engines.begin(), v.engines.end(),
            [](const fleet_engine& a, const fleet_engine& b) { return a.name < b.name; });
  return v;
}

std::string fleet_text(const fleet_view& v) {
  std::ostringstream out;
  out << "version " << v.version << ", " << v.rounds << " rounds, " << v.live << " of " << v.engines.size()
      << " engines live";
  if (v.below_min_live_events > 0)
    out << ", below min_live_engines " << v.below_min_live_events << " times";
  out << "\n";
  std::size_t name_w = 6, node_w = 4, state_w = 5;
  for (const auto& e : v.engines) {
    name_w = std::max(name_w, e.name.size());
    node_w = std::max(node_w, e.node.size());
    state_w = std::max(state_w, e.state.size());
  }
  out << std::left << std::setw(static_cast<int>(name_w)) << "ENGINE" << "  " << std::setw(static_cast<int>(node_w))
      << "NODE" << "  " << std::setw(static_cast<int>(state_w)) << "STATE" << "  " << std::setw(8) << "VERSION"
      << "  " << std::setw(11) << "OUTSTANDING" << "  LAST EVICTION\n";
  for (const auto& e : v.engines) {
    out << std::left << std::setw(static_cast<int>(name_w)) << e.name << "  " << std::setw(static_cast<int>(node_w))
        << (e.node.empty() ? "-" : e.node) << "  " << std::setw(static_cast<int>(state_w)) << e.state << "  "
        << std::setw(8) << e.version << "  " << std::setw(11)
        << (e.outstanding ? std::to_string(*e.outstanding) : std::string{"?"}) << "  "
        << (e.last_eviction.empty() ? "-" : e.last_eviction) << "\n";
  }
  if (v.last_round) {
    auto f = figures_of(*v.last_round);
    out << "last round: version " << v.last_round->version << (v.last_round->aborted ? " (aborted)" : "") << ", "
        << v.last_round->engines_synced << " engines synced, " << v.last_round->evicted.size() << " evicted; stall "
        << fixed(f.stall_ms) << " ms, transfer " << fixed(f.transfer_ms) << " ms, " << v.last_round->bytes
        << " bytes (" << fixed(f.gbps, 2) << " GB/s), control " << fixed(f.control_ms) << " ms\n";
  } else {
    out << "last round: none yet\n";
  }
  if (v.router)
    out << "router: " << v.router->routable << " routable, " << v.router->queued << " queued, "
        << v.router->outstanding << " outstanding, " << v.router->completed << " completed, " << v.router->rejected
        << " rejected, " << v.router->rerouted << " rerouted\n";
  else
    out << "router: did not answer\n";
  if (v.nccl_epoch != 0 || v.nccl_rebuilds != 0)
    out << "nccl: communicator epoch " << v.nccl_epoch << ", " << v.nccl_members << " members, "
        << (v.nccl_healthy ? "serving" : "rebuilt at the next round") << "; " << v.nccl_rebuilds << " built\n";
  return out.str();
}

nlohmann::ordered_json fleet_json(const fleet_view& v) {
  nlohmann::ordered_json j;
  j["version"] = v.version;
  j["rounds"] = v.rounds;
  j["live"] = v.live;
  j["below_min_live_events"] = v.below_min_live_events;
  j["engines"] = nlohmann::ordered_json::array();
  for (const auto& e : v.engines) {
    nlohmann::ordered_json x;
    x["name"] = e.name;
    x["node"] = e.node;
    x["state"] = e.state;
    x["version"] = e.version;
    x["incarnation"] = e.incarnation;
    x["outstanding"] = e.outstanding ? nlohmann::ordered_json(*e.outstanding) : nlohmann::ordered_json(nullptr);
    x["last_eviction"] = e.last_eviction.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(e.last_eviction);
    j["engines"].push_back(std::move(x));
  }
  if (v.last_round) {
    auto f = figures_of(*v.last_round);
    const auto& r = *v.last_round;
    j["last_round"] = {{"version", r.version},        {"aborted", r.aborted},     {"engines_synced", r.engines_synced},
                       {"evicted", r.evicted},        {"stall_ms", f.stall_ms},   {"transfer_ms", f.transfer_ms},
                       {"bytes", r.bytes},            {"gbps", f.gbps},           {"control_ms", f.control_ms}};
    for (const auto& [name, value] : slowest_pull_ms(r)) // as bench sync reports them
      j["last_round"][name] = value;
  } else {
    j["last_round"] = nullptr;
  }
  if (v.router)
    j["router"] = {{"routable", v.router->routable},   {"queued", v.router->queued},
                   {"outstanding", v.router->outstanding}, {"completed", v.router->completed},
                   {"rejected", v.router->rejected},   {"rerouted", v.router->rerouted}};
  else
    j["router"] = nullptr;
  if (v.nccl_epoch != 0 || v.nccl_rebuilds != 0)
    j["nccl"] = {{"epoch", v.nccl_epoch},
                 {"members", v.nccl_members},
                 {"serving", v.nccl_healthy},
                 {"built", v.nccl_rebuilds}};
  else
    j["nccl"] = nullptr;
  return j;
}

std::optional<fleet_view> fetch_fleet(caf::actor_system& sys, const status_target& target, std::string& why) {
  auto where = target.host + ":" + std::to_string(target.port);
  auto gate = connect_node<gatekeeper_actor>(sys, target.host, target.port);
  if (!gate) {
    why = "cannot reach the head at " + where + ": " + sys.render(gate.error());
    return std::nullopt;
  }
  caf::scoped_actor self{sys};
  auto answer = ask_admission(self, *gate, target.node, target.secret, std::chrono::steady_clock::now() + target.deadline);
  if (answer.unproved) {
    why = "whoever answers at " + where + " admitted node '" + target.node
          + "' without proving it holds that node's secret: not the head (or it runs another rlsync build)";
    return std::nullopt;
  }
  if (!answer.grant) {
    why = "not admitted as node '" + target.node + "': " + answer.step + " at " + where + ": " + sys.render(answer.error);
    return std::nullopt;
  }
  const auto& grant = answer.grant;
  auto failed = [&](const char* step) {
    return [&, step](caf::error& err) { why = std::string{step} + " at " + where + ": " + sys.render(err); };
  };
  std::optional<coordinator_status> coord;
  self->request(grant->coordinator, target.deadline, status_atom::value)
    .receive([&](coordinator_status& s) { coord = std::move(s); }, failed("the coordinator's status"));
  if (!coord)
    return std::nullopt;
  std::optional<router_status> router;
  if (grant->router)
    self->request(grant->router, target.deadline, status_atom::value)
      .receive([&](router_status& s) { router = s; }, [](caf::error&) {}); // the view says it did not answer
  return fleet_view_of(*coord, router);
}

} // namespace rlsync::jobs
