// The drill section: fault-injection drills, each checked against the
// engines and nodes it names.
#include "runtime/config/topology_reader.hpp"

namespace rlsync::topology_reading {

void reader::read_drill(const map_reader& root) {
  auto drill = root.map("drill", {"faults"});
  auto items = drill.list("faults");
  if (!items)
    return;
  if (static_cast<std::int64_t>(items->size()) > max_faults) {
    drill.error("faults", "must list at most " + std::to_string(max_faults) + " faults, got "
                            + std::to_string(items->size()));
    return;
  }
  for (auto& item : *items) {
    map_reader r(d, item.node, item.path, {"at_sync", "phase", "at_ms", "action", "target", "duration_ms", "dp_rank", "worker"},
                 drill.mark("faults"));
    if (!r.valid())
      continue;
    fault_spec f;
    if (r.has("at_sync") && r.has("at_ms")) {
      r.error("at_ms", "set either at_sync or at_ms, not both");
    } else if (!r.has("at_sync") && !r.has("at_ms")) {
      r.error("needs at_sync (a sync round, from 1) or at_ms (time since start) to say when it fires");
    } else if (r.has("at_sync")) {
      std::int64_t v = 0;
      if (r.read("at_sync", v, between(1, max_version_count)))
        f.at_sync = v;
    } else {
      milliseconds v{};
      if (r.read_ms("at_ms", v, between(0, max_duration_ms)))
        f.at = v;
    }
    if (r.has("phase") && !r.has("at_sync"))
      r.error("phase", "only used with at_sync (the phase of that round the fault fires in)");
    else if (r.has("phase"))
      r.read_choice("phase", f.phase, phase_choices);
    bool action_ok = r.read_choice("action", f.action, action_choices, presence::required);
    bool target_ok = r.read("target", f.target, presence::required);
    if (r.has("duration_ms")) {
      milliseconds v{};
      if (action_ok && f.action != fault_action::partition && f.action != fault_action::delay_acks
          && f.action != fault_action::kill && f.action != fault_action::kill_worker)
        r.error("duration_ms", "only used with kill or kill_worker (restart after it), partition or delay_acks");
      else if (r.read_ms("duration_ms", v, between(1, max_duration_ms)))
        f.duration = v;
    }
    for (const char* key : {"dp_rank", "worker"})
      if (r.has(key) && action_ok && f.action != fault_action::kill_worker)
        r.error(key, "only used with kill_worker (which rank's worker thread dies)");
    const bool rank_ok = r.read("dp_rank", f.dp_rank, between(0, max_dp - 1)) || !r.has("dp_rank");
    const bool worker_ok = r.read("worker", f.worker, between(0, max_tp - 1)) || !r.has("worker");
    if (!action_ok || !target_ok || !nodes_ok || !engines_ok || !rank_ok || !worker_ok)
      continue;
    // Which kinds of target each action accepts, most specific first.
    std::vector<fault_target> kinds;
    switch (f.action) {
    case fault_action::kill:
    case fault_action::restart:
      kinds = {fault_target::engine, fault_target::node, fault_target::trainer, fault_target::router,
               fault_target::coordinator};
      break;
    case fault_action::partition:
    case fault_action::heal:
      kinds = {fault_target::engine, fault_target::node};
      break;
    case fault_action::delay_acks:
    case fault_action::corrupt:
    case fault_action::kill_worker:
      kinds = {fault_target::engine};
      break;
    }
    bool found = false;
    std::vector<std::string> wanted;
    for (auto kind : kinds) {
      switch (kind) {
      case fault_target::engine:
        found = contains(engine_names, f.target);
        wanted.push_back("an engine (" + list_names(engine_names) + ")");
        break;
      case fault_target::node:
        found = contains(node_names, f.target);
        wanted.push_back("a node (" + list_names(node_names) + ")");
        break;
      default:
        found = f.target == name_of(target_choices, kind);
        wanted.emplace_back(name_of(target_choices, kind));
      }
      if (found) {
        f.target_kind = kind;
        break;
      }
    }
    if (!found) {
      std::string expected;
      for (std::size_t i = 0; i < wanted.size(); ++i)
        expected += (i == 0 ? "" : i + 1 == wanted.size() ? " or " : ", ") + wanted[i];
      r.error("target", "unknown target '" + printable(f.target) + "' for " + std::string(name_of(action_choices, f.action))
                          + " (expected " + expected + ")");
      continue;
    }
    // An external rank's process is the user's: no node process can kill or restart it.
    if (f.target_kind == fault_target::trainer && t.trainer.source == trainer_source::external) {
      r.error("target", std::string(name_of(action_choices, f.action))
                          + " cannot act on the trainer: its ranks are outside processes (source: external); "
                            "stop them yourself");
      continue;
    }
    // The drill kills or restarts one trainer process: with several ranks,
    // or a rank elsewhere, that is not the trainer (the nodes hosting the
    // ranks are targets of their own).
    if (f.target_kind == fault_target::trainer
        && (t.trainer.ranks.size() > 1 || (t.trainer.ranks.size() == 1 && t.trainer.ranks[0].node != t.trainer.node))) {
      std::vector<std::string> rank_nodes;
      for (const auto& rank : t.trainer.ranks)
        if (!contains(rank_nodes, rank.node))
          rank_nodes.push_back(rank.node);
      r.error("target", std::string(name_of(action_choices, f.action)) + " of the trainer would act on one process, and "
                          "this trainer has " + std::to_string(t.trainer.ranks.size()) + " rank"
                          + (t.trainer.ranks.size() == 1 ? "" : "s") + " on " + list_names(rank_nodes)
                          + ": target the nodes hosting them instead");
      continue;
    }
    // Partitions and held acknowledgements act on the built-in engine's
    // fault gate; an external server has none (kill its process instead).
    if (f.action == fault_action::partition || f.action == fault_action::heal || f.action == fault_action::delay_acks) {
      const engine_spec* server = nullptr;
      for (const auto& e : t.engines)
        if (e.kind == engine_kind::vllm
            && (f.target_kind == fault_target::engine ? e.name == f.target : e.node == f.target)) {
          server = &e;
          break;
        }
      if (server) {
        r.error("action", std::string(name_of(action_choices, f.action)) + " cannot act on engine '" + server->name
                            + "' (kind vllm: an external server has no fault gate; kill its server instead)");
        continue;
      }
    }
    if (f.action == fault_action::kill_worker) {
      const auto& e = *std::find_if(t.engines.begin(), t.engines.end(),
                                    [&](const engine_spec& x) { return x.name == f.target; });
      if (e.kind == engine_kind::vllm) {
        r.error("action", "kill_worker cannot act on engine '" + e.name
                            + "' (kind vllm: rlsync does not own its worker processes; kill its server instead)");
        continue;
      }
      if (f.dp_rank >= e.dp) {
        r.error("dp_rank", "engine '" + e.name + "' has " + std::to_string(e.dp) + " data-parallel rank"
                             + (e.dp == 1 ? "" : "s") + " (0.." + std::to_string(e.dp - 1) + ")");
        continue;
      }
      if (f.worker >= e.tp) {
        r.error("worker", "engine '" + e.name + "' has " + std::to_string(e.tp) + " tp worker"
                            + (e.tp == 1 ? "" : "s") + " per rank (0.." + std::to_string(e.tp - 1) + ")");
        continue;
      }
    }
    t.drill.faults.push_back(std::move(f));
  }
}

} // namespace rlsync::topology_reading
