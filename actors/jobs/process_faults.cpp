#include "actors/jobs/process_faults.hpp"

#include "runtime/config/topology_names.hpp"

#include <algorithm>
#include <charconv>
#include <csignal>

namespace rlsync::jobs {

bool runs_as_processes(const topology& t) {
  return t.nodes.size() > 1;
}

bool hosts_rank(const topology& t, const std::string& node) {
  if (t.trainer.ranks.empty())
    return t.trainer.node == node;
  return std::any_of(t.trainer.ranks.begin(), t.trainer.ranks.end(),
                     [&](const trainer_rank& r) { return r.node == node; });
}

std::string_view to_string(process_action a) {
  switch (a) {
  case process_action::kill: return "SIGKILL";
  case process_action::kill_restart: return "SIGKILL and start again";
  case process_action::stop: return "SIGSTOP";
  case process_action::cut_link: return "link down";
  case process_action::restore_link: return "link up";
  case process_action::corrupt: return "SIGRTMIN+2 (corrupt the next group)";
  }
  return "?";
}

int drill_withhold_signal() {
  return SIGRTMIN + 1;
}

int drill_corrupt_signal() {
  return SIGRTMIN + 2;
}

std::optional<std::uint64_t> encode_drill_order(const drill_order& o) {
  if ((o.engine && *o.engine > max_drill_order_engine) || o.version > max_drill_order_version)
    return std::nullopt;
  return (o.version << 16) | (o.engine ? std::uint64_t{*o.engine} + 1 : 0);
}

sigset_t drill_order_signals() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, drill_corrupt_signal());
  sigaddset(&s, drill_withhold_signal());
  return s;
}

drill_order decode_drill_order(std::uint64_t value) {
  drill_order o;
  if (auto engine = value & 0xffff; engine != 0)
    o.engine = static_cast<std::uint32_t>(engine - 1);
  o.version = value >> 16;
  return o;
}

namespace {

/// The node a fault's target lives on.

std::string what(const fault_spec& f) {
  return std::string(to_string(f.action)) + " of " + f.target;
}


} // namespace

std::string fault_node(const topology& t, const fault_spec& f) {
  switch (f.target_kind) {
  case fault_target::engine:
    if (auto* e = t.find_engine(f.target))
      return e->node;
    return {};
  case fault_target::node: return f.target;
  case fault_target::trainer: return t.trainer.node;
  case fault_target::router: return t.router.node;
  case fault_target::coordinator: return t.coordinator.node;
  }
  return {};
}

process_fault_plan plan_process_fault(const topology& t, const fault_spec& f, bool netns, const std::string& place) {
  auto refuse = [&](const std::string& why) { return process_fault_plan{std::nullopt, place + ": " + why}; };
  process_fault p;
  p.node = fault_node(t, f);
  bool found = false;
  for (std::size_t i = 0; i < t.nodes.size(); ++i)
    if (t.nodes[i].name == p.node) {
      p.node_index = i;
      found = true;
    }
  if (!found)
    return refuse(what(f) + ": no node hosts it");
  p.head = p.node == t.coordinator.node;
  switch (f.action) {
  case fault_action::kill:
    p.action = process_action::kill;
    p.ends_after = f.duration;
    // The head runs the job: nothing would finish it.
    if (p.head && !f.duration)
      return refuse(what(f) + " kills the head (node " + p.node
                    + ", which runs the coordinator and the job) for good: give it a duration_ms to restart it after");
    // Under rlsync launch that node would come back on its own; the drill
    // supervises no restarts, so it would rehearse a loss launch never has.
    if (!f.duration && t.nodes[p.node_index].restart == node_restart::on_failure)
      return refuse(what(f) + " kills node " + p.node + " for good, which has restart: on-failure (rlsync launch "
                    + "would restart it; the drill does not): give the fault a duration_ms to restart it after");
    break;
  case fault_action::restart:
    p.action = process_action::kill_restart;
    break;
  case fault_action::delay_acks:
    if (!f.duration)
      return refuse(what(f) + " needs a duration_ms with processes (SIGSTOP, then SIGCONT after it)");
    p.action = process_action::stop;
    p.ends_after = f.duration;
    break;
  case fault_action::partition:
  case fault_action::heal:
    if (!netns)
      return refuse(what(f) + " cuts node " + p.node
                    + "'s network link: only with --netns (run as root), where each node has its own namespace");
    p.action = f.action == fault_action::partition ? process_action::cut_link : process_action::restore_link;
    if (f.action == fault_action::partition)
      p.ends_after = f.duration;
    break;
  case fault_action::kill_worker:
    return refuse(what(f) + ": a worker thread is killed through the engine's in-process fault gate; rlsync drill "
                            "runs it in one process, which it does for a topology of a single node");
  case fault_action::corrupt:
    // The producer alters the bytes after their checksum; each rank's UCX
    // producer takes drill_corrupt_signal() for it (rlsync node --drill-events). Group 0
    // may be served by any rank holding its tensors: all are armed, each for
    // the round's version only, so one round's group 0 is altered.
    if (t.transfer.backend != transfer_backend::ucx)
      return refuse(what(f) + ": with processes the UCX producer corrupts a group; transfer.backend is not ucx");
    p.rank_nodes.clear();
    for (auto& n : t.nodes)
      if (hosts_rank(t, n.name))
        p.rank_nodes.push_back(n.name);
    if (p.rank_nodes.empty())
      return refuse(what(f) + ": no node hosts a trainer rank, whose producer would corrupt the group");
    p.node = p.rank_nodes.front();
    for (std::size_t i = 0; i < t.nodes.size(); ++i)
      if (t.nodes[i].name == p.node)
        p.node_index = i;
    p.head = p.node == t.coordinator.node;
    p.action = process_action::corrupt;
    break;
  }
  p.withhold_first = (p.action == process_action::kill || p.action == process_action::kill_restart
                      || p.action == process_action::cut_link)
                     && f.at_sync && f.phase == sync_phase::transfer && !p.head && hosts_rank(t, p.node);
  return {p, {}};
}

process_drill_plan plan_process_drill(const topology& t, bool netns,
                                      const std::function<std::string(std::size_t)>& place) {
  process_drill_plan plan;
  if (t.drill.faults.empty()) {
    plan.refusal = "no drill.faults: nothing to rehearse (see configs/drills/)";
    return plan;
  }
  for (std::size_t i = 0; i < t.drill.faults.size(); ++i) {
    auto p = plan_process_fault(t, t.drill.faults[i], netns, place(i) + ": drill.faults[" + std::to_string(i) + "]");
    if (!p.fault) {
      plan.faults.clear();
      plan.refusal = p.refusal;
      return plan;
    }
    plan.faults.push_back(*p.fault);
  }
  return plan;
}

std::string drill_phase_line(std::uint64_t round, std::uint64_t version, sync_phase phase,
                             const std::vector<std::string>& engines) {
  std::string line(drill_phase_prefix);
  line += "round=" + std::to_string(round) + " version=" + std::to_string(version)
          + " phase=" + std::string(topology_names::name_of(topology_names::phase_choices, phase)) + " engines=";
  for (std::size_t i = 0; i < engines.size(); ++i)
    line += (i ? "," : "") + engines[i];
  return line;
}

namespace {

/// Consumes "KEY=" at the front of `s`, then the value up to the next space
/// (or the end); nullopt when `s` does not start with it.
std::optional<std::string_view> field(std::string_view& s, std::string_view key) {
  if (s.substr(0, key.size()) != key || s.size() <= key.size() || s[key.size()] != '=')
    return std::nullopt;
  s.remove_prefix(key.size() + 1);
  auto space = s.find(' ');
  auto value = s.substr(0, space);
  s = space == std::string_view::npos ? std::string_view{} : s.substr(space + 1);
  return value;
}

std::optional<std::uint64_t> number(std::string_view s) {
  std::uint64_t v = 0;
  if (s.empty())
    return std::nullopt;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size())
    return std::nullopt;
  return v;
}

/// `line` without its end of line and a launcher's "[NAME] " prefix, past
/// `prefix`; nullopt when it does not start with it.
std::optional<std::string_view> drill_line_body(std::string_view line, std::string_view prefix) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r'))
    line.remove_suffix(1);
  if (!line.empty() && line.front() == '[') { // a launcher's "[NAME] " prefix
    auto close = line.find("] ");
    if (close == std::string_view::npos)
      return std::nullopt;
    line.remove_prefix(close + 2);
  }
  if (line.substr(0, prefix.size()) != prefix)
    return std::nullopt;
  line.remove_prefix(prefix.size());
  return line;
}

} // namespace

std::string drill_synced_line(const sync_report& r) {
  return std::string(drill_synced_prefix) + "version=" + std::to_string(r.version)
         + " engines=" + std::to_string(r.engines_synced) + " aborted=" + (r.aborted ? "1" : "0");
}

std::optional<drill_synced_event> parse_drill_synced_line(std::string_view text) {
  auto line = drill_line_body(text, drill_synced_prefix);
  if (!line)
    return std::nullopt;
  auto version = field(*line, "version");
  auto engines = version ? field(*line, "engines") : std::nullopt;
  auto aborted = engines ? field(*line, "aborted") : std::nullopt;
  if (!aborted || !line->empty() || (*aborted != "0" && *aborted != "1"))
    return std::nullopt;
  auto v = number(*version), n = number(*engines);
  if (!v || !n)
    return std::nullopt;
  return drill_synced_event{*v, *n, *aborted == "1"};
}

std::optional<drill_phase_event> parse_drill_phase_line(std::string_view text) {
  auto body = drill_line_body(text, drill_phase_prefix);
  if (!body)
    return std::nullopt;
  auto line = *body;
  drill_phase_event e;
  auto round = field(line, "round");
  auto version = round ? field(line, "version") : std::nullopt;
  auto phase = version ? field(line, "phase") : std::nullopt;
  auto engines = phase ? field(line, "engines") : std::nullopt;
  if (!engines || !line.empty())
    return std::nullopt;
  auto r = number(*round), v = number(*version);
  if (!r || !v)
    return std::nullopt;
  e.round = *r;
  e.version = *v;
  bool known = false;
  for (auto& [name, value] : topology_names::phase_choices)
    if (name == *phase) {
      e.phase = value;
      known = true;
    }
  if (!known)
    return std::nullopt;
  std::string_view list = *engines;
  while (!list.empty()) {
    auto comma = list.find(',');
    auto name = list.substr(0, comma);
    if (!is_topology_name(name))
      return std::nullopt;
    e.engines.emplace_back(name);
    if (comma == std::string_view::npos)
      break;
    list.remove_prefix(comma + 1);
    if (list.empty()) // a trailing comma
      return std::nullopt;
  }
  return e;
}

drill_rounds::drill_rounds(std::vector<std::string> engines) : engines_(std::move(engines)) {}

/// Adds to `seen` each of `names` that is one of the topology's `engines`
/// and not seen yet: bounded by the topology, whatever a line names.
static void add_known_engines(const std::vector<std::string>& engines, const std::vector<std::string>& names,
                              std::vector<std::string>& seen) {
  for (auto& name : names)
    if (std::find(engines.begin(), engines.end(), name) != engines.end()
        && std::find(seen.begin(), seen.end(), name) == seen.end())
      seen.push_back(name);
}

std::optional<std::uint64_t> drill_rounds::on_phase(const drill_phase_event& e) {
  if (base_ == 0) {
    if (e.round == 0)
      return std::nullopt;
    if (e.round != seen_round_) {
      seen_round_ = e.round;
      seen_engines_.clear();
    }
    add_known_engines(engines_, e.engines, seen_engines_);
    if (seen_engines_.size() < engines_.size())
      return std::nullopt;
    base_ = e.round;
  }
  if (e.round < base_)
    return std::nullopt;
  return e.round - base_ + 1;
}

void version_watch::on_phase(const drill_phase_event& e) {
  last_round_ = e.round;
  if (e.version < highest_ && regression_.empty())
    regression_ = "v" + std::to_string(e.version) + " (round " + std::to_string(e.round) + ") after v"
                  + std::to_string(highest_) + " completed (round " + std::to_string(highest_round_) + ")";
}

void version_watch::on_synced(const drill_synced_event& e) {
  if (e.engines == 0 || e.version < highest_)
    return;
  highest_ = e.version;
  highest_round_ = last_round_;
}

fleet_recovery_watch::fleet_recovery_watch(std::vector<std::string> engines) : engines_(std::move(engines)) {}

void fleet_recovery_watch::arm() {
  armed_ = true;
  round_ = 0;
  resumed_.clear();
  reached_all_ = false;
}

void fleet_recovery_watch::on_phase(const drill_phase_event& e) {
  if (!armed_ || recovered_ || e.phase != sync_phase::resume)
    return;
  if (e.round != round_) {
    round_ = e.round;
    resumed_.clear();
  }
  add_known_engines(engines_, e.engines, resumed_);
  reached_all_ = resumed_.size() == engines_.size();
}

void fleet_recovery_watch::on_synced(const drill_synced_event& e) {
  if (!armed_ || recovered_)
    return;
  recovered_ = reached_all_ && !e.aborted;
  reached_all_ = false; // the next round has to reach every engine again
  resumed_.clear();
}

} // namespace rlsync::jobs
