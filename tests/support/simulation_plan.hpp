#pragma once
// The fault plans of the deterministic simulation (tests/actors/test_simulation.cpp):
// everything a seed decides (engines, requests, faults at moments in time and
// as phases of chosen rounds are sent), drawn up front, and printable so that
// a failing seed shows what ran.
#include "actors/interfaces.hpp"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace rlsync::test::sim {

// -- the fault plan ------------------------------------------------------------------

enum class fault_kind { publish, kill_engine, silence, slow, bad_transfer, kill_trainer };

inline const char* to_string(fault_kind k) {
  switch (k) {
    case fault_kind::publish: return "publish";
    case fault_kind::kill_engine: return "kill engine";
    case fault_kind::silence: return "silence engine";
    case fault_kind::slow: return "slow engine";
    case fault_kind::bad_transfer: return "bad transfer";
    case fault_kind::kill_trainer: return "kill trainer";
  }
  return "?";
}

struct fault {
  fault_kind kind = fault_kind::publish;
  std::int64_t at_ms = -1;    ///< timed; -1: fires as `phase` of round `at_round` is sent
  std::uint64_t at_round = 0;
  sync_phase phase = sync_phase::pause;
  std::uint32_t target = 0;   ///< an engine, modulo those eligible then
  /// silence, slow: how long; kills: until the restart (-1: not before the end)
  std::int64_t duration_ms = 0;
  std::int64_t delay_ms = 0;  ///< slow: how late each phase answer is
  bool keep_version = false;  ///< a restarted engine comes back with the version it held
  bool fired = false;

  std::string to_string() const {
    std::string s = at_ms >= 0 ? "at " + std::to_string(at_ms) + " ms"
                               : "at round " + std::to_string(at_round) + " " + std::string{rlsync::to_string(phase)};
    s += ": " + std::string{sim::to_string(kind)};
    if (kind != fault_kind::publish && kind != fault_kind::kill_trainer)
      s += " #" + std::to_string(target);
    if (kind == fault_kind::silence || kind == fault_kind::slow)
      s += " for " + std::to_string(duration_ms) + " ms";
    if (kind == fault_kind::slow)
      s += ", answers " + std::to_string(delay_ms) + " ms late";
    if (kind == fault_kind::kill_engine || kind == fault_kind::kill_trainer)
      s += duration_ms < 0 ? ", back at the end" : ", back after " + std::to_string(duration_ms) + " ms";
    if (kind == fault_kind::kill_engine && keep_version)
      s += " holding its version";
    return s;
  }
};

struct request_plan {
  std::int64_t at_ms = 0;
  generate_request req;
};

/// Request `i`: when it is sent (within the plan's first plan_ms - 140 ms), its
/// prompt and length.
template <class Pick>
request_plan draw_request(Pick& pick, std::int64_t i, std::int64_t plan_ms) {
  request_plan r;
  r.at_ms = 10 + pick(static_cast<std::uint64_t>(plan_ms - 150));
  r.req.request_id = static_cast<std::uint64_t>(i);
  r.req.prompt = {1, 2, static_cast<std::int32_t>(i % 50)};
  r.req.sampling.max_tokens = 4 + static_cast<std::uint32_t>(pick(37));
  return r;
}

/// How long fault `f` lasts (and how late a slow engine answers); a fifth
/// of the kills last to the end when `forever_kills`.
template <class Pick>
void draw_duration(Pick& pick, fault& f, bool forever_kills) {
  switch (f.kind) {
    case fault_kind::kill_engine:
      f.duration_ms = forever_kills && pick(5) == 0 ? -1 : 10 + pick(300);
      f.keep_version = pick(4) == 0;
      break;
    case fault_kind::silence: // a third stay below the heartbeat timeout
      f.duration_ms = pick(3) == 0 ? 3 + pick(40) : 60 + pick(250);
      break;
    case fault_kind::slow:
      f.duration_ms = 20 + pick(200);
      f.delay_ms = 20 + pick(180); // phase deadlines are 100 ms (transfer 200)
      break;
    case fault_kind::kill_trainer:
      f.duration_ms = pick(6) == 0 ? -1 : 5 + pick(250);
      break;
    default:
      break;
  }
}

/// Everything a seed decides, drawn up front (rng() % n: the same on every
/// standard library, unlike the distributions).
struct plan {
  std::uint64_t seed = 0;
  std::uint32_t engines = 3;
  std::int64_t plan_ms = 800;
  std::int64_t max_restarts = 3;
  std::int64_t wave_size = 0; ///< sync.wave_size: 0 = every engine at once
  std::vector<std::int64_t> transfer_ms; ///< per engine incarnation, drawn in order
  std::vector<fault> faults;
  std::vector<request_plan> requests;

  std::string to_string() const {
    std::string s = "seed " + std::to_string(seed) + ": " + std::to_string(engines) + " engines, "
                    + std::to_string(requests.size()) + " requests over " + std::to_string(plan_ms)
                    + " ms, sync.max_restarts " + std::to_string(max_restarts) + ", sync.wave_size "
                    + std::to_string(wave_size) + "\n";
    for (auto& f : faults)
      if (f.kind != fault_kind::publish)
        s += "  " + f.to_string() + "\n";
    return s;
  }
};

inline plan make_plan(std::uint64_t seed) {
  std::mt19937_64 rng{seed};
  auto pick = [&](std::uint64_t n) { return static_cast<std::int64_t>(rng() % n); };
  plan p;
  p.seed = seed;
  p.engines = 2 + static_cast<std::uint32_t>(pick(3));
  p.plan_ms = 800;
  p.max_restarts = 1 + pick(4);
  for (int i = 0; i < 64; ++i)
    p.transfer_ms.push_back(2 + pick(19));
  for (std::int64_t t = 0; (t += 40 + pick(140)) < p.plan_ms - 50;) {
    fault f;
    f.at_ms = t;
    p.faults.push_back(f);
  }
  auto engine_fault = [&](fault& f) {
    // kill 30%, silence 30%, slow 15%, bad transfer 15%, trainer 10%
    auto k = pick(100);
    f.kind = k < 30 ? fault_kind::kill_engine
           : k < 60 ? fault_kind::silence
           : k < 75 ? fault_kind::slow
           : k < 90 ? fault_kind::bad_transfer
                    : fault_kind::kill_trainer;
    f.target = static_cast<std::uint32_t>(pick(16));
    draw_duration(pick, f, true);
  };
  for (auto n = 3 + pick(6); n > 0; --n) {
    fault f;
    f.at_ms = 30 + pick(static_cast<std::uint64_t>(p.plan_ms - 130));
    engine_fault(f);
    p.faults.push_back(f);
  }
  for (auto n = pick(4); n > 0; --n) {
    fault f;
    f.at_round = 2 + static_cast<std::uint64_t>(pick(8));
    f.phase = static_cast<sync_phase>(pick(6));
    engine_fault(f);
    p.faults.push_back(f);
  }
  std::stable_sort(p.faults.begin(), p.faults.end(),
                   [](const fault& a, const fault& b) { return a.at_ms < b.at_ms; });
  for (auto n = 25 + pick(30), i = std::int64_t{1}; i <= n; ++i)
    p.requests.push_back(draw_request(pick, i, p.plan_ms));
  // Drawn last, so that the draws above stay what they were for every seed.
  p.wave_size = pick(3) == 0 ? 1 + pick(2) : 0;
  return p;
}

/// A fleet: `engines` engines, and in every round from the second on a
/// `failing_percent` share of them hit by an engine fault (kill, silence,
/// slowness, a bad transfer) as one of that round's phases goes out; no
/// retirement (max_restarts above what the plan can use up). Requests spread
/// over the plan as in make_plan.
inline plan make_fleet_plan(std::uint64_t seed, std::uint32_t engines, std::uint32_t failing_percent,
                            std::int64_t wave_size = 0) {
  std::mt19937_64 rng{seed};
  auto pick = [&](std::uint64_t n) { return static_cast<std::int64_t>(rng() % n); };
  plan p;
  p.seed = seed;
  p.engines = engines;
  p.plan_ms = 800;
  p.max_restarts = 1000;
  p.wave_size = wave_size;
  for (std::uint32_t i = 0; i < engines + 64; ++i)
    p.transfer_ms.push_back(2 + pick(19));
  for (std::int64_t t = 0; (t += 60 + pick(100)) < p.plan_ms - 50;) {
    fault f;
    f.at_ms = t;
    p.faults.push_back(f); // a publish
  }
  const auto per_round = std::max<std::uint32_t>(1, engines * failing_percent / 100);
  for (std::uint64_t round = 2; round <= 6; ++round)
    for (std::uint32_t i = 0; i < per_round; ++i) {
      fault f;
      f.at_round = round;
      f.phase = static_cast<sync_phase>(pick(6));
      f.target = static_cast<std::uint32_t>(pick(engines));
      auto k = pick(100); // kill 35 %, silence 35 %, slow 15 %, bad transfer 15 %
      f.kind = k < 35 ? fault_kind::kill_engine
             : k < 70 ? fault_kind::silence
             : k < 85 ? fault_kind::slow
                      : fault_kind::bad_transfer;
      draw_duration(pick, f, false);
      p.faults.push_back(f);
    }
  std::stable_sort(p.faults.begin(), p.faults.end(),
                   [](const fault& a, const fault& b) { return a.at_ms < b.at_ms; });
  for (std::int64_t i = 1; i <= static_cast<std::int64_t>(engines); ++i)
    p.requests.push_back(draw_request(pick, i, p.plan_ms));
  return p;
}

} // namespace rlsync::test::sim
