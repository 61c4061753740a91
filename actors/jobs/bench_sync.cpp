#include "actors/jobs/bench_sync.hpp"

#include "actors/assembly/head_node.hpp"
#include "actors/certs.hpp"
#include "actors/gatekeeper.hpp"
#include "actors/tls.hpp"
#include "actors/jobs/speed_of_light.hpp"
#include "runtime/base/format.hpp"
#include "runtime/base/stats.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/recording.hpp"
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
#include <sstream>
#include <thread>

namespace rlsync::jobs {

namespace {

using clock_type = std::chrono::steady_clock;

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

model_config model_of_size(std::uint64_t bytes) {
  model_config c;
  c.vocab_size = 320;
  c.hidden_size = 1024;
  c.intermediate_size = 2816;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  c.num_hidden_layers = 1;
  std::uint64_t one = bf16_model_bytes(c);
  c.num_hidden_layers = 2;
  std::uint64_t per_layer = bf16_model_bytes(c) - one;
  // Bounded: --model-bytes is at most what parse_size accepts, far below
  // 2^63 bytes; a layer is about 20 MB.
  c.num_hidden_layers = std::max<std::int64_t>(1, 1 + static_cast<std::int64_t>((bytes > one ? bytes - one : 0) / per_layer));
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
  for (int w = 0; w < e.tp; ++w)
    for (const auto& entry : engine::make_plan(c, static_cast<int>(e.tp), w, dtype::bf16).entries)
      total += entry.bytes();
  return total;
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

// -- one case's figures -----------------------------------------------------------

case_medians medians_of(const case_result& c) {
  std::vector<double> stall, transfer, control, gbps;
  for (auto& x : c.warm) {
    stall.push_back(ms(x.stall_ns));
    transfer.push_back(ms(x.transfer_ns));
    control.push_back(ms(x.control_ns));
    if (x.transfer_ns > 0)
      gbps.push_back(x.bytes / static_cast<double>(x.transfer_ns));
  }
  return {median(stall), median(transfer), median(control), median(gbps), median(c.probe_ms)};
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

double control_overhead(const case_result& c) {
  auto m = medians_of(c);
  return m.stall_ms / std::max(1e-9, m.probe_ms);
}

std::uint64_t producer_bound_bytes(const case_result& c) {
  return static_cast<std::uint64_t>(c.producer_peak_groups) * c.largest_group;
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
                     {"bytes", x.bytes}});
    return out;
  };
  auto probes = nlohmann::ordered_json::array();
  for (double p : c.probe_ms)
    probes.push_back(rounded(p, 3));
  return {{"case", c.name},
          {"model_bytes", c.model_bytes},
          {"bytes_per_sync", c.bytes_per_sync},
          {"light_ms", rounded(c.light_ms, 3)},
          {"cold", rounds(c.cold)},
          {"warm", rounds(c.warm)},
          {"probe6_ms", probes},
          {"producer_peak_groups", c.producer_peak_groups},
          {"largest_group_bytes", c.largest_group},
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

/// The other nodes of a deployment, as `rlsync node` children of a
/// supervisor running on its own thread; their output is kept (the last
/// lines) for a failure, and passed on with --verbose.
class node_children {
public:
  node_children(std::vector<child_spec> children, const bench_session& s) {
    supervisor_options o;
    o.grace = std::chrono::seconds(5);
    o.sink = [this, &s](output_stream, std::string_view line) {
      std::string text(line);
      if (!text.empty() && text.back() == '\n')
        text.pop_back();
      if (s.verbose())
        s.note(text);
      std::lock_guard<std::mutex> lock(mutex_);
      tail_.push_back(std::move(text));
      if (tail_.size() > 60)
        tail_.pop_front();
    };
    sup_ = std::make_unique<supervisor>(o);
    if (!children.empty())
      thread_ = std::thread([this, children = std::move(children)] { result_ = sup_->run(children); });
  }
  ~node_children() { stop(); }
  void stop() {
    if (thread_.joinable()) {
      sup_->request_stop();
      thread_.join();
    }
  }
  std::string tail() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string s;
    for (auto& l : tail_)
      s += (s.empty() ? "" : "\n") + l;
    return s;
  }

private:
  std::unique_ptr<supervisor> sup_;
  std::thread thread_;
  launch_result result_;
  mutable std::mutex mutex_;
  std::deque<std::string> tail_;
};

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

case_result run_case(bench_session& s, topology t, const std::string& name, const model_config& model,
                     transfer_mode mode, int rounds, bool probe) {
  case_result r;
  r.name = name;
  r.mode = mode;
  t.model.config = model;
  t.model.checkpoint.clear();
  t.model.weights_dtype = dtype::bf16;
  t.trainer.source = trainer_source::synthetic;
  t.trainer.ranks = {trainer_rank{t.trainer.node, {}}};
  for (std::int64_t l = 0; l < model.num_hidden_layers; ++l)
    t.trainer.ranks.front().layers.push_back(l);
  t.transfer.mode = mode;
  t.cluster.secret_env = "RLSYNC_BENCH_SECRET";
  t.cluster.secret_file.clear();
  t.cluster.tls = s.tls();
  t.cluster.allow_insecure_network = false;
  r.model_bytes = bf16_model_bytes(model);
  // The nodes' copy of the topology: the same model, mode and nodes.
  const std::string path = s.dir() + "/bench-" + name + ".yaml";
  {
    std::ofstream f(path);
    f << node_yaml(t);
    if (!f) {
      r.error = "cannot write " + path;
      return r;
    }
  }
  // This process drives: no step unless asked, no round unless asked. Phase
  // deadlines are generous: a large model on a loaded 2-core machine is slow
  // everywhere, and a bench that evicts measures nothing.
  t.trainer.step_time = std::chrono::hours(24);
  t.sync.every_versions = std::int64_t(1) << 40;
  for (auto* phase : {&t.sync.deadlines.pause, &t.sync.deadlines.start, &t.sync.deadlines.finish})
    *phase = std::max(*phase, std::chrono::milliseconds(60000));

  const node_spec* head_spec = t.find_node(t.coordinator.node);
  std::vector<child_spec> children;
  for (const auto& n : t.nodes)
    if (n.name != head_spec->name)
      children.push_back({n.name, {s.exe(), "node", "--topology", path, "--node", n.name}});
  std::mutex mutex;
  std::vector<sync_report> reports;
  std::unique_ptr<head_node> head;
  auto& sys = s.system();
  try {
    head = std::make_unique<head_node>(sys, t, *head_spec, member_secrets(t, head_spec->name, s.secret()),
                                       head_hooks{[&s](const std::string& l) {
                                                    if (s.verbose())
                                                      s.note(l);
                                                  },
                                                  {},
                                                  [&](const sync_report& rep) {
                                                    std::lock_guard<std::mutex> lock(mutex);
                                                    reports.push_back(rep);
                                                  }});
  } catch (const std::exception& e) {
    r.error = e.what();
    return r;
  }
  node_children nodes(std::move(children), s);
  auto fail = [&](const std::string& what) {
    r.error = what;
    auto tail = nodes.tail();
    if (!tail.empty() && !s.verbose())
      s.note("bench " + name + ": the nodes' last lines:\n" + tail);
    return r;
  };

  // Cold: every engine registered, then synced once. A round that evicts
  // somebody (a slow first session start, say) is retried by asking for the
  // next one: this process asks for every round itself.
  caf::scoped_actor self{sys};
  auto& d = t.sync.deadlines;
  auto round_time = d.pause + d.flush + d.start + d.transfer + d.finish + d.resume;
  auto cold_deadline = clock_type::now() + t.cluster.connect_deadline * 2 + round_time;
  while (head->members() < t.engines.size() && clock_type::now() < cold_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  while (head->routable() < t.engines.size() && clock_type::now() < cold_deadline)
    self->request(head->coordinator(), round_time * 2, sync_atom::value)
      .receive([](const sync_report&) {}, [](caf::error&) {});
  if (head->routable() < t.engines.size())
    return fail("only " + std::to_string(head->routable()) + " of " + std::to_string(t.engines.size())
                + " engines registered and synced in time");
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& rep : reports)
      if (rep.engines_synced > 0)
        r.cold.push_back(rep);
  }
  auto light = light_of(t, model, mode, s.memcpy_gbps, s.ucx_gbps);
  r.bytes_per_sync = light.bytes;
  r.light_ms = light.light_ms;

  auto long_wait = t.cluster.connect_deadline + d.transfer;
  for (int k = 0; k < rounds; ++k) {
    if (probe) {
      std::uint64_t ns = 0;
      self->request(head->coordinator(), long_wait, probe_atom::value, std::uint32_t{6})
        .receive([&](std::uint64_t x) { ns = x; }, [&](caf::error& err) { r.error = sys.render(err); });
      r.probe_ms.push_back(ns / 1e6);
    }
    bool stepped = false;
    self->request(head->trainer(), long_wait, step_atom::value)
      .receive([&](const version_info&) { stepped = true; }, [&](caf::error& err) { r.error = sys.render(err); });
    if (!stepped)
      return fail("the trainer did not step: " + r.error);
    std::optional<sync_report> rep;
    self->request(head->coordinator(), long_wait * 2, sync_atom::value)
      .receive([&](const sync_report& x) { rep = x; }, [&](caf::error& err) { r.error = sys.render(err); });
    if (!rep)
      return fail("sync failed: " + r.error);
    if (!rep->evicted.empty())
      return fail("sync " + std::to_string(k + 1) + " evicted " + rep->evicted.front());
    r.warm.push_back(*rep);
  }
  if (auto* p = head->producer())
    r.producer_peak_groups = p->stats().peak_packed;
  if (auto lt = head->local_transfer())
    r.local_peak_bytes = lt->stats().peak_buffers;
  if (auto snapshot = head->source()->latest())
    for (auto g : snapshot->groups())
      r.largest_group = std::max(r.largest_group, snapshot->group_bytes(g));
  head->stop();
  nodes.stop();
  return r;
}

std::string node_yaml(const topology& t) {
  const auto& c = t.model.config;
  std::ostringstream y;
  y << "name: " << t.name << "\nmodel:\n  synthetic: {layers: " << c.num_hidden_layers
    << ", hidden_size: " << c.hidden_size << ", heads: " << c.num_attention_heads
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
  y << "trainer: {node: " << t.trainer.node << "}\nengines:\n";
  for (const auto& e : t.engines)
    y << "  - {name: " << e.name << ", node: " << e.node << ", tp: " << e.tp << ", max_batch: " << e.max_batch
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

std::string bench_sync_problem(const topology& t, const std::string& path, const model_config& model) {
  if (auto problem = cluster_layout_problem(t); !problem.empty())
    return path + ": " + problem;
  // The benchmark steps the one trainer on the coordinator's node itself.
  const std::string& head = t.coordinator.node;
  if (t.router.node != head || t.trainer.ranks.size() != 1 || t.trainer.ranks[0].node != head)
    return path + ": the router and the trainer (one rank) must run on the coordinator's node (" + head
           + ") for the benchmark";
  auto local = local_nodes(t);
  for (const auto& n : t.nodes)
    if (std::none_of(local.begin(), local.end(), [&](const node_spec* l) { return l->name == n.name; }))
      return path + ": node '" + n.name + "' (" + n.address
             + ") is not on this machine; the benchmark starts every node itself";
  for (const auto& e : t.engines)
    if (auto errors = validate_tp(model, e.tp); !errors.empty())
      return "engine " + e.name + ": tp " + std::to_string(e.tp) + ": " + errors.front();
  return {};
}

bool bench_sync_result::failed() const {
  return std::any_of(cases.begin(), cases.end(), [](const case_result& c) { return !c.error.empty(); });
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
  auto model = model_of_size(o.model_bytes);

  bench_session s(t, o.exe, o.verbose, o.note);
  s.note("measuring the speed of light...");
  s.memcpy_gbps = r.memcpy_gbps = measure_memcpy_gbps(std::size_t(256) << 20);
  r.remote = std::any_of(t.engines.begin(), t.engines.end(),
                         [&](const engine_spec& e) { return e.node != t.coordinator.node; });
  auto group_guess = std::min<std::uint64_t>(static_cast<std::uint64_t>(t.transfer.bucket_bytes), 64u << 20);
  if (r.remote && t.transfer.backend == transfer_backend::ucx) {
    auto ucx = measure_ucx_gbps(t.transfer.ucx_transports, group_guess, o.model_bytes);
    r.ucx_gbps = ucx.value;
    r.ucx_why = ucx.why;
  } else if (r.remote) {
    r.ucx_why = "remote engines pull over CAF (transfer.backend " + std::string(to_string(t.transfer.backend))
                + "): no raw baseline";
  }
  s.ucx_gbps = r.ucx_gbps;
  s.ucx_why = r.ucx_why;

  for (auto mode : o.modes) {
    std::string name{to_string(mode)};
    s.note("bench " + name + ": " + std::to_string(t.engines.size()) + " engines, model "
           + format("%.0f", o.model_bytes / 1e6) + " MB, " + std::to_string(o.syncs) + " syncs...");
    r.cases.push_back(run_case(s, t, name, model, mode, o.syncs, false));
  }
  s.note("bench control: " + std::to_string(t.engines.size()) + " engines, model "
         + format("%.0f", bf16_model_bytes(tiny_model()) / 1e3) + " kB, " + std::to_string(o.syncs) + " rounds...");
  r.cases.push_back(run_case(s, t, "control", tiny_model(), transfer_mode::sharded, o.syncs, true));

  // The classic baseline: MPI_Bcast of the model to one rank per engine.
  auto mpi = measure_mpi_bcast_s(o.exe, bf16_model_bytes(model), t.engines.size(), static_cast<std::uint64_t>(o.syncs));
  r.mpi_bcast_s = mpi.value;
  r.mpi_why = mpi.why;
  return r;
}

std::string bench_sync_report(const bench_sync_result& r) {
  std::string out = format("rlsync bench sync %s: %zu engines on %zu node(s), backend %s, %u cores\n", r.path.c_str(),
                           r.engines, r.nodes, std::string(to_string(r.backend)).c_str(), r.cores);
  out += format("speed of light: memcpy %.1f GB/s (engines in this process)", r.memcpy_gbps);
  if (r.remote) {
    if (r.ucx_gbps > 0)
      out += format(", raw UCX %.2f GB/s (ucx_perftest tag_bw", r.ucx_gbps)
             + (r.ucx_tls.empty() ? std::string() : ", UCX_TLS " + r.ucx_tls) + ", other processes)";
    else
      out += ", not measured: " + r.ucx_why;
  }
  out += "\n\n";
  for (const auto& line : case_table(r.cases))
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
  for (auto& c : r.cases)
    if (c.error.empty() && c.name != "control")
      out += format("%s memory: largest group %.1f MB; UCX producer peak %zu packed groups (<= %.1f MB)\n",
                    c.name.c_str(), c.largest_group / 1e6, c.producer_peak_groups, producer_bound_bytes(c) / 1e6);
  for (auto& c : r.cases)
    if (c.name == "control" && c.error.empty()) {
      auto m = medians_of(c);
      out += format("control plane: median round %.2f ms (%zu kB model) vs six CAF round-trip waves %.2f ms: %.2fx\n",
                    m.stall_ms, static_cast<std::size_t>(c.model_bytes / 1000), m.probe_ms, control_overhead(c));
    }
  if (r.mpi_bcast_s > 0) {
    out += format("MPI_Bcast (Open MPI) of the %.0f MB model to %zu ranks: median %.2f ms", r.model_bytes / 1e6,
                  r.engines, r.mpi_bcast_s * 1e3);
    if (sharded) {
      auto transfer = medians_of(*sharded).transfer_ms;
      out += format("; sharded transfer %.2f ms: %.2fx %s", transfer, r.mpi_bcast_s * 1e3 / std::max(1e-9, transfer),
                    transfer < r.mpi_bcast_s * 1e3 ? "faster" : "(slower)");
    }
    out += "\n";
  } else {
    out += "MPI_Bcast baseline " + r.mpi_why + "\n";
  }
  return out;
}

nlohmann::ordered_json bench_sync_json(const bench_sync_result& r) {
  auto cases = nlohmann::ordered_json::array();
  for (const auto& c : r.cases)
    cases.push_back(case_json(c));
  return {{"topology", r.path},
          {"memcpy_gbps", rounded(r.memcpy_gbps, 2)},
          {"ucx_gbps", rounded(r.ucx_gbps, 2)},
          {"cores", r.cores},
          {"mpi_bcast_median_s", r.mpi_bcast_s},
          {"cases", cases}};
}

} // namespace rlsync::jobs
