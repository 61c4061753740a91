#include "actors/jobs/drill_faults.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

namespace rlsync::jobs {

std::string fault_label(const fault_spec& f) {
  std::string s = std::string(to_string(f.action)) + " " + f.target;
  if (f.at_sync)
    s += " (sync " + std::to_string(*f.at_sync) + " "
         + (f.phase == sync_phase::resume ? std::string("continue") : std::string(to_string(f.phase))) + ")";
  else if (f.at)
    s += " (at " + std::to_string(f.at->count()) + " ms)";
  if (f.duration)
    s += " for " + std::to_string(f.duration->count()) + " ms";
  return s;
}

std::string unsupported_fault(const fault_spec& f) {
  if (f.target_kind == fault_target::node && (f.action == fault_action::kill || f.action == fault_action::restart))
    return std::string(to_string(f.action)) + " of a whole node needs the multi-process drill; target its engines";
  return {};
}

bool fault_has_end(const fault_spec& f) {
  if (!f.duration)
    return false;
  if (f.target_kind == fault_target::engine || f.target_kind == fault_target::node)
    return true;
  return f.action == fault_action::kill;
}

bool holds_layers_alone(const topology& t, const std::string& node) {
  // What ranks hold: (layer, -1) for a layer's dense tensors, (layer, e)
  // for expert e of a sparse layer when some rank holds only some experts.
  const auto& c = t.model.config;
  const bool split_experts = std::any_of(t.trainer.ranks.begin(), t.trainer.ranks.end(),
                                         [](const trainer_rank& r) { return r.experts.has_value(); });
  std::set<std::pair<std::int64_t, std::int64_t>> here, elsewhere;
  for (const auto& r : t.trainer.ranks)
    for (auto l : r.layers) {
      auto& held = r.node == node ? here : elsewhere;
      held.insert({l, -1});
      if (split_experts && c.sparse_layer(l))
        for (std::int64_t e = 0; e < c.num_experts; ++e)
          if (!r.experts || std::binary_search(r.experts->begin(), r.experts->end(), e))
            held.insert({l, e});
    }
  if (t.trainer.ranks.empty() && t.trainer.node == node)
    return true;
  return std::any_of(here.begin(), here.end(), [&](const auto& unit) { return !elsewhere.count(unit); });
}

std::int64_t engines_killed_at_once(const topology& t) {
  // Key: when the kill fires ("ms:4000", "sync:16:transfer"); value: engines it takes.
  std::map<std::string, std::set<std::string>> killed;
  for (const auto& f : t.drill.faults) {
    bool cuts_holder = f.action == fault_action::partition && f.target_kind == fault_target::node;
    // A corruption takes its engine out of the round too: its update fails
    // and it is evicted.
    if (f.action != fault_action::kill && f.action != fault_action::kill_worker && f.action != fault_action::corrupt
        && !cuts_holder)
      continue;
    if (f.action == fault_action::corrupt && f.at)
      continue; // its eviction comes at some later round's transfer: no moment to group it with
    std::string when = f.at ? "ms:" + std::to_string(f.at->count())
                            : "sync:" + std::to_string(f.at_sync.value_or(0)) + ":" + std::string(to_string(f.phase));
    if (f.action == fault_action::corrupt) { // it evicts its engine at that round's transfer, or the next round's
      auto round = f.at_sync.value_or(0) + (f.phase > sync_phase::transfer ? 1 : 0);
      when = "sync:" + std::to_string(round) + ":" + std::string(to_string(sync_phase::transfer));
    }
    auto& set = killed[when];
    // Killed (or cut off) as a transfer goes out, the only holder of some
    // layer leaves every engine with part of the update: all of them stay
    // dirty until the next round.
    bool takes_fleet = f.at_sync && f.phase == sync_phase::transfer
                       && ((f.target_kind == fault_target::trainer && t.trainer.ranks.size() <= 1)
                           || (f.target_kind == fault_target::node && holds_layers_alone(t, f.target)));
    for (const auto& e : t.engines) {
      bool its_own = (f.target_kind == fault_target::engine && e.name == f.target)
                     || (f.target_kind == fault_target::node && e.node == f.target);
      if (takes_fleet || (its_own && !cuts_holder)) // a partitioned engine is not killed
        set.insert(e.name);
    }
  }
  std::size_t most = 0;
  for (const auto& [when, engines] : killed)
    most = std::max(most, engines.size());
  return static_cast<std::int64_t>(most);
}

namespace {

/// Fault `a` (index ia) surely fires after fault `b` (index ib): by time,
/// or by round and phase; at the same moment, by their order in the list
/// (as the drill fires them). A timed and a round-based fault fire in no
/// order known beforehand: false.
bool fires_after(const fault_spec& a, std::size_t ia, const fault_spec& b, std::size_t ib) {
  if (a.at && b.at)
    return *a.at != *b.at ? *a.at > *b.at : ia > ib;
  if (a.at_sync && b.at_sync && (*a.at_sync != *b.at_sync || a.phase != b.phase))
    return *a.at_sync != *b.at_sync ? *a.at_sync > *b.at_sync : a.phase > b.phase;
  return a.at_sync && b.at_sync && ia > ib;
}

/// Fault i takes its target out with nothing in the drill to bring it back.
bool out_for_good(const topology& t, std::size_t i) {
  const auto& f = t.drill.faults[i];
  if (f.duration)
    return false;
  if (f.action == fault_action::kill || f.action == fault_action::kill_worker)
    return true;
  if (f.action != fault_action::partition)
    return false;
  // A heal of the same target that surely fires later ends it; one whose
  // order is not known beforehand leaves the engine excused, not required.
  for (std::size_t j = 0; j < t.drill.faults.size(); ++j)
    if (t.drill.faults[j].action == fault_action::heal && t.drill.faults[j].target == f.target
        && fires_after(t.drill.faults[j], j, f, i))
      return false;
  return true;
}

/// The node a fault takes whole: with processes its target's node (a
/// kill_worker stays in its engine); in one process only a node target.
std::string node_taken(const fault_spec& f, const fault_node_fn& node_hit) {
  if (f.action == fault_action::kill_worker)
    return {};
  if (node_hit)
    return node_hit(f);
  return f.target_kind == fault_target::node ? f.target : std::string();
}

bool hosts_trainer(const topology& t, const std::string& node) {
  if (t.trainer.ranks.empty())
    return t.trainer.node == node;
  return std::any_of(t.trainer.ranks.begin(), t.trainer.ranks.end(),
                     [&](const trainer_rank& r) { return r.node == node; });
}

} // namespace

std::set<std::string> engines_lost_by_design(const topology& t, const fault_node_fn& node_hit) {
  std::set<std::string> lost;
  for (std::size_t i = 0; i < t.drill.faults.size(); ++i) {
    const auto& f = t.drill.faults[i];
    if (!out_for_good(t, i))
      continue;
    const auto node = node_taken(f, node_hit);
    for (const auto& e : t.engines)
      if ((f.target_kind == fault_target::engine && e.name == f.target) || (!node.empty() && e.node == node))
        lost.insert(e.name);
  }
  return lost;
}

bool trainer_lost_by_design(const topology& t, const fault_node_fn& node_hit) {
  for (std::size_t i = 0; i < t.drill.faults.size(); ++i) {
    const auto& f = t.drill.faults[i];
    if (!out_for_good(t, i))
      continue;
    if (f.target_kind == fault_target::trainer && f.action == fault_action::kill)
      return true;
    if (auto node = node_taken(f, node_hit); !node.empty() && hosts_trainer(t, node))
      return true;
  }
  return false;
}

std::string refuse_drill(const topology& t, const std::function<std::string(std::size_t)>& place) {
  if (t.drill.faults.empty())
    return "no drill.faults: nothing to rehearse (see configs/drills/)";
  for (std::size_t i = 0; i < t.drill.faults.size(); ++i)
    if (auto why = unsupported_fault(t.drill.faults[i]); !why.empty())
      return (place ? place(i) + ": " : std::string()) + "drill.faults[" + std::to_string(i) + "]: " + why;
  return {};
}

fault_schedule::fault_schedule(std::vector<fault_spec> faults) {
  faults_.reserve(faults.size());
  for (auto& f : faults)
    faults_.push_back({std::move(f)});
}

std::vector<std::size_t> fault_schedule::take_at_phase(std::uint64_t round, sync_phase phase) {
  std::vector<std::size_t> due;
  for (std::size_t i = 0; i < faults_.size(); ++i) {
    auto& f = faults_[i];
    if (!f.queued && f.spec.at_sync && *f.spec.at_sync >= 0 && static_cast<std::uint64_t>(*f.spec.at_sync) == round
        && f.spec.phase == phase) {
      f.queued = true;
      due.push_back(i);
    }
  }
  return due;
}

std::vector<std::size_t> fault_schedule::take_due_by(duration elapsed) {
  std::vector<std::size_t> due;
  for (std::size_t i = 0; i < faults_.size(); ++i) {
    auto& f = faults_[i];
    if (!f.queued && f.spec.at && elapsed >= *f.spec.at) {
      f.queued = true;
      due.push_back(i);
    }
  }
  // Due in the same poll: by their time, then in drill order.
  std::stable_sort(due.begin(), due.end(), [&](std::size_t a, std::size_t b) { return *faults_[a].spec.at < *faults_[b].spec.at; });
  return due;
}

void fault_schedule::settle(std::size_t i, bool fired) {
  auto& f = faults_.at(i);
  f.queued = true;
  f.fired = true;
  f.skipped = !fired;
}

bool fault_schedule::landed(const std::vector<std::size_t>& due) const {
  return std::all_of(due.begin(), due.end(), [&](std::size_t i) {
    return faults_.at(i).fired || faults_.at(i).spec.action == fault_action::restart;
  });
}

bool fault_schedule::all_settled() const {
  return std::all_of(faults_.begin(), faults_.end(), [](const pending& f) { return f.fired; });
}

void fault_schedule::end_at(std::size_t i, duration at) {
  if (i >= faults_.size())
    throw std::out_of_range("fault_schedule::end_at: no fault " + std::to_string(i));
  if (std::any_of(ends_.begin(), ends_.end(), [&](const end& e) { return e.fault == i; }))
    return; // a fault ends once
  ends_.push_back({at, i});
}

std::vector<std::size_t> fault_schedule::take_ends_due(duration elapsed) {
  std::vector<end> due;
  for (auto e = ends_.begin(); e != ends_.end();) {
    if (elapsed >= e->at) {
      due.push_back(*e);
      e = ends_.erase(e);
    } else {
      ++e;
    }
  }
  std::stable_sort(due.begin(), due.end(), [](const end& a, const end& b) { return a.at < b.at; });
  std::vector<std::size_t> out;
  for (auto& e : due)
    out.push_back(e.fault);
  return out;
}

std::vector<std::size_t> fault_schedule::never_fired() const {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < faults_.size(); ++i)
    if (!faults_[i].fired)
      out.push_back(i);
  return out;
}

invariant_result fault_schedule::fired_invariant() const {
  bool held = std::all_of(faults_.begin(), faults_.end(), [](const pending& f) { return f.fired && !f.skipped; });
  std::string evidence;
  for (std::size_t i = 0; i < faults_.size(); ++i)
    evidence += (i ? "; " : "") + fault_label(faults_[i].spec)
                + (faults_[i].skipped ? ": skipped (not in one process)" : faults_[i].fired ? ": fired" : ": NEVER FIRED");
  return {"every scheduled fault fired", held, evidence};
}

} // namespace rlsync::jobs
