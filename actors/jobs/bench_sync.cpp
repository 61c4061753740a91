#include "actors/jobs/bench_sync.hpp"
#include "actors/jobs/bench_sync_deployment.hpp"

#include "actors/assembly/head_node.hpp"
#include "actors/certs.hpp"
#include "actors/gatekeeper.hpp"
#include "actors/tls.hpp"
#include "actors/jobs/speed_of_light.hpp"
#include "runtime/base/format.hpp"
#include "runtime/base/stats.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/plan/plan.hpp"
#include "runtime/process/launcher.hpp"

#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <tuple>
#include <sstream>
#include <thread>

namespace rlsync::jobs {

namespace {

using bench_detail::bench_deployment;
using bench_detail::bench_layout;
using bench_detail::clock_type;
using bench_detail::node_children;

std::uint64_t sum_bytes(const std::vector<tensor_spec>& specs) {
  std::uint64_t n = 0;
  for (const auto& s : specs)
    n += s.bytes();
  return n;
}

double ms(std::uint64_t ns) {
  return ns / 1e6;
}

/// `x` rounded to `digits` decimals, for JSON figures that carry no noise.
double rounded(double x, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(x * scale) / scale;
}

} // namespace

// -- models and bytes -----------------------------------------------------------

std::uint64_t bf16_model_bytes(const model_config& c) {
  return sum_bytes(llama_parameter_specs(c, dtype::bf16));
}

model_config model_of_size(std::uint64_t bytes, model_arch arch) {
  model_config c;
  c.arch = arch;
  c.vocab_size = 320;
  c.hidden_size = 1024;
  c.intermediate_size = arch == model_arch::qwen3 ? 3072 : 2816;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  if (arch != model_arch::llama)
    c.explicit_head_dim = 128;
  if (arch == model_arch::qwen3_moe) { // Qwen3-30B-A3B's expert shape, fewer experts: 16 of 768, 2 per token
    c.num_experts = 16;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 768;
  }
  c.num_hidden_layers = 1;
  std::uint64_t one = bf16_model_bytes(c);
  c.num_hidden_layers = 2;
  std::uint64_t per_layer = bf16_model_bytes(c) - one;
  // Bounded: --model-bytes is at most what parse_size accepts, far below
  // 2^63 bytes; a layer is about 20 MB.
  c.num_hidden_layers = std::max<std::int64_t>(1, 1 + static_cast<std::int64_t>((bytes > one ? bytes - one : 0) / per_layer));
  return c;
}

model_config bench_model(std::uint64_t bytes, const std::vector<int>& ranks, model_arch arch) {
  auto c = model_of_size(bytes, arch);
  for (int n : ranks)
    c.num_hidden_layers = std::max<std::int64_t>(c.num_hidden_layers, std::min(n, max_bench_ranks));
  return c;
}

model_config tiny_model() {
  model_config c;
  c.vocab_size = 320;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 8;
  c.num_hidden_layers = 1;
  return c;
}

std::uint64_t engine_bytes(const model_config& c, const engine_spec& e, transfer_mode mode) {
  if (mode == transfer_mode::broadcast)
    return static_cast<std::uint64_t>(e.tp) * bf16_model_bytes(c);
  std::uint64_t total = 0;
  for (int w = 0; w < e.tp; ++w) // the control case's tiny dense model has no experts to place
    total += plan::bytes_per_worker(
      engine::make_plan(c, static_cast<int>(e.tp), w, dtype::bf16, e.expert_parallel && c.arch == model_arch::qwen3_moe));
  return total;
}

std::vector<worker_bytes> bytes_per_worker(const model_config& c, const topology& t) {
  std::vector<worker_bytes> out;
  for (const auto& e : t.engines) {
    if (std::any_of(out.begin(), out.end(),
                    [&](const worker_bytes& b) { return b.tp == e.tp && b.expert_parallel == e.expert_parallel; }))
      continue;
    worker_bytes b{e.tp, e.expert_parallel, 0, ~std::uint64_t{0}, bf16_model_bytes(c)};
    for (int w = 0; w < e.tp; ++w) {
      auto n = plan::bytes_per_worker(engine::make_plan(c, static_cast<int>(e.tp), w, dtype::bf16, e.expert_parallel));
      b.sharded_max = std::max(b.sharded_max, n);
      b.sharded_min = std::min(b.sharded_min, n);
    }
    out.push_back(b);
  }
  return out;
}

light_budget light_of(const topology& t, const model_config& model, transfer_mode mode, double memcpy_gbps,
                      double ucx_gbps) {
  light_budget b;
  for (const auto& e : t.engines) {
    double gbps = e.node == t.coordinator.node ? memcpy_gbps : ucx_gbps;
    auto bytes = engine_bytes(model, e, mode);
    b.bytes += bytes;
    if (gbps > 0 && b.light_ms >= 0)
      b.light_ms += bytes / gbps / 1e6;
    else
      b.light_ms = -1; // a path we could not measure
  }
  return b;
}

// -- trainer ranks -------------------------------------------------------------------

std::vector<trainer_rank> split_layers(const std::string& node, std::int64_t layers, int ranks) {
  if (ranks < 1 || layers < ranks)
    return {};
  std::vector<trainer_rank> out;
  const std::int64_t share = layers / ranks, extra = layers % ranks;
  std::int64_t next = 0;
  for (int r = 0; r < ranks; ++r) {
    trainer_rank rank{node, {}, std::nullopt}; // every expert of its layers
    for (std::int64_t n = share + (r < extra ? 1 : 0); n > 0; --n)
      rank.layers.push_back(next++);
    out.push_back(std::move(rank));
  }
  return out;
}

std::size_t distinct_plans(const topology& t, transfer_mode mode, bool in_process) {
  std::set<std::tuple<std::int64_t, bool, int>> plans; // (tp, experts placed whole, worker)
  for (const auto& e : t.engines) {
    if ((e.node == t.coordinator.node) != in_process)
      continue;
    if (mode == transfer_mode::broadcast)
      return 1;
    for (int w = 0; w < e.tp; ++w)
      plans.insert({e.tp, e.expert_parallel && t.model.config.arch == model_arch::qwen3_moe, w});
  }
  return plans.size();
}

namespace {

/// `packs` over what packing each (plan, group) once per version would take.
double packs_per_plan_group(std::uint64_t packs, const rank_packs& p, std::size_t plans) {
  const double once = static_cast<double>(p.versions) * static_cast<double>(plans) * static_cast<double>(p.groups);
  return once > 0 ? packs / once : 0;
}

} // namespace

double local_packs_per_plan_group(const rank_packs& p) {
  return packs_per_plan_group(p.local_packs, p, p.local_plans);
}

double ucx_packs_per_plan_group(const rank_packs& p) {
  return packs_per_plan_group(p.ucx_packs, p, p.ucx_plans);
}

bool packed_at_most_once(const rank_packs& p) {
  // Bounded: at most 1000 warm rounds, a few hundred plans and groups.
  const std::uint64_t per_plan = p.versions * p.groups;
  return p.local_packs <= per_plan * p.local_plans && p.ucx_packs <= per_plan * p.ucx_plans;
}

// -- one case's figures -----------------------------------------------------------

case_medians medians_of(const case_result& c) {
  std::vector<double> stall, transfer, control, gbps, pull, wait, store, rest;
  for (auto& x : c.warm) {
    stall.push_back(ms(x.stall_ns));
    transfer.push_back(ms(x.transfer_ns));
    control.push_back(ms(x.control_ns));
    if (x.transfer_ns > 0)
      gbps.push_back(x.bytes / static_cast<double>(x.transfer_ns));
    if (x.slowest_wait_ns > 0 || x.slowest_store_ns > 0) {
      pull.push_back(ms(x.slowest_pull_ns));
      wait.push_back(ms(x.slowest_wait_ns));
      store.push_back(ms(x.slowest_store_ns));
      rest.push_back(std::max(0.0, ms(x.slowest_pull_ns) - wait.back() - store.back()));
    }
  }
  return {median(stall), median(transfer), median(control), median(gbps), median(c.probe_ms),
          median(pull),  median(wait),     median(store),   median(rest)};
}

double cold_transfer_ms(const case_result& c) {
  double cold = 0;
  for (auto& x : c.cold)
    cold = std::max(cold, ms(x.transfer_ns));
  return cold;
}

std::optional<double> percent_of_light(const case_result& c) {
  auto transfer = medians_of(c).transfer_ms;
  if (c.light_ms > 0 && transfer > 0)
    return 100.0 * c.light_ms / transfer;
  return std::nullopt;
}

mode_ratios compare_modes(const case_result& broadcast, const case_result& sharded) {
  auto b = medians_of(broadcast), s = medians_of(sharded);
  return {double(broadcast.bytes_per_sync) / std::max<std::uint64_t>(1, sharded.bytes_per_sync),
          b.transfer_ms / std::max(1e-9, s.transfer_ms), b.stall_ms / std::max(1e-9, s.stall_ms)};
}

rank_ratios compare_ranks(const case_result& ranks, const case_result& one) {
  auto r = medians_of(ranks), o = medians_of(one);
  return {r.transfer_ms / std::max(1e-9, o.transfer_ms), r.stall_ms / std::max(1e-9, o.stall_ms)};
}

double control_overhead(const case_result& c) {
  auto m = medians_of(c);
  return m.stall_ms / std::max(1e-9, m.probe_ms);
}

std::uint64_t producer_bound_bytes(const case_result& c) {
  return static_cast<std::uint64_t>(c.producer_peak_groups) * c.largest_group;
}

std::vector<std::string> pull_lines(const std::vector<case_result>& cases) {
  std::vector<std::string> lines;
  for (const auto& c : cases) {
    if (!c.error.empty() || c.zero_byte)
      continue;
    const auto m = medians_of(c);
    if (m.wait_ms <= 0 && m.store_ms <= 0)
      continue; // a data plane that does not measure where its pulls go
    lines.push_back(format("%s pulls (medians): the slowest engine's %.2f ms; its slowest worker waited %.2f ms for "
                           "the producer and stored (copy, checksum) for %.2f ms, the rest %.2f ms",
                           c.name.c_str(), m.pull_ms, m.wait_ms, m.store_ms, m.rest_ms));
    // The cold round the table shows (the slowest), where it measured: its
    // rest holds connecting, registering the plans and first mappings.
    const sync_report* cold = nullptr;
    for (const auto& x : c.cold)
      if (!cold || x.transfer_ns > cold->transfer_ns)
        cold = &x;
    if (cold && (cold->slowest_wait_ns > 0 || cold->slowest_store_ns > 0))
      lines.push_back(format("%s cold pull: the slowest engine's %.2f ms of a %.2f ms transfer; its slowest worker "
                             "waited %.2f ms for the producer and stored for %.2f ms, the rest %.2f ms",
                             c.name.c_str(), ms(cold->slowest_pull_ns), ms(cold->transfer_ns),
                             ms(cold->slowest_wait_ns), ms(cold->slowest_store_ns),
                             std::max(0.0, ms(cold->slowest_pull_ns) - ms(cold->slowest_wait_ns)
                                               - ms(cold->slowest_store_ns))));
  }
  return lines;
}

std::vector<std::string> case_table(const std::vector<case_result>& cases) {
  std::vector<std::string> lines{format("%-10s %10s %9s %9s %11s %9s %8s %10s %9s", "mode", "MB/sync", "stall ms",
                                        "xfer ms", "cold xfer", "GB/s", "% light", "control", "6 RTT ms")};
  for (auto& c : cases) {
    if (!c.error.empty()) {
      lines.push_back(format("%-10s failed: %s", c.name.c_str(), c.error.c_str()));
      continue;
    }
    auto m = medians_of(c);
    auto light = percent_of_light(c);
    lines.push_back(format("%-10s %10.1f %9.2f %9.2f %11.2f %9.2f %8s %10.2f %9s", c.name.c_str(),
                           c.bytes_per_sync / 1e6, m.stall_ms, m.transfer_ms, cold_transfer_ms(c), m.gbps,
                           light ? format("%.0f%%", *light).c_str() : "n/a", m.control_ms,
                           c.probe_ms.empty() ? "-" : format("%.2f", m.probe_ms).c_str()));
  }
  return lines;
}

nlohmann::ordered_json case_json(const case_result& c) {
  auto rounds = [](const std::vector<sync_report>& v) {
    auto out = nlohmann::ordered_json::array();
    for (const auto& x : v)
      out.push_back({{"version", x.version},
                     {"engines", x.engines_synced},
                     {"stall_ms", rounded(ms(x.stall_ns), 3)},
                     {"transfer_ms", rounded(ms(x.transfer_ns), 3)},
                     {"control_ms", rounded(ms(x.control_ns), 3)},
                     {"bytes", x.bytes},
                     {"slowest_pull_ms", rounded(ms(x.slowest_pull_ns), 3)},
                     {"slowest_wait_ms", rounded(ms(x.slowest_wait_ns), 3)},
                     {"slowest_store_ms", rounded(ms(x.slowest_store_ns), 3)}});
    return out;
  };
  auto probes = nlohmann::ordered_json::array();
  for (double p : c.probe_ms)
    probes.push_back(rounded(p, 3));
  auto packs = nlohmann::ordered_json::array();
  for (const auto& p : c.packs)
    packs.push_back({{"rank", p.rank},
                     {"groups", p.groups},
                     {"versions", p.versions},
                     {"local_plans", p.local_plans},
                     {"local_packs", p.local_packs},
                     {"local_passes", p.local_passes},
                     {"ucx_plans", p.ucx_plans},
                     {"ucx_packs", p.ucx_packs},
                     {"packed_at_most_once", packed_at_most_once(p)}});
  return {{"case", c.name},
          {"model_bytes", c.model_bytes},
          {"bytes_per_sync", c.bytes_per_sync},
          {"zero_byte", c.zero_byte},
          {"light_ms", rounded(c.light_ms, 3)},
          {"cold", rounds(c.cold)},
          {"warm", rounds(c.warm)},
          {"probe6_ms", probes},
          {"producer_peak_groups", c.producer_peak_groups},
          {"producer_peak_bytes", c.producer_peak_bytes},
          {"producer_budget_bytes", c.producer_budget_bytes},
          {"producer_packs_ahead", c.producer_packs_ahead},
          {"producer_evictions", c.producer_evictions},
          {"producer_buffers_made", c.producer_buffers_made},
          {"producer_buffers_prewarmed", c.producer_buffers_prewarmed},
          {"producer_huge_buffers", c.producer_huge_buffers},
          {"largest_group_bytes", c.largest_group},
          {"ranks", c.ranks},
          {"packs", packs},
          {"error", c.error}};
}

// -- running cases ----------------------------------------------------------------

namespace {

std::string secret_for_this_run() {
  std::random_device rd;
  std::string s;
  for (int i = 0; i < 4; ++i)
    s += std::to_string(rd());
  return s;
}

} // namespace

bench_session::bench_session(const topology& t, std::string exe, bool verbose,
                             std::function<void(const std::string&)> note)
    : exe_(std::move(exe)), secret_(secret_for_this_run()), verbose_(verbose), note_(std::move(note)) {
  char tmpl[] = "/tmp/rlsync-bench-XXXXXX";
  if (!::mkdtemp(tmpl))
    throw std::runtime_error("cannot create a temporary directory in /tmp");
  dir_ = tmpl;
  ::setenv("RLSYNC_BENCH_SECRET", secret_.c_str(), 1);
  certs_options certs;
  certs.out_dir = dir_ + "/certs";
  for (const auto& n : t.nodes)
    certs.nodes.push_back(n.name);
  try {
    make_certs(certs);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    throw;
  }
  tls_ = {certs.out_dir + "/ca.pem", certs.out_dir + "/{node}.pem", certs.out_dir + "/{node}.key"};
  cfg_ = std::make_unique<system_config>();
  enable_tls(*cfg_, tls_.for_node(t.coordinator.node));
  cfg_->set("middleman.heartbeat-interval", caf::timespan{t.cluster.heartbeat_interval});
  cfg_->set("middleman.connection-timeout", caf::timespan{t.cluster.heartbeat_timeout});
  sys_ = std::make_unique<caf::actor_system>(*cfg_);
}

bench_session::~bench_session() {
  sys_.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void bench_session::note(const std::string& line) const {
  if (note_)
    note_(line);
}

namespace {

/// Each hosted rank's packing counters now, in ranks() order.
std::vector<rank_packs> packs_now(head_node& head, const topology& t) {
  std::vector<rank_packs> out;
  const auto& producers = head.rank_producers();
  for (std::size_t i = 0; i < head.ranks().size(); ++i) {
    const auto& r = head.ranks()[i];
    rank_packs p;
    p.rank = r.rank;
    if (auto snapshot = r.trainer.source->latest())
      p.groups = snapshot->groups().size();
    p.local_plans = distinct_plans(t, t.transfer.mode, true);
    p.ucx_plans = distinct_plans(t, t.transfer.mode, false);
    if (r.trainer.transfer) {
      auto st = r.trainer.transfer->stats();
      p.local_packs = st.packs;
      p.local_passes = st.passes;
    }
    if (i < producers.size() && producers[i]) {
      p.ucx = true;
      p.ucx_packs = producers[i]->stats().packs;
    }
    out.push_back(p);
  }
  return out;
}

} // namespace

case_result run_case(bench_session& s, topology t, const std::string& name, const model_config& model,
                     transfer_mode mode, int rounds, bool probe, int ranks) {
  case_result r;
  r.name = name;
  r.mode = mode;
  r.ranks = ranks;
  r.model_bytes = bf16_model_bytes(model);
  bench_layout(s, t, model, mode, ranks);
  if (t.trainer.ranks.empty()) {
    r.error = std::to_string(ranks) + " ranks cannot share " + std::to_string(model.num_hidden_layers) + " layers";
    return r;
  }
  bench_deployment d(s, t, name);
  if (r.error = d.start(); !r.error.empty())
    return r;
  for (auto& rep : d.reports())
    if (rep.engines_synced > 0)
      r.cold.push_back(rep);
  auto light = light_of(t, model, mode, s.memcpy_gbps, s.ucx_gbps);
  r.bytes_per_sync = light.bytes;
  r.light_ms = light.light_ms;

  auto& sys = s.system();
  caf::scoped_actor self{sys};
  const auto before = packs_now(d.head(), d.topo());
  std::vector<transfer::ucx_producer_stats> producers_before;
  for (const auto& p : d.head().rank_producers())
    producers_before.push_back(p->stats());
  for (int k = 0; k < rounds; ++k) {
    if (probe) {
      std::uint64_t ns = 0;
      self->request(d.head().coordinator(), d.long_wait(), probe_atom::value, std::uint32_t{6})
        .receive([&](std::uint64_t x) { ns = x; }, [&](caf::error& err) { r.error = sys.render(err); });
      r.probe_ms.push_back(ns / 1e6);
    }
    if (r.error = d.step_all(); !r.error.empty())
      return r;
    auto rep = d.sync(r.error);
    if (!rep)
      return r;
    if (!rep->evicted.empty()) {
      r.error = d.failure("sync " + std::to_string(k + 1) + " evicted " + rep->evicted.front());
      return r;
    }
    r.warm.push_back(*rep);
  }
  if (t.trainer.perturb == 0) { // what the zero-byte rounds moved, not what a changed version would
    r.zero_byte = true;
    r.bytes_per_sync = 0;
    for (const auto& x : r.warm)
      r.bytes_per_sync = std::max(r.bytes_per_sync, x.bytes);
    r.light_ms = 0;
  }
  r.packs = packs_now(d.head(), d.topo());
  for (std::size_t i = 0; i < r.packs.size() && i < before.size(); ++i) {
    r.packs[i].versions = static_cast<std::uint64_t>(rounds);
    r.packs[i].local_packs -= before[i].local_packs;
    r.packs[i].local_passes -= before[i].local_passes;
    r.packs[i].ucx_packs -= before[i].ucx_packs;
  }
  std::uint64_t sent = 0, lent = 0, in_place = 0;
  for (std::size_t i = 0; i < d.head().rank_producers().size(); ++i) {
    const auto s = d.head().rank_producers()[i]->stats();
    r.producer_peak_groups = std::max(r.producer_peak_groups, s.peak_packed);
    r.producer_peak_bytes = std::max(r.producer_peak_bytes, s.peak_packed_bytes);
    r.producer_budget_bytes = std::max(r.producer_budget_bytes, s.budget_bytes);
    const auto b = i < producers_before.size() ? producers_before[i] : transfer::ucx_producer_stats{};
    r.producer_packs_ahead += s.packs_ahead - b.packs_ahead;
    r.producer_evictions += s.evictions - b.evictions;
    r.producer_buffers_made += s.buffers_made - b.buffers_made;
    r.producer_buffers_prewarmed += s.buffers_prewarmed;
    r.producer_huge_buffers += s.huge_buffers;
    r.ucx_transports.insert(s.data_transports.begin(), s.data_transports.end());
    sent += s.groups_sent - b.groups_sent;
    lent += s.groups_lent - b.groups_lent;
    in_place += s.groups_lent_in_place - b.groups_lent_in_place;
  }
  r.lent = sent > 0 && lent == sent;
  r.in_place = r.lent && in_place == sent;
  for (const auto& rank : d.head().ranks()) {
    if (rank.trainer.transfer)
      r.local_peak_bytes = std::max<std::uint64_t>(r.local_peak_bytes, rank.trainer.transfer->stats().peak_buffers);
    if (auto snapshot = rank.trainer.source->latest())
      for (auto g : snapshot->groups())
        r.largest_group = std::max(r.largest_group, snapshot->group_bytes(g));
  }
  d.stop();
  return r;
}

namespace {
// ", mlp_only_layers: [0, 3]" (dense layers of a mixture of experts), or nothing.
std::string mlp_only_layers(const model_config& c) {
  if (c.mlp_only_layers.empty())
    return {};
  std::string out = ", mlp_only_layers: [";
  for (std::size_t i = 0; i < c.mlp_only_layers.size(); ++i)
    out += (i ? ", " : "") + std::to_string(c.mlp_only_layers[i]);
  return out + "]";
}
} // namespace

std::string node_yaml(const topology& t) {
  const auto& c = t.model.config;
  std::ostringstream y;
  y << "name: " << t.name << "\nmodel:\n  synthetic: {arch: " << to_string(c.arch) << ", layers: "
    << c.num_hidden_layers << ", hidden_size: " << c.hidden_size << ", heads: " << c.num_attention_heads
    << (c.explicit_head_dim > 0 ? ", head_dim: " + std::to_string(c.explicit_head_dim) : std::string{})
    << (c.arch == model_arch::qwen3_moe
          ? ", experts: " + std::to_string(c.num_experts) + ", experts_per_tok: " + std::to_string(c.num_experts_per_tok)
              + ", moe_intermediate_size: " + std::to_string(c.moe_intermediate_size)
              + ", norm_topk_prob: " + (c.norm_topk_prob ? "true" : "false")
              + ", decoder_sparse_step: " + std::to_string(c.decoder_sparse_step)
              + ", expert_layout: " + (c.fused_experts ? "fused" : "separate") + mlp_only_layers(c)
          : std::string{})
    << ", kv_heads: " << c.num_key_value_heads << ", intermediate_size: " << c.intermediate_size
    << ", vocab_size: " << c.vocab_size << ", dtype: bf16, seed: " << t.model.seed << "}\nnodes:\n";
  for (const auto& n : t.nodes)
    y << "  - {name: " << n.name << ", address: '" << n.address << "', port: " << n.port << "}\n";
  y << "cluster: {secret_env: " << t.cluster.secret_env;
  if (t.cluster.tls)
    y << ", tls: {ca: '" << t.cluster.tls->ca << "', cert: '" << t.cluster.tls->cert << "', key: '"
      << t.cluster.tls->key << "'}";
  else if (t.cluster.allow_insecure_network)
    y << ", allow_insecure_network: true";
  y
    << ", heartbeat_interval_ms: " << t.cluster.heartbeat_interval.count()
    << ", heartbeat_timeout_ms: " << t.cluster.heartbeat_timeout.count()
    << ", connect_deadline_ms: " << t.cluster.connect_deadline.count() << "}\n";
  y << "trainer: {node: " << t.trainer.node;
  if (t.trainer.ranks.size() > 1) { // one rank holding every layer is the default
    y << ", ranks: [";
    for (std::size_t i = 0; i < t.trainer.ranks.size(); ++i) {
      const auto& rank = t.trainer.ranks[i];
      y << (i ? ", " : "") << "{node: " << rank.node << ", layers: [";
      for (std::size_t l = 0; l < rank.layers.size(); ++l)
        y << (l ? ", " : "") << rank.layers[l];
      y << "]";
      if (rank.experts) { // expert parallelism in the trainer: the experts it holds
        y << ", experts: [";
        for (std::size_t x = 0; x < rank.experts->size(); ++x)
          y << (x ? ", " : "") << (*rank.experts)[x];
        y << "]";
      }
      y << "}";
    }
    y << "]";
  }
  y << "}\nengines:\n";
  for (const auto& e : t.engines)
    y << "  - {name: " << e.name << ", node: " << e.node << ", tp: " << e.tp << ", dp: " << e.dp
      << ", dp_balance: " << e.dp_balance << (e.expert_parallel ? ", expert_parallel: true" : "") << (e.weights != "received" ? ", weights: " + e.weights : "")
      << ", max_batch: " << e.max_batch
      << ", queue_limit: " << e.queue_limit << "}\n";
  y << "router: {node: " << t.router.node << "}\ncoordinator: {node: " << t.coordinator.node << "}\n";
  y << "transfer: {backend: " << to_string(t.transfer.backend) << ", mode: " << to_string(t.transfer.mode)
    << ", bucket_bytes: " << t.transfer.bucket_bytes << ", groups_in_flight: " << t.transfer.groups_in_flight
    << ", ucx_transports: [";
  for (std::size_t i = 0; i < t.transfer.ucx_transports.size(); ++i)
    y << (i ? ", " : "") << to_string(t.transfer.ucx_transports[i]);
  y << "]}\n";
  return y.str();
}

// -- bench sync -------------------------------------------------------------------

std::string bench_sync_problem(const topology& t, const std::string& path, const model_config& model,
                               const std::vector<int>& ranks) {
  if (auto problem = cluster_layout_problem(t); !problem.empty())
    return path + ": " + problem;
  // The benchmark steps every trainer rank itself, so it places them on the
  // coordinator's node, with the router it asks for status.
  const std::string& head = t.coordinator.node;
  if (t.router.node != head)
    return path + ": the router must run on the coordinator's node (" + head + ") for the benchmark";
  for (int n : ranks)
    if (n < 1 || n > max_bench_ranks || n > model.num_hidden_layers)
      return "--ranks " + std::to_string(n) + ": between 1 and " + std::to_string(max_bench_ranks) + " and at most the model's "
             + std::to_string(model.num_hidden_layers) + " layers (each rank holds at least one)";
  auto local = local_nodes(t);
  for (const auto& n : t.nodes)
    if (std::none_of(local.begin(), local.end(), [&](const node_spec* l) { return l->name == n.name; }))
      return path + ": node '" + n.name + "' (" + n.address
             + ") is not on this machine; the benchmark starts every node itself";
  for (const auto& e : t.engines)
    if (auto errors = validate_tp(model, e.tp, e.expert_parallel); !errors.empty())
      return "engine " + e.name + ": tp " + std::to_string(e.tp) + ": " + errors.front();
  return {};
}

std::vector<int> default_rank_counts(const topology& t) {
  if (t.trainer.ranks.size() > 1)
    return {1, static_cast<int>(t.trainer.ranks.size())};
  return {1};
}

bool bench_sync_result::failed() const {
  return std::any_of(cases.begin(), cases.end(), [](const case_result& c) { return !c.error.empty(); })
         || (rank_kill && !rank_kill->held());
}

bench_sync_result run_bench_sync(const topology& t, const bench_sync_options& o) {
  bench_sync_result r;
  r.path = o.path;
  r.engines = t.engines.size();
  r.nodes = t.nodes.size();
  r.backend = t.transfer.backend;
  r.cores = std::thread::hardware_concurrency();
  r.model_bytes = o.model_bytes;
  r.ucx_tls = ucx_tls(t.transfer.ucx_transports);
  r.arch = t.model.config.arch;
  auto model = bench_model(o.model_bytes, o.ranks, r.arch);
  model.fused_experts = r.fused_experts = r.arch == model_arch::qwen3_moe && t.model.config.fused_experts;

  bench_session s(t, o.exe, o.verbose, o.note);
  s.note("measuring the speed of light...");
  s.memcpy_gbps = r.memcpy_light.before = measure_memcpy_gbps(std::size_t(256) << 20);
  r.remote = std::any_of(t.engines.begin(), t.engines.end(),
                         [&](const engine_spec& e) { return e.node != t.coordinator.node; });
  const bool raw_ucx = r.remote && t.transfer.backend == transfer_backend::ucx;
  auto group_guess = std::min<std::uint64_t>(static_cast<std::uint64_t>(t.transfer.bucket_bytes), 64u << 20);
  if (raw_ucx) {
    auto ucx = measure_ucx_gbps(t.transfer.ucx_transports, group_guess, o.model_bytes);
    r.ucx_gbps = r.ucx_light.before = ucx.value;
    r.ucx_why = ucx.why;
  } else if (r.remote) {
    r.ucx_why = std::string(t.transfer.backend == transfer_backend::cuda_ipc
                              ? "remote engines pull through CUDA IPC"
                              : "remote engines pull over CAF")
                + " (transfer.backend " + std::string(to_string(t.transfer.backend)) + "): no raw baseline";
  }
  s.ucx_gbps = r.ucx_gbps;
  s.ucx_why = r.ucx_why;

  r.per_worker = bytes_per_worker(model, t);
  int most_ranks = 1;
  for (auto mode : o.modes)
    for (int ranks : o.ranks) {
      most_ranks = std::max(most_ranks, ranks);
      std::string name{to_string(mode)};
      if (ranks > 1)
        name += "/" + std::to_string(ranks) + "r";
      s.note("bench " + name + ": " + std::to_string(t.engines.size()) + " engines, " + std::to_string(ranks)
             + " trainer rank(s), model " + format("%.0f", bf16_model_bytes(model) / 1e6) + " MB, " + std::to_string(o.syncs)
             + " syncs...");
      r.cases.push_back(run_case(s, t, name, model, mode, o.syncs, false, ranks));
    }
  if (most_ranks > 1) {
    s.note("bench rank-kill: " + std::to_string(most_ranks) + " ranks, one killed mid-transfer...");
    r.rank_kill = run_rank_kill(s, t, model, most_ranks);
  }
  s.note("bench control: " + std::to_string(t.engines.size()) + " engines, model "
         + format("%.0f", bf16_model_bytes(tiny_model()) / 1e3) + " kB, " + std::to_string(o.syncs)
         + " zero-byte rounds...");
  auto unchanged = t;
  unchanged.trainer.perturb = 0; // every step publishes the same bytes: engines skip the data plane
  r.cases.push_back(run_case(s, unchanged, "control", tiny_model(), transfer_mode::sharded, o.syncs, true));

  // The light again, the raw UCX over the transports the data plane's
  // connections used; each case's light is the faster of the two.
  s.note("measuring the speed of light again...");
  r.memcpy_light.after = measure_memcpy_gbps(std::size_t(256) << 20);
  if (raw_ucx) {
    std::set<std::string> used;
    for (const auto& c : r.cases)
      used.insert(c.ucx_transports.begin(), c.ucx_transports.end());
    r.ucx_tls_after = ucx_tls_of(used);
    auto ucx = r.ucx_tls_after.empty() ? measure_ucx_gbps(t.transfer.ucx_transports, group_guess, o.model_bytes)
                                       : measure_ucx_gbps(r.ucx_tls_after, group_guess, o.model_bytes);
    r.ucx_light.after = ucx.value;
    if (r.ucx_light.best() > 0)
      r.ucx_why.clear();
    else if (r.ucx_why.empty())
      r.ucx_why = ucx.why;
  }
  r.memcpy_gbps = r.memcpy_light.best();
  r.ucx_gbps = r.ucx_light.best();
  for (auto& c : r.cases)
    if (c.error.empty() && !c.zero_byte)
      c.light_ms = light_of(t, c.name == "control" ? tiny_model() : model, c.mode, r.memcpy_gbps,
                            c.lent ? r.memcpy_gbps : r.ucx_gbps)
                     .light_ms;

  // The classic baseline: MPI_Bcast of the model to one rank per engine.
  if (!o.mpi) {
    r.mpi_why = "not measured: --no-mpi";
    return r;
  }
  auto mpi = measure_mpi_bcast(o.exe, bf16_model_bytes(model), t.engines.size(), static_cast<std::uint64_t>(o.syncs));
  r.mpi_bcast_s = mpi.best_s();
  r.mpi_bcast_defaults_s = mpi.defaults_s;
  r.mpi_bcast_no_single_copy_s = mpi.no_single_copy_s;
  r.mpi_bcast_huge_pages_s = mpi.huge_pages_s;
  r.mpi_why = mpi.why;
  return r;
}

double light_pair::spread() const {
  if (before <= 0 || after <= 0)
    return 0;
  return std::abs(before - after) / best();
}

std::vector<std::string> packs_lines(const std::vector<case_result>& cases) {
  std::vector<std::string> out;
  for (const auto& c : cases) {
    if (!c.error.empty() || c.name == "control")
      continue;
    for (const auto& p : c.packs) {
      std::string line = format("%s packs, rank %u (%zu groups, %llu versions):", c.name.c_str(), p.rank, p.groups,
                                static_cast<unsigned long long>(p.versions));
      if (p.local_plans > 0)
        line += format(" local %llu packs in %llu passes for %zu plan(s), %.2f per (plan, group) per version;",
                       static_cast<unsigned long long>(p.local_packs), static_cast<unsigned long long>(p.local_passes),
                       p.local_plans, local_packs_per_plan_group(p));
      if (p.ucx && p.ucx_plans > 0)
        line += format(" UCX %llu packs for %zu plan(s), %.2f per (plan, group) per version;",
                       static_cast<unsigned long long>(p.ucx_packs), p.ucx_plans, ucx_packs_per_plan_group(p));
      line += packed_at_most_once(p) ? " each packed at most once per version" : " SOME PACKED TWICE IN A VERSION";
      out.push_back(line);
    }
  }
  return out;
}

std::vector<target_check> sync_targets(const bench_sync_result& r) {
  std::vector<target_check> out;
  const case_result* sharded = nullptr;
  const case_result* broadcast = nullptr;
  const case_result* control = nullptr;
  for (const auto& c : r.cases) {
    if (!c.error.empty() || c.ranks != 1)
      continue;
    if (c.name == "sharded")
      sharded = &c;
    else if (c.name == "broadcast")
      broadcast = &c;
    else if (c.name == "control")
      control = &c;
  }
  const double sharded_ms = sharded ? medians_of(*sharded).transfer_ms : 0;

  target_check mpi{"sharded warm transfer <= MPI_Bcast of the same model", "", std::nullopt};
  if (!sharded || sharded_ms <= 0)
    mpi.measured = "no sharded case";
  else if (r.mpi_bcast_s <= 0)
    mpi.measured = "MPI_Bcast " + r.mpi_why;
  else {
    const double bcast_ms = r.mpi_bcast_s * 1e3;
    mpi.measured = format("%.2f ms against %.2f ms (the fastest of Open MPI's three): %.2fx", sharded_ms, bcast_ms,
                          bcast_ms / sharded_ms);
    mpi.met = sharded_ms <= bcast_ms;
  }
  out.push_back(mpi);

  // The raw transport's light: one ucx_perftest stream carrying every
  // engine's bytes in turn (its bandwidth is one stream's, the engines pull
  // side by side).
  if (!r.remote) { // every engine in this process: its light is memcpy's
    target_check local{"sharded warm transfer in one process >= 50% of memcpy for the bytes the engines keep", "",
                       std::nullopt};
    const auto percent = sharded ? percent_of_light(*sharded) : std::nullopt;
    if (!percent)
      local.measured = sharded ? "memcpy not measured" : "no sharded case";
    else {
      local.measured = format("%.2f ms for %.1f MB: %.0f%% of memcpy's %.1f GB/s", sharded_ms,
                              sharded->bytes_per_sync / 1e6, *percent, r.memcpy_gbps);
      local.met = *percent >= 50;
    }
    out.push_back(local);
  }
  target_check raw{"sharded warm transfer >= 0.8x the raw transport for the bytes each receiver needs", "",
                   std::nullopt};
  if (!sharded || sharded_ms <= 0)
    raw.measured = "no sharded case";
  else if (!r.remote)
    raw.measured = "every engine in this process: no transport";
  else if (r.ucx_gbps <= 0)
    raw.measured = "raw UCX not measured: " + r.ucx_why;
  else {
    const double gbps = sharded->bytes_per_sync / (sharded_ms * 1e6);
    raw.measured = format("%.2f GB/s for %.1f MB against raw UCX %.2f GB/s (one stream, the engines' bytes in "
                          "turn): %.2fx",
                          gbps, sharded->bytes_per_sync / 1e6, r.ucx_gbps, gbps / r.ucx_gbps);
    raw.met = gbps >= 0.8 * r.ucx_gbps;
  }
  out.push_back(raw);

  target_check modes{"broadcast / sharded warm transfer >= 0.9x their bytes' ratio (0.9 x tp, dense)", "", std::nullopt};
  if (!sharded || !broadcast || sharded_ms <= 0)
    modes.measured = "needs both the sharded and the broadcast case";
  else {
    const auto x = compare_modes(*broadcast, *sharded);
    modes.measured = format("%.2fx the bytes, %.2fx the transfer time (%.2f against %.2f ms)", x.bytes, x.transfer,
                            medians_of(*broadcast).transfer_ms, sharded_ms);
    modes.met = x.transfer >= 0.9 * x.bytes;
  }
  out.push_back(modes);

  for (const auto& c : r.cases) {
    if (!c.error.empty() || c.name == "control")
      continue;
    const double warm = medians_of(c).transfer_ms, cold = cold_transfer_ms(c);
    target_check t{c.name + " cold transfer <= 2x a warm one", "", std::nullopt};
    if (c.cold.empty() || warm <= 0)
      t.measured = "no cold or no warm round";
    else {
      t.measured = format("%.2f ms against %.2f ms: %.2fx", cold, warm, cold / warm);
      t.met = cold <= 2 * warm;
    }
    out.push_back(t);
  }

  for (const auto& c : r.cases) {
    if (!c.error.empty() || c.name == "control" || c.producer_budget_bytes == 0)
      continue;
    target_check t{c.name + " producer's peak packed memory <= its budget (transfer.packed_budget_bytes)",
                   format("%.1f MB of %.1f MB (the model: %.1f MB)", c.producer_peak_bytes / 1e6,
                          c.producer_budget_bytes / 1e6, c.model_bytes / 1e6),
                   c.producer_peak_bytes <= c.producer_budget_bytes};
    out.push_back(t);
  }

  if (control) {
    const auto m = medians_of(*control);
    target_check t{"control round <= 1.15x six CAF round-trip waves (the target's 8 engines: rlsync bench control "
                   "--engines 8)",
                   "", std::nullopt};
    if (m.probe_ms <= 0)
      t.measured = "no round trips probed";
    else {
      t.measured = format("%s %.2f ms against %.2f ms with %zu engines: %.2fx",
                          control->zero_byte ? "zero-byte round" : "round", m.stall_ms, m.probe_ms, r.engines,
                          control_overhead(*control));
      t.met = control_overhead(*control) <= 1.15;
    }
    out.push_back(t);
  }
  return out;
}

std::string bench_sync_report(const bench_sync_result& r) {
  std::string out = format("rlsync bench sync %s: %zu engines on %zu node(s), backend %s, %u cores%s\n",
                           r.path.c_str(), r.engines, r.nodes, std::string(to_string(r.backend)).c_str(), r.cores,
                           r.arch == model_arch::llama
                             ? ""
                             : (std::string(", a ") + to_string(r.arch) + " model"
                                + (r.fused_experts ? " (fused experts)" : ""))
                                 .c_str());
  out += format("speed of light: memcpy %.1f GB/s (engines in this process)", r.memcpy_gbps);
  if (r.remote) {
    if (r.ucx_gbps > 0)
      out += format(", raw UCX %.2f GB/s (ucx_perftest tag_bw", r.ucx_gbps)
             + (r.ucx_tls.empty() ? std::string() : ", UCX_TLS " + r.ucx_tls) + ", other processes)";
    else
      out += ", not measured: " + r.ucx_why;
  }
  out += "\n";
  if (r.memcpy_light.after > 0) {
    out += format("measured before / after the cases: memcpy %.1f / %.1f GB/s (spread %.0f%%)", r.memcpy_light.before,
                  r.memcpy_light.after, 100 * r.memcpy_light.spread());
    if (r.ucx_light.best() > 0)
      out += format("; raw UCX %.2f / %.2f GB/s (spread %.0f%%)", r.ucx_light.before, r.ucx_light.after,
                    100 * r.ucx_light.spread())
             + (r.ucx_tls_after.empty() ? std::string()
                                        : ", after over " + r.ucx_tls_after
                                              + ", the transports the data plane's connections used");
    out += "; % light uses the faster\n";
  }
  for (const auto& b : r.per_worker) // a worker keeps 1/tp of a sharded layer, all of a broadcast one
    out += format("bytes per worker, tp %lld%s: sharded %.1f MB%s, broadcast %.1f MB (%.1fx)\n",
                  static_cast<long long>(b.tp), b.expert_parallel ? " with expert parallelism" : "",
                  b.sharded_max / 1e6,
                  b.sharded_min == b.sharded_max ? "" : format(" (%.1f MB the least)", b.sharded_min / 1e6).c_str(),
                  b.broadcast / 1e6, double(b.broadcast) / std::max<std::uint64_t>(1, b.sharded_max));
  out += "\n";
  for (const auto& line : case_table(r.cases))
    out += line + "\n";
  std::string lent, in_place;
  for (const auto& c : r.cases) {
    if (c.error.empty() && c.lent)
      lent += (lent.empty() ? "" : ", ") + c.name;
    if (c.error.empty() && c.in_place)
      in_place += (in_place.empty() ? "" : ", ") + c.name;
  }
  if (!lent.empty())
    out += "lent in shared memory, copied once (their light is memcpy's): " + lent + "\n";
  if (!in_place.empty())
    out += "lent in place, gathered from the trainer's version memory (nothing packed): " + in_place + "\n";
  for (const auto& line : pull_lines(r.cases))
    out += line + "\n";
  const case_result* sharded = nullptr;
  const case_result* broadcast = nullptr;
  for (auto& c : r.cases) {
    if (c.name == "sharded" && c.error.empty())
      sharded = &c;
    if (c.name == "broadcast" && c.error.empty())
      broadcast = &c;
  }
  if (sharded && broadcast) {
    auto x = compare_modes(*broadcast, *sharded);
    out += format("broadcast / sharded: %.2fx the bytes, %.2fx the transfer time, %.2fx the stall\n", x.bytes,
                  x.transfer, x.stall);
  }
  for (auto& c : r.cases) {
    if (!c.error.empty() || c.ranks < 2)
      continue;
    for (auto& one : r.cases)
      if (one.error.empty() && one.ranks == 1 && one.mode == c.mode && one.name != "control") {
        auto x = compare_ranks(c, one);
        out += format("%s / %s: %.2fx the transfer time, %.2fx the stall (below 1: the ranks pack in parallel)\n",
                      c.name.c_str(), one.name.c_str(), x.transfer, x.stall);
      }
  }
  for (const auto& line : packs_lines(r.cases))
    out += line + "\n";
  if (r.rank_kill)
    for (const auto& line : rank_kill_lines(*r.rank_kill))
      out += line + "\n";
  for (auto& c : r.cases)
    if (c.error.empty() && c.name != "control" && c.producer_budget_bytes == 0) // no UCX producer
      out += format("%s memory: largest group %.1f MB; local data plane peak %.1f MB of buffers\n", c.name.c_str(),
                    c.largest_group / 1e6, c.local_peak_bytes / 1e6);
    else if (c.error.empty() && c.name != "control")
      out += format("%s memory: largest group %.1f MB; UCX producer peak %.1f MB packed (%zu groups) of its "
                    "%.1f MB budget (%llu buffers made at start; %llu of all made in huge pages); warm rounds: "
                    "%llu groups packed ahead, %llu dropped while needed, %llu buffers made\n",
                    c.name.c_str(), c.largest_group / 1e6, c.producer_peak_bytes / 1e6, c.producer_peak_groups,
                    c.producer_budget_bytes / 1e6, static_cast<unsigned long long>(c.producer_buffers_prewarmed),
                    static_cast<unsigned long long>(c.producer_huge_buffers),
                    static_cast<unsigned long long>(c.producer_packs_ahead),
                    static_cast<unsigned long long>(c.producer_evictions),
                    static_cast<unsigned long long>(c.producer_buffers_made));
  for (auto& c : r.cases)
    if (c.name == "control" && c.error.empty()) {
      auto m = medians_of(c);
      out += format("control plane: median %s %.2f ms (%zu kB model%s) vs six CAF round-trip waves %.2f ms: "
                    "%.2fx\n",
                    c.zero_byte ? "zero-byte round" : "round", m.stall_ms, static_cast<std::size_t>(c.model_bytes / 1000),
                    c.zero_byte ? ", unchanged by the trainer's steps" : "", m.probe_ms, control_overhead(c));
    }
  if (r.mpi_bcast_s > 0) {
    auto ms = [](double s) { return s > 0 ? format("%.2f ms", s * 1e3) : std::string("failed"); };
    out += format("MPI_Bcast (Open MPI) of the %.0f MB model to %zu ranks: median %.2f ms (defaults %s, vader "
                  "single copy off %s, buffers in huge pages %s: the fastest counts)",
                  r.model_bytes / 1e6, r.engines, r.mpi_bcast_s * 1e3, ms(r.mpi_bcast_defaults_s).c_str(),
                  ms(r.mpi_bcast_no_single_copy_s).c_str(), ms(r.mpi_bcast_huge_pages_s).c_str());
    if (sharded) {
      auto transfer = medians_of(*sharded).transfer_ms;
      out += format("; sharded transfer %.2f ms: %.2fx %s", transfer, r.mpi_bcast_s * 1e3 / std::max(1e-9, transfer),
                    transfer < r.mpi_bcast_s * 1e3 ? "faster" : "(slower)");
    }
    out += "\n";
  } else {
    out += "MPI_Bcast baseline " + r.mpi_why + "\n";
  }
  out += "\ntargets, this run:\n";
  for (const auto& t : sync_targets(r))
    out += format("  %-8s %s: %s\n", !t.met ? "n/a" : *t.met ? "met" : "NOT met", t.target.c_str(),
                  t.measured.c_str());
  return out;
}

nlohmann::ordered_json bench_sync_json(const bench_sync_result& r) {
  auto cases = nlohmann::ordered_json::array();
  for (const auto& c : r.cases)
    cases.push_back(case_json(c));
  nlohmann::ordered_json out{{"topology", r.path},
                             {"memcpy_gbps", rounded(r.memcpy_gbps, 2)},
                             {"ucx_gbps", rounded(r.ucx_gbps, 2)},
                             {"memcpy_gbps_before", rounded(r.memcpy_light.before, 2)},
                             {"memcpy_gbps_after", rounded(r.memcpy_light.after, 2)},
                             {"ucx_gbps_before", rounded(r.ucx_light.before, 2)},
                             {"ucx_gbps_after", rounded(r.ucx_light.after, 2)},
                             {"ucx_tls_after", r.ucx_tls_after},
                             {"cores", r.cores},
                             {"mpi_bcast_median_s", r.mpi_bcast_s},
                             {"mpi_bcast_defaults_median_s", r.mpi_bcast_defaults_s},
                             {"mpi_bcast_no_single_copy_median_s", r.mpi_bcast_no_single_copy_s},
                             {"mpi_bcast_huge_pages_median_s", r.mpi_bcast_huge_pages_s},
                             {"cases", cases}};
  auto per_worker = nlohmann::ordered_json::array();
  for (const auto& b : r.per_worker)
    per_worker.push_back({{"tp", b.tp},
                          {"expert_parallel", b.expert_parallel},
                          {"sharded_max_bytes", b.sharded_max},
                          {"sharded_min_bytes", b.sharded_min},
                          {"broadcast_bytes", b.broadcast}});
  out["bytes_per_worker"] = per_worker;
  auto targets = nlohmann::ordered_json::array();
  for (const auto& t : sync_targets(r))
    targets.push_back({{"target", t.target},
                       {"measured", t.measured},
                       {"met", t.met ? nlohmann::ordered_json(*t.met) : nlohmann::ordered_json(nullptr)}});
  out["targets"] = targets;
  if (r.rank_kill) {
    const auto& k = *r.rank_kill;
    out["rank_kill"] = {{"ranks", k.ranks},
                        {"killed_rank", k.killed_rank},
                        {"transfer_deadline_ms", k.transfer_deadline_ms},
                        {"aborted", k.aborted},
                        {"kill_to_abort_ms", rounded(k.kill_to_abort_ms, 3)},
                        {"dirty_after_abort", k.dirty_after_abort},
                        {"dirty_routable", k.dirty_routable},
                        {"dirty_tokens", k.dirty_tokens},
                        {"restart_ms", rounded(k.restart_ms, 3)},
                        {"restart_to_complete_ms", rounded(k.restart_to_complete_ms, 3)},
                        {"rounds_to_complete", k.rounds_to_complete},
                        {"held", k.held()},
                        {"error", k.error}};
  }
  return out;
}

} // namespace rlsync::jobs
