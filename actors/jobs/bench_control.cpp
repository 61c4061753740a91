#include "actors/jobs/bench_control.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <sstream>
#include <thread>

namespace rlsync::jobs {

std::string control_topology_yaml(std::uint64_t engines, int port) {
  std::ostringstream y;
  y << "name: bench-control\nmodel:\n  synthetic: {layers: 1, hidden_size: 64, heads: 8, kv_heads: 8, "
       "intermediate_size: 128, vocab_size: 320, dtype: bf16, seed: 1}\nnodes:\n  - {name: head, address: "
       "127.0.0.1, port: "
    << port << "}\n";
  for (std::uint64_t i = 0; i < engines; ++i)
    y << "  - {name: n" << i << ", address: 127.0.0.1}\n";
  // The bench session replaces these paths with its own CA's (bench_session::tls).
  y << "cluster: {secret_env: RLSYNC_BENCH_SECRET, heartbeat_interval_ms: 500, heartbeat_timeout_ms: 5000, "
       "tls: {ca: ca.pem, cert: '{node}.pem', key: '{node}.key'}}\n"
       "trainer: {node: head}\nengines:\n";
  for (std::uint64_t i = 0; i < engines; ++i)
    y << "  - {name: e" << i << ", node: n" << i << ", tp: 1}\n";
  y << "router: {node: head}\ncoordinator: {node: head}\ntransfer: {backend: ucx, mode: sharded}\n";
  return y.str();
}

bench_control_result run_bench_control(const bench_control_options& o) {
  bench_control_result r;
  r.engines = o.engines;
  r.rounds = o.rounds;
  r.cores = std::thread::hardware_concurrency();
  std::mt19937 rng{static_cast<unsigned>(::getpid())};
  int port = 20000 + static_cast<int>(rng() % 6000) * 2; // even: the bench test script takes odd ones
  // A synthetic model and no paths: nothing is relative to the directory.
  topology t = parse_topology(control_topology_yaml(o.engines, port), "bench-control.yaml",
                              std::filesystem::temp_directory_path().string());
  bench_session s(t, o.exe, o.verbose, o.note);
  s.note("bench control: " + std::to_string(o.engines) + " engine processes, " + std::to_string(o.rounds)
         + " rounds...");
  r.control = run_case(s, t, "control", t.model.config, transfer_mode::sharded, o.rounds, true);
  return r;
}

std::string bench_control_report(const bench_control_result& r) {
  const auto& c = r.control;
  auto m = medians_of(c);
  std::vector<double> stalls;
  for (auto& x : c.warm)
    stalls.push_back(x.stall_ns / 1e6);
  std::sort(stalls.begin(), stalls.end());
  auto probes = c.probe_ms;
  std::sort(probes.begin(), probes.end());
  auto first = [](const std::vector<double>& v) { return v.empty() ? 0.0 : v.front(); };
  auto last = [](const std::vector<double>& v) { return v.empty() ? 0.0 : v.back(); };
  char buf[256];
  std::string out;
  std::snprintf(buf, sizeof buf, "rlsync bench control: %llu engine processes on loopback, %d rounds, %u cores\n",
                static_cast<unsigned long long>(r.engines), r.rounds, r.cores);
  out += buf;
  std::snprintf(buf, sizeof buf, "%-28s %9s %9s %9s\n", "", "median", "min", "max");
  out += buf;
  std::snprintf(buf, sizeof buf, "%-28s %9.2f %9.2f %9.2f ms\n", "round (pause..continue)", m.stall_ms, first(stalls),
                last(stalls));
  out += buf;
  std::snprintf(buf, sizeof buf, "%-28s %9.2f ms (%zu kB moved per round)\n", "  of which transfer", m.transfer_ms,
                static_cast<std::size_t>(c.bytes_per_sync / 1000));
  out += buf;
  std::snprintf(buf, sizeof buf, "%-28s %9.2f %9.2f %9.2f ms\n", "six CAF round-trip waves", m.probe_ms, first(probes),
                last(probes));
  out += buf;
  std::snprintf(buf, sizeof buf, "round / six round trips: %.2fx\n", control_overhead(c));
  out += buf;
  return out;
}

nlohmann::ordered_json bench_control_json(const bench_control_result& r) {
  // No speed of light is measured here (the figure is the round against the
  // round trips): 0, as in the sync JSON for a path not measured.
  return {{"engines", r.engines},
          {"memcpy_gbps", 0.0},
          {"ucx_gbps", 0.0},
          {"cores", r.cores},
          {"control", case_json(r.control)}};
}

} // namespace rlsync::jobs
