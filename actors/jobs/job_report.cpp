#include "actors/jobs/job_report.hpp"

#include "runtime/base/printable.hpp"
#include "runtime/base/stats.hpp"
#include "runtime/control/round_figures.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>

namespace rlsync::jobs {

std::string fixed(double x, int digits) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(digits);
  os << x;
  return os.str();
}

sync_figures figures_of(const sync_report& r) {
  return {ms_of(r.stall_ns), ms_of(r.transfer_ns), transfer_gbps(r.bytes, r.transfer_ns), ms_of(r.control_ns)};
}

sync_summary summarize_syncs(const std::vector<sync_report>& rounds) {
  sync_summary s;
  s.rounds = rounds.size();
  std::vector<double> stall, transfer, gbps, control;
  bool cold_seen = false;
  for (auto& r : rounds) {
    s.evictions += r.evicted.size();
    if (r.engines_synced == 0)
      continue;
    auto f = figures_of(r);
    if (!cold_seen) {
      cold_seen = true;
      s.cold = f;
      continue;
    }
    stall.push_back(f.stall_ms);
    transfer.push_back(f.transfer_ms);
    gbps.push_back(f.gbps);
    control.push_back(f.control_ms);
  }
  s.warm = stall.size();
  s.warm_median = {median(stall), median(transfer), median(gbps), median(control)};
  return s;
}

bool weights_verified(const std::vector<engine_verification>& checks) {
  return !checks.empty() && std::all_of(checks.begin(), checks.end(), [](auto& c) { return c.ok(); });
}

std::string rank_status_text(const rank_status& r) {
  auto version = [](std::uint64_t v) { return v == 0 ? std::string("none") : "v" + std::to_string(v); };
  return "rank " + std::to_string(r.rank) + " on " + printable(r.node) + " (incarnation "
         + std::to_string(r.incarnation) + "): published " + version(r.latest_version) + ", pinned "
         + version(r.pinned_version) + ", " + (r.reachable ? "reachable" : "UNREACHABLE");
}

std::string job_summary_text(const job_outcome& o) {
  const auto& result = o.workload;
  auto syncs = summarize_syncs(o.syncs);
  std::ostringstream s;
  s << "\n== rlsync run " << o.label << (o.interrupted ? " (interrupted)" : "") << "\n";
  s << "requests: " << o.requests << " — " << result.completed << " completed, " << result.failed << " failed, "
    << result.rejected << " rejected, " << result.not_sent << " not sent\n";
  if (!o.drain.empty())
    s << "drain: " << o.drain << "\n";
  s << "tokens: " << result.tokens << " in " << fixed(o.seconds) << " s ("
    << fixed(o.seconds > 0 ? static_cast<double>(result.tokens) / o.seconds : 0) << " tokens/s), "
    << result.stale_kv_tokens << " over stale KV; by version:";
  for (auto& [v, n] : result.tokens_by_version)
    s << " v" << v << "=" << n;
  s << "\n";
  s << "syncs: " << (o.total_syncs != 0 ? o.total_syncs : syncs.rounds) << ", evictions: " << syncs.evictions;
  if (o.total_syncs > o.syncs.size())
    s << " (figures over the cold sync and the last " << o.syncs.size() << " rounds)";
  if (auto cold = syncs.cold)
    s << "\n  cold sync: stall " << fixed(cold->stall_ms) << " ms, transfer " << fixed(cold->transfer_ms) << " ms, "
      << fixed(cold->gbps, 2) << " GB/s";
  if (syncs.warm > 0) {
    const auto& m = syncs.warm_median;
    s << "\n  median of " << syncs.warm << " warm syncs: stall " << fixed(m.stall_ms) << " ms, transfer "
      << fixed(m.transfer_ms) << " ms, " << fixed(m.gbps, 2) << " GB/s ("
      << fixed(o.memcpy_gbps > 0 ? 100 * m.gbps / o.memcpy_gbps : 0) << "% of memcpy " << fixed(o.memcpy_gbps)
      << " GB/s), control " << fixed(m.control_ms) << " ms";
  }
  s << "\nweights after the last sync (v" << (o.last ? o.last->version : 0) << "):";
  if (!o.last_error.empty())
    s << " last sync failed: " << o.last_error;
  for (auto& c : o.checks) {
    s << "\n  " << c.engine << " v" << c.version << ": ";
    if (c.ok())
      s << "byte-identical to the trainer (" << c.shards << " parameter shards)";
    else if (!c.error.empty())
      s << "NOT VERIFIED: " << c.error;
    else if (c.dirty)
      s << "DIRTY";
    else
      s << c.mismatched << " of " << c.shards << " shards DIFFER";
  }
  if (!o.ranks.empty())
    s << "\ntrainer ranks:";
  for (auto& r : o.ranks)
    s << "\n  " << rank_status_text(r);
  for (auto& e : result.errors)
    s << "\n  error: " << e;
  if (o.below_min_live_events > 0)
    s << "\nALERT: engines live and serving within sync.staleness fell below sync.min_live_engines ("
      << o.min_live_engines << ") " << o.below_min_live_events << " times; retired: " << o.retired;
  s << "\n";
  return s.str();
}

std::string job_summary_json(const job_outcome& o) {
  using nlohmann::ordered_json; // ordered: fields stay in the order listed
  const auto& result = o.workload;
  ordered_json by_version = ordered_json::object();
  for (auto& [v, n] : result.tokens_by_version)
    by_version[std::to_string(v)] = n;
  ordered_json syncs = ordered_json::array();
  for (auto& r : o.syncs) {
    auto f = figures_of(r);
    syncs.push_back({{"version", r.version},
                     {"engines", r.engines_synced},
                     {"stall_ms", f.stall_ms},
                     {"transfer_ms", f.transfer_ms},
                     {"bytes", r.bytes},
                     {"gbps", f.gbps},
                     {"control_ms", f.control_ms},
                     {"evicted", r.evicted}});
  }
  ordered_json ranks = ordered_json::array();
  for (auto& r : o.ranks)
    ranks.push_back({{"rank", r.rank},
                     {"node", r.node},
                     {"incarnation", r.incarnation},
                     {"latest_version", r.latest_version},
                     {"pinned_version", r.pinned_version},
                     {"reachable", r.reachable}});
  ordered_json weights = ordered_json::array();
  for (auto& c : o.checks)
    weights.push_back({{"engine", c.engine},
                       {"version", c.version},
                       {"dirty", c.dirty},
                       {"identical", c.ok()},
                       {"shards", c.shards},
                       {"mismatched", c.mismatched},
                       {"error", c.error},
                       {"member", c.member}});
  ordered_json j = {
    {"topology", o.label},
    {"interrupted", o.interrupted},
    {"drain", o.drain},
    {"requests",
     {{"total", o.requests},
      {"completed", result.completed},
      {"failed", result.failed},
      {"rejected", result.rejected},
      {"not_sent", result.not_sent}}},
    {"tokens", {{"total", result.tokens}, {"stale_kv", result.stale_kv_tokens}, {"by_version", by_version}}},
    // What a drill with processes checks its stream invariant and min_live by.
    {"streamed_tokens", result.streamed_tokens},
    {"stream_mismatches", result.stream_mismatches},
    {"min_live_engines", o.min_live_engines},
    {"below_min_live_events", o.below_min_live_events},
    {"seconds", o.seconds},
    {"memcpy_gbps", o.memcpy_gbps},
    {"syncs", syncs},
    {"final_round_error", o.last_error},
    {"final_check_error", o.last_check_error},
    {"weights", weights},
    {"weights_verified", weights_verified(o.checks)},
    {"ranks", ranks},
  };
  // Non-finite numbers come out as null; text that is not UTF-8 gets U+FFFD.
  return j.dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

int job_exit_status(const job_outcome& o) {
  if (o.interrupted)
    return 128 + (o.stop_signal != 0 ? o.stop_signal : 2);
  if (o.below_min_live_events > 0)
    return 3; // the fleet was too small for a while: the run's figures do not stand
  const auto& r = o.workload;
  bool all_served = r.completed == o.requests && r.failed == 0 && r.rejected == 0;
  return all_served && weights_verified(o.checks) && r.stream_mismatches == 0 ? 0 : 1;
}

} // namespace rlsync::jobs
