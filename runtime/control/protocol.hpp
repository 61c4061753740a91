#pragma once
// The values the four actors exchange. Plain structs, no CAF:
// runtime/ code builds and tests them without an actor system. Their CAF
// `inspect` overloads, type IDs and atoms live in actors/type_ids.hpp.
//
// Every struct that crosses the network is checked on arrival with the
// matching `check_*` function below, because a peer can lie: an enum out of
// range or a span that does not add up is rejected, never trusted.
#include "runtime/config/modes.hpp"
#include "runtime/config/topology.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rlsync {

// -- engine scheduler -------------------------------------------------------

/// The scheduler's pause state.
enum class scheduler_state : std::uint8_t { unpaused, paused_new, paused_all };

/// What `pause` reports once the engine is idle and every token produced
/// before the pause has reached its requester.
struct pause_report {
  std::string engine;
  std::uint64_t version = 0;
  scheduler_state state = scheduler_state::unpaused;
  std::uint32_t aborted = 0; ///< requests aborted (mode abort)
  std::uint32_t frozen = 0;  ///< requests frozen (mode keep)
  std::uint32_t waited = 0;  ///< requests run to completion (mode wait)
};

// -- generation ---------------------------------------------------------------

/// Per-request sampling. temperature 0 means greedy.
struct sampling_params {
  float temperature = 0.0f;
  float top_p = 1.0f;
  std::uint32_t max_tokens = 16;
  std::uint64_t seed = 0;
  bool stop_at_eos = true;
  /// Report each sampled token's log-probability (log-softmax of the raw
  /// logits, before temperature and top-p). Off by default: computing it
  /// costs a pass over the vocabulary per token.
  bool logprobs = false;
  /// With logprobs: also this many most probable tokens per step, with
  /// theirs (at most max_top_logprobs).
  std::uint32_t top_logprobs = 0;
  /// Tokens that end the request like EOS (reason eos), ignore_eos or not.
  std::vector<std::int32_t> stop_token_ids;
};

/// Whether sampling `token` ends a request sampled with `s` as EOS does
/// (finish_reason::eos): the EOS token unless ignored, or a stop token.
bool ends_as_eos(const sampling_params& s, std::int32_t token);

/// A generation request. `generated` carries tokens already produced
/// elsewhere (a reroute after a replica failed): the engine continues after
/// them and counts them against max_tokens.
struct generate_request {
  std::uint64_t request_id = 0;
  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> generated;
  sampling_params sampling;
  std::uint64_t min_version = 0; ///< staleness bound: do not serve below this version
  /// Longest the router may hold the request while no engine can serve it
  /// (every engine down, or none current), counted from its arrival and again
  /// from each requeue after its engine failed; then it is rejected. 0: the
  /// router's default. Relative, so that no clocks need to agree.
  std::uint32_t deadline_ms = 0;
};

/// One streamed token. `index` counts generated tokens from 0 for the
/// request (reroutes continue the count), so a receiver detects gaps and
/// duplicates.
struct token_event {
  std::uint64_t request_id = 0;
  std::uint32_t index = 0;
  std::int32_t token = 0;
  std::uint64_t version = 0; ///< weight version that produced this token
  bool stale_kv = false;     ///< produced over KV computed with older weights
  /// With sampling.logprobs: the token's log-probability, and the
  /// sampling.top_logprobs most probable tokens with theirs (most probable
  /// first, ties by lower id). Empty or 0 otherwise.
  float logprob = 0.0f;
  std::vector<std::int32_t> top_tokens;
  std::vector<float> top_logprobs;
};

/// Generated tokens [begin, end) produced with one weight version.
struct version_span {
  std::uint64_t version = 0;
  std::uint32_t begin = 0;
  std::uint32_t end = 0;
};

enum class finish_reason : std::uint8_t {
  length,   ///< max_tokens reached
  eos,      ///< end-of-sequence token
  aborted,  ///< pause(abort) or an explicit abort
  rejected, ///< never started: queue full or nothing routable before a deadline
  failed,   ///< the serving engine failed and no retry was possible
};

/// The final answer to a generate request.
struct generate_result {
  std::uint64_t request_id = 0;
  std::vector<std::int32_t> tokens; ///< every generated token, reroutes included
  std::vector<version_span> spans;  ///< contiguous, cover [0, tokens.size())
  finish_reason reason = finish_reason::length;
  std::string engine;               ///< the engine that produced the last token
  std::uint32_t stale_kv_tokens = 0;
  /// With sampling.logprobs: one per token; else empty. Top tokens and their
  /// log-probabilities are flat, sampling.top_logprobs per token.
  std::vector<float> logprobs;
  std::vector<std::int32_t> top_tokens;
  std::vector<float> top_logprobs;
};

// -- membership and health ------------------------------------------------------

/// How an engine introduces itself to the coordinator.
struct engine_info {
  std::string name;  ///< unique replica name from the topology
  std::string node;  ///< topology node it runs on
  std::uint32_t tp = 1;
  std::uint64_t version = 0; ///< version it holds (0: none yet)
  bool dirty = false;        ///< holds a partial update
  std::uint64_t incarnation = 0; ///< grows with every restart of this replica
  /// Its scheduler is paused (a coordinator that paused it went before
  /// continuing it): it serves only once a sync continues it.
  bool paused = false;
};

/// The coordinator's answer to a registration.
struct registration {
  std::uint64_t current_version = 0;
  bool routable = false; ///< false until the engine completes a sync
};

struct heartbeat {
  std::string from;
  std::uint64_t seq = 0;
};

/// What an engine reports about itself.
struct engine_status {
  std::string name;
  std::uint64_t version = 0;
  bool dirty = false;
  scheduler_state state = scheduler_state::unpaused;
  std::uint32_t running = 0;
  std::uint32_t waiting = 0;
  std::uint32_t frozen = 0;
  std::uint64_t tokens_generated = 0;
  std::uint64_t dirty_tokens = 0; ///< tokens produced while dirty (never, by design)
  std::uint64_t prefix_cache_hits = 0;
  std::uint64_t prefix_cache_queries = 0;
  std::uint64_t refused = 0; ///< messages refused: their sender may not drive this engine
};

// -- weight-update session ------------------------------------------------------

/// Metadata of one parameter as the trainer holds it (full, unsharded).
struct tensor_meta {
  std::string name;
  std::uint8_t dtype = 0; ///< rlsync::dtype as an integer
  std::vector<std::int64_t> shape;
};

/// One tensor's bytes inside a bucket.
struct bucket_entry {
  std::string name;
  std::uint8_t dtype = 0;
  std::vector<std::int64_t> shape;
  std::uint64_t offset = 0; ///< into bucket data
  std::uint64_t bytes = 0;
  /// Where these bytes start in the whole tensor: 0 for a whole tensor; a
  /// tensor cut across buckets comes as pieces of flat shape {elements}.
  std::uint64_t tensor_offset = 0;
};

/// A bucket of weights for `update`. When the bytes travel over the data
/// plane, `data` is empty and only the layout and checksum come through CAF.
struct weight_bucket {
  std::uint64_t version = 0;
  std::uint32_t group = 0; ///< index of the parameter group (transformer block)
  std::vector<bucket_entry> entries;
  std::vector<std::uint8_t> data;
  std::uint64_t checksum = 0; ///< checksum64 of the bucket bytes
};

/// A trainer rank as it registers with the coordinator: which rank of the
/// topology's trainer.ranks it is, which restart, and what it holds.
struct rank_info {
  std::uint32_t rank = 0; ///< index in the topology's trainer.ranks
  std::string node;       ///< topology node it runs on
  std::uint64_t incarnation = 0; ///< grows with every restart of this rank
  std::vector<std::string> held; ///< names of the tensors it holds, ascending
};

/// One producer of a transfer: a trainer rank (this incarnation) and the
/// tensors it holds. Engines pull each tensor from one of its holders.
struct producer_holding {
  std::uint32_t rank = 0;
  std::uint64_t incarnation = 0;
  std::vector<std::string> held; ///< tensor names, ascending
};

/// The coordinator's order for the transfer phase. Only what the engine
/// uses: the pipeline depth and the group layout come from the engine's own
/// data plane (set up from the topology).
struct transfer_order {
  std::uint64_t version = 0;
  transfer_mode mode = transfer_mode::sharded;
  std::string backend; ///< local, ucx (named in the engine's errors)
  /// The trainer ranks to pull from and what each holds (their actor
  /// handles travel beside the order, in the same order); empty: the
  /// engine's one producer (a single trainer).
  std::vector<producer_holding> producers;
  /// The version's bytes equal those of every version from this one on
  /// (version_info::same_bytes_since): an engine serving one of them, clean,
  /// pulls nothing. 0: not known, every engine pulls.
  std::uint64_t same_bytes_since = 0;
};

/// What an engine reports once it has received and verified a version.
struct transfer_report {
  std::string engine;
  std::uint64_t version = 0;
  std::uint64_t bytes = 0;       ///< bytes this engine's workers received
  std::uint32_t groups = 0;
  std::uint64_t duration_ns = 0;
  /// Where its slowest worker's pull went (transfer::pull_report): waiting
  /// for producers and storing (copy, checksum, the sink); 0 where the
  /// data plane does not measure it.
  std::uint64_t wait_ns = 0;
  std::uint64_t store_ns = 0;
  /// ... and how long that worker's thread ran on a core, and waited
  /// runnable for one (a host with more busy threads than cores); 0: not
  /// measured.
  std::uint64_t ran_ns = 0;
  std::uint64_t queued_ns = 0;
};

/// The acknowledgement of start, flush, finish and continue.
struct phase_ack {
  std::string engine;
  std::uint64_t version = 0;
  /// Holds a partial update and serves nothing (a continue after an aborted round).
  bool dirty = false;
};

/// Published by the trainer when a version is ready to be pulled.
struct version_info {
  std::uint64_t version = 0;
  std::uint32_t groups = 0;
  std::uint64_t total_bytes = 0;
  /// A trainer rank's: checksum64 of each tensor it holds, in the order of
  /// its rank_info::held, so that the coordinator finds two ranks holding
  /// one tensor with different bytes. Empty: not computed.
  std::vector<std::uint64_t> checksums;
  /// The oldest version whose bytes equal this one's, every version between
  /// them the same too (weight_source::same_bytes_since): `version` when it
  /// changed something; 0: not known. At most `version`.
  std::uint64_t same_bytes_since = 0;
};

/// The coordinator's record of one sync round: stall, transfer, bytes (for
/// the effective bandwidth) and control-plane overhead.
struct sync_report {
  std::uint64_t version = 0;
  std::uint32_t engines_synced = 0;
  std::vector<std::string> evicted;
  std::uint64_t stall_ns = 0;    ///< pause sent → last resume acknowledged
  std::uint64_t transfer_ns = 0; ///< transfer phase
  std::uint64_t bytes = 0;       ///< bytes received by all engine workers
  std::uint64_t control_ns = 0;  ///< stall minus transfer: the control plane's share
  bool aborted = false;
  /// The slowest engine's pull (the transfer report of longest duration,
  /// what bounds the transfer phase): its duration and its slowest
  /// worker's wait and store (transfer_report); zeros when none pulled.
  std::uint64_t slowest_pull_ns = 0;
  std::uint64_t slowest_wait_ns = 0;
  std::uint64_t slowest_store_ns = 0;
  std::uint64_t slowest_ran_ns = 0;    ///< that worker on a core
  std::uint64_t slowest_queued_ns = 0; ///< that worker runnable, waiting for a core
};

/// Checksums of the weights an engine serves (checksum64 of every parameter
/// shard, fp32), to verify that engines hold exactly the trainer's weights.
struct weight_digest {
  std::string engine;
  std::uint64_t version = 0;
  bool dirty = false;
  std::vector<std::string> names; ///< "worker/parameter"
  std::vector<std::uint64_t> checksums;
};

/// What an engine worker needs to pull over UCX, asked of the trainer (a
/// members-only request): the producer's UCX worker address (it listens on
/// no port of its own) and a session token it issued for that worker.
struct ucx_ticket {
  std::vector<std::uint8_t> producer;
  std::vector<std::uint8_t> token;
};

/// What an engine worker asks a trainer for over cuda_ipc (a members-only
/// request): group `group` of `version` as chunk `chunk` of its session
/// `session` (chunk 0 with session 0 begins a session). Also the release
/// that ends the session (version, group and chunk unused).
struct ipc_pull {
  std::string engine;
  std::int32_t worker = 0;
  std::uint64_t version = 0;
  std::uint32_t group = 0;
  std::uint32_t chunk = 0;
  std::uint64_t session = 0;
};

/// The answer: the group's bucket bytes lie at [offset, offset + bytes) of
/// the trainer's exported device buffer (`handle`: a cudaIpcMemHandle_t,
/// `buffer_bytes` long); `bucket` is the bucket without its bytes.
struct ipc_chunk {
  std::uint64_t session = 0;
  std::uint32_t chunk = 0;
  std::vector<std::uint8_t> handle;
  std::uint64_t buffer_bytes = 0;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  weight_bucket bucket;
};

/// nccl: an engine worker asks a trainer (rank) to send group `group` of
/// `version` to it over the communicator of `epoch`, and waits `wait_ms` for
/// the bytes (the send's deadline on the trainer's clock). `plan` 0: the
/// group whole (broadcast mode); else the digest of the worker's plan as it
/// registered it (nccl_plan): the rank packs the worker's entries of the
/// group (sharded mode).
struct nccl_pull {
  std::string engine;
  std::int32_t worker = 0;
  std::uint64_t version = 0;
  std::uint32_t group = 0;
  std::uint64_t epoch = 0;
  std::uint32_t wait_ms = 0;
  std::uint64_t plan = 0;
};

/// nccl, sharded: an engine worker's sharding plan (the ucx wire's plan
/// encoding), registered with a trainer rank in the communicator of `epoch`
/// before the worker asks it for packed groups. The answer is the plan's
/// digest (checksum64 of `plan`), which the worker's pulls name.
struct nccl_plan {
  std::string engine;
  std::int32_t worker = 0;
  std::uint64_t epoch = 0;
  std::vector<std::uint8_t> plan;
};

/// The answer, once the send is queued: the group's `bytes` bytes arrive
/// over NCCL from rank `root` of communicator `epoch`; `bucket` is the
/// bucket without its bytes (sharded: no entries, the checksum of the
/// packed bytes).
struct nccl_chunk {
  std::uint64_t epoch = 0;
  std::int32_t root = 0;
  std::uint64_t bytes = 0;
  weight_bucket bucket;
  /// Sharded, packed on the rank's device: the bytes sent are the packed
  /// bytes followed by their mixsum64 in 8 little-endian bytes (a device
  /// computes no XXH3), and bucket.checksum is unused.
  bool trailer = false;
};

/// nccl, the collective baseline (broadcast mode; with several trainer
/// ranks, on the asked rank's own communicator, root its rank 0): the
/// answer to an engine worker's ask for a version (nccl_broadcast_atom, an
/// nccl_pull without group or plan). A broadcast starts only once every
/// worker of the communicator asked for the version; until then the answer
/// is `wait` (ask again). If they do not all ask within the rank's join
/// window, or the version was broadcast already, it is `point_to_point`:
/// pull the groups one by one (nccl_pull_atom). With `broadcast`: what the
/// rank broadcasts to every member of communicator `epoch`, in this order:
/// one bucket per group, group i's `bytes[i]` bytes being its data, then its
/// checksum64 in 8 little-endian bytes (known only once the rank packed
/// it). `buckets` are without their bytes. Broadcast k carries the next
/// `packed[k]` of them back to back (transfer.bucket_bytes); `packed` empty:
/// one each.
struct nccl_manifest {
  enum status_t : std::uint8_t { broadcast = 0, wait = 1, point_to_point = 2 };
  std::uint8_t status = broadcast;
  std::uint64_t epoch = 0;
  std::int32_t root = 0;
  std::vector<weight_bucket> buckets;
  std::vector<std::uint64_t> bytes;
  std::vector<std::uint32_t> packed;
};

/// A member of an NCCL communicator on the wire (gpu::comm_member): a
/// trainer rank, or worker `rank` of engine `engine`.
struct nccl_member {
  bool producer = false;
  std::string engine;
  std::int32_t rank = 0;
};

/// The coordinator's rendezvous for a new communicator
/// (gpu::nccl_rendezvous): every process hosting a member joins it.
/// gpu::from_wire checks it (the id is NCCL's 128 bytes).
struct nccl_rendezvous_msg {
  std::uint64_t epoch = 0;
  std::vector<std::uint8_t> id;
  std::vector<nccl_member> members; ///< in rank order
  /// The collective with several trainer ranks: one id per producer, in
  /// member order, for its own communicator with every worker. Else empty.
  std::vector<std::vector<std::uint8_t>> root_ids;
};

/// Where a registered engine runs, as the coordinator tells every trainer
/// (rank) it follows: the CAF node id, printed, of the process that
/// registered it. A trainer issues an engine's UCX tickets only to that node
/// and serves weights to other nodes only when they host an engine.
struct engine_placement {
  std::string engine;
  std::string node;
};

// -- routing and status ---------------------------------------------------------

/// The coordinator tells the router which engine may serve which version.
struct route_update {
  std::string engine;
  std::uint64_t version = 0;
  bool routable = false;
};

struct router_status {
  std::uint32_t routable = 0;    ///< engines requests may go to now
  std::uint32_t queued = 0;      ///< requests waiting for a routable engine
  std::uint32_t outstanding = 0; ///< requests sent to engines, not yet finished
  std::uint64_t completed = 0;
  std::uint64_t rejected = 0;
  std::uint64_t rerouted = 0;
  std::uint64_t refused = 0; ///< messages refused: their sender's node is not admitted
  /// Requests sent to each known engine, not yet finished.
  std::map<std::string, std::uint32_t> outstanding_by_engine;
};

/// One trainer rank as the coordinator sees it (coordinator_status::ranks).
struct rank_status {
  std::uint32_t rank = 0;
  std::string node;
  std::uint64_t incarnation = 0;
  std::uint64_t latest_version = 0; ///< the newest version it published (0: none yet)
  std::uint64_t pinned_version = 0; ///< the version the last round pinned on it (0: none yet)
  bool reachable = false;           ///< registered, not down, answering heartbeats
};

struct coordinator_status {
  std::uint64_t version = 0; ///< last version every live engine holds
  std::vector<engine_info> members;
  std::vector<std::string> routable;
  std::uint64_t rounds = 0;
  std::vector<sync_report> history; ///< the last rounds, oldest first (bounded)
  std::vector<std::string> unreachable; ///< silent past the heartbeat timeout
  std::vector<std::string> retired;     ///< past max_restarts, refused for good
  std::uint32_t live = 0;               ///< members answering heartbeats
  std::uint64_t below_min_live_events = 0; ///< times live fell below min_live_engines
  std::uint64_t refused = 0; ///< messages refused: their sender's node is not admitted
  std::vector<rank_status> ranks; ///< the registered trainer ranks by index (none: a single trainer)
  /// Each replica's last eviction from a round, "phase: why" (those never evicted are absent).
  std::map<std::string, std::string> last_evictions;
  /// transfer.backend nccl: the communicator the members joined (epoch 0:
  /// none), its members, how many were built, and whether it serves (no
  /// member failed since).
  std::uint64_t nccl_epoch = 0;
  std::uint32_t nccl_members = 0;
  std::uint64_t nccl_rebuilds = 0;
  bool nccl_healthy = false;
};

// -- names and checks ------------------------------------------------------------------

std::string to_string(pause_mode x);
std::string to_string(scheduler_state x);
std::string to_string(finish_reason x);
std::string to_string(transfer_mode x);

// -- bounds on what a peer can make rlsync hold -----------------------------------
// Checked on arrival, before anything is stored or acted on; a value past
// one is refused with the field and the bound named.

/// Names a peer sends (engine, node, heartbeat sender, backend): bytes.
constexpr std::size_t max_name_bytes = 256;
/// Tokens of one request's prompt, and of what it already generated.
constexpr std::size_t max_request_tokens = std::size_t{1} << 20;
/// Tensors in one inline weight bucket.
constexpr std::size_t max_bucket_entries = std::size_t{1} << 16;
/// Dimensions of one tensor's shape.
constexpr std::size_t max_shape_rank = 8;
/// A published version number (version_info::version): a step counter never
/// gets near it, and a peer's 2^64-1 would wedge the never-backwards counter
/// (and wrap the +1s after it).
constexpr std::uint64_t max_version = std::uint64_t{1} << 53;
/// The version after `v`, for "vouches from the next one": saturating, so a
/// number that slipped past the bound never wraps to 0 (vouching for all).
constexpr std::uint64_t next_version(std::uint64_t v) { return v < UINT64_MAX ? v + 1 : v; }
/// Tensors one trainer rank may hold (rank_info::held, producer_holding::held).
constexpr std::size_t max_held_tensors = std::size_t{1} << 18;
/// Trainer ranks one transfer order may name.
constexpr std::size_t max_producers = 4096;
/// Most probable tokens a request may ask to see per step (vLLM's default max_logprobs).
constexpr std::uint32_t max_top_logprobs = 20;
/// Stop token ids of one request.
constexpr std::size_t max_stop_token_ids = 256;
/// Heartbeat waves one control-plane probe may ask for.
constexpr std::uint32_t max_probe_waves = 10000;
/// An engine's tensor-parallel workers (engine_info::tp), as the topology
/// bounds them: the coordinator makes a communicator member of each.
constexpr std::uint32_t max_engine_tp = 1024;

/// Empty when `name` (field `field`) is non-empty and within max_name_bytes,
/// else what is wrong with it.
std::string check_name(const std::string& name, const char* field);

/// Checks of values received from a peer. Each returns an empty string when
/// the value is well formed, else what is wrong with it.
std::string check(const engine_info& x);
std::string check(const heartbeat& x);
std::string check(const route_update& x);
std::string check(const pause_request& x);
std::string check(const generate_request& x);
std::string check(const generate_result& x);
std::string check(const weight_bucket& x);
std::string check(const transfer_order& x);
std::string check(const rank_info& x);
std::string check(const producer_holding& x);
std::string check(const version_info& x);

} // namespace rlsync
