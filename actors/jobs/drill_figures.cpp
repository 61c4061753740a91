#include "actors/jobs/drill_figures.hpp"

#include "runtime/base/stats.hpp"

#include <algorithm>
#include <cstdio>

namespace rlsync::jobs {

namespace {

std::uint64_t count_at(const std::vector<token_sample>& samples, double ms) {
  std::uint64_t n = 0;
  for (auto& s : samples)
    if (s.at_ms <= ms)
      n = s.tokens;
  return n;
}

double worst(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

} // namespace

double tokens_per_second(const std::vector<token_sample>& samples, double from_ms, double to_ms) {
  if (!(to_ms > from_ms))
    return 0;
  auto from = count_at(samples, from_ms), to = count_at(samples, to_ms);
  if (to < from)
    return 0;
  return static_cast<double>(to - from) * 1000.0 / (to_ms - from_ms);
}

std::vector<throughput_sample> throughput_plot(const std::vector<token_sample>& samples, double window_ms) {
  std::vector<throughput_sample> out;
  std::size_t j = 0; // the earliest sample within the window before sample k
  for (std::size_t k = 0; k < samples.size(); ++k) {
    while (j < k && samples[k].at_ms - samples[j].at_ms > window_ms)
      ++j;
    double dt = samples[k].at_ms - samples[j].at_ms;
    if (dt > 0 && samples[k].tokens >= samples[j].tokens)
      out.push_back({samples[k].at_ms, static_cast<double>(samples[k].tokens - samples[j].tokens) * 1000.0 / dt});
  }
  return out;
}

time_span baseline_window(double first_fault_ms, double faults_end_ms, double workload_start_ms, double ramp_up_ms,
                          double window_ms) {
  double to = first_fault_ms >= 0 ? first_fault_ms : faults_end_ms;
  return {std::max(workload_start_ms + ramp_up_ms, to - window_ms), to};
}

bool measure_another_window(double before, double after, int windows_measured, int max_windows, double tolerance) {
  if (windows_measured >= max_windows)
    return false;
  return windows_measured == 0 || after < (1.0 - tolerance) * before;
}

std::vector<drill_figure> drill_figures(const drill_measurements& m) {
  std::vector<drill_figure> out;
  if (!m.failover_after_kill_ms.empty()) {
    out.push_back({"failover after a kill, median of " + std::to_string(m.failover_after_kill_ms.size())
                     + " rerouted requests",
                   median(m.failover_after_kill_ms), "ms", "< 100 ms"});
    out.push_back({"failover after a kill, worst", worst(m.failover_after_kill_ms), "ms", "< 100 ms"});
  }
  if (!m.failover_after_other_ms.empty())
    out.push_back({"failover after a partition or other fault, median of "
                     + std::to_string(m.failover_after_other_ms.size()),
                   median(m.failover_after_other_ms), "ms", "heartbeat timeout + reroute"});
  if (!m.detect_ms.empty())
    out.push_back({"partition detected after, worst", worst(m.detect_ms), "ms",
                   "<= heartbeat timeout " + std::to_string(m.heartbeat_timeout_ms) + " ms + one interval"});
  out.push_back({"throughput before the first fault", m.throughput_before, "tokens/s", ""});
  out.push_back({"throughput after healing", m.throughput_after, "tokens/s", ""});
  out.push_back({"after / before", m.throughput_before > 0 ? 100.0 * m.throughput_after / m.throughput_before : 0, "%",
                 m.throughput_judged ? ">= 90%" : ">= 90%, reported, not judged"});
  out.push_back({"requests completed", static_cast<double>(m.completed), "", ""});
  out.push_back({"requests rerouted (router)", static_cast<double>(m.rerouted), "", ""});
  return out;
}

std::string drill_summary(const drill_record& r, const std::string& source, const std::string& dir) {
  std::string s = "\n== rlsync drill " + source + ": " + (r.passed() ? "PASSED" : "FAILED") + "\n";
  for (auto& f : r.figures) {
    char value[32];
    std::snprintf(value, sizeof value, "%.1f", f.value);
    s += "  " + f.name + ": " + value + (f.unit.empty() ? "" : " " + f.unit)
         + (f.target.empty() ? "" : " (target " + f.target + ")") + "\n";
  }
  for (auto& inv : r.invariants)
    s += std::string(!inv.judged ? "  reported  " : inv.held ? "  held      " : "  VIOLATED  ") + inv.name + ": "
         + inv.evidence + "\n";
  s += "report: " + dir + "/report.html\n";
  s += dir + "\n";
  return s;
}

} // namespace rlsync::jobs
