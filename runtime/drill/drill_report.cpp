#include "runtime/drill/drill_report.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <system_error>

namespace rlsync {

std::string_view to_string(lane_state s) {
  switch (s) {
    case lane_state::generating: return "generating";
    case lane_state::paused: return "paused";
    case lane_state::transferring: return "transferring";
    case lane_state::dirty: return "dirty";
    case lane_state::dead: return "dead";
    case lane_state::rejoining: return "rejoining";
  }
  return "?";
}

bool drill_record::passed() const {
  return std::any_of(invariants.begin(), invariants.end(), [](auto& i) { return i.judged; })
         && std::all_of(invariants.begin(), invariants.end(), [](auto& i) { return i.held || !i.judged; });
}

namespace {

double timeline_end(const drill_record& r) {
  return std::isfinite(r.duration_ms) && r.duration_ms > 0 ? r.duration_ms : 0.0;
}

} // namespace

std::vector<lane_segment> lane_segments(const drill_record& r) {
  const double end = timeline_end(r);
  std::vector<lane_segment> out;
  for (auto& engine : r.engines) {
    std::vector<lane_event> events;
    for (auto& e : r.lanes)
      if (e.engine == engine && std::isfinite(e.at_ms))
        events.push_back(e);
    // Stable, so that of two events at the same time the later one wins.
    std::stable_sort(events.begin(), events.end(),
                     [](auto& a, auto& b) { return a.at_ms < b.at_ms; });
    for (std::size_t i = 0; i < events.size(); ++i) {
      double begin = std::clamp(events[i].at_ms, 0.0, end);
      double until = i + 1 < events.size() ? std::clamp(events[i + 1].at_ms, 0.0, end) : end;
      if (until <= begin)
        continue;
      if (!out.empty() && out.back().engine == engine && out.back().state == events[i].state
          && out.back().end_ms == begin)
        out.back().end_ms = until;
      else
        out.push_back({engine, events[i].state, begin, until});
    }
  }
  return out;
}

// --- JSON --------------------------------------------------------------------

std::string drill_report_json(const drill_record& r) {
  using nlohmann::ordered_json; // ordered: fields stay in the order listed
  auto rows = [](const auto& xs, auto f) {
    ordered_json out = ordered_json::array();
    for (auto& x : xs)
      out.push_back(f(x));
    return out;
  };
  ordered_json report = {
    {"name", r.name},
    {"source", r.source},
    {"passed", r.passed()},
    {"duration_ms", r.duration_ms},
    {"engines", r.engines},
    {"figures", rows(r.figures, [](auto& f) -> ordered_json {
       return {{"name", f.name}, {"value", f.value}, {"unit", f.unit}, {"target", f.target}};
     })},
    {"invariants", rows(r.invariants, [](auto& i) -> ordered_json {
       return {{"name", i.name}, {"held", i.held}, {"judged", i.judged}, {"evidence", i.evidence}};
     })},
    {"marks", rows(r.marks, [](auto& m) -> ordered_json {
       return {{"at_ms", m.at_ms}, {"kind", m.kind}, {"label", m.label}};
     })},
    {"throughput", rows(r.throughput, [](auto& t) -> ordered_json {
       return {{"at_ms", t.at_ms}, {"tokens_per_s", t.tokens_per_s}};
     })},
    {"segments", rows(lane_segments(r), [](auto& s) -> ordered_json {
       return {{"engine", s.engine}, {"state", to_string(s.state)}, {"begin_ms", s.begin_ms}, {"end_ms", s.end_ms}};
     })},
    {"log", r.log},
  };
  // Non-finite numbers come out as null; text that is not UTF-8 gets U+FFFD.
  std::string json = report.dump(2, ' ', false, ordered_json::error_handler_t::replace);
  // "</" only occurs inside strings, where "<\/" means the same: the text can
  // then sit inside an HTML <script> element.
  std::string out;
  out.reserve(json.size() + 1);
  for (std::size_t i = 0; i < json.size(); ++i) {
    out += json[i];
    if (json[i] == '<' && i + 1 < json.size() && json[i + 1] == '/')
      out += '\\';
  }
  out += '\n';
  return out;
}

// --- HTML --------------------------------------------------------------------

namespace {

std::string esc(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

/// `v` with at most `decimals` decimals, trailing zeros dropped; "n/a" when not finite.
std::string num(double v, int decimals = 2) {
  if (!std::isfinite(v))
    return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, std::fabs(v) < 1e15 ? "%.*f" : "%.*g", decimals, v);
  std::string s = buf;
  if (s.find('.') != std::string::npos && s.find('e') == std::string::npos) {
    s.erase(s.find_last_not_of('0') + 1);
    if (s.back() == '.')
      s.pop_back();
  }
  return s == "-0" ? "0" : s;
}

/// At most `n` bytes of `s`, cut at a UTF-8 character boundary, with "…" when cut.
std::string shorten(const std::string& s, std::size_t n) {
  if (s.size() <= n)
    return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80)
    --n;
  return s.substr(0, n) + "\u2026";
}

/// A round step near `span / count` (1, 2 or 5 times a power of ten).
double nice_step(double span, int count) {
  double raw = span / count;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * mag >= raw)
      return m * mag;
  return 10 * mag;
}

/// The CSS class of a mark kind; unknown kinds get "other" (never the raw text).
const char* mark_class(const std::string& kind) {
  for (const char* k : {"sync", "fault", "heal", "detect"})
    if (kind == k)
      return k;
  return "other";
}

constexpr lane_state all_states[] = {lane_state::generating, lane_state::paused,
                                     lane_state::transferring, lane_state::dirty,
                                     lane_state::dead, lane_state::rejoining};

const char* page_style = R"(
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { margin-bottom: 0.2em; }
.verdict { font-size: 2.5em; font-weight: bold; margin: 0.1em 0 0.4em; }
.verdict.passed, td.held { color: #1e7b34; }
.verdict.failed, td.violated { color: #b3261e; }
td.reported { color: #6b6b6b; }
.meta { color: #666; }
table { border-collapse: collapse; margin-bottom: 1em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; }
svg { max-width: 100%; height: auto; font: 11px system-ui, sans-serif; }
.lane-bg { fill: #f4f4f4; }
.lane-label { font-size: 12px; }
.axis, .tick { stroke: #444; }
.grid { stroke: #e4e4e4; }
.generating { fill: #2e9e44; } .paused { fill: #f0a202; } .transferring { fill: #2f6fd6; }
.dirty { fill: #8e44ad; } .dead { fill: #5c1010; } .rejoining { fill: #17a2a2; }
.mark line { stroke-width: 1.5; }
.mark text { paint-order: stroke; stroke: #fff; stroke-width: 3px; }
.mark.sync line { stroke: #999; stroke-width: 1; } .mark.sync text { fill: #777; }
.mark.fault line { stroke: #d62728; stroke-dasharray: 5 3; } .mark.fault text { fill: #d62728; }
.mark.heal line { stroke: #2ca02c; stroke-dasharray: 5 3; } .mark.heal text { fill: #2ca02c; }
.mark.detect line { stroke: #ff7f0e; } .mark.detect text { fill: #d66a00; }
.mark.other line { stroke: #555; stroke-dasharray: 1 3; } .mark.other text { fill: #555; }
.tput { fill: none; stroke: #2f6fd6; stroke-width: 1.5; }
.empty { fill: #999; font-style: italic; }
)";

// Timeline geometry, in SVG units.
constexpr double svg_w = 1000, left = 150, right = 20, plot_w = svg_w - left - right;
constexpr double label_row_h = 14, lane_h = 24, lane_gap = 6, tput_h = 120;
constexpr std::size_t label_rows_max = 6, label_chars_max = 40;

std::string svg_timeline(const drill_record& r) {
  const double end = timeline_end(r);
  const double span = end > 0 ? end : 1; // duration 0: everything sits at the left edge
  auto px = [&](double t) { return left + std::clamp(t, 0.0, span) / span * plot_w; };
  auto x = [&](double t) { return num(px(t)); };
  auto in_range = [&](double t) { return std::isfinite(t) && t >= 0 && t <= span; };

  // Mark labels go in staggered rows above the lanes: each takes the first row
  // whose last label ends left of it (a rough width estimate is enough).
  std::vector<const drill_mark*> marks;
  for (auto& m : r.marks)
    if (in_range(m.at_ms))
      marks.push_back(&m);
  std::stable_sort(marks.begin(), marks.end(),
                   [](auto* a, auto* b) { return a->at_ms < b->at_ms; });
  std::vector<int> mark_row;
  std::vector<double> row_end;
  for (auto* m : marks) {
    double mx = px(m->at_ms);
    double w = 6.0 * std::min(m->label.size(), label_chars_max + 1) + 8;
    std::size_t row = 0;
    while (row < row_end.size() && row_end[row] > mx)
      ++row;
    if (row == row_end.size() && row_end.size() == label_rows_max) // full: least crowded row
      row = std::min_element(row_end.begin(), row_end.end()) - row_end.begin();
    if (row == row_end.size())
      row_end.push_back(0);
    row_end[row] = mx + w;
    mark_row.push_back(static_cast<int>(row));
  }

  const std::size_t lanes = std::max<std::size_t>(r.engines.size(), 1);
  const double lanes_top = 10 + label_row_h * row_end.size() + 6;
  const double lanes_bottom = lanes_top + lanes * (lane_h + lane_gap);
  const double tput_top = lanes_bottom + 16, tput_bottom = tput_top + tput_h;
  const double legend_y = tput_bottom + 48, height = legend_y + 24;

  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(svg_w) + "\" height=\""
                  + num(height) + "\" viewBox=\"0 0 " + num(svg_w) + " " + num(height)
                  + "\" role=\"img\" aria-label=\"timeline\">\n";

  // Time grid and axis (along the bottom of the throughput panel).
  const double step = nice_step(span, 10);
  for (int k = 0; k * step <= span * (1 + 1e-9); ++k) {
    const double t = k * step;
    s += "<line class=\"grid\" x1=\"" + x(t) + "\" x2=\"" + x(t) + "\" y1=\"" + num(lanes_top)
         + "\" y2=\"" + num(tput_bottom) + "\"/>";
    s += "<line class=\"tick\" x1=\"" + x(t) + "\" x2=\"" + x(t) + "\" y1=\"" + num(tput_bottom)
         + "\" y2=\"" + num(tput_bottom + 5) + "\"/>";
    s += "<text x=\"" + x(t) + "\" y=\"" + num(tput_bottom + 17) + "\" text-anchor=\"middle\">"
         + num(t, 3) + "</text>\n";
  }
  s += "<line class=\"axis\" x1=\"" + num(left) + "\" x2=\"" + num(left + plot_w) + "\" y1=\""
       + num(tput_bottom) + "\" y2=\"" + num(tput_bottom) + "\"/>";
  s += "<text x=\"" + num(left + plot_w / 2) + "\" y=\"" + num(tput_bottom + 32)
       + "\" text-anchor=\"middle\">time (ms)</text>\n";

  // One lane per engine.
  auto lane_y = [&](std::size_t i) { return lanes_top + i * (lane_h + lane_gap); };
  if (r.engines.empty())
    s += "<text class=\"empty\" x=\"" + num(left + 8) + "\" y=\"" + num(lanes_top + 16)
         + "\">no engines</text>\n";
  for (std::size_t i = 0; i < r.engines.size(); ++i) {
    s += "<rect class=\"lane-bg\" x=\"" + num(left) + "\" y=\"" + num(lane_y(i)) + "\" width=\""
         + num(plot_w) + "\" height=\"" + num(lane_h) + "\"/>";
    s += "<text class=\"lane-label\" x=\"" + num(left - 8) + "\" y=\"" + num(lane_y(i) + 16)
         + "\" text-anchor=\"end\"><title>" + esc(r.engines[i]) + "</title>"
         + esc(shorten(r.engines[i], 18)) + "</text>\n";
  }
  for (auto& seg : lane_segments(r)) {
    auto i = std::find(r.engines.begin(), r.engines.end(), seg.engine) - r.engines.begin();
    double w = std::max((seg.end_ms - seg.begin_ms) / span * plot_w, 0.5);
    std::string state(to_string(seg.state));
    s += "<rect class=\"seg " + state + "\" x=\"" + x(seg.begin_ms) + "\" y=\"" + num(lane_y(i) + 2)
         + "\" width=\"" + num(w) + "\" height=\"" + num(lane_h - 4) + "\"><title>"
         + esc(seg.engine) + ": " + state + " " + num(seg.begin_ms, 3) + "\u2013"
         + num(seg.end_ms, 3) + " ms</title></rect>\n";
  }

  // Throughput panel: y axis from 0 to a round maximum.
  std::vector<throughput_sample> pts;
  double peak = 0;
  for (auto& t : r.throughput)
    if (in_range(t.at_ms) && std::isfinite(t.tokens_per_s)) {
      pts.push_back(t);
      peak = std::max(peak, t.tokens_per_s);
    }
  std::stable_sort(pts.begin(), pts.end(), [](auto& a, auto& b) { return a.at_ms < b.at_ms; });
  double ystep = nice_step(peak > 0 ? peak : 1, 4);
  double ymax = std::ceil((peak > 0 ? peak : 1) / ystep - 1e-9) * ystep;
  auto y = [&](double v) { return num(tput_bottom - std::clamp(v, 0.0, ymax) / ymax * tput_h); };
  s += "<line class=\"axis\" x1=\"" + num(left) + "\" x2=\"" + num(left) + "\" y1=\""
       + num(tput_top) + "\" y2=\"" + num(tput_bottom) + "\"/>";
  for (int k = 0; k * ystep <= ymax * (1 + 1e-9); ++k) {
    const double v = k * ystep;
    s += "<line class=\"tick\" x1=\"" + num(left - 5) + "\" x2=\"" + num(left) + "\" y1=\"" + y(v)
         + "\" y2=\"" + y(v) + "\"/><text x=\"" + num(left - 8) + "\" y=\"" + y(v)
         + "\" dy=\"4\" text-anchor=\"end\">" + num(v, 3) + "</text>\n";
  }
  const std::string ylx = num(left - 60), yly = num(tput_top + tput_h / 2);
  s += "<text x=\"" + ylx + "\" y=\"" + yly + "\" transform=\"rotate(-90 " + ylx + " " + yly
       + ")\" text-anchor=\"middle\">tokens/s</text>\n";
  if (pts.empty())
    s += "<text class=\"empty\" x=\"" + num(left + 8) + "\" y=\"" + num(tput_top + 16)
         + "\">no throughput samples</text>\n";
  std::string points;
  for (auto& p : pts)
    points += (points.empty() ? "" : " ") + x(p.at_ms) + "," + y(p.tokens_per_s);
  if (pts.size() == 1)
    s += "<circle class=\"tput\" cx=\"" + x(pts[0].at_ms) + "\" cy=\"" + y(pts[0].tokens_per_s)
         + "\" r=\"3\"/>\n";
  else if (!pts.empty())
    s += "<polyline class=\"tput\" points=\"" + points + "\"/>\n";

  // Marks over everything, label at the top of the line; full text on hover.
  for (std::size_t k = 0; k < marks.size(); ++k) {
    auto& m = *marks[k];
    double label_y = 10 + label_row_h * (mark_row[k] + 1) - 3;
    s += "<g class=\"mark " + std::string(mark_class(m.kind)) + "\"><title>" + esc(m.kind) + " at "
         + num(m.at_ms, 3) + " ms: " + esc(m.label) + "</title><line x1=\"" + x(m.at_ms)
         + "\" x2=\"" + x(m.at_ms) + "\" y1=\"" + num(label_y + 3) + "\" y2=\""
         + num(tput_bottom) + "\"/><text x=\"" + num(px(m.at_ms) + 3)
         + "\" y=\"" + num(label_y) + "\">" + esc(shorten(m.label, label_chars_max))
         + "</text></g>\n";
  }

  // Legend: the six states, then the four kinds of marks.
  double lx = left;
  for (auto st : all_states) {
    std::string name(to_string(st));
    s += "<rect class=\"swatch " + name + "\" x=\"" + num(lx) + "\" y=\"" + num(legend_y - 10)
         + "\" width=\"14\" height=\"12\"/><text x=\"" + num(lx + 18) + "\" y=\""
         + num(legend_y) + "\">" + name + "</text>";
    lx += 30 + 6 * name.size();
  }
  for (const char* kind : {"sync", "fault", "heal", "detect"}) {
    s += "<g class=\"mark " + std::string(kind) + "\"><line x1=\"" + num(lx) + "\" x2=\""
         + num(lx) + "\" y1=\"" + num(legend_y - 12) + "\" y2=\"" + num(legend_y + 3)
         + "\"/></g><text x=\"" + num(lx + 5) + "\" y=\"" + num(legend_y) + "\">" + kind
         + "</text>";
    lx += 20 + 6 * std::string_view(kind).size();
  }
  s += "\n</svg>\n";
  return s;
}

} // namespace

std::string drill_report_html(const drill_record& r) {
  const bool ok = r.passed();
  const char* verdict = ok ? "PASSED" : "FAILED";
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>"
                  + esc(r.name) + " \u2014 " + verdict + "</title>\n<style>" + page_style
                  + "</style>\n</head>\n<body>\n";
  h += "<h1>Drill: " + esc(r.name) + "</h1>\n";
  h += "<p class=\"verdict " + std::string(ok ? "passed" : "failed") + "\">" + verdict + "</p>\n";
  h += "<p class=\"meta\">source: " + esc(r.source) + " \u00b7 duration: " + num(r.duration_ms, 3)
       + " ms \u00b7 engines: " + std::to_string(r.engines.size()) + "</p>\n";

  h += "<h2>Invariants</h2>\n";
  if (r.invariants.empty()) {
    h += "<p>No invariant was checked, so the drill cannot pass.</p>\n";
  } else {
    h += "<table>\n<tr><th>Invariant</th><th>Result</th><th>Evidence</th></tr>\n";
    for (auto& i : r.invariants)
      h += "<tr><td>" + esc(i.name) + "</td>"
           + (!i.judged ? "<td class=\"reported\">reported, not judged</td>"
              : i.held  ? "<td class=\"held\">held</td>"
                        : "<td class=\"violated\">violated</td>")
           + "<td>" + esc(i.evidence) + "</td></tr>\n";
    h += "</table>\n";
  }

  h += "<h2>Figures</h2>\n";
  if (r.figures.empty()) {
    h += "<p>No figures.</p>\n";
  } else {
    h += "<table>\n<tr><th>Figure</th><th>Value</th><th>Unit</th><th>Target</th></tr>\n";
    for (auto& f : r.figures)
      h += "<tr><td>" + esc(f.name) + "</td><td class=\"num\">" + num(f.value, 3) + "</td><td>"
           + esc(f.unit) + "</td><td>" + esc(f.target) + "</td></tr>\n";
    h += "</table>\n";
  }

  h += "<h2>Timeline</h2>\n" + svg_timeline(r);

  h += "<h2>Log</h2>\n";
  if (r.log.empty()) {
    h += "<p>No log lines.</p>\n";
  } else {
    h += "<pre>";
    for (auto& line : r.log)
      h += esc(line) + "\n";
    h += "</pre>\n";
  }
  h += "</body>\n</html>\n";
  return h;
}

namespace {

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out)
    throw std::runtime_error("cannot write drill report " + path.string());
}

} // namespace

void write_drill_report(const drill_record& r, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw std::runtime_error("cannot create drill report directory " + dir + ": " + ec.message());
  write_file(std::filesystem::path(dir) / "report.json", drill_report_json(r));
  write_file(std::filesystem::path(dir) / "report.html", drill_report_html(r));
}

} // namespace rlsync
