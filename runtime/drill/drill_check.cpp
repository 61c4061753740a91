#include "runtime/drill/drill_check.hpp"

#include <cstdio>

namespace rlsync {

namespace {

std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", x);
  return buf;
}

std::string join(const std::vector<std::string>& xs) {
  std::string out;
  for (const auto& x : xs)
    out += (out.empty() ? "" : "; ") + x;
  return out;
}

/// Engines that should serve now: alive, reachable, not retired.
bool serving_member(const drill_engine_end& e) {
  return e.alive && e.reachable && !e.retired;
}

std::string state_of(const drill_engine_end& e) {
  return e.name + " v" + std::to_string(e.version) + (e.routable ? " routable" : " NOT routable")
         + (e.dirty ? " DIRTY" : "");
}

invariant_result requests_answered(const drill_observation& o) {
  auto answered = o.completed + o.rejected + o.failed;
  bool held = o.failed == 0 && answered == o.sent;
  std::string ev = std::to_string(o.sent) + " sent: " + std::to_string(o.completed) + " completed, "
                   + std::to_string(o.rejected) + " explicitly rejected, " + std::to_string(o.failed) + " failed";
  if (answered != o.sent)
    ev += ", " + std::to_string(o.sent > answered ? o.sent - answered : answered - o.sent)
          + (o.sent > answered ? " never answered" : " answered twice");
  return {"every request finished or was explicitly rejected", held, ev};
}

invariant_result streams_whole(const drill_observation& o) {
  bool held = o.stream_mismatches == 0 && o.streamed_tokens == o.tokens;
  return {"no token lost or duplicated in any stream", held,
          std::to_string(o.streamed_tokens) + " tokens streamed, " + std::to_string(o.tokens)
            + " in the results; " + std::to_string(o.stream_mismatches)
            + " streams with a gap, duplicate or reordering"};
}

invariant_result same_version(const drill_observation& o) {
  std::vector<std::string> good, bad;
  for (const auto& e : o.engines) {
    if (!serving_member(e))
      continue;
    bool ok = e.routable && !e.dirty && e.version == o.synced_version && e.weights_problem.empty();
    (ok ? good : bad).push_back(state_of(e) + (e.weights_problem.empty() ? "" : " (" + e.weights_problem + ")"));
  }
  bool held = bad.empty() && !good.empty();
  std::string ev = "synced v" + std::to_string(o.synced_version) + "; ";
  if (good.empty() && bad.empty())
    ev += "no live engine";
  else if (bad.empty())
    ev += std::to_string(good.size()) + " live engines at it, byte-identical to the trainer";
  else
    ev += "differ: " + join(bad);
  if (o.trainer_version && *o.trainer_version != o.synced_version) {
    held = false;
    ev += "; the trainer froze at v" + std::to_string(*o.trainer_version) + ", which no final round reached";
  }
  if (!o.final_round_problem.empty() || !o.final_check_problem.empty()) {
    held = held && o.trainer_lost_by_design && o.final_check_problem.empty();
    ev += "; the final round: " + (o.final_round_problem.empty() ? o.final_check_problem : o.final_round_problem);
    if (o.trainer_lost_by_design)
      ev += o.final_check_problem.empty() ? " (the drill took the trainer out for good)"
                                          : " (the drill took the trainer out for good; the check after the round "
                                            "is not excused: " + o.final_check_problem + ")";
  }
  return {"every live engine on the same version", held, ev};
}

invariant_result no_dirty_tokens(const drill_observation& o) {
  std::uint64_t dirty = 0;
  std::vector<std::string> who;
  for (const auto& e : o.engines)
    if (e.dirty_tokens > 0) {
      dirty += e.dirty_tokens;
      who.push_back(e.name + " " + std::to_string(e.dirty_tokens));
    }
  std::vector<std::string> unknown;
  for (const auto& [v, n] : o.tokens_by_version)
    if (!o.completed_versions.count(v))
      unknown.push_back(std::to_string(n) + " tokens at v" + std::to_string(v));
  bool held = dirty == 0 && unknown.empty();
  std::string ev = "engines' own count of tokens made while dirty: " + std::to_string(dirty)
                   + (who.empty() ? "" : " (" + join(who) + ")") + "; versions in the results: ";
  std::string versions;
  for (const auto& [v, n] : o.tokens_by_version)
    versions += (versions.empty() ? "v" : ", v") + std::to_string(v);
  ev += versions.empty() ? "none" : versions;
  ev += unknown.empty() ? ", each one a completed round's" : "; not from a completed round: " + join(unknown);
  return {"no token produced by a dirty engine", held, ev};
}

invariant_result rejoined_current(const drill_observation& o) {
  std::vector<std::string> good, bad, out;
  for (const auto& e : o.engines) {
    if (!serving_member(e)) {
      // Out at the end: only where the drill's own faults took it for good.
      std::string how = e.name + (e.retired ? " retired" : !e.alive ? " dead" : " unreachable");
      if (o.lost_by_design.count(e.name))
        out.push_back(how);
      else
        bad.push_back(how + ", though no fault of the drill took it for good");
      continue;
    }
    if (!e.faulted)
      continue;
    bool ok = e.routable && !e.dirty && e.version == o.synced_version;
    (ok ? good : bad).push_back(state_of(e));
  }
  bool held = bad.empty();
  std::string ev;
  if (good.empty() && bad.empty())
    ev = "no faulted replica rejoined";
  else
    ev = std::to_string(good.size()) + " rejoined and current at v" + std::to_string(o.synced_version)
         + (bad.empty() ? "" : "; not current: " + join(bad));
  if (!out.empty())
    ev += "; out for good: " + join(out);
  return {"rejoined replicas are current", held, ev};
}

invariant_result throughput_back(const drill_observation& o) {
  double floor = o.throughput_before * (1.0 - o.throughput_tolerance);
  bool held = o.throughput_before > 0 && o.throughput_after >= floor;
  std::string ev = "before the first fault " + num(o.throughput_before) + " tokens/s, after healing "
                   + num(o.throughput_after) + " tokens/s";
  if (o.throughput_before > 0)
    ev += " (" + num(100.0 * o.throughput_after / o.throughput_before) + "%, at least "
          + num(100.0 * (1.0 - o.throughput_tolerance)) + "% needed)";
  else
    ev += " (nothing measured before the fault)";
  if (!o.judge_throughput)
    ev += "; reported, not judged";
  return {"throughput back to its pre-fault level", held, ev, o.judge_throughput};
}

invariant_result min_live(const drill_observation& o) {
  auto replicas = static_cast<std::int64_t>(o.engines.size());
  bool by_design = o.engines_killed_at_once > 0 && replicas - o.engines_killed_at_once < o.min_live_engines;
  std::string ev = "min_live_engines " + std::to_string(o.min_live_engines) + "; fell below it "
                   + std::to_string(o.below_min_live_events) + " times";
  if (by_design)
    ev += "; reported, not judged: the drill takes out " + std::to_string(o.engines_killed_at_once) + " of "
          + std::to_string(replicas) + " engines at once";
  return {"engines live and serving within sync.staleness never below sync.min_live_engines",
          o.below_min_live_events == 0, ev, !by_design};
}

} // namespace

std::vector<invariant_result> check_drill(const drill_observation& o) {
  return {requests_answered(o), streams_whole(o),   same_version(o), no_dirty_tokens(o),
          rejoined_current(o),  throughput_back(o), min_live(o)};
}

} // namespace rlsync
