#pragma once
// A scripted trainer for tests on the deterministic scheduler
// (actor_fixture.hpp): it holds no weights, reports the version its script
// says, records its subscribers and the versions rounds pin, and publishes a
// version to every subscriber when the test tells it to. One thread runs
// every actor here: no locks.
#include "actors/interfaces.hpp"
#include "runtime/base/checksum.hpp"

#include <caf/atom.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <cstdint>
#include <functional>
#include <utility>
#include <memory>
#include <vector>

namespace rlsync::test {

/// What the trainer reports and saw; shared with the test.
struct trainer_script {
  version_info current{2, 4, 4096}; ///< answered to version, freeze and step
  std::vector<version_listener_actor> listeners;
  std::vector<std::uint64_t> pins;
  std::vector<std::uint64_t> catch_ups; ///< versions the coordinator told it to catch up to
  std::vector<engine_placement> placements; ///< as the coordinator last told
  /// Heartbeats go unanswered (a partitioned trainer rank).
  bool silent = false;
  /// Version queries are held unanswered (a trainer busy in a long step).
  bool hold_version = false;
  std::vector<caf::typed_response_promise<version_info>> held_versions;
  /// Whole-group pulls: 0 refuses each at once (it holds no weights);
  /// otherwise each is held unanswered until this many are, then all are
  /// refused together ("answered together"), showing how many a puller asks ahead.
  std::size_t pulls_answered_together = 0;
  std::vector<caf::typed_response_promise<weight_bucket>> held_pulls;
  /// Answers cuda_ipc pulls (a producer that may lie); none: refuse them.
  std::function<caf::result<ipc_chunk>(const ipc_pull&)> ipc;
  std::vector<ipc_pull> ipc_releases; ///< releases received, in order
  /// Answers nccl pulls (a trainer that may lie); none: refuse them.
  std::function<caf::result<nccl_chunk>(const nccl_pull&)> nccl;
  /// Answers plan registrations (sharded nccl pulls); none: the plan's
  /// checksum64, as a trainer rank that took it. Each one lands in nccl_plans.
  std::function<caf::result<std::uint64_t>(const nccl_plan&)> nccl_plan_answer;
  std::vector<nccl_plan> nccl_plans;
  /// Answers collective broadcast asks (a trainer that may lie); none: refuse them.
  std::function<caf::result<nccl_manifest>(const nccl_pull&)> nccl_broadcast;
  /// Answers the coordinator's ask for a unique id; none: refuse it.
  std::function<caf::result<std::vector<std::uint8_t>>()> nccl_id;
  /// Keep every ask for an id unanswered, in held_ids, until the test delivers it.
  bool hold_nccl_ids = false;
  std::vector<caf::typed_response_promise<std::vector<std::uint8_t>>> held_ids;
  /// Whether it joins a rendezvous (answering its epoch); every one it
  /// was sent lands in nccl_joins.
  bool nccl_joins_ok = false;
  std::vector<nccl_rendezvous_msg> nccl_joins;
  /// Every member death the coordinator told it of: (epoch, who).
  std::vector<std::pair<std::uint64_t, std::string>> nccl_dead;
};

/// A trainer that also takes `publish`: make this the current version and
/// tell every subscriber.
/// Answers every held id ask with nccl_id() (an error without it).
using release_ids_atom = caf::atom_constant<caf::atom("relids")>;

using scripted_trainer_actor =
  trainer_actor::extend<caf::reacts_to<caf::publish_atom, version_info>, caf::reacts_to<release_ids_atom>>;

inline scripted_trainer_actor::behavior_type
scripted_trainer(scripted_trainer_actor::pointer self, std::shared_ptr<trainer_script> script) {
  return {
    [=](meta_atom) { return std::vector<tensor_meta>{}; },
    [=](version_atom) -> caf::result<version_info> {
      if (!script->hold_version)
        return script->current;
      auto rp = self->make_response_promise<version_info>();
      script->held_versions.push_back(rp);
      return rp;
    },
    [=](pull_atom, std::uint64_t, std::uint32_t) -> caf::result<weight_bucket> {
      if (script->pulls_answered_together == 0)
        return make_error(errc::unknown_name, "the scripted trainer holds no weights");
      auto rp = self->make_response_promise<weight_bucket>();
      script->held_pulls.push_back(rp);
      if (script->held_pulls.size() >= script->pulls_answered_together) {
        for (auto& held : script->held_pulls)
          held.deliver(make_error(errc::unknown_name, "answered together with "
                                                        + std::to_string(script->held_pulls.size()) + " pulls"));
        script->held_pulls.clear();
      }
      return rp;
    },
    [=](subscribe_atom, const version_listener_actor& l) { script->listeners.push_back(l); },
    [=](freeze_atom) { return script->current; },
    [=](pin_atom, std::uint64_t v) { script->pins.push_back(v); },
    [=](catch_up_atom, std::uint64_t v) { script->catch_ups.push_back(v); },
    [=](step_atom) { return script->current; },
    [=](heartbeat_atom, const heartbeat& hb) -> caf::result<heartbeat> {
      if (script->silent)
        return self->make_response_promise<heartbeat>(); // never delivered: the asker times out
      return hb;
    },
    [=](ucx_ticket_atom, const std::string&, std::int32_t) -> caf::result<ucx_ticket> {
      return make_error(errc::unknown_name, "the scripted trainer runs no UCX producer");
    },
    [=](ipc_pull_atom, const ipc_pull& req) -> caf::result<ipc_chunk> {
      if (!script->ipc)
        return make_error(errc::unknown_name, "the scripted trainer runs no cuda_ipc producer");
      return script->ipc(req);
    },
    [=](ipc_release_atom, const ipc_pull& req) { script->ipc_releases.push_back(req); },
    [=](nccl_pull_atom, const nccl_pull& req) -> caf::result<nccl_chunk> {
      if (!script->nccl)
        return make_error(errc::unknown_name, "the scripted trainer runs no nccl sender");
      return script->nccl(req);
    },
    [=](nccl_broadcast_atom, const nccl_pull& req) -> caf::result<nccl_manifest> {
      if (!script->nccl_broadcast)
        return make_error(errc::unknown_name, "the scripted trainer broadcasts nothing");
      return script->nccl_broadcast(req);
    },
    [=](nccl_plan_atom, const nccl_plan& req) -> caf::result<std::uint64_t> {
      script->nccl_plans.push_back(req);
      if (script->nccl_plan_answer)
        return script->nccl_plan_answer(req);
      return checksum64(req.plan.data(), req.plan.size());
    },
    [=](nccl_id_atom) -> caf::result<std::vector<std::uint8_t>> {
      if (script->hold_nccl_ids) {
        script->held_ids.push_back(self->make_response_promise<std::vector<std::uint8_t>>());
        return script->held_ids.back();
      }
      if (!script->nccl_id)
        return make_error(errc::unknown_name, "the scripted trainer makes no nccl ids");
      return script->nccl_id();
    },
    [=](nccl_join_atom, const nccl_rendezvous_msg& msg) -> caf::result<std::uint64_t> {
      script->nccl_joins.push_back(msg);
      if (!script->nccl_joins_ok)
        return make_error(errc::unknown_name, "the scripted trainer joins no nccl communicator");
      return msg.epoch;
    },
    [=](nccl_dead_atom, std::uint64_t epoch, const std::string& who) { script->nccl_dead.emplace_back(epoch, who); },
    [=](register_atom, const std::vector<engine_placement>& placements) { script->placements = placements; },
    [=](release_ids_atom) {
      for (auto& rp : std::exchange(script->held_ids, {})) {
        if (!script->nccl_id) {
          rp.deliver(make_error(errc::unknown_name, "the scripted trainer makes no nccl ids"));
          continue;
        }
        auto id = script->nccl_id();
        if (id.flag == caf::rt_value && id.value.match_elements<std::vector<std::uint8_t>>())
          rp.deliver(id.value.get_as<std::vector<std::uint8_t>>(0));
        else
          rp.deliver(make_error(errc::unknown_name, "the scripted trainer made no id"));
      }
    },
    [=](caf::publish_atom, const version_info& vi) {
      script->current = vi;
      for (auto& l : script->listeners)
        self->send(l, version_atom::value, vi);
    },
  };
}

} // namespace rlsync::test
