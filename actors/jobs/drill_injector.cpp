#include "actors/jobs/drill_injector.hpp"

#include "actors/jobs/drill_faults.hpp"
#include "actors/workload.hpp"

#include <caf/send.hpp>

#include <chrono>

namespace rlsync::jobs {

fault_injector::fault_injector(caf::actor_system& sys, const topology& t, local_deployment& d,
                               const caf::actor& workload, hooks h)
  : sys_(sys), t_(t), d_(d), workload_(workload), h_(std::move(h)) {}

std::vector<std::size_t> fault_injector::engines_of(const fault_spec& f) const {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < t_.engines.size(); ++i)
    if ((f.target_kind == fault_target::engine && t_.engines[i].name == f.target)
        || (f.target_kind == fault_target::node && t_.engines[i].node == f.target))
      out.push_back(i);
  return out;
}

bool fault_injector::fire(const fault_spec& spec) {
  if (!unsupported_fault(spec).empty())
    return false;
  h_.mark("fault", fault_label(spec));
  h_.note("drill: fault: " + fault_label(spec));
  const bool kill = spec.action == fault_action::kill, restart = spec.action == fault_action::restart;
  switch (spec.target_kind) {
    case fault_target::router:
      if (kill)
        caf::anon_send_exit(d_.router, caf::exit_reason::kill);
      else if (restart)
        restart_router();
      return true;
    case fault_target::coordinator:
      if (kill)
        caf::anon_send_exit(d_.coordinator, caf::exit_reason::kill);
      else if (restart)
        restart_coordinator(true);
      return true;
    case fault_target::trainer:
      if (kill)
        caf::anon_send_exit(d_.trainer.actor, caf::exit_reason::kill);
      else if (restart)
        restart_trainer();
      return true;
    case fault_target::engine:
    case fault_target::node:
      break;
  }
  auto now = std::chrono::steady_clock::now();
  for (auto i : engines_of(spec)) {
    const auto& name = t_.engines[i].name;
    if (spec.action != fault_action::heal)
      h_.hit(name, spec.action);
    switch (spec.action) {
      case fault_action::kill:
        caf::anon_send_exit(d_.engines[i], caf::exit_reason::kill);
        h_.lane(name, lane_state::dead);
        break;
      case fault_action::restart:
        restart_engine(i);
        break;
      case fault_action::partition:
        d_.gates[i]->partitioned = true;
        break;
      case fault_action::heal:
        d_.gates[i]->partitioned = false;
        break;
      case fault_action::delay_acks: {
        auto hold = spec.duration.value_or(2 * t_.sync.deadlines.pause);
        d_.gates[i]->acks_held_until_ns = (now + hold).time_since_epoch().count();
        break;
      }
      case fault_action::corrupt:
        d_.trainer.transfer->corrupt({name, -1, 0, 0, 1});
        break;
      case fault_action::kill_worker:
        // The engine applies it at its next heartbeat or step, reports the
        // failure and stops; the coordinator evicts it.
        d_.gates[i]->kill_worker = static_cast<int>(spec.worker);
        d_.gates[i]->kill_rank = static_cast<int>(spec.dp_rank);
        h_.lane(name, lane_state::dead);
        break;
    }
  }
  return true;
}

void fault_injector::end(const fault_spec& spec) {
  switch (spec.target_kind) {
    case fault_target::router:
      h_.mark("heal", "restart router");
      restart_router();
      return;
    case fault_target::coordinator:
      h_.mark("heal", "restart coordinator");
      restart_coordinator(false);
      return;
    case fault_target::trainer:
      h_.mark("heal", "restart trainer");
      restart_trainer();
      return;
    case fault_target::engine:
    case fault_target::node:
      break;
  }
  for (auto i : engines_of(spec)) {
    if (spec.action == fault_action::partition)
      d_.gates[i]->partitioned = false;
    else if (spec.action == fault_action::kill || spec.action == fault_action::kill_worker)
      restart_engine(i);
    // delay_acks ends by itself at its time
  }
  const bool killed = spec.action == fault_action::kill || spec.action == fault_action::kill_worker;
  h_.mark("heal", (killed ? "restart " : "heal ") + spec.target);
  h_.note("drill: end of fault: " + fault_label(spec));
}

void fault_injector::restart_engine(std::size_t i) {
  const auto& name = t_.engines[i].name;
  h_.lane(name, lane_state::rejoining);
  auto refused = d_.restart_engine(sys_, t_, i);
  if (!refused.empty()) {
    h_.note("drill: " + name + " restart refused: " + refused);
    caf::anon_send_exit(d_.engines[i], caf::exit_reason::kill); // a retired replica's process stops
    h_.lane(name, lane_state::dead);
  } else {
    h_.note("drill: " + name + " restarted as incarnation " + std::to_string(d_.incarnations[i]));
  }
}

void fault_injector::restart_router() {
  set_workload_router(workload_, d_.restart_router(sys_));
  h_.note("drill: router restarted; the requests the old one held are resent as continuations");
}

void fault_injector::restart_coordinator(bool kill_first) {
  try {
    d_.restart_coordinator(sys_, t_, kill_first);
    h_.note("drill: coordinator restarted from " + t_.coordinator.state_file);
  } catch (const std::exception& e) {
    h_.note(std::string("drill: coordinator restart failed: ") + e.what());
  }
}

void fault_injector::restart_trainer() {
  if (auto why = d_.restart_trainer(sys_, t_); !why.empty())
    h_.note("drill: trainer restart failed: " + why);
  else
    h_.note("drill: trainer restarted on the same source");
}

} // namespace rlsync::jobs
