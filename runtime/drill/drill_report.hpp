#pragma once
// The report of one fault-injection drill: what each engine was
// doing over time, where the faults, heals and sync rounds fell, the request
// throughput, and which invariants held. Pure values in, text out: the drill
// runner fills a drill_record, and this renders it as JSON (for tools) and as
// one self-contained HTML page with an inline SVG timeline (for people).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rlsync {

/// What an engine is doing, one lane per engine in the timeline.
enum class lane_state : std::uint8_t { generating, paused, transferring, dirty, dead, rejoining };

/// "generating", "paused", "transferring", "dirty", "dead", "rejoining".
std::string_view to_string(lane_state s);

/// An engine entered `state` at `at_ms` (ms since the drill started); it
/// stays there until its next event.
struct lane_event {
  double at_ms = 0;
  std::string engine;
  lane_state state = lane_state::generating;
};

/// A vertical mark on the timeline: a sync round, a fault, a heal, a detection.
struct drill_mark {
  double at_ms = 0;
  std::string kind; ///< "sync", "fault", "heal", "detect"
  std::string label;
};

/// Generated tokens per second over one window [at_ms - window, at_ms].
struct throughput_sample {
  double at_ms = 0;
  double tokens_per_s = 0;
};

/// One invariant of the fault model after the drill: held or violated, with its evidence.
/// One that is not judged is reported with its evidence but never fails the
/// drill (throughput on a shared machine measures the neighbours too).
struct invariant_result {
  std::string name;
  bool held = false;
  std::string evidence;
  bool judged = true;
};

/// A figure the drill reached (failover time, detection time, throughput before/after).
struct drill_figure {
  std::string name;
  double value = 0;
  std::string unit;
  std::string target; ///< "< 100 ms", may be empty
};

struct drill_record {
  std::string name;                    ///< the drill (topology name)
  std::string source;                  ///< the YAML file
  double duration_ms = 0;              ///< the timeline's end
  std::vector<std::string> engines;    ///< lane order
  std::vector<lane_event> lanes;       ///< any order; sorted by the writer
  std::vector<drill_mark> marks;
  std::vector<throughput_sample> throughput;
  std::vector<invariant_result> invariants;
  std::vector<drill_figure> figures;
  std::vector<std::string> log;        ///< notable lines, in order (bounded by the caller)
  bool passed() const;                 ///< every judged invariant held (and at least one was judged)
};

/// Every engine's lane as segments [begin_ms, end_ms) in one state, built
/// from the events: an engine's state lasts until its next event or
/// duration_ms; before its first event an engine has no segment. Events past
/// duration_ms are clipped. Sorted by engine (in `engines` order), then begin.
/// Events at the same time: the later one in `lanes` wins. Back-to-back
/// segments in the same state are merged; events before 0 start at 0; events
/// of engines not in `engines`, or at a non-finite time, are ignored.
struct lane_segment {
  std::string engine;
  lane_state state;
  double begin_ms = 0;
  double end_ms = 0;
};
std::vector<lane_segment> lane_segments(const drill_record& r);

/// The record as one JSON object: name, source, passed, duration_ms, engines,
/// figures, invariants (name, held, judged, evidence), marks, throughput,
/// segments (from lane_segments), log.
/// Non-finite numbers are written as null; "</" is written "<\/" so that the
/// text can sit inside an HTML <script>.
std::string drill_report_json(const drill_record& r);

/// The record as one self-contained HTML page (no external resources, no
/// script): verdict, invariants, figures, an SVG timeline with lanes, marks
/// and throughput, and the log. Every string from the record is escaped.
std::string drill_report_html(const drill_record& r);

/// Writes DIR/report.json and DIR/report.html (creating DIR and its parents).
/// Throws std::runtime_error naming the path that failed.
void write_drill_report(const drill_record& r, const std::string& dir);

} // namespace rlsync
