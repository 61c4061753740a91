// The control plane at fleet scale: one sync round of the real coordinator
// (and router) over 100 to 10,000 scripted engines on CAF's deterministic
// scheduler, printing per round the messages, the coordinator's bookkeeping
// steps, the CPU time of running the round and the fleet's heap, each also
// per engine, and how each grew against the smallest fleet (linear growth:
// per-engine figures stay flat). Figures, not pass/fail: it exits non-zero
// only when a round did not sync the engines it should have.
//
//   bench_fleet [N ...] [--failing K] [--wave W]
//     N: fleet sizes (default 100 1000 10000); --failing 20: every 20th engine
//     fails its transfer (5 %); --wave W: sync.wave_size (0, the default: one wave)
#define DOCTEST_CONFIG_IMPLEMENT // the fixtures' checks, outside a doctest run
#include "tests/support/fleet_scale.hpp"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <iostream>
#include <string>
#include <vector>

namespace {

int usage(const char* why) {
  std::cerr << "bench_fleet: " << why << "\nusage: bench_fleet [N ...] [--failing K] [--wave W]\n";
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  // The fixtures' checks outside a test case: a failed one ends the bench.
  doctest::Context checks;
  checks.setAsDefaultForAssertsOutOfTestCases();
  checks.setAssertHandler([](const doctest::AssertData& d) {
    std::cerr << "bench_fleet: check failed at " << d.m_file << ":" << d.m_line << "\n";
    std::exit(1);
  });
  std::vector<std::size_t> sizes;
  std::size_t failing_every = 0, wave = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto number = [&](const std::string& text, unsigned long long least = 1) -> std::size_t {
      char* end = nullptr;
      auto v = std::strtoull(text.c_str(), &end, 10);
      if (text.empty() || text[0] == '-' || *end != '\0' || v < least || v > 100000)
        throw std::invalid_argument("'" + text + "' is not a count in " + std::to_string(least) + "..100000");
      return static_cast<std::size_t>(v);
    };
    try {
      if (a == "--failing" && i + 1 < argc)
        failing_every = number(argv[++i]);
      else if (a == "--wave" && i + 1 < argc)
        wave = number(argv[++i], 0);
      else
        sizes.push_back(number(a));
    } catch (const std::exception& e) {
      return usage(e.what());
    }
  }
  if (sizes.empty())
    sizes = {100, 1000, 10000};
  std::printf("one warm sync round (the mean of %zu) over N scripted engines (wave %zu%s), CAF's deterministic scheduler:\n",
              rlsync::test::fleet_rounds, wave,
              failing_every ? (", every " + std::to_string(failing_every) + "th engine failing its transfer").c_str()
                            : "");
  std::printf("%8s %9s %10s %8s %10s %8s %9s %10s %11s %8s %9s %10s %8s %9s %9s %8s\n", "engines", "synced",
              "messages", "/engine", "book ops", "/engine", "cpu ms", "cpu us/eng", "coord us/eng", "growth", "heap MB",
              "heap B/eng", "growth", "join ms", "tick msgs", "tick us/eng");
  double first_cpu_per_engine = 0, first_coordinator_per_engine = 0;
  int status = 0;
  for (auto n : sizes) {
    auto r = rlsync::test::measure_fleet_round(n, wave, failing_every, rlsync::test::fleet_rounds);
    const double per = static_cast<double>(n);
    const double cpu_per_engine = r.cpu_ms * 1e3 / per;
    const double coordinator_per_engine = r.coordinator_ms * 1e3 / per;
    if (first_cpu_per_engine == 0) {
      first_cpu_per_engine = cpu_per_engine;
      first_coordinator_per_engine = coordinator_per_engine;
    }
    std::printf("%8zu %9zu %10llu %8.1f %10llu %8.1f %9.1f %10.2f %11.2f %7.2fx %9.1f %10.0f %7.2fx %9.1f %9llu %8.2f\n",
                n, r.synced, static_cast<unsigned long long>(r.messages), static_cast<double>(r.messages) / per,
                static_cast<unsigned long long>(r.ops), static_cast<double>(r.ops) / per, r.cpu_ms, cpu_per_engine,
                coordinator_per_engine, coordinator_per_engine / first_coordinator_per_engine,
                static_cast<double>(r.heap_bytes) / 1e6, static_cast<double>(r.heap_bytes) / per,
                cpu_per_engine / first_cpu_per_engine, r.join_cpu_ms, static_cast<unsigned long long>(r.tick_messages),
                r.tick_cpu_ms * 1e3 / per);
    if (r.synced + r.evicted != n || r.evicted != r.failing) {
      std::printf("  round over %zu engines: %zu synced, %zu evicted, %zu told to fail\n", n, r.synced, r.evicted,
                  r.failing);
      status = 1;
    }
  }
  std::printf("coord: the coordinator's own jobs within the round; growth after it: its time per engine against\n"
              "the smallest fleet's; growth after heap: the whole round's CPU per engine likewise (1.00x = linear);\n"
              "join ms: CPU time of every engine registering and its cold sync;\n"
              "tick: one heartbeat tick to every engine (one-way heartbeats: answers are plain messages)\n");
  return status;
}
