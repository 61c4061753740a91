// The sync bench: its models, its deployments of a topology, the cases it
// runs (sharded, broadcast, control, several ranks) and the MPI baseline.
// The figures and the report are in bench_sync_report.cpp.
#include "actors/jobs/bench_sync.hpp"
#include "actors/jobs/bench_sync_deployment.hpp"

#include "actors/assembly/head_node.hpp"
#include "actors/certs.hpp"
#include "actors/gatekeeper.hpp"
#include "actors/tls.hpp"
#include "actors/jobs/speed_of_light.hpp"
#include "runtime/base/format.hpp"
#include "runtime/base/thread_schedule.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/plan/plan.hpp"
#include "runtime/process/launcher.hpp"

#include <caf/scoped_actor.hpp>

#include <algorithm>
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
      p.local_lent = st.lent;
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
    r.packs[i].local_lent -= before[i].local_lent;
    r.packs[i].ucx_packs -= before[i].ucx_packs;
  }
  r.queued_known = thread_schedule::now().queued_known; // the engines and producers run on this host
  std::uint64_t sent = 0, lent = 0, in_place = 0;
  for (std::size_t i = 0; i < d.head().rank_producers().size(); ++i) {
    const auto s = d.head().rank_producers()[i]->stats();
    r.producer_peak_groups = std::max(r.producer_peak_groups, s.peak_packed);
    r.producer_peak_bytes = std::max(r.producer_peak_bytes, s.peak_packed_bytes);
    r.producer_budget_bytes = std::max(r.producer_budget_bytes, s.budget_bytes);
    const auto b = i < producers_before.size() ? producers_before[i] : transfer::ucx_producer_stats{};
    r.producer_packs_ahead += s.packs_ahead - b.packs_ahead;
    r.producer_evictions += s.evictions - b.evictions;
    if (rounds > 0) {
      r.producer_ran_ms += std::chrono::duration<double, std::milli>(s.progress_ran - b.progress_ran).count() / rounds;
      r.producer_queued_ms +=
          std::chrono::duration<double, std::milli>(s.progress_queued - b.progress_queued).count() / rounds;
    }
    r.producer_buffers_made += s.buffers_made - b.buffers_made;
    r.producer_buffers_prewarmed += s.buffers_prewarmed;
    r.producer_huge_buffers += s.huge_buffers;
    r.ucx_transports.insert(s.data_transports.begin(), s.data_transports.end());
    sent += s.groups_sent - b.groups_sent;
    lent += s.groups_lent - b.groups_lent;
    in_place += s.groups_lent_in_place - b.groups_lent_in_place;
  }
  std::uint64_t local_offered = 0, local_lent = 0; // the local plane lends in place, or packs short runs
  for (const auto& p : r.packs) {
    local_offered += p.local_packs;
    local_lent += p.local_lent;
  }
  r.lent = sent > 0 && lent == sent;
  r.in_place = (r.lent && in_place == sent) || (sent == 0 && local_offered > 0 && local_lent == local_offered);
  for (const auto& rank : d.head().ranks()) {
    if (rank.trainer.transfer)
      r.local_peak_bytes = std::max(r.local_peak_bytes, rank.trainer.transfer->stats().peak_buffer_bytes);
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
      << (e.dp > 1 ? ", dp_balance: " + e.dp_balance : std::string()) << (e.expert_parallel ? ", expert_parallel: true" : "") << (e.weights != "received" ? ", weights: " + e.weights : "")
      << ", device: " << e.device << ", max_batch: " << e.max_batch << ", queue_limit: " << e.queue_limit
      << ", kv_block_tokens: " << e.kv_block_tokens << ", prefix_cache_blocks: " << e.prefix_cache_blocks << "}\n";
  y << "router: {node: " << t.router.node << "}\ncoordinator: {node: " << t.coordinator.node << "}\n";
  y << "transfer: {backend: " << to_string(t.transfer.backend) << ", mode: " << to_string(t.transfer.mode)
    // The collective broadcasts whole groups: the bench's sharded cases run without it.
    << (t.transfer.collective && t.transfer.mode == transfer_mode::broadcast
          ? ", collective: true, bucket_bytes: " + std::to_string(t.transfer.bucket_bytes)
          : std::string())
    << ", groups_in_flight: " << t.transfer.groups_in_flight;
  if (t.transfer.backend == transfer_backend::ucx) { // the other backends refuse the key
    y << ", ucx_transports: [";
    for (std::size_t i = 0; i < t.transfer.ucx_transports.size(); ++i)
      y << (i ? ", " : "") << to_string(t.transfer.ucx_transports[i]);
    y << "]";
  }
  y << "}\n";
  // The engines' phase deadlines (the transfer's bounds each pull).
  const auto& d = t.sync.deadlines;
  y << "sync: {deadlines_ms: {pause: " << d.pause.count() << ", flush: " << d.flush.count()
    << ", start: " << d.start.count() << ", transfer: " << d.transfer.count() << ", finish: " << d.finish.count()
    << ", continue: " << d.resume.count() << "}}\n";
  return y.str();
}

// -- bench sync -------------------------------------------------------------------

std::string bench_sync_problem(const topology& t, const std::string& path, const model_config& model,
                               const std::vector<int>& ranks) {
  if (auto problem = cluster_layout_problem(t); !problem.empty())
    return problem;
  // The benchmark steps every trainer rank itself, so it places them on the
  // coordinator's node, with the router it asks for status.
  const std::string& head = t.coordinator.node;
  if (t.router.node != head)
    return topology_place(path, {"router", "node"}) + ": the router must run on the coordinator's node (" + head
           + ") for the benchmark";
  for (int n : ranks)
    if (n < 1 || n > max_bench_ranks || n > model.num_hidden_layers)
      return "--ranks " + std::to_string(n) + ": between 1 and " + std::to_string(max_bench_ranks) + " and at most the model's "
             + std::to_string(model.num_hidden_layers) + " layers (each rank holds at least one)";
  auto local = local_nodes(t);
  for (const auto& n : t.nodes)
    if (std::none_of(local.begin(), local.end(), [&](const node_spec* l) { return l->name == n.name; }))
      return topology_place(path, {"nodes", "name=" + n.name, "address"}) + ": node '" + n.name + "' (" + n.address
             + ") is not on this machine; the benchmark starts every node itself";
  for (const auto& e : t.engines)
    if (e.kind != engine_kind::builtin)
      return topology_place(path, {"engines", "name=" + e.group, "kind"}) + ": engine '" + e.name
             + "' is kind vllm: the benchmark measures rlsync's own engines, which it starts with their model";
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

bool mpi_over_tcp(const topology& t) {
  const auto& named = t.transfer.ucx_transports;
  return t.transfer.backend == transfer_backend::ucx && !named.empty()
         && std::all_of(named.begin(), named.end(), [](ucx_transport u) { return u == ucx_transport::tcp; });
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
  r.mpi_over_tcp = mpi_over_tcp(t);
  auto mpi = measure_mpi_bcast(o.exe, bf16_model_bytes(model), t.engines.size(), static_cast<std::uint64_t>(o.syncs),
                               r.mpi_over_tcp);
  r.mpi_bcast_s = mpi.best_s();
  r.mpi_bcast_tcp_s = mpi.tcp_s;
  r.mpi_bcast_defaults_s = mpi.defaults_s;
  r.mpi_bcast_no_single_copy_s = mpi.no_single_copy_s;
  r.mpi_bcast_huge_pages_s = mpi.huge_pages_s;
  r.mpi_why = mpi.why;
  return r;
}

} // namespace rlsync::jobs
