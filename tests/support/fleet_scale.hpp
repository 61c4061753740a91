#pragma once
// One sync round of the real coordinator over N scripted engines on CAF's
// deterministic scheduler, measured: the messages it took (the scheduler
// runs one message per job), the coordinator's bookkeeping steps (its
// round book's instrumented counter), the CPU time of running it and the
// heap the fleet holds. Shared by the scale test (test_coordinator.cpp) and
// the benchmark that prints the growth to 10,000 engines (bench_fleet.cpp).
#include "tests/support/coordinator_fixture.hpp"

#include <caf/actor_cast.hpp>
#include <caf/resumable.hpp>

#include <chrono>

#include <malloc.h>

#include <cstdint>
#include <ctime>
#include <string>

namespace rlsync::test {

struct fleet_round {
  std::size_t engines = 0;
  std::size_t wave_size = 0;
  std::uint64_t messages = 0;      ///< delivered during the round (a warm round, after every cold sync)
  std::uint64_t ops = 0;           ///< the coordinator's bookkeeping steps for the round
  double cpu_ms = 0;               ///< CPU time of running the round (this thread runs every actor)
  double coordinator_ms = 0;       ///< of which the coordinator's own jobs (wall time around each, one thread)
  double join_cpu_ms = 0;          ///< CPU time of the fleet joining: every registration and cold sync
  std::uint64_t tick_messages = 0; ///< one heartbeat tick after the rounds: messages
  double tick_cpu_ms = 0;          ///< and CPU time
  std::uint64_t heap_bytes = 0;    ///< heap in use by the fleet after the round (coordinator, engines, records)
  std::size_t synced = 0;          ///< engines the round's report counts as synced
  std::size_t evicted = 0;         ///< engines the round evicted (those told to fail)
  std::size_t failing = 0;         ///< engines told to fail their transfer in the measured round
};

/// Heap bytes in use now (glibc's allocator).
inline std::uint64_t heap_in_use() {
  auto m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

inline double cpu_ms_now() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

/// Runs every queued job, as actor_fixture::run, and adds the time spent in
/// `actor`'s own jobs to `ms` (a steady clock around each: one thread runs
/// them all, so wall time is its CPU time). Returns the jobs run. Never
/// inlined: tools/fleet-instructions counts the instructions run inside it.
[[gnu::noinline]] inline std::uint64_t run_timing(coordinator_fixture& f, caf::resumable* actor, double& ms) {
  std::uint64_t jobs = 0;
  double ns = 0;
  while (f.sched.has_job()) {
    if (f.sched.jobs.front() == actor) {
      auto t0 = std::chrono::steady_clock::now();
      f.sched.run_once();
      ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    } else {
      f.sched.run_once();
    }
    ++jobs;
  }
  ms += ns / 1e6;
  return jobs;
}

/// Warm rounds the benchmark measures (tools/fleet-instructions reads it from its output).
constexpr std::size_t fleet_rounds = 3;

/// Registers `engines` scripted engines, lets their cold syncs run, then
/// measures `rounds` rounds (>= 1), each towards a new version, in which every
/// `failing_every`-th engine (0: none) answers its transfer with an error.
inline fleet_round measure_fleet_round(std::size_t engines, std::size_t wave_size = 0,
                                       std::size_t failing_every = 0, std::size_t rounds = fleet_rounds) {
  const auto heap_before = heap_in_use();
  fleet_round out;
  out.engines = engines;
  out.wave_size = wave_size;
  {
    coordinator_fixture f;
    auto c = f.config();
    c.sync.wave_size = static_cast<std::int64_t>(wave_size);
    // One tick, fired by hand after the rounds (shorter than every phase
    // deadline, so that nothing else falls due); nobody goes silent.
    c.heartbeat_interval = std::chrono::milliseconds{500};
    c.heartbeat_timeout = std::chrono::hours{1};
    c.log = {};
    c.on_member = {};
    f.start(c);
    const auto join_before = cpu_ms_now();
    for (std::size_t i = 0; i < engines; ++i) {
      auto name = "engine-" + std::to_string(100000 + i); // snapshot order is name order
      auto& e = f.spawn_engine(name);
      f.tell(f.coord, register_atom::value, engine_info{name, "node", 1, 0, false, 0},
             caf::actor_cast<rollout_engine_actor>(e.actor));
    }
    f.run(); // the cold syncs
    out.join_cpu_ms = cpu_ms_now() - join_before;
    f.forget_history();
    if (failing_every > 0)
      for (std::size_t i = 0; i < engines; i += failing_every) {
        f.engines.at("engine-" + std::to_string(100000 + i)).on(sync_phase::transfer, act::fail);
        ++out.failing;
      }
    // Warm rounds, one version each; the figures are per round (the mean).
    // An engine evicted in one round rejoins at the next one's boundary
    // with a full transfer, and fails it again.
    double cpu = 0;
    auto* self = dynamic_cast<caf::stateful_actor<coordinator_state, coordinator_impl_actor::base>*>(
      caf::actor_cast<caf::abstract_actor*>(f.coord));
    REQUIRE(self != nullptr);
    auto* coordinator_job = static_cast<caf::resumable*>(self);
    for (std::size_t v = 1; v <= rounds; ++v) {
      // A live clock fires every deadline set so far (the last round's,
      // answered long ago, each firing into nothing); the test clock fires
      // none unless told, and every insert would search a schedule of every
      // deadline ever set. Fired here, outside the measurement.
      f.sched.trigger_timeouts();
      f.run();
      f.tell(f.coord, version_atom::value, version_info{v, 4, 4096});
      const auto cpu_before = cpu_ms_now();
      out.messages += run_timing(f, coordinator_job, out.coordinator_ms);
      cpu += cpu_ms_now() - cpu_before;
    }
    out.messages /= rounds;
    out.cpu_ms = cpu / static_cast<double>(rounds);
    out.coordinator_ms /= static_cast<double>(rounds);
    const auto tick_before = cpu_ms_now();
    f.sched.advance_time(c.heartbeat_interval);
    out.tick_messages = f.run();
    out.tick_cpu_ms = cpu_ms_now() - tick_before;
    out.heap_bytes = heap_in_use() - heap_before;
    if (!f.reports.empty()) {
      out.synced = f.reports.back().engines_synced;
      out.evicted = f.reports.back().evicted.size();
    }
    out.ops = self->state.last_round_ops;
  }
  return out;
}

} // namespace rlsync::test
