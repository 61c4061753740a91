#include "runtime/forecast/predict.hpp"

#include "runtime/forecast/flow_model.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_set>

namespace rlsync::forecast {

namespace {

// The fabric's links, made as flows need them.
class fabric {
public:
  explicit fabric(const cluster& c) : c_(c) {}

  /// The links a flow from `from` to `to` crosses.
  std::vector<std::size_t> route(const gpu_place& from, const gpu_place& to) {
    if (from.node == to.node && from.gpu == to.gpu)
      return {};
    const bool local = from.node == to.node;
    const double bw = local ? c_.fabric.intra_node_bytes_per_s : c_.fabric.nic_bytes_per_s;
    const std::string kind = local ? c_.fabric.intra_node_link : "nic";
    return {get(from, kind + " out", bw), get(to, kind + " in", bw)};
  }
  const std::vector<link>& links() const { return links_; }

private:
  std::size_t get(const gpu_place& p, const std::string& kind, double bw) {
    const std::string name = place_name(c_, p) + " " + kind;
    auto [it, fresh] = index_.emplace(name, links_.size());
    if (fresh)
      links_.push_back({name, bw});
    return it->second;
  }
  const cluster& c_;
  std::vector<link> links_;
  std::map<std::string, std::size_t> index_;
};

std::vector<const consumer*> syncing(const cluster& c, const layout& l, const sync_knobs& k) {
  std::vector<char> chosen(static_cast<std::size_t>(c.engine_count()), k.engines.empty() ? 1 : 0);
  for (auto e : k.engines)
    if (e >= 0 && e < c.engine_count())
      chosen[static_cast<std::size_t>(e)] = 1;
  std::vector<const consumer*> out;
  for (const auto& x : l.consumers)
    if (chosen[static_cast<std::size_t>(x.replica_index)])
      out.push_back(&x);
  return out;
}

std::set<std::uint32_t> all_groups(const layout& l) {
  std::set<std::uint32_t> all;
  for (std::uint32_t g = 0; g < l.groups; ++g)
    all.insert(g);
  return all;
}

const std::vector<plan_share>& shares_of(const recorded_plan& p, plan_mode m) {
  return m == plan_mode::sharded ? p.shares : p.broadcast;
}

struct phase_flows {
  std::vector<link> links;
  std::vector<flow> flows;
};

// The flows of the groups in `groups` to the consumers, one per (producer,
// consumer) pair.
phase_flows flows_of(const cluster& c, const layout& l, const std::vector<const consumer*>& consumers,
                     const std::set<std::uint32_t>& groups, plan_mode mode) {
  fabric f(c);
  std::map<std::pair<std::size_t, std::size_t>, double> bytes;
  for (std::size_t i = 0; i < consumers.size(); ++i)
    for (const auto& s : shares_of(l.plans[consumers[i]->plan], mode))
      if (groups.count(s.group))
        bytes[{s.producer, i}] += static_cast<double>(s.bytes);
  phase_flows out;
  for (const auto& [pair, b] : bytes)
    out.flows.push_back({b, f.route(l.producers[pair.first].place, consumers[pair.second]->place)});
  out.links = f.links();
  return out;
}

// The busiest producer's distinct operations for group g: slices it packs
// (sharded) or tensors it sends (broadcast); replicas' identical slices once.
std::uint64_t group_ops(const layout& l, const std::vector<const consumer*>& consumers, std::uint32_t g,
                        plan_mode mode) {
  std::map<std::size_t, std::unordered_set<std::uint32_t>> work;
  std::set<std::size_t> seen_plans;
  for (const auto* x : consumers) {
    if (!seen_plans.insert(x->plan).second)
      continue;
    for (const auto& s : shares_of(l.plans[x->plan], mode)) {
      if (s.group != g)
        continue;
      auto& keys = work[s.producer];
      keys.insert(s.work.begin(), s.work.end());
    }
  }
  std::uint64_t most = 0;
  for (const auto& [p, keys] : work)
    most = std::max<std::uint64_t>(most, keys.size());
  return most;
}

// The trainer's tp all-gather of group g's dense tensors: each rank receives
// (tp - 1) / tp of them over the intra-node link.
double gather_seconds(const cluster& c, const layout& l, std::uint32_t g, const model_constants& mc) {
  const auto tp = c.trainer.tp;
  if (tp <= 1)
    return 0;
  const double bytes = static_cast<double>(l.group_dense_bytes[g]) * static_cast<double>(tp - 1) / static_cast<double>(tp);
  return bytes / (mc.efficiency * c.fabric.intra_node_bytes_per_s);
}

phase_prediction predict_phase(const cluster& c, const layout& l, const std::vector<const consumer*>& consumers,
                               const std::set<std::uint32_t>& groups, const sync_knobs& k, const model_constants& mc,
                               std::string name, double& wire_bytes) {
  phase_prediction out;
  out.name = std::move(name);
  const auto all = flows_of(c, l, consumers, groups, k.mode);
  const auto whole = simulate(all.links, all.flows);
  for (const auto& f : all.flows)
    wire_bytes += f.bytes;
  out.light_s = whole.light_seconds;
  if (whole.bottleneck < all.links.size()) {
    out.bottleneck = all.links[whole.bottleneck].name;
    out.bottleneck_bytes = whole.link_bytes[whole.bottleneck];
  }
  double gathers = 0, first_gather = -1;
  for (auto g : groups) {
    const double gather = gather_seconds(c, l, g, mc);
    if (first_gather < 0)
      first_gather = gather;
    gathers += gather;
    const auto ops = group_ops(l, consumers, g, k.mode);
    out.ops += ops;
    out.overhead_s += mc.group_latency_s + mc.op_s * static_cast<double>(ops);
    if (k.groups_in_flight == 1) {
      const auto one = flows_of(c, l, consumers, {g}, k.mode);
      out.transfer_s += simulate(one.links, one.flows).seconds / mc.efficiency;
    }
  }
  if (k.groups_in_flight == 1) {
    out.gather_s = gathers;
    out.seconds = out.transfer_s + out.gather_s + out.overhead_s;
  } else {
    out.transfer_s = whole.seconds / mc.efficiency;
    out.gather_s = std::max(0.0, first_gather);
    // The gathers of later groups hide behind the transfers unless longer.
    out.seconds = std::max(out.transfer_s, gathers - out.gather_s) + out.gather_s + out.overhead_s;
  }
  return out;
}

} // namespace

sync_prediction predict_sync(const cluster& c, const layout& l, const sync_knobs& k, const model_constants& mc) {
  sync_prediction out;
  out.knobs = k;
  const auto consumers = syncing(c, l, k);
  std::vector<std::pair<std::string, std::set<std::uint32_t>>> phases;
  if (k.pp == pp_order::serial) {
    for (std::int64_t s = 0; s < c.trainer.pp; ++s)
      phases.push_back({"stage " + std::to_string(s), {}});
    for (std::uint32_t g = 0; g < l.groups; ++g)
      phases[static_cast<std::size_t>(l.group_stage[g])].second.insert(g);
  } else {
    phases.push_back({"all stages", all_groups(l)});
  }
  double most_light = -1;
  for (auto& [name, groups] : phases) {
    auto p = predict_phase(c, l, consumers, groups, k, mc, name, out.bytes);
    out.seconds += p.seconds;
    out.light_s += p.light_s;
    out.ops += p.ops;
    if (p.light_s > most_light) {
      most_light = p.light_s;
      out.bottleneck = p.bottleneck;
    }
    out.phases.push_back(std::move(p));
  }
  return out;
}

baseline_prediction predict_nccl_broadcast(const cluster& c, const layout& l, const model_constants& mc) {
  baseline_prediction out;
  const auto& T = c.trainer;
  const double nic = mc.efficiency * c.fabric.nic_bytes_per_s, intra = mc.efficiency * c.fabric.intra_node_bytes_per_s;
  // Rank 0 (trainer node 0, stage 0) collects every tensor: a stage's dense
  // tensors after its tp gather (over the node's links for stage 0, then over
  // a NIC from any other stage), each expert from its nearest holder.
  const std::int64_t per_stage = T.tp * T.dp, gpn = c.fabric.gpus_per_node;
  for (std::uint32_t g = 0; g < l.groups; ++g) {
    const std::int64_t stage = l.group_stage[g];
    const double bytes = static_cast<double>(l.group_bytes[g]), dense = static_cast<double>(l.group_dense_bytes[g]);
    out.gather_s += gather_seconds(c, l, g, mc);
    if (stage != 0)
      out.gather_s += dense / nic;
    const double part = (bytes - dense) / static_cast<double>(T.ep);
    for (std::int64_t j = 0; j < T.ep; ++j) {
      bool self = false, node0 = false;
      for (std::int64_t r = stage * per_stage; r < (stage + 1) * per_stage; ++r)
        if ((r % per_stage) % T.ep == j) {
          self |= r == 0;
          node0 |= r / gpn == 0;
        }
      out.gather_s += self ? 0.0 : part / (node0 ? intra : nic);
    }
    out.broadcast_s += bytes / nic;
    out.tensors += l.group_tensors[g];
    out.operations += l.group_gathers[g] + 2 * l.group_tensors[g]; // the gathers, the broadcast, the engine's load
  }
  out.overhead_s = mc.op_s * static_cast<double>(out.operations);
  out.seconds = out.gather_s + out.broadcast_s + out.overhead_s;
  return out;
}

traffic_summary summarize(const cluster& c, const layout& l, const sync_knobs& k) {
  traffic_summary out;
  const auto consumers = syncing(c, l, k);
  std::vector<std::uint64_t> sent(l.producers.size(), 0);
  std::vector<std::vector<std::uint64_t>> received(consumers.size(), std::vector<std::uint64_t>(l.groups, 0));
  std::vector<std::vector<std::uint64_t>> packed(l.producers.size(), std::vector<std::uint64_t>(l.groups, 0));
  std::set<std::size_t> packed_plans;
  for (std::size_t i = 0; i < consumers.size(); ++i) {
    const bool first_of_plan = packed_plans.insert(consumers[i]->plan).second;
    for (const auto& s : shares_of(l.plans[consumers[i]->plan], k.mode)) {
      const auto b = s.bytes;
      sent[s.producer] += b;
      received[i][s.group] += b;
      if (first_of_plan) // replicas' identical sub-plans are packed once
        packed[s.producer][s.group] += b;
    }
  }
  auto fill = [](traffic_summary::side& side, std::uint64_t v, const std::string& where) {
    if (side.count == 0 || v < side.min)
      side.min = v;
    if (side.count == 0 || v > side.max) {
      side.max = v;
      side.busiest = where;
    }
    side.total += v;
    ++side.count;
  };
  for (std::size_t p = 0; p < l.producers.size(); ++p)
    fill(out.per_producer, sent[p], place_name(c, l.producers[p].place));
  std::uint64_t largest_receipt = 0;
  for (std::size_t i = 0; i < consumers.size(); ++i) {
    std::uint64_t total = 0;
    for (auto b : received[i]) {
      total += b;
      largest_receipt = std::max(largest_receipt, b);
    }
    fill(out.per_consumer, total, place_name(c, consumers[i]->place));
  }
  for (std::uint32_t g = 0; g < l.groups; ++g)
    if (l.group_bytes[g] > out.largest_group) {
      out.largest_group = l.group_bytes[g];
      out.largest_group_index = g;
    }
  std::uint64_t producer_peak = 0;
  for (std::size_t p = 0; p < l.producers.size(); ++p)
    for (std::uint32_t g = 0; g < l.groups; ++g)
      producer_peak = std::max(producer_peak, l.held_bytes[p][g] + packed[p][g]);
  // No more groups are in flight than one phase has.
  std::uint64_t most_groups = l.groups;
  if (k.pp == pp_order::serial) {
    std::vector<std::uint64_t> per_stage(static_cast<std::size_t>(c.trainer.pp), 0);
    for (auto s : l.group_stage)
      ++per_stage[static_cast<std::size_t>(s)];
    most_groups = *std::max_element(per_stage.begin(), per_stage.end());
  }
  const auto window = std::min(static_cast<std::uint64_t>(k.groups_in_flight), std::max<std::uint64_t>(most_groups, 1));
  out.producer_memory = window * producer_peak;
  out.consumer_memory = window * largest_receipt;

  const auto f = flows_of(c, l, consumers, all_groups(l), k.mode);
  const auto link_bytes = forecast::link_bytes(f.links, f.flows);
  std::vector<std::size_t> order(f.links.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const double la = link_bytes[a] / f.links[a].bytes_per_s, lb = link_bytes[b] / f.links[b].bytes_per_s;
    return la != lb ? la > lb : f.links[a].name < f.links[b].name;
  });
  for (std::size_t i = 0; i < order.size() && i < 3; ++i)
    out.busiest_links.push_back(
      {f.links[order[i]].name, link_bytes[order[i]], link_bytes[order[i]] / f.links[order[i]].bytes_per_s});
  return out;
}

wave_prediction predict_waves(const cluster& c, const layout& l, std::int64_t wave_size, const sync_knobs& k,
                              const model_constants& mc) {
  wave_prediction out;
  out.engines = c.engine_count();
  out.wave_size = wave_size == 0 ? out.engines : std::min(wave_size, out.engines);
  out.waves = (out.engines + out.wave_size - 1) / out.wave_size;
  out.serving = out.engines - out.wave_size;
  for (std::int64_t w = 0; w < out.waves; ++w) {
    sync_knobs one = k;
    one.engines.clear();
    for (std::int64_t e = w * out.wave_size; e < std::min(out.engines, (w + 1) * out.wave_size); ++e)
      one.engines.push_back(e);
    const auto p = predict_sync(c, l, one, mc);
    out.total_s += p.seconds;
    out.max_stall_s = std::max(out.max_stall_s, p.seconds);
  }
  return out;
}

} // namespace rlsync::forecast
