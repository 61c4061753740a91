#include "actors/assembly/local_deployment.hpp"

#include "runtime/engine/loader.hpp"

#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <iostream>
#include <map>
#include <stdexcept>

namespace rlsync {

rollout_engine_config engine_config_from(const topology& t, const engine_spec& e,
                                         std::shared_ptr<transfer::weight_puller> puller, dtype source_dtype) {
  rollout_engine_config cfg;
  cfg.model = t.model.config;
  cfg.options.name = e.name;
  cfg.options.tp = static_cast<int>(e.tp);
  cfg.options.max_batch = static_cast<std::uint32_t>(e.max_batch);
  cfg.options.queue_limit = static_cast<std::uint32_t>(e.queue_limit);
  cfg.options.block_tokens = e.kv_block_tokens;
  cfg.options.prefix_cache_blocks = static_cast<std::size_t>(e.prefix_cache_blocks);
  cfg.options.source_dtype = source_dtype;
  cfg.options.preallocate_staging = true;
  cfg.node = e.node;
  cfg.puller = std::move(puller);
  cfg.transfer_deadline_ms = static_cast<std::uint64_t>(t.sync.deadlines.transfer.count());
  return cfg;
}

namespace {

/// Registers engine `i` with the coordinator; the refusal, or empty.
std::string register_engine(caf::actor_system& sys, local_deployment& d, const topology& t, std::size_t i,
                            std::chrono::milliseconds deadline) {
  const auto& spec = t.engines[i];
  engine_info info{spec.name, spec.node, static_cast<std::uint32_t>(spec.tp), 0, true, d.incarnations[i]};
  std::string failure;
  caf::scoped_actor self{sys};
  self->request(d.coordinator, deadline, register_atom::value, info, caf::actor_cast<rollout_engine_actor>(d.engines[i]))
    .receive([](const registration&) {}, [&](caf::error& err) { failure = sys.render(err); });
  return failure;
}

rollout_engine_impl spawn_engine(caf::actor_system& sys, const local_deployment& d, const topology& t, std::size_t i) {
  auto cfg = engine_config_from(t, t.engines[i], d.trainer.transfer, d.source_dtype);
  cfg.faults = d.gates[i];
  return spawn_rollout_engine(sys, std::move(cfg));
}

} // namespace

local_deployment deploy_local(caf::actor_system& sys, const topology& t, deployment_options opts) {
  local_deployment d;
  std::optional<persisted_coordinator> restored;
  if (!t.coordinator.state_file.empty())
    restored = read_coordinator_state(t.coordinator.state_file); // throws, naming file:line:column
  d.trainer = make_local_trainer(sys, t, 0);
  // Engines record their plans in the dtype the trainer sends.
  auto first = d.trainer.source->latest();
  d.source_dtype = t.model.weights_dtype.value_or(
    first && !first->tensors().empty() ? first->tensors().front().type : dtype::bf16);
  for (std::size_t i = 0; i < t.engines.size(); ++i) {
    d.gates.push_back(opts.fault_gates ? std::make_shared<engine_fault_gate>() : nullptr);
    d.incarnations.push_back(1);
    if (restored) // a restarted run: its engines reconnect under the names (and incarnations) on record
      for (auto& pm : restored->members)
        if (pm.name == t.engines[i].name)
          d.incarnations.back() = pm.incarnation;
    d.engines.push_back(spawn_engine(sys, d, t, i));
    d.engine_names.push_back(t.engines[i].name);
  }
  auto rc = router_config_from(t);
  rc.log = opts.router_log;
  d.router_cfg = rc;
  d.router = spawn_router(sys, rc);
  auto cc = coordinator_config_from(t);
  cc.trainer = d.trainer.actor;
  cc.router = d.router;
  cc.log = opts.log;
  cc.on_report = opts.on_sync;
  cc.on_phase = opts.on_phase;
  cc.on_member = opts.on_member;
  d.coordinator_cfg = cc;
  cc.restored = restored;
  d.coordinator = sys.spawn(coordinator, cc);

  for (std::size_t i = 0; i < d.engines.size(); ++i)
    if (auto failure = register_engine(sys, d, t, i, opts.register_deadline); !failure.empty()) {
      d.shutdown();
      throw std::runtime_error("engine " + t.engines[i].name + " could not register with the coordinator: " + failure);
    }
  return d;
}

std::string local_deployment::restart_engine(caf::actor_system& sys, const topology& t, std::size_t i,
                                             std::chrono::milliseconds deadline) {
  caf::anon_send_exit(engines[i], caf::exit_reason::kill); // a no-op when it is dead already
  if (gates[i]) { // the new process starts whole
    gates[i]->partitioned = false;
    gates[i]->acks_held_until_ns = 0;
  }
  ++incarnations[i];
  engines[i] = spawn_engine(sys, *this, t, i);
  return register_engine(sys, *this, t, i, deadline);
}

void local_deployment::restart_coordinator(caf::actor_system& sys, const topology& t, bool kill_first) {
  if (coordinator_cfg.state_file.empty())
    throw std::runtime_error("a coordinator restart needs coordinator.state_file: without it the version counter "
                             "would start again from 0");
  if (kill_first) {
    caf::scoped_actor self{sys};
    self->monitor(coordinator);
    caf::anon_send_exit(coordinator, caf::exit_reason::kill);
    self->receive([](const caf::down_msg&) {}, caf::after(std::chrono::seconds(5)) >> [] {});
  }
  auto cc = coordinator_cfg;
  cc.trainer = trainer.actor;
  cc.router = router; // a router restarted since is the one to tell
  cc.restored = read_coordinator_state(cc.state_file); // throws, naming file:line:column
  coordinator = sys.spawn(rlsync::coordinator, cc);
  caf::scoped_actor self{sys};
  for (std::size_t i = 0; i < engines.size(); ++i) {
    std::optional<engine_status> st;
    self->request(engines[i], std::chrono::seconds(2), status_atom::value)
      .receive([&](engine_status& s) { st = s; }, [](caf::error&) {});
    if (!st)
      continue; // dead or cut off: it registers when it is restarted
    const auto& spec = t.engines[i];
    engine_info info{spec.name, spec.node, static_cast<std::uint32_t>(spec.tp), st->version, st->dirty, incarnations[i]};
    self->request(coordinator, std::chrono::seconds(10), register_atom::value, info,
                  caf::actor_cast<rollout_engine_actor>(engines[i]))
      .receive([](const registration&) {}, [](caf::error&) {});
  }
}

router_actor local_deployment::restart_router(caf::actor_system& sys) {
  { // the requesters must have seen the old one go before they hear of the new one
    caf::scoped_actor self{sys};
    self->monitor(router);
    caf::anon_send_exit(router, caf::exit_reason::kill);
    self->receive([](const caf::down_msg&) {}, caf::after(std::chrono::seconds(5)) >> [] {});
  }
  router = spawn_router(sys, router_cfg);
  caf::anon_send(coordinator, register_atom::value, router);
  return router;
}

void local_deployment::restart_trainer(caf::actor_system& sys, const topology& t) {
  caf::anon_send_exit(trainer.actor, caf::exit_reason::kill);
  trainer_config tc;
  tc.source = trainer.source;
  tc.step_time = t.trainer.step_time;
  tc.log = [](const std::string& line) { std::cerr << (line + '\n'); };
  trainer.actor = spawn_trainer(sys, tc);
  caf::anon_send(coordinator, register_atom::value, trainer.actor);
}

void local_deployment::shutdown() {
  auto stop = [](const auto& handle) {
    if (handle)
      caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
  };
  stop(trainer.actor);
  stop(coordinator);
  stop(router);
  for (auto& e : engines)
    stop(e);
}

std::vector<engine_verification> verify_weights(const topology& t, const transfer::weight_source& source,
                                                const std::vector<weight_digest>& digests) {
  std::vector<engine_verification> out;
  // The trainer's weights through the engines' own loader, per (version, tp).
  std::map<std::pair<std::uint64_t, std::int64_t>, std::map<std::string, std::uint64_t>> reference;
  for (const auto& digest : digests) {
    engine_verification v;
    v.engine = digest.engine;
    v.version = digest.version;
    v.dirty = digest.dirty;
    const engine_spec* spec = t.find_engine(digest.engine);
    if (!spec) {
      v.error = "not an engine of the topology";
    } else if (digest.names.empty()) {
      v.error = "no checksums (no weights, or no answer in time)";
    } else {
      auto key = std::make_pair(v.version, spec->tp);
      if (!reference.count(key)) {
        if (auto snap = source.find(v.version)) {
          auto set = engine::weight_set::make(t.model.config, static_cast<int>(spec->tp));
          engine::load_weights(snap->tensors(), *set);
          reference[key] = engine::weight_checksums(*set);
        }
      }
      auto ref = reference.find(key);
      if (ref == reference.end()) {
        v.error = "the trainer no longer holds version " + std::to_string(v.version);
      } else {
        v.shards = digest.names.size();
        if (v.shards != ref->second.size())
          v.error = std::to_string(v.shards) + " parameter shards, the trainer's version has "
                    + std::to_string(ref->second.size());
        for (std::size_t k = 0; k < digest.names.size() && k < digest.checksums.size(); ++k) {
          auto it = ref->second.find(digest.names[k]);
          if (it == ref->second.end() || it->second != digest.checksums[k])
            ++v.mismatched;
        }
      }
    }
    out.push_back(v);
  }
  for (const auto& e : t.engines) // an engine nobody could ask is unverified, not forgotten
    if (std::none_of(out.begin(), out.end(), [&](auto& v) { return v.engine == e.name; }))
      out.push_back({e.name, 0, false, 0, 0, "not a member of the cluster (never registered, or dead)"});
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.engine < b.engine; });
  return out;
}

} // namespace rlsync
