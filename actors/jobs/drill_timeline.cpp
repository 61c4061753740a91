#include "actors/jobs/drill_timeline.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>

namespace rlsync::jobs {

namespace {

/// The unsigned decimal number at the start of `text`, or nullopt.
std::optional<unsigned long long> leading_number(const std::string& text, std::size_t at) {
  if (at >= text.size() || text[at] < '0' || text[at] > '9')
    return std::nullopt;
  errno = 0;
  char* end = nullptr;
  auto n = std::strtoull(text.c_str() + at, &end, 10);
  if (errno == ERANGE)
    return std::nullopt;
  return n;
}

} // namespace

std::optional<reroute_line> parse_reroute_line(const std::string& line) {
  static const std::string request = "request ", from = " rerouted from ", after = " after ";
  auto at = line.find(request);
  auto from_at = line.find(from);
  auto after_at = line.rfind(after);
  if (at == std::string::npos || from_at == std::string::npos || after_at == std::string::npos || from_at < at
      || after_at < from_at)
    return std::nullopt;
  auto id = leading_number(line, at + request.size());
  auto tokens = leading_number(line, after_at + after.size());
  if (!id || !tokens || *tokens > std::numeric_limits<std::uint32_t>::max())
    return std::nullopt;
  auto name_from = from_at + from.size();
  auto name_end = line.find(' ', name_from);
  if (name_end == std::string::npos || name_end == name_from)
    return std::nullopt;
  return reroute_line{*id, line.substr(name_from, name_end - name_from), static_cast<std::uint32_t>(*tokens)};
}

void drill_timeline::lane(double at_ms, const std::string& engine, lane_state state) {
  if (lanes_.size() >= max_events) {
    ++dropped_;
    return;
  }
  lanes_.push_back({at_ms, engine, state});
}

void drill_timeline::mark(double at_ms, const std::string& kind, const std::string& label) {
  if (marks_.size() >= max_events) {
    ++dropped_;
    return;
  }
  marks_.push_back({at_ms, kind, label});
}

void drill_timeline::on_phase(double at_ms, sync_phase phase, const std::vector<std::string>& engines) {
  for (auto& e : engines)
    if (phase == sync_phase::pause)
      lane(at_ms, e, lane_state::paused);
    else if (phase == sync_phase::transfer)
      lane(at_ms, e, lane_state::transferring);
  round_engines_ = engines;
}

void drill_timeline::on_member(double at_ms, const std::string& engine, const std::string& what,
                               bool workload_started) {
  if (what == "evicted" || what == "dirty")
    if (auto last = fault_action_.find(engine); last != fault_action_.end() && last->second == fault_action::corrupt)
      caught_.insert(engine);
  if (what == "routable") {
    lane(at_ms, engine, lane_state::generating);
  } else if (what == "registered") {
    if (!workload_started)
      return; // the cold start
    faulted_.insert(engine); // a restart, or a new coordinator's roll call
    lane(at_ms, engine, lane_state::rejoining);
  } else if (what == "evicted") {
    faulted_.insert(engine); // out of service: it has to rejoin
    if (!unreachable_.count(engine)) // a cut-off engine stays dead on its lane until it answers
      lane(at_ms, engine, lane_state::rejoining);
  } else if (what == "dirty") {
    faulted_.insert(engine);
    lane(at_ms, engine, lane_state::dirty);
  } else if (what == "unreachable" || what == "left" || what == "retired") {
    lane(at_ms, engine, lane_state::dead);
    faulted_.insert(engine);
    if (what == "unreachable")
      unreachable_.insert(engine);
    if (auto f = last_fault_ms_.find(engine); f != last_fault_ms_.end() && what != "retired") {
      double after = at_ms - f->second;
      mark(at_ms, "detect", engine + " " + what + " (" + std::to_string(static_cast<long long>(after)) + " ms after its fault)");
      if (what == "unreachable")
        detect_ms_.push_back(after);
    }
  } else if (what == "reachable") {
    unreachable_.erase(engine);
    lane(at_ms, engine, lane_state::rejoining);
  }
}

void drill_timeline::on_sync(double at_ms, const sync_report& r) {
  mark(at_ms, "sync", "v" + std::to_string(r.version) + (r.aborted ? " aborted" : ""));
  if (r.engines_synced > 0) // a round aborted after a wave: that wave's engines serve its version
    completed_versions_.insert(r.version);
  if (r.aborted) // engines that were not dirty serve their old version again
    for (auto& e : round_engines_)
      if (!std::count(r.evicted.begin(), r.evicted.end(), e))
        lane(at_ms, e, lane_state::generating);
}

void drill_timeline::on_fault(double at_ms, const std::string& engine, fault_action action) {
  last_fault_ms_[engine] = at_ms;
  fault_action_[engine] = action;
  faulted_.insert(engine);
}

void drill_timeline::on_reroute(const reroute_line& r) {
  if (watches_.size() < max_watches || watches_.count(r.request_id))
    watches_[r.request_id] = {r.tokens, r.engine};
}

void drill_timeline::on_token(double at_ms, std::uint64_t request_id, std::uint32_t index) {
  auto w = watches_.find(request_id);
  if (w == watches_.end() || index != w->second.index)
    return;
  if (auto f = last_fault_ms_.find(w->second.engine); f != last_fault_ms_.end()) {
    auto ms = at_ms - f->second;
    (fault_action_[w->second.engine] == fault_action::kill ? failover_kill_ms_ : failover_other_ms_).push_back(ms);
  }
  watches_.erase(w);
}

} // namespace rlsync::jobs
