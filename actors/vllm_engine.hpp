#pragma once
// The rollout-engine actor for an external server that speaks vLLM's RL
// HTTP API (`vllm serve` with VLLM_SERVER_DEV_MODE=1 and the disk weight
// transfer backend, or `rlsync serve`): the coordinator and the router drive
// it exactly as they drive the built-in engine (rollout_engine_actor).
//
//   pause(mode, clear)  ─► POST /pause?mode=..&clear_cache=..   (abort: its open streams end
//                                                               here too; wait: replies once the
//                                                               running ones are relayed)
//   flush               ─► POST /reset_prefix_cache
//   start(v)            ─► POST /start_weight_update {"is_checkpoint_format": true}
//   transfer(order)     ─► pull whole checkpoint tensors (one tp-1 worker) ─► weights_dir/v<v>/
//                          one safetensors file per group as it arrives ─► POST /update_weights {"path"}
//   finish(v)           ─► POST /finish_weight_update {"weight_version": "v<v>"}, old dirs removed
//   resume              ─► POST /resume (a session left open by an aborted round is closed first)
//   generate(req, sink) ─► streaming POST /v1/completions, token by token to the sink
//   abort(id)           ─► the stream closed, POST /abort_requests
//   digest              ─► checksums of what the adapter wrote, cross-checked by POST /weight_checker
//
// Blocking HTTP never runs in the actor's handlers: each call runs on a
// detached worker under its phase's deadline and reports back to the actor,
// which answers through a response promise. Any failure or deadline is an
// error reply and leaves the engine dirty until a later successful finish.
//
// Health: a poller asks GET /health (and /weight_info) every interval.
//
//   healthy ──(/health fails, or /weight_info names another label than the
//              adapter's last finish: the server restarted)──► unhealthy:
//              heartbeats unanswered, streams failed (the router reroutes)
//   unhealthy ──(/health answers)──► healthy at version 0, clean: a restarted
//              server holds its initial weights, so the coordinator must give
//              it a full sync before it is routable again
#include "actors/interfaces.hpp"
#include "actors/phase_orders.hpp"
#include "actors/sender_guard.hpp"
#include "runtime/config/model_config.hpp"
#include "runtime/transfer/holder_pull.hpp"
#include "runtime/transfer/puller.hpp"
#include "runtime/vllm/remote_engine.hpp"

#include <caf/actor_system.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

namespace rlsync {

struct engine_metrics; // actors/fleet_metrics.hpp

/// What a vLLM-server engine actor is made from.
struct vllm_engine_config {
  model_config model;
  std::string name; ///< the replica's name
  std::string node;
  std::string url;          ///< "http://host:port" of the server
  std::string bearer_token; ///< sent as "Authorization: Bearer ..." (the caller reads api_key_file); empty: none
  std::string served_model; ///< the completions' "model" field; empty: left out (the server's only model)
  /// Where versions are written for the server to load (tmpfs beside it):
  /// <weights_dir>/v<N>/. The server must see the same path.
  std::string weights_dir;
  dtype source_dtype = dtype::bf16; ///< what the trainer sends and the files hold
  /// The server's tensor parallelism: how its weight_checker names shards
  /// and how the digest shards the weights (as verify_weights loads them).
  int server_tp = 1;
  /// The data plane (as rollout_engine_config): the adapter registers one
  /// worker of tp 1 whose plan is every tensor whole.
  std::shared_ptr<transfer::weight_puller> puller;
  std::function<std::shared_ptr<transfer::weight_puller>(const producer_holding&, const trainer_actor&)>
    producer_puller;
  /// Deadlines of the phases' HTTP calls (transfer: the pull, the files and update_weights).
  std::uint64_t pause_deadline_ms = 60000;
  std::uint64_t flush_deadline_ms = 10000;
  std::uint64_t start_deadline_ms = 10000;
  std::uint64_t transfer_deadline_ms = 60000;
  std::uint64_t finish_deadline_ms = 60000;
  std::uint64_t resume_deadline_ms = 10000;
  std::uint64_t abort_deadline_ms = 5000;
  std::uint64_t digest_deadline_ms = 60000;
  /// Health polls: how often, and how long one may take.
  std::uint64_t health_interval_ms = 1000;
  std::uint64_t health_timeout_ms = 2000;
  /// Longest silence of a generation stream (no token, no keep-alive)
  /// before it fails: a paused real vLLM sends nothing, so this must
  /// exceed a sync round's stall.
  std::uint64_t stream_idle_ms = 120000;
  /// Streams open at once (the server's max_batch + queue_limit); beyond
  /// it a request is refused with errc::queue_full.
  std::uint32_t max_streams = 64;
  /// Control calls (phases, digests, aborts) in flight at once; beyond it refused.
  std::uint32_t max_control_calls = 16;
  sender_policy authorize; ///< as rollout_engine_config::authorize
  std::function<bool(const caf::strong_actor_ptr& sender, const caf::actor_addr& router)> vouched_router;
  std::function<void(const std::string&)> log; ///< one line per event worth knowing; empty: stderr
  std::shared_ptr<engine_metrics> metrics;     ///< nullptr: nowhere
  /// Called in the actor when the server answers again after it was
  /// unhealthy or restarted (the deployment re-registers the engine).
  std::function<void()> on_recovered;
};

/// A blocking call's outcome, applied in the actor (local messages only).
struct vllm_job_done {
  std::function<void()> apply;
};

/// One health poll (local).
struct vllm_health_report {
  bool healthy = false;
  std::string label; ///< /weight_info's weight_version when healthy and answered
  std::string why;   ///< why unhealthy
  std::chrono::steady_clock::time_point started;
};

/// What a generation stream read since its last report (local).
struct vllm_stream_update {
  std::uint64_t stream = 0; ///< the adapter's stream number
  std::string completion_id;
  std::vector<std::int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<std::int32_t, float>>> top;
  std::optional<finish_reason> finish;
  std::optional<std::vector<vllm::label_span>> spans; ///< the chunk's weight_versions, as the server sent them
  std::string error; ///< the stream failed (set alone, last)
  int refused_with = 0; ///< the HTTP status the server refused the request with (with error)
  bool ended = false; ///< the worker is done with the stream
};

} // namespace rlsync

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<rlsync::vllm_job_done>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<rlsync::vllm_health_report>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<rlsync::vllm_stream_update>)

namespace rlsync {

using vllm_job_atom = caf::atom_constant<caf::atom("vjob")>;
using vllm_health_atom = caf::atom_constant<caf::atom("vhealth")>;
using vllm_stream_atom = caf::atom_constant<caf::atom("vstream")>;

/// The interface plus the adapter's own local messages.
using vllm_engine_impl =
  rollout_engine_actor::extend<caf::reacts_to<vllm_job_atom, std::shared_ptr<vllm_job_done>>,
                               caf::reacts_to<vllm_health_atom, std::shared_ptr<vllm_health_report>>,
                               caf::reacts_to<vllm_stream_atom, std::shared_ptr<vllm_stream_update>>>;

/// One generation stream the adapter relays.
struct vllm_stream {
  generate_request request;
  token_sink_actor sink;
  caf::typed_response_promise<generate_result> promise;
  generate_result result;             ///< what was relayed so far (tokens from generated.size())
  std::string completion_id;          ///< the server's, once its first chunk came
  std::shared_ptr<std::atomic<bool>> cancel; ///< tells the worker to close the stream
  bool answered = false;              ///< the promise was delivered (the worker may still run)
  bool seen = false;                  ///< a chunk came: the server runs it
  std::uint64_t opened_at = 0;        ///< the version the server held as the stream opened
  /// With top_logprobs: whether the server sends them (a vLLM that ignores
  /// return_tokens_as_token_ids sends none the adapter can read), as its
  /// first chunk of tokens said; every later chunk must say the same.
  std::optional<bool> sends_top;
};

struct vllm_engine_state {
  std::string node;
  phase_order_count phase_orders; ///< the coordinator's, taken and not yet answered
  std::uint64_t version = 0;    ///< what the server holds, as the adapter knows it (0: its initial weights)
  bool dirty = false;
  bool said_no_top = false;     ///< that the server sends no top log-probabilities it can read: said once
  std::string finished_label;   ///< the label of the adapter's last successful finish; empty: none
  scheduler_state sched = scheduler_state::unpaused;
  std::optional<std::uint64_t> session; ///< the version of the open weight-update session
  std::string session_dir;      ///< written and loaded by the session's transfer; empty: none
  bool transfer_in_flight = false; ///< until its worker returned, even when its round was aborted
  std::uint64_t transfer_seq = 0; ///< bumps when a round is aborted or the server lost: a late transfer is stale
  std::uint64_t phase_seq = 0;  ///< bumps with every pause and finish (a late answer of an older one is stale)
  std::uint32_t control_calls = 0;
  std::chrono::steady_clock::time_point last_change; ///< of the last phase that changed the label
  bool healthy = false;         ///< until the first poll answers: not known healthy
  bool ever_healthy = false;
  std::uint64_t next_stream = 1;
  std::map<std::uint64_t, vllm_stream> streams;   ///< by stream number, answered ones until their worker ends
  std::map<std::uint64_t, std::uint64_t> stream_of; ///< request id -> stream number (unanswered ones)
  std::uint32_t workers = 0;    ///< stream workers still running (the bound counts them)
  std::uint64_t tokens_generated = 0;
  std::shared_ptr<std::atomic<bool>> stopped; ///< tells the health poller to stop
  std::shared_ptr<sender_guard> guard;
  static inline const char* name = "vllm_engine";
};

vllm_engine_impl::behavior_type vllm_engine(vllm_engine_impl::stateful_pointer<vllm_engine_state> self,
                                            vllm_engine_config cfg);

/// Spawns the adapter (and its health poller). Throws std::invalid_argument
/// for a bad url, an empty name or weights_dir, or server_tp < 1.
rollout_engine_actor spawn_vllm_engine(caf::actor_system& sys, vllm_engine_config cfg);

} // namespace rlsync
