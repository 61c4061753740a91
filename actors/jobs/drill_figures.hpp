#pragma once
// The drill's measurements as pure functions: throughput from token counts
// sampled over time, the window before the faults and the judgement of the
// windows after recovery, the figures of the report, and the summary printed
// at the end.
#include "runtime/drill/drill_report.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace rlsync::jobs {

/// Tokens streamed so far, counted at `at_ms` (ms since the drill started).
struct token_sample {
  double at_ms = 0;
  std::uint64_t tokens = 0;
};

/// Tokens per second over [from_ms, to_ms]: the count at the last sample at
/// or before each end (0 before the first). 0 for an empty or reversed span,
/// or a count that went down.
double tokens_per_second(const std::vector<token_sample>& samples, double from_ms, double to_ms);

/// The throughput plot: at each sample, tokens/s since the earliest sample
/// within the `window_ms` before it (samples in time order; none for the
/// first, which has nothing before it).
std::vector<throughput_sample> throughput_plot(const std::vector<token_sample>& samples, double window_ms);

/// A span of the timeline, ms since the drill started.
struct time_span {
  double from_ms = 0;
  double to_ms = 0;
};

/// The baseline: the `window_ms` before the first fault fired (before the
/// faults ended when none fired: first_fault_ms < 0), starting no earlier than
/// `ramp_up_ms` after the workload did (a cold workload is not a baseline).
time_span baseline_window(double first_fault_ms, double faults_end_ms, double workload_start_ms, double ramp_up_ms,
                          double window_ms);

/// The throughput judgement: throughput "returns" when one window after
/// recovery reaches (1 - tolerance) of the baseline; windows are measured one
/// after another until one does, at most `max_windows`. True: measure another.
bool measure_another_window(double before, double after, int windows_measured, int max_windows,
                            double tolerance = 0.10);

/// What the drill measured, for its figures.
struct drill_measurements {
  std::vector<double> failover_after_kill_ms;
  std::vector<double> failover_after_other_ms;
  std::vector<double> detect_ms;
  std::int64_t heartbeat_timeout_ms = 0;
  double throughput_before = 0;
  double throughput_after = 0;
  bool throughput_judged = true; ///< false: its target is marked "reported, not judged"
  std::uint64_t completed = 0;
  std::uint64_t rerouted = 0;
};

/// The report's figures, in order: failover after a kill (median, worst),
/// after other faults (median), partition detection (worst) — each only when
/// measured — then throughput before and after, after / before, requests
/// completed and rerouted.
std::vector<drill_figure> drill_figures(const drill_measurements& m);

/// What `rlsync drill` prints on stdout at the end: the verdict, the figures,
/// one line per invariant ("held", "VIOLATED" or "reported" when not
/// judged), the report's page, and the report folder alone on the last line.
std::string drill_summary(const drill_record& r, const std::string& source, const std::string& dir);

} // namespace rlsync::jobs
