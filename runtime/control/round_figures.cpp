#include "runtime/control/round_figures.hpp"

#include <cstdio>
#include <limits>

namespace rlsync {

namespace {

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  return a > std::numeric_limits<std::uint64_t>::max() - b ? std::numeric_limits<std::uint64_t>::max() : a + b;
}

std::uint64_t elapsed(std::uint64_t from, std::uint64_t to) {
  return to > from ? to - from : 0;
}

} // namespace

round_figures figures_of(const std::vector<wave_times>& waves, std::uint64_t end_ns) {
  round_figures f;
  for (auto& w : waves) {
    auto ended = w.ended_ns != 0 ? w.ended_ns : end_ns;
    auto stalled_until = w.last_resume_ack_ns != 0 ? w.last_resume_ack_ns : ended;
    f.stall_ns = saturating_add(f.stall_ns, elapsed(w.pause_sent_ns, stalled_until));
    if (w.transfer_sent_ns != 0 && w.transfer_done_ns >= w.transfer_sent_ns)
      f.transfer_ns = saturating_add(f.transfer_ns, w.transfer_done_ns - w.transfer_sent_ns);
  }
  f.control_ns = elapsed(f.transfer_ns, f.stall_ns);
  return f;
}

sync_report report_of(const round_record& r, std::uint64_t end_ns) {
  auto f = figures_of(r.waves, end_ns);
  sync_report rep;
  rep.version = r.version;
  rep.engines_synced = r.engines_synced;
  rep.evicted = r.evicted;
  rep.stall_ns = f.stall_ns;
  rep.transfer_ns = f.transfer_ns;
  rep.bytes = r.bytes;
  rep.control_ns = f.control_ns;
  rep.aborted = r.aborted;
  rep.slowest_pull_ns = r.slowest_pull.duration_ns;
  rep.slowest_wait_ns = r.slowest_pull.wait_ns;
  rep.slowest_store_ns = r.slowest_pull.store_ns;
  rep.slowest_ran_ns = r.slowest_pull.ran_ns;
  rep.slowest_queued_ns = r.slowest_pull.queued_ns;
  return rep;
}

double transfer_gbps(std::uint64_t bytes, std::uint64_t transfer_ns) {
  return transfer_ns > 0 ? static_cast<double>(bytes) / static_cast<double>(transfer_ns) : 0.0;
}

double ms_of(std::uint64_t ns) { return static_cast<double>(ns) / 1e6; }

std::string millis(std::uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", ms_of(ns));
  return buf;
}

std::vector<std::pair<std::string, double>> slowest_pull_ms(const sync_report& r) {
  return {{"slowest_pull_ms", ms_of(r.slowest_pull_ns)},
          {"slowest_wait_ms", ms_of(r.slowest_wait_ns)},
          {"slowest_store_ms", ms_of(r.slowest_store_ns)},
          {"slowest_ran_ms", ms_of(r.slowest_ran_ns)},
          {"slowest_queued_ms", ms_of(r.slowest_queued_ns)}};
}

std::string log_line_of(const round_record& r, const sync_report& rep) {
  std::string line = "sync round " + std::to_string(r.id) + " v" + std::to_string(r.version) + ": ";
  if (r.aborted) {
    line += "ABORTED (" + r.abort_reason + "): " + std::to_string(r.old_version)
            + " engines resume on their old version, " + std::to_string(r.dirty) + " dirty";
    if (rep.engines_synced > 0) // earlier waves completed
      line += ", " + std::to_string(rep.engines_synced) + " synced in earlier waves";
  } else {
    line += std::to_string(rep.engines_synced) + " engines synced";
    if (r.waves.size() > 1)
      line += " in " + std::to_string(r.waves.size()) + " waves";
  }
  for (auto& note : r.eviction_notes)
    line += ", evicted " + note;
  line += "; stall " + millis(rep.stall_ns) + ", transfer " + millis(rep.transfer_ns) + ", "
          + std::to_string(rep.bytes) + " bytes, control " + millis(rep.control_ns);
  return line;
}

} // namespace rlsync
