// rlsync bench sync / bench control: the figures DESIGN §8 asks of every
// benchmark, for the data plane and the control plane, each against a speed
// of light measured in the same run on the same machine.
//
//   bench sync     for each mode (sharded, broadcast): deploy the topology
//                  with a synthetic model of --model-bytes (the head in this
//                  process, every other node as an `rlsync node` child),
//                  wait for the cold syncs, then K warm syncs, each one
//                  trainer step + one round. Then the same deployment with a
//                  near-empty model: the control plane alone.
//   bench control  the near-empty round alone across N engine processes,
//                  against six waves of CAF round trips (the coordinator's
//                  probe) measured between the rounds.
//
// Speed of light of a transfer: the bytes each engine must receive over the
// path it takes, divided by that path's raw bandwidth, summed over engines
// (they share the machine): memcpy for engines in this process, a raw UCX
// tag transfer (ucx_perftest, same transports) for engines in other
// processes. Both measured in this run, before the syncs.
#include "actors/assembly/head_node.hpp"
#include "actors/gatekeeper.hpp"
#include "actors/jobs/main_job.hpp"
#include "actors/system_config.hpp"
#include "runtime/base/stats.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/process/launcher.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

namespace rlsync::tools {

using namespace rlsync::jobs;

namespace {

using clock_type = std::chrono::steady_clock;
namespace fs = std::filesystem;

const char* sync_usage =
  "usage: rlsync bench sync --topology T.yaml [--model-bytes N] [--syncs K] [--modes sharded,broadcast]\n"
  "                         [--json FILE] [--verbose]\n"
  "Deploys the topology (every node must be on this machine: the coordinator's node in this\n"
  "process, the others as `rlsync node` processes) with a synthetic bf16 model of about N bytes\n"
  "(default 256MiB; suffixes KiB MiB GiB), and for each mode runs the cold sync, then K warm\n"
  "syncs (default 5): stall, transfer, effective GB/s against the speed of light measured in\n"
  "this run, and control-plane overhead. Then K rounds of a near-empty model (the control plane\n"
  "alone). Prints a table; --json FILE writes every figure.\n";

const char* control_usage =
  "usage: rlsync bench control [--engines N] [--rounds K] [--json FILE] [--verbose]\n"
  "Starts N engine processes (default 8, one engine each, tp 1) on loopback around a head in\n"
  "this process, and runs K (default 20) sync rounds of a near-empty model: the control plane\n"
  "alone. Each round is compared with six waves of CAF round trips to every engine (pause,\n"
  "flush, start, transfer, finish and continue are six waves) measured between the rounds.\n";

std::uint64_t sum_bytes(const std::vector<tensor_spec>& specs) {
  std::uint64_t n = 0;
  for (const auto& s : specs)
    n += s.bytes();
  return n;
}

std::string fixed(double x, int digits = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

/// Runs `command` through the shell and returns its output (stdout and stderr).
std::string capture(const std::string& command) {
  std::string out;
  if (FILE* p = ::popen((command + " 2>&1").c_str(), "r")) {
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, p))
      out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

std::string ucx_tls(const std::vector<ucx_transport>& transports) {
  std::string tls;
  for (auto t : transports) {
    std::string name{to_string(t)};
    if (name == "shm")
      name = "sm"; // UCX's alias for every shared-memory transport
    tls += (tls.empty() ? "" : ",") + name;
  }
  return tls;
}

/// The raw UCX bandwidth between two processes of this machine over
/// `transports` (empty: UCX decides): ucx_perftest tag_bw with messages of
/// `message_bytes`, moving about `total_bytes`. 0 when it cannot be measured
/// (`why` says why).
double measure_ucx_gbps(const std::vector<ucx_transport>& transports, std::uint64_t message_bytes,
                        std::uint64_t total_bytes, std::string& why) {
  if (::system("command -v ucx_perftest >/dev/null 2>&1") != 0) {
    why = "ucx_perftest not installed (apt-get install ucx-utils)";
    return 0;
  }
  message_bytes = std::clamp<std::uint64_t>(message_bytes, 1 << 20, std::uint64_t(256) << 20);
  auto iterations = std::clamp<std::uint64_t>(total_bytes / message_bytes, 8, 256);
  std::mt19937 rng{static_cast<unsigned>(::getpid())};
  int port = 30000 + static_cast<int>(rng() % 2000);
  std::string env;
  if (!transports.empty()) {
    // tcp too: UCX needs it to connect client and server (ucx_transfer.hpp).
    auto tls = ucx_tls(transports);
    env = "UCX_TLS=" + tls + (tls.find("tcp") == std::string::npos ? ",tcp" : "") + " ";
  }
  std::string server = env + "timeout 60 ucx_perftest -p " + std::to_string(port) + " >/dev/null 2>&1 &";
  if (::system(server.c_str()) != 0) {
    why = "could not start ucx_perftest";
    return 0;
  }
  std::string client = env + "timeout 60 ucx_perftest 127.0.0.1 -p " + std::to_string(port) + " -t tag_bw -s "
                       + std::to_string(message_bytes) + " -n " + std::to_string(iterations);
  std::string out;
  for (int attempt = 0; attempt < 20; ++attempt) { // the server needs a moment to listen
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    out = capture(client);
    if (out.find("Final:") != std::string::npos)
      break;
  }
  auto at = out.find("Final:");
  if (at == std::string::npos) {
    why = "ucx_perftest failed: " + out.substr(0, 200);
    return 0;
  }
  // Final: iterations, latency 50%, average, overall, bandwidth average, overall (MB/s = MiB/s), rates.
  std::istringstream line(out.substr(at + 6));
  double f[7] = {};
  for (double& x : f)
    line >> x;
  return f[5] * 1048576.0 / 1e9;
}

/// A synthetic bf16 llama of about `bytes`: hidden 1024 (16 heads, 8 kv
/// heads), intermediate 2816, as many layers as fit (at least 1).
model_config model_of_size(std::uint64_t bytes) {
  model_config c;
  c.vocab_size = 320;
  c.hidden_size = 1024;
  c.intermediate_size = 2816;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  c.num_hidden_layers = 1;
  auto size = [&] { return sum_bytes(llama_parameter_specs(c, dtype::bf16)); };
  std::uint64_t one = size();
  c.num_hidden_layers = 2;
  std::uint64_t per_layer = size() - one;
  c.num_hidden_layers = std::max<std::int64_t>(1, 1 + static_cast<std::int64_t>((bytes > one ? bytes - one : 0) / per_layer));
  return c;
}

/// The smallest model the engines accept at tp up to 8 (a few hundred KiB).
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

/// Bytes engine `e` receives per sync: its workers' plan entries (sharded),
/// or every parameter once per worker (broadcast).
std::uint64_t engine_bytes(const model_config& c, const engine_spec& e, transfer_mode mode) {
  if (mode == transfer_mode::broadcast)
    return static_cast<std::uint64_t>(e.tp) * sum_bytes(llama_parameter_specs(c, dtype::bf16));
  std::uint64_t total = 0;
  for (int w = 0; w < e.tp; ++w)
    for (const auto& entry : engine::make_plan(c, static_cast<int>(e.tp), w, dtype::bf16).entries)
      total += entry.bytes();
  return total;
}

/// What an engine node needs of `t` as topology YAML: the (synthetic)
/// model, the nodes, the cluster's secret and heartbeats, where the trainer,
/// router and coordinator are, each engine replica, and the transfer.
std::string node_yaml(const topology& t) {
  const auto& c = t.model.config;
  std::ostringstream y;
  y << "name: " << t.name << "\nmodel:\n  synthetic: {layers: " << c.num_hidden_layers
    << ", hidden_size: " << c.hidden_size << ", heads: " << c.num_attention_heads
    << ", kv_heads: " << c.num_key_value_heads << ", intermediate_size: " << c.intermediate_size
    << ", vocab_size: " << c.vocab_size << ", dtype: bf16, seed: " << t.model.seed << "}\nnodes:\n";
  for (const auto& n : t.nodes)
    y << "  - {name: " << n.name << ", address: '" << n.address << "', port: " << n.port << "}\n";
  y << "cluster: {secret_env: " << t.cluster.secret_env
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

/// The other nodes of a deployment, as `rlsync node` children of a
/// supervisor running on its own thread; their output is kept (the last
/// lines) and shown on failure or with --verbose.
class node_children {
public:
  node_children(std::vector<child_spec> children, bool verbose) {
    supervisor_options o;
    o.grace = std::chrono::seconds(5);
    o.sink = [this, verbose](output_stream, std::string_view line) {
      if (verbose)
        std::cerr << line;
      std::lock_guard<std::mutex> lock(mutex_);
      tail_.emplace_back(line);
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
      s += l;
    return s;
  }

private:
  std::unique_ptr<supervisor> sup_;
  std::thread thread_;
  launch_result result_;
  mutable std::mutex mutex_;
  std::deque<std::string> tail_;
};

/// One deployment's figures.
struct case_result {
  std::string name; ///< sharded, broadcast, control
  transfer_mode mode = transfer_mode::sharded;
  std::uint64_t model_bytes = 0;
  std::uint64_t bytes_per_sync = 0; ///< received by every engine together, expected
  double light_ms = 0;              ///< speed-of-light transfer time
  std::vector<sync_report> cold;
  std::vector<sync_report> warm;
  std::vector<double> probe_ms; ///< six waves of round trips, one per warm round
  std::uint64_t producer_peak_bytes = 0; ///< UCX producer: packed groups alive at once × their size
  std::size_t producer_peak_groups = 0;
  std::uint64_t local_peak_bytes = 0;    ///< local data plane: one pass's buffers at once
  std::uint64_t largest_group = 0;
  std::string error;
};

struct bench_env {
  caf::actor_system& sys;
  std::string exe;
  std::string dir;      ///< temporary topologies
  std::string secret;
  bool verbose = false;
  double memcpy_gbps = 0;
  double ucx_gbps = 0;  ///< 0: not measured
  std::string ucx_why;
};

/// Deploys `t` (its model replaced by `model`, mode `mode`), waits for the
/// cold syncs, then runs `rounds` warm rounds (a trainer step and a sync
/// each), probing six waves of round trips before each when `probe`.
case_result run_case(bench_env& env, topology t, const std::string& name, const model_config& model,
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
  r.model_bytes = sum_bytes(llama_parameter_specs(model, dtype::bf16));
  // The nodes' copy of the topology: the same model, mode and nodes.
  const std::string path = env.dir + "/bench-" + name + ".yaml";
  {
    std::ofstream f(path);
    f << node_yaml(t);
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
      children.push_back({n.name, {env.exe, "node", "--topology", path, "--node", n.name}});
  std::mutex mutex;
  std::vector<sync_report> reports;
  std::unique_ptr<head_node> head;
  try {
    head = std::make_unique<head_node>(env.sys, t, *head_spec, env.secret,
                                       head_hooks{[&](const std::string& l) {
                                                    if (env.verbose)
                                                      std::cerr << (l + "\n");
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
  node_children nodes(std::move(children), env.verbose);
  auto fail = [&](const std::string& what) {
    r.error = what;
    auto tail = nodes.tail();
    if (!tail.empty() && !env.verbose)
      std::cerr << "bench " << name << ": the nodes' last lines:\n" << tail;
    return r;
  };

  // Cold: every engine registered, then synced once. A round that evicts
  // somebody (a slow first session start, say) is retried by asking for the
  // next one: this process asks for every round itself.
  caf::scoped_actor self{env.sys};
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

  for (const auto& e : t.engines) {
    double gbps = e.node == head_spec->name ? env.memcpy_gbps : env.ucx_gbps;
    auto bytes = engine_bytes(model, e, mode);
    r.bytes_per_sync += bytes;
    if (gbps > 0 && r.light_ms >= 0)
      r.light_ms += bytes / gbps / 1e6;
    else
      r.light_ms = -1; // a path we could not measure
  }

  auto long_wait = t.cluster.connect_deadline + d.transfer;
  for (int k = 0; k < rounds; ++k) {
    if (probe) {
      std::uint64_t ns = 0;
      self->request(head->coordinator(), long_wait, probe_atom::value, std::uint32_t{6})
        .receive([&](std::uint64_t x) { ns = x; }, [&](caf::error& err) { r.error = env.sys.render(err); });
      r.probe_ms.push_back(ns / 1e6);
    }
    bool stepped = false;
    self->request(head->trainer(), long_wait, step_atom::value)
      .receive([&](const version_info&) { stepped = true; }, [&](caf::error& err) { r.error = env.sys.render(err); });
    if (!stepped)
      return fail("the trainer did not step: " + r.error);
    std::optional<sync_report> rep;
    self->request(head->coordinator(), long_wait * 2, sync_atom::value)
      .receive([&](const sync_report& x) { rep = x; }, [&](caf::error& err) { r.error = env.sys.render(err); });
    if (!rep)
      return fail("sync failed: " + r.error);
    if (!rep->evicted.empty())
      return fail("sync " + std::to_string(k + 1) + " evicted " + rep->evicted.front());
    r.warm.push_back(*rep);
  }
  if (auto* p = head->producer()) {
    auto st = p->stats();
    r.producer_peak_groups = st.peak_packed;
  }
  if (auto lt = head->local_transfer()) {
    auto st = lt->stats();
    r.local_peak_bytes = st.peak_buffers;
  }
  auto source = head->source();
  if (auto s = source->latest())
    for (auto g : s->groups())
      r.largest_group = std::max(r.largest_group, s->group_bytes(g));
  head->stop();
  nodes.stop();
  return r;
}

double ms(std::uint64_t ns) { return ns / 1e6; }

std::string json_case(const case_result& c) {
  std::ostringstream o;
  auto list = [&](const std::vector<sync_report>& v) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto& x = v[i];
      s += (i ? ", " : "") + std::string("{\"version\": ") + std::to_string(x.version)
           + ", \"engines\": " + std::to_string(x.engines_synced) + ", \"stall_ms\": " + fixed(ms(x.stall_ns), 3)
           + ", \"transfer_ms\": " + fixed(ms(x.transfer_ns), 3) + ", \"control_ms\": " + fixed(ms(x.control_ns), 3)
           + ", \"bytes\": " + std::to_string(x.bytes) + "}";
    }
    return s + "]";
  };
  std::string probes = "[";
  for (std::size_t i = 0; i < c.probe_ms.size(); ++i)
    probes += (i ? ", " : "") + fixed(c.probe_ms[i], 3);
  probes += "]";
  o << "{\"case\": \"" << c.name << "\", \"model_bytes\": " << c.model_bytes
    << ", \"bytes_per_sync\": " << c.bytes_per_sync << ", \"light_ms\": " << fixed(c.light_ms, 3)
    << ", \"cold\": " << list(c.cold) << ", \"warm\": " << list(c.warm) << ", \"probe6_ms\": " << probes
    << ", \"producer_peak_groups\": " << c.producer_peak_groups << ", \"largest_group_bytes\": " << c.largest_group
    << ", \"error\": \"" << c.error << "\"}";
  return o.str();
}

struct medians {
  double stall = 0, transfer = 0, control = 0, gbps = 0, probe = 0;
};

medians medians_of(const case_result& c) {
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

std::string secret_for_this_run() {
  std::random_device rd;
  std::string s;
  for (int i = 0; i < 4; ++i)
    s += std::to_string(rd());
  return s;
}

/// Common start: a temporary directory, the secret in the environment (the
/// node children inherit it), the actor system.
struct bench_setup {
  std::string dir;
  std::string secret = secret_for_this_run();
  bench_setup() {
    char tmpl[] = "/tmp/rlsync-bench-XXXXXX";
    if (!::mkdtemp(tmpl))
      throw std::runtime_error("cannot create a temporary directory");
    dir = tmpl;
    ::setenv("RLSYNC_BENCH_SECRET", secret.c_str(), 1);
  }
  ~bench_setup() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

void print_case_table(const std::vector<case_result>& cases) {
  std::printf("\n%-10s %10s %9s %9s %11s %9s %8s %10s %9s\n", "mode", "MB/sync", "stall ms", "xfer ms",
              "cold xfer", "GB/s", "% light", "control", "6 RTT ms");
  for (auto& c : cases) {
    if (!c.error.empty()) {
      std::printf("%-10s failed: %s\n", c.name.c_str(), c.error.c_str());
      continue;
    }
    auto m = medians_of(c);
    double cold = 0;
    for (auto& x : c.cold)
      cold = std::max(cold, ms(x.transfer_ns));
    std::string light = c.light_ms > 0 && m.transfer > 0 ? fixed(100.0 * c.light_ms / m.transfer, 0) + "%" : "n/a";
    std::printf("%-10s %10.1f %9.2f %9.2f %11.2f %9.2f %8s %10.2f %9s\n", c.name.c_str(), c.bytes_per_sync / 1e6,
                m.stall, m.transfer, cold, m.gbps, light.c_str(), m.control,
                c.probe_ms.empty() ? "-" : fixed(m.probe, 2).c_str());
  }
}

std::string json_env(const bench_env& env) {
  return "\"memcpy_gbps\": " + fixed(env.memcpy_gbps, 2) + ", \"ucx_gbps\": " + fixed(env.ucx_gbps, 2)
         + ", \"cores\": " + std::to_string(std::thread::hardware_concurrency());
}

system_config bench_system_config(const topology& t) {
  system_config cfg;
  cfg.set("middleman.heartbeat-interval", caf::timespan{t.cluster.heartbeat_interval});
  cfg.set("middleman.connection-timeout", caf::timespan{t.cluster.heartbeat_timeout});
  return cfg;
}

/// MPI_Bcast of `bytes` from one rank to `receivers` (Open MPI, the classic
/// broadcast baseline; tools/mpi_bcast_bench.cpp, built when MPI is found).
/// The median seconds, or 0 with `why` set.
double measure_mpi_bcast(const std::string& exe, std::uint64_t bytes, std::size_t receivers, std::uint64_t iterations,
                         std::string& why) {
  auto bin = (fs::path(exe).parent_path() / "rlsync-mpi-bcast").string();
  if (!fs::exists(bin) || ::system("command -v mpirun >/dev/null 2>&1") != 0) {
    why = "not measured: Open MPI or rlsync-mpi-bcast missing (apt-get install openmpi-bin libopenmpi-dev, rebuild)";
    return 0;
  }
  auto out = capture("timeout 300 mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(receivers + 1)
                     + " " + bin + " --bytes " + std::to_string(bytes) + " --iterations " + std::to_string(iterations));
  auto at = out.find("\"median_s\": ");
  if (at == std::string::npos) {
    why = "failed: " + out.substr(0, 300);
    return 0;
  }
  return std::strtod(out.c_str() + at + 12, nullptr);
}

} // namespace

int bench_sync(const arg_list& argv) {
  cli::args a(argv, {"topology", "model-bytes", "syncs", "modes", "json"}, {"verbose", "help"});
  if (a.has("help")) {
    std::cout << sync_usage;
    return 0;
  }
  const auto path = a.required("topology");
  const std::uint64_t model_bytes = a.has("model-bytes") ? cli::parse_size(*a.get("model-bytes"), "--model-bytes")
                                                         : std::uint64_t(256) << 20;
  const auto syncs = a.get_u64("syncs", 5);
  if (syncs == 0 || syncs > 1000)
    throw cli::usage_error("--syncs: between 1 and 1000, got " + std::to_string(syncs));
  std::vector<transfer_mode> modes;
  {
    std::stringstream ss(a.get_or("modes", "sharded,broadcast"));
    for (std::string m; std::getline(ss, m, ',');) {
      if (m == "sharded")
        modes.push_back(transfer_mode::sharded);
      else if (m == "broadcast")
        modes.push_back(transfer_mode::broadcast);
      else
        throw cli::usage_error("--modes: 'sharded' or 'broadcast', got '" + m + "'");
    }
  }
  auto loaded = load_topology_or_report(path);
  if (!loaded)
    return 1;
  topology t = *loaded;
  for (const auto* n : {t.find_node(t.trainer.node), t.find_node(t.router.node)})
    if (n->name != t.coordinator.node) {
      std::cerr << "rlsync bench sync: " << path << ": the trainer and the router must be on the coordinator's node\n";
      return 1;
    }
  auto local = local_nodes(t);
  for (const auto& n : t.nodes)
    if (std::none_of(local.begin(), local.end(), [&](const node_spec* l) { return l->name == n.name; })) {
      std::cerr << "rlsync bench sync: " << path << ": node '" << n.name << "' (" << n.address
                << ") is not on this machine; the benchmark starts every node itself\n";
      return 1;
    }
  auto model = model_of_size(model_bytes);
  for (const auto& e : t.engines)
    if (auto errors = validate_tp(model, e.tp); !errors.empty()) {
      std::cerr << "rlsync bench sync: engine " << e.name << ": tp " << e.tp << ": " << errors.front() << "\n";
      return 1;
    }

  bench_setup setup;
  auto cfg = bench_system_config(t);
  caf::actor_system sys{cfg};
  bench_env env{sys, self_executable(), setup.dir, setup.secret, a.has("verbose")};
  std::cerr << "measuring the speed of light..." << std::endl;
  env.memcpy_gbps = measure_memcpy_gbps(std::size_t(256) << 20);
  bool remote = std::any_of(t.engines.begin(), t.engines.end(),
                            [&](const engine_spec& e) { return e.node != t.coordinator.node; });
  auto group_guess = std::min<std::uint64_t>(static_cast<std::uint64_t>(t.transfer.bucket_bytes), 64u << 20);
  if (remote && t.transfer.backend == transfer_backend::ucx)
    env.ucx_gbps = measure_ucx_gbps(t.transfer.ucx_transports, group_guess, model_bytes, env.ucx_why);
  else if (remote)
    env.ucx_why = "remote engines pull over CAF (transfer.backend " + std::string(to_string(t.transfer.backend))
                  + "): no raw baseline";

  std::vector<case_result> cases;
  for (auto mode : modes) {
    std::string name{to_string(mode)};
    std::cerr << "bench " << name << ": " << t.engines.size() << " engines, model " << fixed(model_bytes / 1e6, 0)
              << " MB, " << syncs << " syncs..." << std::endl;
    cases.push_back(run_case(env, t, name, model, mode, static_cast<int>(syncs), false));
  }
  std::cerr << "bench control: " << t.engines.size() << " engines, model "
            << fixed(sum_bytes(llama_parameter_specs(tiny_model(), dtype::bf16)) / 1e3, 0) << " kB, " << syncs
            << " rounds..." << std::endl;
  cases.push_back(run_case(env, t, "control", tiny_model(), transfer_mode::sharded, static_cast<int>(syncs), true));

  std::printf("rlsync bench sync %s: %zu engines on %zu node(s), backend %s, %u cores\n", path.c_str(),
              t.engines.size(), t.nodes.size(), std::string(to_string(t.transfer.backend)).c_str(),
              std::thread::hardware_concurrency());
  std::printf("speed of light: memcpy %.1f GB/s (engines in this process)", env.memcpy_gbps);
  if (remote)
    std::printf(", %s", env.ucx_gbps > 0 ? ("raw UCX " + fixed(env.ucx_gbps, 2) + " GB/s (ucx_perftest tag_bw"
                                            + (t.transfer.ucx_transports.empty() ? std::string()
                                                                                  : ", UCX_TLS " + ucx_tls(t.transfer.ucx_transports))
                                            + ", other processes)").c_str()
                                         : ("not measured: " + env.ucx_why).c_str());
  std::printf("\n");
  print_case_table(cases);
  const case_result* sharded = nullptr;
  const case_result* broadcast = nullptr;
  for (auto& c : cases) {
    if (c.name == "sharded" && c.error.empty())
      sharded = &c;
    if (c.name == "broadcast" && c.error.empty())
      broadcast = &c;
  }
  if (sharded && broadcast) {
    auto ms_ = medians_of(*sharded), mb = medians_of(*broadcast);
    std::printf("broadcast / sharded: %.2fx the bytes, %.2fx the transfer time, %.2fx the stall\n",
                double(broadcast->bytes_per_sync) / std::max<std::uint64_t>(1, sharded->bytes_per_sync),
                mb.transfer / std::max(1e-9, ms_.transfer), mb.stall / std::max(1e-9, ms_.stall));
  }
  for (auto& c : cases)
    if (c.error.empty() && c.name != "control") {
      auto bound = c.producer_peak_groups * c.largest_group;
      std::printf("%s memory: largest group %.1f MB; UCX producer peak %zu packed groups (<= %.1f MB)\n",
                  c.name.c_str(), c.largest_group / 1e6, c.producer_peak_groups, bound / 1e6);
    }
  for (auto& c : cases)
    if (c.name == "control" && c.error.empty()) {
      auto m = medians_of(c);
      std::printf("control plane: median round %.2f ms (%zu kB model) vs six CAF round-trip waves %.2f ms: %.2fx\n",
                  m.stall, static_cast<std::size_t>(c.model_bytes / 1000), m.probe, m.stall / std::max(1e-9, m.probe));
    }
  // The classic baseline: MPI_Bcast of the model to one rank per engine.
  std::string mpi_why;
  double mpi_s = measure_mpi_bcast(env.exe, sum_bytes(llama_parameter_specs(model, dtype::bf16)), t.engines.size(),
                                   syncs, mpi_why);
  if (mpi_s > 0) {
    std::printf("MPI_Bcast (Open MPI) of the %.0f MB model to %zu ranks: median %.2f ms", model_bytes / 1e6,
                t.engines.size(), mpi_s * 1e3);
    if (sharded)
      std::printf("; sharded transfer %.2f ms: %.2fx %s", medians_of(*sharded).transfer,
                  mpi_s * 1e3 / std::max(1e-9, medians_of(*sharded).transfer),
                  medians_of(*sharded).transfer < mpi_s * 1e3 ? "faster" : "(slower)");
    std::printf("\n");
  } else {
    std::printf("MPI_Bcast baseline %s\n", mpi_why.c_str());
  }
  if (auto json = a.get("json")) {
    std::ofstream f(*json);
    f << "{\"topology\": \"" << path << "\", " << json_env(env) << ", \"mpi_bcast_median_s\": " << mpi_s
      << ", \"cases\": [";
    for (std::size_t i = 0; i < cases.size(); ++i)
      f << (i ? ", " : "") << json_case(cases[i]);
    f << "]}\n";
  }
  bool failed = std::any_of(cases.begin(), cases.end(), [](const case_result& c) { return !c.error.empty(); });
  return failed ? 1 : 0;
}

int bench_control(const arg_list& argv) {
  cli::args a(argv, {"engines", "rounds", "json"}, {"verbose", "help"});
  if (a.has("help")) {
    std::cout << control_usage;
    return 0;
  }
  const auto engines = a.get_u64("engines", 8);
  const auto rounds = a.get_u64("rounds", 20);
  if (engines == 0 || engines > 64)
    throw cli::usage_error("--engines: between 1 and 64, got " + std::to_string(engines));
  if (rounds == 0 || rounds > 10000)
    throw cli::usage_error("--rounds: between 1 and 10000, got " + std::to_string(rounds));
  bench_setup setup;
  // A head node and one node per engine, on loopback.
  std::mt19937 rng{static_cast<unsigned>(::getpid())};
  int port = 20000 + static_cast<int>(rng() % 6000) * 2;
  std::ostringstream y;
  y << "name: bench-control\nmodel:\n  synthetic: {layers: 1, hidden_size: 64, heads: 8, kv_heads: 8, "
       "intermediate_size: 128, vocab_size: 320, dtype: bf16, seed: 1}\nnodes:\n  - {name: head, address: "
       "127.0.0.1, port: "
    << port << "}\n";
  for (std::uint64_t i = 0; i < engines; ++i)
    y << "  - {name: n" << i << ", address: 127.0.0.1}\n";
  y << "cluster: {secret_env: RLSYNC_BENCH_SECRET, heartbeat_interval_ms: 500, heartbeat_timeout_ms: 5000}\n"
       "trainer: {node: head}\nengines:\n";
  for (std::uint64_t i = 0; i < engines; ++i)
    y << "  - {name: e" << i << ", node: n" << i << ", tp: 1}\n";
  y << "router: {node: head}\ncoordinator: {node: head}\ntransfer: {backend: ucx, mode: sharded}\n";
  topology t = parse_topology(y.str(), "bench-control.yaml", setup.dir);
  auto cfg = bench_system_config(t);
  caf::actor_system sys{cfg};
  bench_env env{sys, self_executable(), setup.dir, setup.secret, a.has("verbose")};
  std::cerr << "bench control: " << engines << " engine processes, " << rounds << " rounds..." << std::endl;
  auto c = run_case(env, t, "control", t.model.config, transfer_mode::sharded, static_cast<int>(rounds), true);
  if (!c.error.empty()) {
    std::cerr << "rlsync bench control: " << c.error << "\n";
    return 1;
  }
  auto m = medians_of(c);
  std::vector<double> stalls;
  for (auto& x : c.warm)
    stalls.push_back(ms(x.stall_ns));
  std::sort(stalls.begin(), stalls.end());
  std::printf("rlsync bench control: %llu engine processes on loopback, %llu rounds, %u cores\n",
              (unsigned long long)engines, (unsigned long long)rounds, std::thread::hardware_concurrency());
  std::printf("%-28s %9s %9s %9s\n", "", "median", "min", "max");
  std::printf("%-28s %9.2f %9.2f %9.2f ms\n", "round (pause..continue)", m.stall, stalls.front(), stalls.back());
  std::printf("%-28s %9.2f ms (%zu kB moved per round)\n", "  of which transfer", m.transfer,
              static_cast<std::size_t>(c.bytes_per_sync / 1000));
  auto probes = c.probe_ms;
  std::sort(probes.begin(), probes.end());
  std::printf("%-28s %9.2f %9.2f %9.2f ms\n", "six CAF round-trip waves", m.probe, probes.front(), probes.back());
  std::printf("round / six round trips: %.2fx\n", m.stall / std::max(1e-9, m.probe));
  if (auto json = a.get("json")) {
    std::ofstream f(*json);
    f << "{\"engines\": " << engines << ", " << json_env(env) << ", \"control\": " << json_case(c) << "}\n";
  }
  return 0;
}

} // namespace rlsync::tools
