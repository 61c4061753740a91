#include "actors/local_deployment.hpp"

#include "runtime/engine/loader.hpp"

#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
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
  cfg.node = e.node;
  cfg.puller = std::move(puller);
  cfg.transfer_deadline_ms = static_cast<std::uint64_t>(t.sync.deadlines.transfer.count());
  return cfg;
}

local_deployment deploy_local(caf::actor_system& sys, const topology& t, deployment_options opts) {
  local_deployment d;
  d.trainer = make_local_trainer(sys, t, 0);
  // Engines record their plans in the dtype the trainer sends.
  auto first = d.trainer.source->latest();
  dtype source_dtype = t.model.weights_dtype.value_or(
    first && !first->tensors().empty() ? first->tensors().front().type : dtype::bf16);
  for (const auto& e : t.engines) {
    d.engines.push_back(spawn_rollout_engine(sys, engine_config_from(t, e, d.trainer.transfer, source_dtype)));
    d.engine_names.push_back(e.name);
  }
  d.router = spawn_router(sys, router_config_from(t));
  coordinator_config cc;
  cc.sync = t.sync;
  cc.transfer = t.transfer;
  cc.trainer = d.trainer.actor;
  cc.router = d.router;
  cc.log = opts.log;
  cc.on_report = opts.on_sync;
  d.coordinator = sys.spawn(coordinator, cc);

  caf::scoped_actor self{sys};
  for (std::size_t i = 0; i < d.engines.size(); ++i) {
    const auto& spec = t.engines[i];
    engine_info info{spec.name, spec.node, static_cast<std::uint32_t>(spec.tp), 0, true, 1};
    std::string failure;
    self->request(d.coordinator, opts.register_deadline, register_atom::value, info,
                  caf::actor_cast<rollout_engine_actor>(d.engines[i]))
      .receive([](const registration&) {}, [&](caf::error& err) { failure = sys.render(err); });
    if (!failure.empty()) {
      d.shutdown();
      throw std::runtime_error("engine " + spec.name + " could not register with the coordinator: " + failure);
    }
  }
  return d;
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
