// The sync bench's figures and report: what one case measured (medians,
// ratios, where its pulls went, its packs), the table, the targets each run
// meets, the text `rlsync bench sync` prints and its JSON. Pure functions
// of the results (bench_sync.cpp runs the cases).
#include "actors/jobs/bench_sync.hpp"

#include "runtime/base/format.hpp"
#include "runtime/base/stats.hpp"
#include "runtime/control/round_figures.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace rlsync::jobs {

namespace {

/// `x` rounded to `digits` decimals, for JSON figures that carry no noise.
double rounded(double x, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(x * scale) / scale;
}

} // namespace

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
  std::vector<double> stall, transfer, control, gbps, pull, wait, store, rest, ran, queued;
  for (auto& x : c.warm) {
    stall.push_back(ms_of(x.stall_ns));
    transfer.push_back(ms_of(x.transfer_ns));
    control.push_back(ms_of(x.control_ns));
    if (x.transfer_ns > 0)
      gbps.push_back(x.bytes / static_cast<double>(x.transfer_ns));
    if (x.slowest_wait_ns > 0 || x.slowest_store_ns > 0) {
      pull.push_back(ms_of(x.slowest_pull_ns));
      wait.push_back(ms_of(x.slowest_wait_ns));
      store.push_back(ms_of(x.slowest_store_ns));
      rest.push_back(std::max(0.0, ms_of(x.slowest_pull_ns) - wait.back() - store.back()));
      if (x.slowest_ran_ns > 0) {
        ran.push_back(ms_of(x.slowest_ran_ns));
        queued.push_back(ms_of(x.slowest_queued_ns));
      }
    }
  }
  return {median(stall), median(transfer), median(control), median(gbps), median(c.probe_ms), median(pull),
          median(wait),  median(store),    median(rest),    median(ran),  median(queued)};
}

double cold_transfer_ms(const case_result& c) {
  double cold = 0;
  for (auto& x : c.cold)
    cold = std::max(cold, ms_of(x.transfer_ns));
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

namespace {
/// "ran on a core for R ms and waited for one for Q ms", the wait left out
/// where the kernel keeps none (it would read as a measured 0).
std::string on_core(const case_result& c, double ran_ms, double queued_ms) {
  return format("ran on a core for %.2f ms", ran_ms)
         + (c.queued_known ? format(" and waited for one for %.2f ms", queued_ms) : std::string());
}
} // namespace

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
                           c.name.c_str(), m.pull_ms, m.wait_ms, m.store_ms, m.rest_ms)
                    + (m.ran_ms > 0 ? "; its thread " + on_core(c, m.ran_ms, m.queued_ms) : std::string()));
    // The cold round the table shows (the slowest), where it measured: its
    // rest holds connecting, registering the plans and first mappings.
    const sync_report* cold = nullptr;
    for (const auto& x : c.cold)
      if (!cold || x.transfer_ns > cold->transfer_ns)
        cold = &x;
    if (cold && (cold->slowest_wait_ns > 0 || cold->slowest_store_ns > 0))
      lines.push_back(format("%s cold pull: the slowest engine's %.2f ms of a %.2f ms transfer; its slowest worker "
                             "waited %.2f ms for the producer and stored for %.2f ms, the rest %.2f ms",
                             c.name.c_str(), ms_of(cold->slowest_pull_ns), ms_of(cold->transfer_ns),
                             ms_of(cold->slowest_wait_ns), ms_of(cold->slowest_store_ns),
                             std::max(0.0, ms_of(cold->slowest_pull_ns) - ms_of(cold->slowest_wait_ns)
                                               - ms_of(cold->slowest_store_ns)))
                      + (cold->slowest_ran_ns > 0
                             ? "; its thread " + on_core(c, ms_of(cold->slowest_ran_ns), ms_of(cold->slowest_queued_ns))
                             : std::string()));
    // The other side of the pulls: the producer's sends and answers, which
    // also include the idle polls between rounds (a few per trainer step).
    if (c.producer_ran_ms > 0)
      lines.push_back(format("%s producer, per warm round: its progress thread ", c.name.c_str())
                      + on_core(c, c.producer_ran_ms, c.producer_queued_ms)
                      + " (the trainer's steps between rounds included)");
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
    for (const auto& x : v) {
      nlohmann::ordered_json round = {{"version", x.version},
                                      {"engines", x.engines_synced},
                                      {"stall_ms", rounded(ms_of(x.stall_ns), 3)},
                                      {"transfer_ms", rounded(ms_of(x.transfer_ns), 3)},
                                      {"control_ms", rounded(ms_of(x.control_ns), 3)},
                                      {"bytes", x.bytes}};
      for (const auto& [name, value] : slowest_pull_ms(x))
        round[name] = rounded(value, 3);
      out.push_back(std::move(round));
    }
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
                     {"local_lent", p.local_lent},
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
          {"producer_ran_ms_per_round", rounded(c.producer_ran_ms, 3)},
          {"producer_queued_ms_per_round", rounded(c.producer_queued_ms, 3)},
          {"producer_buffers_made", c.producer_buffers_made},
          {"producer_buffers_prewarmed", c.producer_buffers_prewarmed},
          {"producer_huge_buffers", c.producer_huge_buffers},
          {"largest_group_bytes", c.largest_group},
          {"ucx_transports", c.ucx_transports}, // the data lanes the UCX producers' connections used
          {"lent", c.lent},
          {"ranks", c.ranks},
          {"packs", packs},
          {"error", c.error}};
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
        line += format(" local %llu packs in %llu passes for %zu plan(s), %.2f per (plan, group) per version"
                       " (%llu lent in place);",
                       static_cast<unsigned long long>(p.local_packs), static_cast<unsigned long long>(p.local_passes),
                       p.local_plans, local_packs_per_plan_group(p), static_cast<unsigned long long>(p.local_lent));
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
  else if (!r.remote) // the target is across processes: MPI_Bcast's ranks are, these engines are not
    mpi.measured = "every engine in this process: the target is across processes";
  else if (r.mpi_bcast_s <= 0)
    mpi.measured = "MPI_Bcast " + r.mpi_why;
  else {
    const double bcast_ms = r.mpi_bcast_s * 1e3;
    mpi.measured = format("%.2f ms against %.2f ms (%s): %.2fx", sharded_ms, bcast_ms,
                          r.mpi_over_tcp ? "Open MPI over tcp, as the engines' bytes go" : "the fastest of Open MPI's three",
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
    if (r.mpi_over_tcp)
      out += format("MPI_Bcast (Open MPI) of the %.0f MB model to %zu ranks: median %.2f ms (btl tcp,self on "
                    "loopback: the topology's ucx_transports are tcp alone)",
                    r.model_bytes / 1e6, r.engines, r.mpi_bcast_s * 1e3);
    else
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
                             {"mpi_bcast_tcp_median_s", r.mpi_bcast_tcp_s},
                             {"mpi_over_tcp", r.mpi_over_tcp},
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
