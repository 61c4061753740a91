#pragma once
// Everything CAF needs to move rlsync's messages: atoms, the type-ID block,
// `inspect` overloads for every type that crosses the network, and the
// "rlsync" error category. One file, so that a reader sees the whole wire
// vocabulary at once. Atoms are CAF 0.17 atom constants (≤ 10 characters);
// CAF's own flush/update atoms are aliased rather than redefined.
#include "runtime/base/errc.hpp"
#include "runtime/control/protocol.hpp"

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/make_message.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/type_id.hpp>

namespace rlsync {

// -- errors ------------------------------------------------------------------
// make_error(errc) is declared before anything compares an error with an
// errc: CAF 0.17 caches has_make_error<errc> as false at the first such
// comparison, and `err == errc::x` then no longer compiles.

constexpr caf::atom_value error_category = caf::atom("rlsync");

inline caf::error make_error(errc x) {
  return {static_cast<std::uint8_t>(x), error_category};
}

inline caf::error make_error(errc x, std::string context) {
  return {static_cast<std::uint8_t>(x), error_category, caf::make_message(std::move(context))};
}

/// True when `err` carries rlsync error code `x`.
inline bool is(const caf::error& err, errc x) {
  // An empty error has no category to read: CAF 0.17's category() of one crashes.
  return err && err.category() == error_category && err.code() == static_cast<std::uint8_t>(x);
}

// -- atoms ----------------------------------------------------------------------------

using caf::flush_atom;  // "flush": reset the prefix cache
using caf::update_atom; // "update": one bucket of the weight-update session

} // namespace rlsync

CAF_BEGIN_TYPE_ID_BLOCK(rlsync, caf::first_custom_type_id)

  CAF_ADD_ATOM(rlsync, rlsync, pause_atom, "pause")
  CAF_ADD_ATOM(rlsync, rlsync, resume_atom, "resume")   // the round's "continue"
  CAF_ADD_ATOM(rlsync, rlsync, start_atom, "start")
  CAF_ADD_ATOM(rlsync, rlsync, finish_atom, "finish")
  CAF_ADD_ATOM(rlsync, rlsync, transfer_atom, "transfer")
  CAF_ADD_ATOM(rlsync, rlsync, generate_atom, "generate")
  CAF_ADD_ATOM(rlsync, rlsync, token_atom, "token")
  CAF_ADD_ATOM(rlsync, rlsync, result_atom, "result")
  CAF_ADD_ATOM(rlsync, rlsync, abort_atom, "abort")
  CAF_ADD_ATOM(rlsync, rlsync, status_atom, "status")
  CAF_ADD_ATOM(rlsync, rlsync, register_atom, "register")
  CAF_ADD_ATOM(rlsync, rlsync, deregister_atom, "deregister")
  CAF_ADD_ATOM(rlsync, rlsync, heartbeat_atom, "heartbeat")
  CAF_ADD_ATOM(rlsync, rlsync, version_atom, "version")
  CAF_ADD_ATOM(rlsync, rlsync, meta_atom, "meta")
  CAF_ADD_ATOM(rlsync, rlsync, pull_atom, "pull")
  CAF_ADD_ATOM(rlsync, rlsync, subscribe_atom, "subscribe")
  CAF_ADD_ATOM(rlsync, rlsync, sync_atom, "sync")
  CAF_ADD_ATOM(rlsync, rlsync, route_atom, "route")
  CAF_ADD_ATOM(rlsync, rlsync, evict_atom, "evict")
  CAF_ADD_ATOM(rlsync, rlsync, step_atom, "step")       // one step: an engine's self-message; the trainer's "step now"
  CAF_ADD_ATOM(rlsync, rlsync, digest_atom, "digest")
  CAF_ADD_ATOM(rlsync, rlsync, hello_atom, "hello")     // a joining node asks for a challenge
  CAF_ADD_ATOM(rlsync, rlsync, admit_atom, "admit")     // ... and answers it
  CAF_ADD_ATOM(rlsync, rlsync, freeze_atom, "freeze")   // training ended: no new versions
  CAF_ADD_ATOM(rlsync, rlsync, pin_atom, "pin")         // keep a round's version until the next round
  CAF_ADD_ATOM(rlsync, rlsync, probe_atom, "probe")     // time the control plane: heartbeat waves
  CAF_ADD_ATOM(rlsync, rlsync, failed_atom, "failed")   // an engine failed: reroute its requests

  CAF_ADD_TYPE_ID(rlsync, (rlsync::pause_request))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::pause_report))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::sampling_params))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::generate_request))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::token_event))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::version_span))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::generate_result))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::engine_info))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::registration))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::heartbeat))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::engine_status))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::tensor_meta))
  CAF_ADD_TYPE_ID(rlsync, (std::vector<rlsync::tensor_meta>))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::bucket_entry))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::weight_bucket))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::transfer_order))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::transfer_report))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::phase_ack))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::version_info))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::sync_report))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::route_update))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::router_status))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::coordinator_status))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::weight_digest))
  CAF_ADD_TYPE_ID(rlsync, (std::vector<rlsync::weight_digest>))
  CAF_ADD_ATOM(rlsync, rlsync, ucx_ticket_atom, "ucxticket") // an engine worker asks for UCX credentials
  CAF_ADD_TYPE_ID(rlsync, (rlsync::ucx_ticket))
  CAF_ADD_ATOM(rlsync, rlsync, ipc_pull_atom, "ipcpull")       // an engine worker asks for a group over cuda_ipc
  CAF_ADD_ATOM(rlsync, rlsync, ipc_release_atom, "ipcrelease") // ... and ends its session
  CAF_ADD_TYPE_ID(rlsync, (rlsync::ipc_pull))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::ipc_chunk))
  CAF_ADD_ATOM(rlsync, rlsync, catch_up_atom, "catchup") // a trainer rank behind the others catches up
  CAF_ADD_TYPE_ID(rlsync, (rlsync::rank_info))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::producer_holding))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::engine_placement))
  CAF_ADD_TYPE_ID(rlsync, (std::vector<rlsync::engine_placement>))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::rank_status))
  CAF_ADD_ATOM(rlsync, rlsync, phase_atom, "phase")          // the coordinator's one-way order for one sync phase
  CAF_ADD_ATOM(rlsync, rlsync, phase_done_atom, "phasedone") // an engine's answer to it, with the order's token
  CAF_ADD_ATOM(rlsync, rlsync, nccl_pull_atom, "ncclpull") // an engine worker asks for a group over NCCL
  CAF_ADD_TYPE_ID(rlsync, (rlsync::nccl_pull))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::nccl_chunk))
  CAF_ADD_ATOM(rlsync, rlsync, nccl_plan_atom, "ncclplan") // ... after registering its plan (sharded)
  CAF_ADD_TYPE_ID(rlsync, (rlsync::nccl_plan))
  CAF_ADD_ATOM(rlsync, rlsync, nccl_broadcast_atom, "ncclbcast") // ... or for a version broadcast to every member
  CAF_ADD_TYPE_ID(rlsync, (rlsync::nccl_manifest))
  CAF_ADD_ATOM(rlsync, rlsync, nccl_id_atom, "ncclid")     // the coordinator asks trainer rank 0 for a unique id
  CAF_ADD_ATOM(rlsync, rlsync, nccl_join_atom, "nccljoin") // ... and every member's process to join the rendezvous
  CAF_ADD_ATOM(rlsync, rlsync, nccl_dead_atom, "nccldead") // ... and, mid-epoch, that a member died: abort its waits
  CAF_ADD_ATOM(rlsync, rlsync, settle_atom, "settle") // the coordinator's own timer: a wait of its ended, look again
  CAF_ADD_TYPE_ID(rlsync, (rlsync::nccl_member))
  CAF_ADD_TYPE_ID(rlsync, (std::vector<rlsync::nccl_member>))
  CAF_ADD_TYPE_ID(rlsync, (rlsync::nccl_rendezvous_msg))

CAF_END_TYPE_ID_BLOCK(rlsync)

namespace rlsync {

// -- inspect overloads (CAF 0.17 form: result_type, f(type_name, fields...)) ---

#define RLSYNC_INSPECT(type, ...)                                                          \
  template <class Inspector>                                                               \
  typename Inspector::result_type inspect(Inspector& f, type& x) {                        \
    return f(caf::meta::type_name(#type), __VA_ARGS__);                                    \
  }

RLSYNC_INSPECT(pause_request, x.mode, x.clear_cache)
RLSYNC_INSPECT(pause_report, x.engine, x.version, x.state, x.aborted, x.frozen, x.waited)
RLSYNC_INSPECT(sampling_params, x.temperature, x.top_p, x.max_tokens, x.seed, x.stop_at_eos, x.logprobs,
               x.top_logprobs, x.stop_token_ids)
RLSYNC_INSPECT(generate_request, x.request_id, x.prompt, x.generated, x.sampling, x.min_version, x.deadline_ms)
RLSYNC_INSPECT(token_event, x.request_id, x.index, x.token, x.version, x.stale_kv, x.logprob, x.top_tokens,
               x.top_logprobs)
RLSYNC_INSPECT(version_span, x.version, x.begin, x.end)
RLSYNC_INSPECT(generate_result, x.request_id, x.tokens, x.spans, x.reason, x.engine,
               x.stale_kv_tokens, x.logprobs, x.top_tokens, x.top_logprobs)
RLSYNC_INSPECT(engine_info, x.name, x.node, x.tp, x.version, x.dirty, x.incarnation, x.paused)
RLSYNC_INSPECT(registration, x.current_version, x.routable)
RLSYNC_INSPECT(heartbeat, x.from, x.seq)
RLSYNC_INSPECT(engine_status, x.name, x.version, x.dirty, x.state, x.running, x.waiting,
               x.frozen, x.tokens_generated, x.dirty_tokens, x.prefix_cache_hits, x.prefix_cache_queries, x.refused)
RLSYNC_INSPECT(tensor_meta, x.name, x.dtype, x.shape)
RLSYNC_INSPECT(bucket_entry, x.name, x.dtype, x.shape, x.offset, x.bytes, x.tensor_offset)
RLSYNC_INSPECT(weight_bucket, x.version, x.group, x.entries, x.data, x.checksum)
RLSYNC_INSPECT(transfer_order, x.version, x.mode, x.backend, x.producers, x.same_bytes_since)
RLSYNC_INSPECT(rank_info, x.rank, x.node, x.incarnation, x.held)
RLSYNC_INSPECT(producer_holding, x.rank, x.incarnation, x.held)
RLSYNC_INSPECT(transfer_report, x.engine, x.version, x.bytes, x.groups, x.duration_ns, x.wait_ns, x.store_ns,
               x.ran_ns, x.queued_ns)
RLSYNC_INSPECT(phase_ack, x.engine, x.version, x.dirty)
RLSYNC_INSPECT(version_info, x.version, x.groups, x.total_bytes, x.checksums, x.same_bytes_since)
RLSYNC_INSPECT(sync_report, x.version, x.engines_synced, x.evicted, x.stall_ns, x.transfer_ns,
               x.bytes, x.control_ns, x.aborted, x.slowest_pull_ns, x.slowest_wait_ns, x.slowest_store_ns,
               x.slowest_ran_ns, x.slowest_queued_ns)
RLSYNC_INSPECT(route_update, x.engine, x.version, x.routable)
RLSYNC_INSPECT(router_status, x.routable, x.queued, x.outstanding, x.completed, x.rejected,
               x.rerouted, x.refused, x.outstanding_by_engine)
RLSYNC_INSPECT(coordinator_status, x.version, x.members, x.routable, x.rounds, x.history,
               x.unreachable, x.retired, x.live, x.below_min_live_events, x.refused, x.ranks,
               x.last_evictions, x.nccl_epoch, x.nccl_members, x.nccl_rebuilds, x.nccl_healthy)
RLSYNC_INSPECT(rank_status, x.rank, x.node, x.incarnation, x.latest_version, x.pinned_version, x.reachable)
RLSYNC_INSPECT(weight_digest, x.engine, x.version, x.dirty, x.names, x.checksums)
RLSYNC_INSPECT(ucx_ticket, x.producer, x.token)
RLSYNC_INSPECT(ipc_pull, x.engine, x.worker, x.version, x.group, x.chunk, x.session)
RLSYNC_INSPECT(ipc_chunk, x.session, x.chunk, x.handle, x.buffer_bytes, x.offset, x.bytes, x.bucket)
RLSYNC_INSPECT(nccl_pull, x.engine, x.worker, x.version, x.group, x.epoch, x.wait_ms, x.plan)
RLSYNC_INSPECT(nccl_plan, x.engine, x.worker, x.epoch, x.plan)
RLSYNC_INSPECT(nccl_manifest, x.status, x.epoch, x.root, x.buckets, x.bytes, x.packed)
RLSYNC_INSPECT(nccl_chunk, x.epoch, x.root, x.bytes, x.bucket, x.trailer)
RLSYNC_INSPECT(nccl_member, x.producer, x.engine, x.rank)
RLSYNC_INSPECT(nccl_rendezvous_msg, x.epoch, x.id, x.members, x.root_ids)
RLSYNC_INSPECT(engine_placement, x.engine, x.node)

#undef RLSYNC_INSPECT

} // namespace rlsync
