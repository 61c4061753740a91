#pragma once
// The rollout-engine actor: one built-in engine (all its dp scheduler ranks and their tp
// workers) behind the rollout_engine_actor interface.
//
// The engine core is single-threaded; this actor owns it and is its only
// caller. Generation advances by `step` messages the actor sends itself, one
// engine step each, so every command (pause, status, a new request) is
// handled between two steps and the mailbox is never blocked for longer than
// one step. Spawn it detached so that steps never occupy a scheduler worker.
//
//   generate ─► core.add ─► step, step, ... ─► tokens to the sink, one by one
//                                          └─► result to the requester
//   pause ─► core.pause ─► (wait: steps until idle) ─► pause_report
//
// Tokens are sent to their sink from inside the step that produced them,
// before any later message of this actor: a pause reply therefore follows
// every token produced before the pause.
#include "actors/interfaces.hpp"
#include "actors/phase_orders.hpp"
#include "actors/sender_guard.hpp"
#include "runtime/engine/engine_core.hpp"
#include "runtime/transfer/holder_pull.hpp"
#include "runtime/transfer/packing.hpp"
#include "runtime/transfer/puller.hpp"

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>

namespace rlsync {

struct engine_metrics; // actors/fleet_metrics.hpp

/// Faults a drill injects into an in-process engine, shared
/// between the engine actor and the drill runner; thread-safe.
struct engine_fault_gate {
  /// Cut off: every message from outside is dropped unanswered and the
  /// engine stops stepping (a partitioned or hung process). Its own pulls
  /// and timers still arrive, so that it is whole again when healed.
  std::atomic<bool> partitioned{false};
  /// Phase acknowledgements are held until this steady-clock time (ns
  /// since the clock's epoch): a straggler past the phase deadline. 0: none.
  std::atomic<std::int64_t> acks_held_until_ns{0};
  /// kill_worker: tp worker `kill_worker` of data-parallel rank `kill_rank`
  /// dies when the engine next looks (a heartbeat or a step); -1: none. The
  /// engine then reports the failure and stops, as a process whose worker
  /// died does, and the coordinator evicts it.
  std::atomic<int> kill_rank{-1};
  std::atomic<int> kill_worker{0};
};

/// What an engine actor is made from.
struct rollout_engine_config {
  model_config model;
  engine::engine_options options; ///< options.name is the replica name
  std::string node;
  /// The data plane the transfer phase pulls from (nullptr: inline buckets only).
  std::shared_ptr<transfer::weight_puller> puller;
  /// The puller of one trainer rank named by a transfer order (its holding
  /// and actor handle); the engine keeps what it returns per rank
  /// incarnation. Empty: orders naming trainer ranks are refused.
  std::function<std::shared_ptr<transfer::weight_puller>(const producer_holding&, const trainer_actor&)>
    producer_puller;
  /// How long a pull may take (the coordinator's transfer deadline bounds the phase too).
  std::uint64_t transfer_deadline_ms = 60000;
  /// Steps itself while it has work. Deterministic tests turn this off and
  /// send `step_atom` themselves, so that a pause can land between steps.
  bool self_stepping = true;
  /// Drill faults; nullptr: none.
  std::shared_ptr<engine_fault_gate> faults;
  /// Who may drive the engine besides itself: on a member node, the
  /// coordinator and router it registered with (local_or_trusted); empty:
  /// this process's actors only (one process plays every node). Every other
  /// sender is refused, on every message.
  sender_policy authorize;
  /// A `route_atom` naming a router arrived from `sender`: true when taken
  /// (it came from the coordinator), false refuses it. Empty: ignored (the
  /// engine's policy already admits every router it may obey).
  std::function<bool(const caf::strong_actor_ptr& sender, const caf::actor_addr& router)> vouched_router;
  /// Receives one line per refused message; empty: stderr.
  std::function<void(const std::string&)> log;
  /// Where the engine records its vLLM metrics; nullptr: nowhere.
  std::shared_ptr<engine_metrics> metrics;
  /// nccl: joins the coordinator's rendezvous with this engine's workers
  /// (the process's gpu::nccl_membership); empty when joined, else why not.
  /// Empty function: nccl_join_atom is refused (the engine pulls over no
  /// NCCL communicator).
  std::function<std::string(const nccl_rendezvous_msg&)> nccl_join;
  /// nccl: the coordinator says a member of the epoch (named) died: marks
  /// it in the process's membership, whose waits then abort. Empty: ignored.
  std::function<void(std::uint64_t epoch, const std::string& who)> nccl_dead;
};

/// How a data-plane pull ended, reported by the pulling thread.
struct pull_outcome {
  std::uint64_t seq = 0; ///< which transfer of this engine (a late one from an aborted round is stale)
  std::uint64_t version = 0;
  std::optional<transfer_report> report;  ///< set on success
  errc code = errc::malformed;            ///< on failure
  std::string what;
  std::vector<std::set<std::string>> received; ///< per worker: tensors written
  bool kept_thread = false; ///< pulled on the engine's kept thread (now free again)
};

/// A pull handed to the engine's kept pulling thread.
struct pull_job {
  std::function<void()> run;
};

} // namespace rlsync

// Stay inside the process: the engine hands a pull to its pulling thread,
// which hands the result back.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<rlsync::pull_outcome>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<rlsync::pull_job>)

namespace rlsync {

// Messages only this process's own HTTP front end (`rlsync serve`) sends;
// local, never on the wire, so plain atom constants without type IDs.
using load_atom = caf::atom_constant<caf::atom("load")>;       // a checkpoint directory into the session
using drop_atom = caf::atom_constant<caf::atom("dropsess")>;   // close the session, keep serving the old weights
using sha256_atom = caf::atom_constant<caf::atom("sha256")>;   // SHA-256 per parameter shard
using release_atom = caf::atom_constant<caf::atom("release")>; // sleep level 2: drop the weights

/// The interface plus the actor's own messages: one step, a pull's end,
/// and the disk weight-transfer backend of `rlsync serve`.
using rollout_engine_impl =
  rollout_engine_actor::extend<caf::reacts_to<step_atom>, caf::reacts_to<pull_atom, std::shared_ptr<pull_outcome>>,
                               // a held acknowledgement is due (drills)
                               caf::reacts_to<caf::timeout_atom, std::uint64_t>,
                               // load every tensor of a checkpoint directory into the open
                               // session's staging weights (swapped in on finish); replies
                               // with the bytes read. The checkpoint must match the served model.
                               caf::replies_to<load_atom, std::string>::with<std::uint64_t>,
                               // close the open session without publishing: an engine that received
                               // nothing of it serves its old weights, clean; replies with the ack
                               caf::replies_to<drop_atom>::with<phase_ack>,
                               // SHA-256 (hex) of every parameter shard served now, fp32 bytes, as
                               // one JSON object {"<worker>/<param>": hex}
                               caf::replies_to<sha256_atom>::with<std::string>,
                               // sleep level 2: free the served weights and every spare set (paused,
                               // idle, no session); replies with the bytes released. A session of
                               // the same version brings them back (the wake)
                               caf::replies_to<release_atom>::with<std::uint64_t>>;

struct rollout_engine_state {
  std::unique_ptr<engine::engine_core> core;
  phase_order_count phase_orders; ///< the coordinator's, taken and not yet answered
  std::string node;
  bool self_stepping = true;
  bool step_scheduled = false;
  std::optional<caf::typed_response_promise<pause_report>> pause_promise;
  std::unordered_map<std::uint64_t, caf::typed_response_promise<generate_result>> pending;
  /// Each running request's sink. A sink that goes down (the router closed
  /// that attempt's relay after a reroute, or the requester is gone) ends
  /// the request here: nobody would see its tokens.
  std::multimap<caf::actor_addr, std::uint64_t> sinks;
  std::shared_ptr<transfer::weight_puller> puller;
  std::vector<std::shared_ptr<const plan::grouped_plan>> plans; ///< per worker
  std::vector<std::shared_ptr<const plan::worker_plan>> worker_plans; ///< the same plans, for the M:N pull
  /// M:N pull: the link to each trainer rank named by an order (its
  /// newest incarnation), by rank; kept so that sub-plans stay registered.
  std::shared_ptr<transfer::producer_links> producer_links;
  /// The transfer phase in flight: its reply waits for the pulling thread.
  std::optional<caf::typed_response_promise<transfer_report>> transfer_promise;
  std::uint64_t transfer_seq = 0; ///< transfers started; the one in flight has this number
  std::chrono::steady_clock::time_point transfer_started; ///< of the one in flight (its duration metric)
  /// Runs pulls one at a time, kept between rounds: a thread made per pull
  /// cost the transfer wave ~0.4 ms across 8 engine processes on 2 cores.
  /// While it still runs an aborted round's pull, a new pull gets a thread
  /// of its own.
  caf::actor pull_thread;
  bool pull_thread_busy = false;
  /// Pulls numbered up to this were abandoned (their round continued without
  /// finish, or the engine went): each stops at its next group rather than
  /// pulling the rest into staging nobody will use. Shared with the pulls.
  std::shared_ptr<std::atomic<std::uint64_t>> pulls_abandoned_through =
    std::make_shared<std::atomic<std::uint64_t>>(0);
  std::shared_ptr<engine_fault_gate> faults;
  /// Acknowledgements held by a delay_acks drill, by id, sent when due.
  std::map<std::uint64_t, std::function<void()>> held_acks;
  std::uint64_t next_held_ack = 1;
  /// Refuses (counts, logs) messages from senders cfg.authorize does not admit.
  std::shared_ptr<sender_guard> guard;
  static inline const char* name = "rollout_engine";
};

rollout_engine_impl::behavior_type
rollout_engine(rollout_engine_impl::stateful_pointer<rollout_engine_state> self, rollout_engine_config cfg);

/// Spawns an engine actor on its own thread.
rollout_engine_impl spawn_rollout_engine(caf::actor_system& sys, rollout_engine_config cfg);

} // namespace rlsync
