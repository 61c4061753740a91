#pragma once
// Fires a drill's faults on a deployment in this process, and ends them.
// An engine's "process" is its actor: kill = the actor is killed; restart =
// a new actor, next incarnation, registered; partition = its messages are
// dropped and it stops stepping (engine_fault_gate); delay_acks = its phase
// acknowledgements are held; corrupt = the data plane alters one group it
// receives. The trainer is killed and restarted on the same source (its
// checkpoints survive it). The coordinator is killed and restarted from its
// state file; live engines re-register as they are. The router is killed and
// restarted: the coordinator routes the current engines to the new one and
// the requester resends what the old one held as continuations. Whole-node
// kills are refused (they need processes).
#include "actors/assembly/local_deployment.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/drill/drill_report.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <functional>
#include <string>

namespace rlsync::jobs {

class fault_injector {
public:
  /// What the injector tells the drill; called on the caller's thread.
  struct hooks {
    std::function<void(const std::string& line)> note;
    std::function<void(const std::string& engine, lane_state state)> lane;
    std::function<void(const std::string& kind, const std::string& label)> mark;
    /// A fault hit `engine` now (for its detection and failover times).
    std::function<void(const std::string& engine, fault_action action)> hit;
  };

  /// `d` and `workload` (the requester, told about a new router) belong to
  /// the caller and outlive the injector.
  fault_injector(caf::actor_system& sys, const topology& t, local_deployment& d, const caf::actor& workload,
                 hooks h);

  /// Fires `spec` now. Blocking (restarts wait for registration): call it
  /// from a thread that is not an actor. False: skipped (not in one process).
  bool fire(const fault_spec& spec);

  /// Ends `spec` (fault_has_end): heals a partition, restarts what was killed.
  void end(const fault_spec& spec);

private:
  std::vector<std::size_t> engines_of(const fault_spec& f) const;
  void restart_engine(std::size_t i);
  void restart_router();
  void restart_coordinator(bool kill_first);
  void restart_trainer();

  caf::actor_system& sys_;
  const topology& t_;
  local_deployment& d_;
  const caf::actor& workload_;
  hooks h_;
};

} // namespace rlsync::jobs
