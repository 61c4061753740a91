#pragma once
// The typed interfaces of rlsync's four actors, in one header
// so the whole protocol reads at a glance. One `///` line per interface, one
// `//` line per handler. Replies are declared for every request: a handler
// without one would answer with an empty message (CAF 0.17 does not refuse it).
#include "actors/type_ids.hpp"
#include "runtime/base/dtype.hpp"

#include <caf/replies_to.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <string>
#include <vector>

namespace rlsync {

/// Receives one request's tokens as the engine produces them.
using token_sink_actor = caf::typed_actor<
  // one generated token, with the version that produced it
  caf::reacts_to<token_atom, token_event>>;

/// Answers liveness probes; `rlsync ping` speaks only this. The engine, the
/// trainer and the router extend it (`extend_with<heartbeat_actor>`).
using heartbeat_actor = caf::typed_actor<
  // answered with the same sequence number
  caf::replies_to<heartbeat_atom, heartbeat>::with<heartbeat>>;

/// Is told when the trainer has published a new version.
using version_listener_actor = caf::typed_actor<
  // version v is ready to be pulled
  caf::reacts_to<version_atom, version_info>>;

/// The trainer and its weight source: parameter metadata, versions, groups.
using trainer_actor = caf::typed_actor<
  // metadata of every parameter: name, dtype, full shape
  caf::replies_to<meta_atom>::with<std::vector<tensor_meta>>,
  // the latest published version
  caf::replies_to<version_atom>::with<version_info>,
  // one group of a version as a bucket, bytes inline (the CAF fallback path)
  caf::replies_to<pull_atom, std::uint64_t, std::uint32_t>::with<weight_bucket>,
  // tell the listener about every version published from now on
  caf::reacts_to<subscribe_atom, version_listener_actor>,
  // training ended: publish no new version, keep serving the ones held; replies with the last
  caf::replies_to<freeze_atom>::with<version_info>,
  // a rank behind the others (it joined late or restarted): make every
  // version up to this one and publish only it
  caf::reacts_to<catch_up_atom, std::uint64_t>,
  // a round transfers this version: keep it until the next pin, however many
  // versions are published meanwhile (consumers across the network are slow)
  caf::reacts_to<pin_atom, std::uint64_t>,
  // step now (or join the step in flight); replies once it ended, with the
  // version then published; frozen and idle: at once; a failed step: an error
  caf::replies_to<step_atom>::with<version_info>,
  // UCX credentials for an engine worker (engine, worker): the producer's
  // address and a fresh session token; an error when no producer runs
  caf::replies_to<ucx_ticket_atom, std::string, std::int32_t>::with<ucx_ticket>,
  // cuda_ipc: write a group into the worker's slot of the exported device
  // buffer and say where; an error when no cuda_ipc producer runs
  caf::replies_to<ipc_pull_atom, ipc_pull>::with<ipc_chunk>,
  // cuda_ipc: the worker's session ended (it copied what it wanted, or gave up)
  caf::reacts_to<ipc_release_atom, ipc_pull>,
  // nccl: queue a group's send to the worker on the rank's communicator and
  // say what arrives; an error when no nccl sender runs or the epoch differs
  caf::replies_to<nccl_pull_atom, nccl_pull>::with<nccl_chunk>,
  // nccl, sharded: keep the worker's plan for its pulls; the answer is its digest
  caf::replies_to<nccl_plan_atom, nccl_plan>::with<std::uint64_t>,
  // nccl, the collective baseline: broadcast the version to every member
  // (once per version and communicator) and say what comes, in order
  caf::replies_to<nccl_broadcast_atom, nccl_pull>::with<nccl_manifest>,
  // nccl, from the coordinator only: a new communicator's unique id (rank 0
  // makes it: NCCL's bootstrap root listens in its process) ...
  caf::replies_to<nccl_id_atom>::with<std::vector<std::uint8_t>>,
  // ... and the rendezvous to join as this rank; the answer is the epoch joined
  caf::replies_to<nccl_join_atom, nccl_rendezvous_msg>::with<std::uint64_t>,
  // ... and that a member of that epoch (named) died: its waits abort now
  caf::reacts_to<nccl_dead_atom, std::uint64_t, std::string>,
  // where the registered engines run (the coordinator, at every change):
  // tickets and weights go to those nodes only
  caf::reacts_to<register_atom, std::vector<engine_placement>>>::extend_with<heartbeat_actor>;

/// The coordinator's order for one phase of a sync round, sent one-way: the
/// engine answers with `phase_done` and the order's token (the answer the
/// phase's request would get), so the coordinator holds no CAF request per
/// engine (see actors/phase_orders.hpp). The fields a phase does not use stay empty.
struct phase_order {
  /// Names this (round, wave, phase, engine): an answer with another token is late.
  std::uint64_t token = 0;
  sync_phase phase = sync_phase::pause;
  /// The phase's deadline at the coordinator, in milliseconds (1 ms to max_phase_deadline_ms).
  std::int64_t deadline_ms = 0;
  pause_request pause;                 ///< pause
  std::uint64_t version = 0;           ///< start, finish
  transfer_order transfer;             ///< transfer
  std::vector<trainer_actor> producers; ///< transfer: the handles of transfer.producers, in order
};

/// The longest phase deadline an order may carry: a day.
constexpr std::int64_t max_phase_deadline_ms = 24LL * 3600 * 1000;

/// What is wrong with an order, or nothing.
std::string check(const phase_order& x);

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, phase_order& x) {
  return f(caf::meta::type_name("phase_order"), x.token, x.phase, x.deadline_ms, x.pause, x.version, x.transfer,
           x.producers);
}

/// One rollout engine (all its tensor-parallel workers), with vLLM's pause and
/// weight-update semantics.
using rollout_engine_actor = caf::typed_actor<
  // pause(mode, clear_cache); replies at idle, after every earlier token was delivered
  caf::replies_to<pause_atom, pause_request>::with<pause_report>,
  // reset the prefix cache
  caf::replies_to<flush_atom>::with<phase_ack>,
  // open the weight-update session for version v
  caf::replies_to<start_atom, std::uint64_t>::with<phase_ack>,
  // one bucket of the session, bytes inline; replies with the bytes applied
  caf::replies_to<update_atom, weight_bucket>::with<std::uint64_t>,
  // pull this engine's shards of a version over the data plane: from the
  // trainer ranks the order names (their handles, in the order's order), or
  // from the engine's one producer when it names none
  caf::replies_to<transfer_atom, transfer_order, std::vector<trainer_actor>>::with<transfer_report>,
  // publish version v; an incomplete session fails and leaves the engine dirty
  caf::replies_to<finish_atom, std::uint64_t>::with<phase_ack>,
  // leave the pause (the round's "continue"); an error while a pause is in flight
  caf::replies_to<resume_atom>::with<phase_ack>,
  // generate; tokens stream to the sink, the reply is the finished request
  caf::replies_to<generate_atom, generate_request, token_sink_actor>::with<generate_result>,
  // abort one request; replies whether it was found
  caf::replies_to<abort_atom, std::uint64_t>::with<bool>,
  // what the engine holds and runs
  caf::replies_to<status_atom>::with<engine_status>,
  // the coordinator vouches for this router (registered on any node): take
  // its generate requests from now on, in place of the one before. Named by
  // its heartbeat face: the router's own interface names engines.
  caf::reacts_to<route_atom, heartbeat_actor>,
  // checksums of the weights served now, to verify them against the trainer's
  caf::replies_to<digest_atom>::with<weight_digest>,
  // nccl, from the coordinator only: join the rendezvous with this engine's
  // workers (each its own member); replies with the epoch joined
  caf::replies_to<nccl_join_atom, nccl_rendezvous_msg>::with<std::uint64_t>,
  // nccl, from the coordinator only: a member of that epoch (named) died:
  // the workers' waits abort now instead of at their deadlines
  caf::reacts_to<nccl_dead_atom, std::uint64_t, std::string>,
  // the coordinator's order for one sync phase, one-way: answered with
  // phase_done and the order's token, as the phase's request above would be
  caf::reacts_to<phase_atom, phase_order>>::extend_with<heartbeat_actor>;

/// Routes generation requests to live, current replicas.
using router_actor = caf::typed_actor<
  // route a request; tokens stream to the sink, the reply is the finished request
  caf::replies_to<generate_atom, generate_request, token_sink_actor>::with<generate_result>,
  // the coordinator's word on whether an engine may serve, and which version it holds
  caf::reacts_to<route_atom, route_update, rollout_engine_actor>,
  // stop routing to an engine at once (evicted before its wave: its running
  // requests stay with it, on its old version)
  caf::reacts_to<evict_atom, std::string>,
  // an engine failed (silent past the heartbeat timeout, evicted in its
  // round's wave, or dirty): stop routing to it and reroute its running requests
  caf::reacts_to<failed_atom, std::string>,
  // the trainer published this version (from the coordinator): replicas more
  // than sync.staleness behind it stop taking requests
  caf::reacts_to<version_atom, version_info>,
  caf::replies_to<status_atom>::with<router_status>>::extend_with<heartbeat_actor>;

/// Runs the sync rounds and owns membership.
using coordinator_actor = version_listener_actor::extend<
  // an engine joins (or rejoins after a restart); it stays unroutable until synced
  caf::replies_to<register_atom, engine_info, rollout_engine_actor>::with<registration>,
  // an engine leaves for good
  caf::reacts_to<deregister_atom, std::string>,
  // a trainer (re)started: follow its versions and pin rounds through it
  caf::reacts_to<register_atom, trainer_actor>,
  // a trainer rank joins (or rejoins after a restart) with what it holds;
  // replies with the cluster's newest version (a restarted rank catches up to it)
  caf::replies_to<register_atom, rank_info, trainer_actor>::with<registration>,
  // a router (re)started: tell it every routable member, and it all changes from now on
  caf::reacts_to<register_atom, router_actor>,
  // training ended: freeze every registered trainer rank, those of other
  // processes too (no new versions); replies with how many froze
  caf::replies_to<freeze_atom>::with<std::uint32_t>,
  // run one sync round now; replies with its figures
  caf::replies_to<sync_atom>::with<sync_report>,
  // the version and the members
  caf::replies_to<status_atom>::with<coordinator_status>,
  // every member's weight checksums, local or remote (to verify them against the trainer)
  caf::replies_to<digest_atom>::with<std::vector<weight_digest>>,
  // a member engine says it is alive (as if it answered a heartbeat)
  caf::reacts_to<heartbeat_atom, heartbeat>,
  // an engine's answer to a phase order (token, then what the phase's
  // request would have answered): pause, transfer, the other four, a failure
  caf::reacts_to<phase_done_atom, std::uint64_t, pause_report>,
  caf::reacts_to<phase_done_atom, std::uint64_t, transfer_report>,
  caf::reacts_to<phase_done_atom, std::uint64_t, phase_ack>,
  caf::reacts_to<phase_done_atom, std::uint64_t, caf::error>,
  // n waves of heartbeats to every member, one wave at a time; replies with
  // the nanoseconds they took (a round's control-plane floor)
  caf::replies_to<probe_atom, std::uint32_t>::with<std::uint64_t>>;

/// The handles a node receives once admitted to the cluster.
struct join_grant {
  coordinator_actor coordinator;
  trainer_actor trainer;
  router_actor router;
  /// The trainer runs a UCX producer (transfer.backend: ucx): engines ask
  /// `trainer` for a ucx_ticket per worker; false: pull over CAF from it.
  bool ucx = false;
  /// The dtype the trainer sends (rlsync::dtype as an integer): what every
  /// engine records its plans in.
  std::uint8_t source_dtype = static_cast<std::uint8_t>(dtype::bf16);
  /// The head's side of the proof (head_proof in gatekeeper.hpp): it holds
  /// the joining node's secret too. A node admitted without it refuses the
  /// grant: whoever answered is not its head.
  std::string head_proof;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, join_grant& x) {
  return f(caf::meta::type_name("join_grant"), x.coordinator, x.trainer, x.router, x.ucx, x.source_dtype,
           x.head_proof);
}

/// The only actor a cluster's head node publishes: it admits nodes that prove
/// they hold the cluster secret (HMAC-SHA256 over a one-time challenge).
using gatekeeper_actor = caf::typed_actor<
  // node name, its build's wire fingerprint -> a fresh one-time challenge (hex)
  caf::replies_to<hello_atom, std::string, std::string>::with<std::string>,
  // node name, HMAC-SHA256(secret, challenge | node name) in hex, a fresh
  // nonce of the node's -> the cluster's handles and the head's proof over
  // that nonce
  caf::replies_to<admit_atom, std::string, std::string, std::string>::with<join_grant>>;

} // namespace rlsync

// Actor handles travel in messages (register, route, generate), so they have
// type IDs too, in a block chained after the value types.
CAF_BEGIN_TYPE_ID_BLOCK(rlsync_handles, caf::id_block::rlsync::end)
  CAF_ADD_TYPE_ID(rlsync_handles, (rlsync::token_sink_actor))
  CAF_ADD_TYPE_ID(rlsync_handles, (rlsync::heartbeat_actor))
  CAF_ADD_TYPE_ID(rlsync_handles, (rlsync::version_listener_actor))
  CAF_ADD_TYPE_ID(rlsync_handles, (rlsync::rollout_engine_actor))
  CAF_ADD_TYPE_ID(rlsync_handles, (rlsync::trainer_actor))
  CAF_ADD_TYPE_ID(rlsync_handles, (std::vector<rlsync::trainer_actor>))
  CAF_ADD_TYPE_ID(rlsync_handles, (rlsync::router_actor))
  CAF_ADD_TYPE_ID(rlsync_handles, (rlsync::coordinator_actor))
  CAF_ADD_TYPE_ID(rlsync_handles, (rlsync::join_grant))
  CAF_ADD_TYPE_ID(rlsync_handles, (rlsync::gatekeeper_actor))
  CAF_ADD_TYPE_ID(rlsync_handles, (rlsync::phase_order))
CAF_END_TYPE_ID_BLOCK(rlsync_handles)
