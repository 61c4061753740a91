#pragma once
// The coordinator's internals shared by its translation units:
// coordinator.cpp (the sync round top to bottom, the behaviour),
// coordinator_membership.cpp (engines joining, leaving and dying, the
// trainer, heartbeats) and coordinator_ranks.cpp (trainer ranks:
// registration, following, the version barrier, catch-up orders). Nothing
// else includes it.

#include "actors/coordinator.hpp"

#include <caf/actor_cast.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rlsync::coordinator_detail {

using self_ptr = coordinator_impl_actor::stateful_pointer<coordinator_state>;

// -- defined in coordinator.cpp ---------------------------------------------------

std::uint64_t now_ns(self_ptr self);
void log_line(self_ptr self, const std::string& line);
/// Moves the round on as far as it goes; every handler ends here.
void settle(self_ptr self);
void abort_round(self_ptr self, const std::string& why);
/// A version the round may sync to (never backwards).
void on_version(self_ptr self, const version_info& vi);
void member_event(self_ptr self, const std::string& engine, const char* what);
/// Writes the state file (when configured); a failed write is logged.
void persist(self_ptr self);
/// sync.min_live_engines: raises the alert once per fall below it.
void check_min_live(self_ptr self);
/// Takes an engine out of the round and out of routing.
/// `untouched`: the engine's weights are known whole (it never began this
/// round's update), so an eviction in an update phase leaves it clean.
void evict(self_ptr self, const std::string& name, const std::string& why, bool untouched = false);

// -- defined in coordinator_membership.cpp ------------------------------------------

void tell_placements(self_ptr self, const trainer_actor& trainer);
/// Forgets an engine: it left, died, or a newer incarnation replaced it.
void drop_member(self_ptr self, std::string name, const std::string& why, bool replaced = false);
/// A registration: refused with an error, or the member joins; returns
/// whether it is routable at once.
caf::expected<bool> on_register(self_ptr self, const engine_info& info, const rollout_engine_actor& engine);
/// Why the current message may not register `member` as `handle` (or
/// deregister it: no handle), see coordinator_config::origin; empty: it may.
std::string origin_problem(self_ptr self, const std::string& member, const caf::actor_addr& handle = {});
void on_down(self_ptr self, const caf::down_msg& dm);
/// A (restarted) trainer: follow its versions, pin the next rounds there.
void attach_trainer(self_ptr self, trainer_actor trainer);
/// Records that member `name` (at `who`) answered; true when that changed
/// something beyond the time (it was unreachable), so the round may move.
bool heard_from(self_ptr self, const std::string& name, const caf::actor_addr& who);
/// Every heartbeat_interval: who has been silent too long, then the next heartbeats.
void heartbeat_tick(self_ptr self);
/// An answer to the last tick's heartbeats (a plain message): its sender is
/// alive. True when it was unreachable (the round may move).
bool heard_heartbeat(self_ptr self);
/// `who` was sent the last tick's heartbeat and is still that member or rank.
bool is_heartbeat_target(const coordinator_state& st, const caf::actor_addr& who);

/// Asks `trainer` (or a rank) for the version it holds, within
/// trainer_deadline: the answer goes to `heard` and the round may then move;
/// a refusal or silence goes to `failed`.
template <class Heard, class Failed>
void ask_version(self_ptr self, const trainer_actor& trainer, Heard heard, Failed failed) {
  self->request(trainer, self->state.cfg.trainer_deadline, version_atom::value)
    .then(
      [=](version_info& vi) {
        heard(vi);
        settle(self);
      },
      [=](caf::error& err) {
        failed(err);
        settle(self);
      });
}

/// Follows a trainer (or rank) `who`: monitored, told where the engines run,
/// subscribed to its versions, and asked for its current one (versions
/// published before the subscription arrived), which goes to `heard`.
template <class Heard>
void follow_trainer(self_ptr self, const trainer_actor& trainer, const std::string& who, Heard heard) {
  self->monitor(trainer);
  tell_placements(self, trainer);
  self->send(trainer, subscribe_atom::value, caf::actor_cast<version_listener_actor>(self));
  ask_version(self, trainer, std::move(heard), [=](const caf::error& err) {
    log_line(self, "coordinator: " + who + " did not report its version: " + self->system().render(err));
  });
}

/// A version answer from the single trainer as it was when asked: dropped
/// when that trainer was replaced since.
inline auto from_current_trainer(self_ptr self) {
  return [self, asked = self->state.cfg.trainer](const version_info& vi) {
    if (self->state.cfg.trainer == asked)
      on_version(self, vi);
  };
}

// -- defined in coordinator_ranks.cpp ---------------------------------------------

bool follows_ranks(const coordinator_state& st);
std::uint64_t cluster_newest(const coordinator_state& st);
bool ranks_live(const coordinator_state& st);
std::optional<std::uint32_t> sending_rank(self_ptr self);
void review_barrier(self_ptr self);
void on_rank_version(self_ptr self, std::uint32_t rank, const version_info& vi);
caf::expected<registration> on_register_rank(self_ptr self, const rank_info& info, const trainer_actor& handle);
void mark_rank_unreachable(self_ptr self, std::uint32_t r, std::uint64_t silent_ns);
bool heard_from_rank(self_ptr self, std::uint32_t r, const caf::actor_addr& who);
caf::result<std::uint32_t> freeze_ranks(self_ptr self);
/// Every registered rank for coordinator_status, by index.
std::vector<rank_status> rank_statuses(const coordinator_state& st);

// -- defined in coordinator_nccl.cpp ----------------------------------------------

/// transfer.backend nccl, at a round boundary: true when the communicator
/// serves the round as it is; false while a rendezvous builds the next one
/// (started here when none is in flight), whose end settles again.
bool nccl_ready(self_ptr self);
/// Something a member holds of the communicator may be broken (it failed a
/// transfer, restarted): the next boundary rebuilds it.
void nccl_suspect(self_ptr self, const std::string& member);
/// A round ended: engines left out of the last rendezvous are asked again.
void nccl_round_ended(self_ptr self);
/// Engine `name` (all its workers) died, or trainer rank `rank` died or
/// went silent (which aborts the round anyway): when it is a member of the
/// communicator joined, every other member's actor hears it (nccl_dead_atom,
/// once per epoch), so their waits on that epoch abort now rather than at
/// their deadlines, and the next boundary rebuilds. An engine that only went
/// silent is evicted alone: its NCCL threads may be fine.
void nccl_engine_lost(self_ptr self, const std::string& name, const std::string& why);
void nccl_rank_lost(self_ptr self, std::uint32_t rank, const std::string& why);

} // namespace rlsync::coordinator_detail
