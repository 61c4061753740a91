#include "runtime/forecast/layout.hpp"

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/control/protocol.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/engine/shard.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/plan/holders.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <unordered_map>

namespace rlsync::forecast {

namespace {

// Stage s holds layers [first(s), first(s + 1)): an even share, the first
// L % pp stages one more.
std::int64_t first_layer(std::int64_t layers, std::int64_t pp, std::int64_t s) {
  return s * (layers / pp) + std::min(s, layers % pp);
}

std::string slice_key(const plan::plan_entry& e) {
  return e.source + "@" + std::to_string(e.view.offset) + "+" + std::to_string(e.numel());
}

// Tensors Megatron keeps whole on every tp rank: the norms and the router.
bool tp_replicated(const std::string& name) {
  const auto ends = [&](const char* tail) {
    const std::string t = tail;
    return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
  };
  return ends("norm.weight") || ends("mlp.gate.weight");
}

} // namespace

std::string place_name(const cluster& c, const gpu_place& p) {
  const bool trainer = p.node < c.trainer.nodes;
  return (trainer ? "t" : "e") + std::to_string(trainer ? p.node : p.node - c.trainer.nodes) + ".gpu"
         + std::to_string(p.gpu);
}

layout build_layout(const cluster& c) {
  const auto& m = c.model;
  const auto& T = c.trainer;
  const std::int64_t gpn = c.fabric.gpus_per_node;
  layout out;

  std::vector<tensor_spec> specs;
  for (auto& s : llama_parameter_specs(m, c.weights))
    if (!ignored_weight(m, s.name))
      specs.push_back(std::move(s));
  out.groups = plan::group_count(m);
  out.group_stage.assign(out.groups, 0);
  for (std::int64_t s = 0; s < T.pp; ++s)
    for (auto l = first_layer(m.num_hidden_layers, T.pp, s); l < first_layer(m.num_hidden_layers, T.pp, s + 1); ++l)
      out.group_stage[static_cast<std::size_t>(l)] = s; // group l is layer l
  out.group_bytes.assign(out.groups, 0);
  out.group_dense_bytes.assign(out.groups, 0);
  out.group_tensors.assign(out.groups, 0);
  out.group_gathers.assign(out.groups, 0);
  std::vector<std::uint32_t> spec_group(specs.size());
  std::vector<std::int64_t> spec_expert(specs.size(), -1);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto g = plan::group_of(m, specs[i].name);
    spec_group[i] = g;
    out.group_bytes[g] += specs[i].bytes();
    out.group_tensors[g] += 1;
    const auto expert = plan::expert_of(specs[i].name);
    if (expert)
      spec_expert[i] = *expert;
    else
      out.group_dense_bytes[g] += specs[i].bytes();
    out.group_gathers[g] += (T.pp > 1 ? 1 : 0) + (expert ? (T.ep > 1 ? 1 : 0)
                                                         : (T.tp > 1 && !tp_replicated(specs[i].name) ? 1 : 0));
    out.model_bytes += specs[i].bytes();
  }
  out.tensors = specs.size();

  // The trainer's ranks and what each holds after its tp gather.
  const std::int64_t per_stage = T.tp * T.dp, experts_per_ep = T.ep > 1 ? m.num_experts / T.ep : 0;
  std::vector<producer_holding> holdings;
  out.held_bytes.assign(static_cast<std::size_t>(T.ranks()), std::vector<std::uint64_t>(out.groups, 0));
  for (std::int64_t r = 0; r < T.ranks(); ++r) {
    producer p;
    p.rank = static_cast<std::uint32_t>(r);
    p.place = {r / gpn, r % gpn};
    p.stage = r / per_stage;
    p.tp_rank = r % T.tp;
    const std::int64_t ep_rank = (r % per_stage) % T.ep;
    producer_holding h;
    h.rank = p.rank;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const auto g = spec_group[i];
      if (out.group_stage[g] != p.stage)
        continue;
      if (spec_expert[i] >= 0 && T.ep > 1 && spec_expert[i] / experts_per_ep != ep_rank)
        continue;
      h.held.push_back(specs[i].name);
      out.held_bytes[static_cast<std::size_t>(r)][g] += specs[i].bytes();
    }
    std::sort(h.held.begin(), h.held.end());
    holdings.push_back(std::move(h));
    out.producers.push_back(std::move(p));
  }
  const plan::holder_index holders(holdings);

  // Tensors with the same holders in one group: a group's dense tensors (its
  // stage), or one ep rank's experts. The holder rule picks one producer per
  // class, so broadcast traffic is computed per class, not per tensor.
  struct tensor_class {
    std::uint32_t group;
    std::string representative;
    std::uint64_t bytes = 0, tensors = 0;
    std::uint32_t first_id = 0; ///< its tensors' work ids: [first_id, first_id + tensors)
  };
  // Work ids: a sharded slice by its key, a broadcast tensor by its class.
  std::unordered_map<std::string, std::uint32_t> slice_ids;
  std::uint32_t next_id = 0;
  std::vector<tensor_class> classes;
  {
    std::map<std::pair<std::uint32_t, std::int64_t>, tensor_class> by_key;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const std::int64_t ep_rank = spec_expert[i] >= 0 && T.ep > 1 ? spec_expert[i] / experts_per_ep : -1;
      auto& k = by_key[{spec_group[i], ep_rank}];
      if (k.tensors == 0) {
        k.group = spec_group[i];
        k.representative = specs[i].name;
      }
      k.bytes += specs[i].bytes();
      k.tensors += 1;
    }
    for (auto& [key, k] : by_key) {
      k.first_id = next_id;
      next_id += static_cast<std::uint32_t>(k.tensors);
      classes.push_back(std::move(k));
    }
  }

  // Each engine worker's plan, recorded once for all replicas.
  const auto started = std::chrono::steady_clock::now();
  std::int64_t next_gpu = 0, next_replica = 0;
  for (std::size_t e = 0; e < c.engines.size(); ++e) {
    const auto& E = c.engines[e];
    const std::size_t first_plan = out.plans.size();
    // Without expert parallelism every dp rank's tp worker w keeps the same
    // slices: recorded once, its holders chosen per dp rank.
    std::vector<plan::worker_plan> by_worker(static_cast<std::size_t>(E.tp));
    for (std::int64_t d = 0; d < E.dp; ++d)
      for (std::int64_t w = 0; w < E.tp; ++w) {
        plan::worker_plan p;
        if (E.expert_parallel || d == 0) {
          const auto shard = engine::shard_spec::make(m, static_cast<int>(E.tp), static_cast<int>(w),
                                                      E.expert_parallel, E.expert_parallel ? static_cast<int>(E.dp) : 1,
                                                      E.expert_parallel ? static_cast<int>(d) : 0);
          p = engine::make_plan(shard, specs, /*check=*/true);
          if (!E.expert_parallel)
            by_worker[static_cast<std::size_t>(w)] = p;
        } else {
          p = by_worker[static_cast<std::size_t>(w)];
        }
        // The holder rule turns on the worker's index among all the engine's
        // GPUs, so that dp ranks spread over the holders as tp workers do.
        p.worker = static_cast<int>(d * E.tp + w);
        const auto choice = plan::choose_holders(m, p, holders);
        recorded_plan rec;
        rec.engine = e;
        rec.dp_rank = d;
        rec.worker = w;
        rec.entries = p.entries.size();
        std::map<std::pair<std::uint32_t, std::size_t>, plan_share> shares, whole;
        for (std::size_t i = 0; i < p.entries.size(); ++i) {
          const auto& entry = p.entries[i];
          const auto g = plan::group_of(m, entry.source);
          auto& share = shares[{g, choice.holder[i]}];
          share.group = g;
          share.producer = choice.holder[i];
          share.bytes += entry.bytes();
          auto [id, fresh] = slice_ids.emplace(slice_key(entry), next_id);
          if (fresh)
            ++next_id;
          share.work.push_back(id->second);
          rec.bytes += entry.bytes();
        }
        for (const auto& k : classes) {
          const auto producer = holders.choose(k.representative, k.group, p.worker);
          auto& share = whole[{k.group, producer}];
          share.group = k.group;
          share.producer = producer;
          share.bytes += k.bytes;
          for (std::uint64_t t = 0; t < k.tensors; ++t)
            share.work.push_back(k.first_id + static_cast<std::uint32_t>(t));
        }
        for (auto& [key, value] : shares)
          rec.shares.push_back(std::move(value));
        for (auto& [key, value] : whole)
          rec.broadcast.push_back(std::move(value));
        out.plans.push_back(std::move(rec));
      }
    for (std::int64_t r = 0; r < E.replicas; ++r)
      for (std::int64_t d = 0; d < E.dp; ++d)
        for (std::int64_t w = 0; w < E.tp; ++w) {
          consumer x;
          x.engine = e;
          x.replica = r;
          x.replica_index = next_replica + r;
          x.dp_rank = d;
          x.worker = w;
          x.place = {T.nodes + next_gpu / gpn, next_gpu % gpn};
          x.plan = first_plan + static_cast<std::size_t>(d * E.tp + w);
          out.consumers.push_back(x);
          ++next_gpu;
        }
    next_replica += E.replicas;
  }
  out.record_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return out;
}

} // namespace rlsync::forecast
