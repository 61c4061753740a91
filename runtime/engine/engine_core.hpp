#pragma once
// The built-in rollout engine: `dp` continuous-batching scheduler ranks over
// the tensor-parallel model, with vLLM's pause/resume and weight-update
// semantics. Single-threaded by contract: one owner thread calls
// every method (the model runs its dp x tp workers inside a step). Callbacks
// run synchronously on that thread, so a token has been handed to its
// requester before the call that produced it returns — which is what lets
// pause() report "every earlier token delivered" without vLLM's 20 ms sleep.
//
// Request life cycle:
//
//   add ──► waiting ──admit (unpaused, slot free)──► running ──► finished
//              ▲                                      │  ▲           (length, eos,
//              │                        pause(keep)   ▼  │ resume     aborted)
//        queued while paused                        frozen
//
// Scheduler state: unpaused → pause(abort|wait) → paused_new (admit nothing;
// wait lets running requests finish) → resume; pause(keep) → paused_all
// (step nothing; running requests frozen in place).
//
// Data parallelism (vLLM's DP with its internal load balancer): each of the
// `dp` ranks has its own batch, queue, KV caches, prefix cache and tp
// workers; a request goes to one rank (least outstanding, or prefix
// affinity) and stays there. A step runs every rank's batch in one lockstep
// forward (model.hpp: with expert parallelism the experts are computed by
// all dp x tp workers for every rank's tokens). The ranks hold identical weights, so they
// share one weight set: a version is received once per engine and fanned
// out by reference (no copy per rank). Pause, resume, flush and the
// weight-update session are engine-wide: one pause covers every rank and
// completes when the last rank reaches its condition (rank_pause.hpp); a
// resume while any rank is on its way is pause_in_flight.
//
// Weight-update session: start_update(v) (paused only) → apply_* → finish_update(v).
// From start until a successful finish the engine is dirty and generates
// nothing; finish checks that every checkpoint tensor arrived for every
// worker, then swaps the staging weights in atomically.
#include "runtime/base/errc.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/control/protocol.hpp"
#include "runtime/engine/apply_packed.hpp"
#include "runtime/engine/process.hpp"
#include "runtime/engine/rank_pause.hpp"
#include "runtime/engine/kv_cache.hpp"
#include "runtime/engine/model.hpp"
#include "runtime/engine/sampling.hpp"
#include "runtime/plan/plan.hpp"

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

namespace rlsync::engine {

/// Which data-parallel rank takes a new request.
enum class dp_balance : std::uint8_t {
  least_outstanding, ///< the rank with the fewest requests (waiting + running); ties: the lowest rank
  /// The rank the prompt's first prefix-cache block hashes to, so that
  /// requests sharing a prompt (a GRPO group) share its cached KV; the
  /// least outstanding rank instead when that one has more than max_batch
  /// requests more than it.
  prefix_affinity,
};

struct engine_options {
  std::string name = "engine";
  int tp = 1;
  /// Scheduler ranks (vLLM's data_parallel_size), each with tp workers.
  int dp = 1;
  dp_balance balance = dp_balance::least_outstanding;
  /// Experts placed whole over the tp workers instead of sliced (vLLM's
  /// --enable-expert-parallel); needs a mixture-of-experts model.
  bool expert_parallel = false;
  /// What the engine serves from (process.hpp): the weights as received, or
  /// int8 computed from them each time a version is served.
  weight_format weights = weight_format::received;
  std::uint32_t max_batch = 32;       ///< requests running at once, per rank
  /// Requests waiting per rank: a request goes to another rank when its own
  /// rank's queue is full, and is refused (queue_full) when every queue is.
  std::uint32_t queue_limit = 256;
  std::int64_t prefill_chunk = 256;   ///< prompt tokens fed per request per step
  std::int64_t block_tokens = 16;     ///< prefix-cache block size
  std::size_t prefix_cache_blocks = 1024;
  dtype source_dtype = dtype::bf16;   ///< dtype of the weights the trainer sends (plans)
  /// Allocate the staging sets of the first two weight-update sessions at
  /// construction (rollout engines: a session then starts without faulting
  /// in a model's worth of pages on the engine's thread). Off for one-shot
  /// uses that only load().
  bool preallocate_staging = false;
  /// Where the matrix products run (device_gemm.hpp): null, the CPU; else a
  /// device holding a copy of each version served (gpu/engine_device.hpp).
  std::shared_ptr<device_backend> device;
};

/// How a request's output reaches its requester.
struct request_callbacks {
  std::function<void(const token_event&)> on_token;
  std::function<void(generate_result)> on_finish;
};

/// A call that failed: the code decides the caller's reaction, the text says why.
struct engine_error {
  errc code;
  std::string what;
};

/// checksum64 of every parameter shard of `w` (fp32 bytes), as "worker/param".
std::map<std::string, std::uint64_t> weight_checksums(const weight_set& w);

class engine_core {
public:
  engine_core(const model_config& c, engine_options opts);
  ~engine_core();
  engine_core(const engine_core&) = delete;
  engine_core& operator=(const engine_core&) = delete;

  const model_config& config() const;
  const engine_options& options() const { return opts_; }

  // -- weights ------------------------------------------------------------------

  /// Serves `weights` as version `version` from now on (engine start, or a
  /// checkpoint load outside a session). Clears dirty and the prefix cache.
  void load(std::shared_ptr<weight_set> weights, std::uint64_t version);
  std::uint64_t version() const { return version_; }
  bool dirty() const { return dirty_; }
  /// Worker w's sharding plan, recorded from the loader at construction.
  const plan::worker_plan& worker_plan(int w) const { return plans_.at(static_cast<std::size_t>(w)); }
  /// The weights served now (nullptr before load() and after release_weights()).
  std::shared_ptr<const weight_set> weights() const;
  /// Sleep level 2: drops the weights served now and every spare set, so
  /// that their memory is freed; the prefix cache goes too. The engine must
  /// be paused with no request admitted and no session open. It serves
  /// nothing until load() or a finished session brings weights back (a
  /// session of the same version re-loads it): resume() is refused
  /// meanwhile. Returns the bytes released, or why not.
  std::variant<std::uint64_t, engine_error> release_weights();
  bool released() const { return released_; }

  // -- requests -----------------------------------------------------------------

  /// Accepts a request (queued on one rank until it can run). Refuses a malformed
  /// request, a token outside the vocabulary, a duplicate id, a full queue
  /// (queue_full) and a dirty engine (engine_dirty).
  std::optional<engine_error> add(generate_request req, request_callbacks cb);
  /// Aborts a request wherever it is; its partial output is delivered with
  /// reason aborted. False when the id is unknown.
  bool abort(std::uint64_t request_id);

  /// One scheduling step: admits waiting requests into free slots, then
  /// advances every running request by one prefill chunk or one decode
  /// token. Returns the tokens produced (0: nothing could run).
  std::size_t step();
  /// True when step() would make progress.
  bool has_work() const;

  // -- pause and resume (vLLM's semantics) -----------------------------------

  /// Starts a pause. abort: every request known now is aborted at once
  /// (partial outputs delivered); wait: running requests run to completion;
  /// keep: running requests are frozen. clear_cache drops the prefix cache
  /// and the KV of frozen requests (they are recomputed on resume). New
  /// requests are queued, never scheduled, never rejected for the pause.
  void pause(const pause_request& req);
  /// The pause's report once the engine is idle (at once for abort and keep,
  /// after the last running request finished for wait); nullopt while the
  /// pause is in flight or when not paused.
  std::optional<pause_report> poll_pause();
  bool pause_in_flight() const;
  /// Back to unpaused: frozen requests continue, queued ones start. An error
  /// (pause_in_flight) while a wait-pause still has running requests.
  std::optional<engine_error> resume();
  /// Drops the prefix cache (a separate call, as RL frameworks do it).
  void flush();
  scheduler_state state() const { return state_; }

  // -- weight-update session ----------------------------------------------------

  /// Opens the session for `version`: the engine must be paused and idle
  /// (not_paused) and `version` newer than the one held (version_mismatch).
  /// The engine is dirty until finish_update succeeds.
  std::optional<engine_error> start_update(std::uint64_t version);
  /// Sharded path: `bytes` are worker w's plan entries whose source tensor is
  /// in `sources`, packed in plan order (what the trainer's replay produced).
  std::optional<engine_error> apply_packed(int worker, const std::set<std::string>& sources,
                                           const std::uint8_t* bytes, std::size_t size);
  /// Full-tensor path (broadcast, buckets): runs the loader for every worker.
  std::optional<engine_error> apply_tensor(const rlsync::tensor_view& tensor);
  /// Publishes `version`: every checkpoint tensor must have arrived for every
  /// worker (update_incomplete otherwise; the engine stays dirty).
  std::optional<engine_error> finish_update(std::uint64_t version);
  /// The transfer order says the session's version holds the same bytes as
  /// every version since `same_since` (0: not known). An engine that served
  /// one of them, clean, before the session started pulls nothing:
  /// finish_update then serves the same set as the session's version (no
  /// copy). True when that is so; false, and nothing changes, otherwise
  /// (the engine pulls as usual).
  bool keep_served(std::uint64_t same_since);
  /// Abandons an open session: the engine stays dirty.
  void abort_update();
  /// The round was aborted before finish (the trainer died): closes an open
  /// session. An engine that received nothing of it — no bytes arrived and
  /// `bytes_in_flight` is false — is as clean as before the session and
  /// serves its old weights again; one that received part stays dirty.
  /// Returns dirty().
  bool abandon_update(bool bytes_in_flight);
  bool in_session() const { return session_.has_value(); }
  /// The open session's version, if any.
  std::optional<std::uint64_t> session_version() const;

  /// Data-plane pulls write straight into the staging weights from their own
  /// threads (each thread only into its worker's shard; the owner calls
  /// nothing else on the session meanwhile), then the owner records what
  /// arrived. nullptr outside a session.
  std::shared_ptr<weight_set> session_staging() const;
  /// With a device that lands (device_gemm.hpp) and weights served as
  /// received: a landing for the session's staging set, attached to it,
  /// for a pull that holds the bytes on a device to fill beside the host
  /// set. nullptr otherwise (no session, no device, the int8 format).
  std::shared_ptr<device_landing> open_landing();
  std::optional<engine_error> mark_received(int worker, const std::set<std::string>& sources,
                                            std::uint64_t version);

  // -- status ---------------------------------------------------------------------

  /// The whole engine: counts summed over the ranks.
  engine_status status() const;
  int dp() const { return opts_.dp; }
  /// One rank's requests: running (or frozen) and waiting.
  std::pair<std::uint32_t, std::uint32_t> rank_load(int rank) const;
  /// The rank that holds request `id`, if any.
  std::optional<int> rank_of(std::uint64_t request_id) const;

  /// Fault injection (drills): tp worker `worker` of rank `rank` dies (its
  /// thread ends). The engine is broken from then on: failure() says so,
  /// and a step of that rank throws engine::worker_died.
  void kill_worker(int rank, int worker);
  /// Why the engine cannot serve any more (a worker died), if so.
  std::optional<std::string> failure() const;
  /// Requests ended `failed` because their logits held NaN or infinity
  /// (broken weights): never sampled from, never reported as a success.
  std::uint64_t nonfinite_logits() const { return nonfinite_logits_; }
  /// checksum64 of every parameter shard served now, as "worker/param" → checksum
  /// (fp32 bytes): compare an engine against weights loaded elsewhere.
  std::map<std::string, std::uint64_t> weight_checksums() const;

private:
  struct request;
  struct prefix_cache;
  struct scheduler_rank;

  /// Swaps `weights` in as the served set of `version`.
  void serve(std::shared_ptr<weight_set> weights, std::uint64_t version);
  /// The rank a new request goes to (balance, among ranks whose queue has
  /// room); nullptr when every queue is full.
  scheduler_rank* choose_rank(const generate_request& req);
  void admit(scheduler_rank& rank);
  /// What one rank's step feeds its requests with: the request of each
  /// batch item, and whether its logits are sampled (its prompt is all in).
  struct rank_batch {
    std::vector<std::uint64_t> order; ///< request ids
    std::vector<bool> samples;
  };
  /// Admits into `rank` (unpaused) and builds its batch for the next step.
  void gather(scheduler_rank& rank, std::vector<forward_item>& batch, rank_batch& work);
  /// Samples and emits what `rank`'s part of the step produced; returns the tokens.
  std::size_t deliver(scheduler_rank& rank, const std::vector<forward_item>& batch, const rank_batch& work,
                      const forward_output& out);
  void finish(scheduler_rank& rank, request& r, finish_reason why);
  void emit(request& r, std::int32_t token, std::uint64_t version, bool stale, const token_logprobs* lp);
  /// Tells the pause which ranks have reached its condition; completes it
  /// when the last one has.
  void finish_paused_wait_if_idle();
  std::size_t running_count() const;
  /// The engine's model (every rank's workers).
  model& primary();
  const model& primary() const;

  engine_options opts_;
  std::unique_ptr<model> net_; ///< dp x tp workers, stepping every rank in lockstep
  std::vector<std::unique_ptr<scheduler_rank>> ranks_;
  std::vector<plan::worker_plan> plans_;
  std::uint64_t version_ = 0;
  bool dirty_ = true; // nothing loaded yet
  scheduler_state state_ = scheduler_state::unpaused;

  struct pending_pause {
    pause_request req;
    pause_report report;
  };
  std::optional<pending_pause> pause_;
  std::optional<pause_report> completed_pause_;
  rank_pause rank_pause_;

  struct session {
    std::uint64_t version = 0;
    std::shared_ptr<weight_set> staging;
    std::vector<std::set<std::string>> arrived; ///< per worker: source tensors applied
    bool was_dirty = true; ///< before the session started
    bool keeps_served = false; ///< keep_served: the served set's bytes are the version's
  };
  std::optional<session> session_;
  /// An open session into which nothing was applied yet.
  bool nothing_arrived() const;
  /// The set served now, and the one it replaced: the next session fills
  /// the spare in place instead of faulting in fresh pages (first touch
  /// costs more than the copy itself).
  std::shared_ptr<weight_set> serving_, spare_;
  /// With preallocate_staging, a second staging set made at construction, like spare_: the first two
  /// sessions then allocate nothing. Faulting in a model's worth of fresh
  /// pages takes seconds at GB scale, and a session starts on the engine's
  /// own thread, where it would miss heartbeats and the start deadline.
  std::shared_ptr<weight_set> reserve_;
  bool released_ = false; ///< release_weights() ran and no weights came since

  std::uint64_t tokens_generated_ = 0;
  std::uint64_t nonfinite_logits_ = 0;
  std::uint64_t dirty_tokens_ = 0; ///< emitted while dirty: must stay 0 (a drill invariant)
};

} // namespace rlsync::engine
