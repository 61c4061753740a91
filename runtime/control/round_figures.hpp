#pragma once
// A sync round's figures and log line, from the times the coordinator
// recorded: stall, transfer, control overhead, GB/s, and what goes into the
// round's sync_report. Pure arithmetic (times are arguments, nanoseconds on
// one clock), so tests check it row by row.
#include "runtime/control/protocol.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rlsync {

/// When one wave's phases went out and came back; 0: did not happen.
struct wave_times {
  std::uint64_t pause_sent_ns = 0;
  std::uint64_t transfer_sent_ns = 0;
  std::uint64_t transfer_done_ns = 0;   ///< the transfer barrier was reached
  std::uint64_t last_resume_ack_ns = 0; ///< the last engine acknowledged resume
  std::uint64_t ended_ns = 0;           ///< its last barrier was reached
};

/// What the coordinator recorded of one round.
struct round_record {
  std::uint64_t id = 0;
  std::uint64_t version = 0;
  /// The waves that paused, in order (a round whose engines were all gone has none).
  std::vector<wave_times> waves;
  std::uint64_t bytes = 0;             ///< transfer reports, summed
  transfer_report slowest_pull;        ///< the transfer report of longest duration
  std::uint32_t engines_synced = 0;    ///< ended a wave holding the version
  std::vector<std::string> evicted;    ///< in eviction order
  std::vector<std::string> eviction_notes; ///< "name (phase: reason)"
  bool aborted = false;
  std::string abort_reason;
  std::uint32_t old_version = 0;       ///< aborted: engines left on their old version
  std::uint32_t dirty = 0;             ///< aborted: engines left holding part of it
};

/// Stall: per wave, pause sent until the last resume acknowledgement (or the
/// wave's end when none came; `end_ns` when it did not end), summed over the
/// waves: how long some engine was paused. Transfer: the transfer phases,
/// summed (an aborted transfer never ended and counts nothing). Control:
/// stall minus transfer, the control plane's share. Sums saturate.
struct round_figures {
  std::uint64_t stall_ns = 0;
  std::uint64_t transfer_ns = 0;
  std::uint64_t control_ns = 0;
};

round_figures figures_of(const std::vector<wave_times>& waves, std::uint64_t end_ns);

/// The round's report, ended at `end_ns`.
sync_report report_of(const round_record& r, std::uint64_t end_ns);

/// Transfer throughput in GB/s (bytes per nanosecond); 0 without a transfer time.
double transfer_gbps(std::uint64_t bytes, std::uint64_t transfer_ns);

/// Nanoseconds as milliseconds, for figures in reports.
double ms_of(std::uint64_t ns);

/// "12.345 ms".
std::string millis(std::uint64_t ns);

/// The slowest engine's pull of a round (sync_report::slowest_*), in
/// milliseconds, under the names every report gives them: bench sync's
/// JSON, `rlsync status --json` and the Python module (0: not measured).
std::vector<std::pair<std::string, double>> slowest_pull_ms(const sync_report& r);

/// The round's log line: "sync round <id> v<version>: ...; stall ..., transfer
/// ..., <bytes> bytes, control ...".
std::string log_line_of(const round_record& r, const sync_report& rep);

} // namespace rlsync
