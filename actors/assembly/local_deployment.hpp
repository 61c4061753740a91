#pragma once
// The one assembly of a head: the trainer (with the local data plane), the
// router, the coordinator and the engines hosted in this process, spawned,
// wired together and the engines registered (assemble_head). With every
// engine hosted it is a whole topology in one process (deploy_local: `rlsync
// run`, the drills); with the engines of the coordinator's node it is a
// cluster's head (head_node.hpp: `rlsync node`, `rlsync bench`). Engines of
// other nodes register through register_engine as well (member_node.hpp).
#include "actors/coordinator.hpp"
#include "actors/http/router_endpoint.hpp"
#include "actors/rollout_engine.hpp"
#include "actors/router.hpp"
#include "actors/trainer.hpp"
#include "actors/vllm_engine.hpp"
#include "gpu/device.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/metrics/registry.hpp"

#include <caf/actor_system.hpp>
#include <caf/node_id.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace rlsync {

/// One trainer rank hosted in this process: its own source, local data
/// plane, ticket office and trainer actor.
struct hosted_rank {
  std::uint32_t rank = 0;          ///< index in the topology's trainer.ranks
  std::uint64_t incarnation = 1;   ///< one more per restart
  local_trainer trainer;
};

/// How an engine reaches the trainer rank a transfer order names
/// (rollout_engine_config::producer_puller); nullptr when it cannot.
using producer_puller_factory =
  std::function<std::shared_ptr<transfer::weight_puller>(const producer_holding&, const trainer_actor&)>;

/// The coordinator to talk to now, replaced when it restarts or a member
/// rejoins another; read from actor threads (an adapter whose server came
/// back registers it again). Thread-safe.
class coordinator_ref {
public:
  void set(const coordinator_actor& c) {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = c;
  }
  coordinator_actor get() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return current_;
  }

private:
  mutable std::mutex mutex_;
  coordinator_actor current_;
};

struct local_deployment {
  /// The first rank hosted here (rank 0 in one process); empty when this
  /// process hosts no rank (a head holding the coordinator alone).
  local_trainer trainer;
  /// Every rank hosted here, in topology order (`trainer` is the first).
  std::vector<hosted_rank> ranks;
  /// The coordinator follows `trainer` itself (a single rank hosted with
  /// it, as before ranks existed); false: every rank registers (rank_info).
  bool single_trainer = true;
  /// Engines reach ranks hosted elsewhere through it (deployment_options).
  producer_puller_factory remote_pullers;
  std::shared_ptr<gpu::nccl_membership> nccl; ///< kept for restarted engines
  std::vector<rollout_engine_actor> engines; ///< the hosted ones, in topology order (either kind)
  std::vector<std::string> engine_names;
  /// Per engine: its drill faults (deployment_options::fault_gates), else nullptr.
  std::vector<std::shared_ptr<engine_fault_gate>> gates;
  /// Per engine: the incarnation running now (deployment_options::incarnation
  /// at first, one more per restart).
  std::vector<std::uint64_t> incarnations;
  router_actor router;
  /// The fleet's HTTP endpoint (router.http_port) when the router runs here; else nullptr.
  std::shared_ptr<router_endpoint> http;
  /// Who besides this process may drive the engines here: the coordinator
  /// and the router it vouches for (one registered from another node).
  std::shared_ptr<engine_drivers> drivers = std::make_shared<engine_drivers>();
  /// `coordinator`, for those on other threads.
  std::shared_ptr<coordinator_ref> current_coordinator = std::make_shared<coordinator_ref>();
  coordinator_actor coordinator;
  /// The dtype engines record their plans in (what the trainer sends).
  dtype source_dtype = dtype::bf16;
  /// Where engines (restarted ones too) record their metrics; nullptr: nowhere.
  std::shared_ptr<metrics::registry> metrics;
  /// The coordinator's configuration as first spawned (hooks included), for a restart.
  coordinator_config coordinator_cfg;

  /// Stops every actor (the trainer first, so no version appears mid-shutdown).
  void shutdown();
  /// Every actor here (empty handles included), for stop_and_await.
  std::vector<caf::actor> actors() const;

  /// Replaces engine `i` by a fresh process's worth of state: the old actor
  /// is killed (if alive), a new one spawned with the next incarnation and
  /// registered; it stays unroutable until its next sync. Returns the
  /// coordinator's refusal (e.g. retired past max_restarts), or empty.
  /// Blocking: call it from a thread that is not an actor.
  std::string restart_engine(caf::actor_system& sys, const topology& t, std::size_t i,
                             std::chrono::milliseconds deadline = std::chrono::milliseconds{10000});

  /// The router's configuration as first spawned, for a restart.
  router_config router_cfg;
  /// Who the trainer, router and coordinator admit (this process and the
  /// nodes deployment_options::admit admitted), for restarts too.
  sender_policy authorize;

  /// Kills the router (when alive) and spawns a new one, attached to the
  /// coordinator, which routes every current member to it. Returns it: the
  /// requesters must be told (set_workload_router) to resend what the dead
  /// one held.
  router_actor restart_router(caf::actor_system& sys);

  /// A trainer on the same source (its checkpoints survive it): spawned and
  /// attached to the coordinator, which retries the round it lost. `hosted`:
  /// which of `ranks`; with several ranks it registers again as the next
  /// incarnation (returns the coordinator's refusal, or empty).
  std::string restart_trainer(caf::actor_system& sys, const topology& t, std::size_t hosted = 0);

  /// Kills the coordinator (when `kill_first`) and starts a new one from
  /// its state file, then re-registers every live engine as it is (same
  /// incarnation, the version it serves): those current at the synced
  /// version serve on at once. The router keeps routing meanwhile. Throws
  /// std::runtime_error without a state file or when it is malformed.
  /// Blocking: call it from a thread that is not an actor.
  void restart_coordinator(caf::actor_system& sys, const topology& t, bool kill_first = true);
};

/// coordinator_config::origin for a cluster: a member (`node_of`: "engine
/// NAME", "trainer rank N" or "router" -> its node in the topology)
/// registers only from its own node, which is `here` for this process (CAF
/// node `own`) and what `name_of` says the gatekeeper admitted for any other.
std::function<std::string(const std::string&, const caf::node_id&)>
origin_check(std::map<std::string, std::string> node_of, caf::node_id own, std::string here,
             std::function<std::optional<std::string>(const caf::node_id&)> name_of);

struct deployment_options {
  /// The node whose engines run in this process; empty: every engine (one
  /// process plays every node).
  std::string node;
  /// Whether another process's node is admitted (a cluster's gatekeeper
  /// decides): the trainer, router and coordinator refuse every message from
  /// any other node; empty: none (this process's actors only).
  std::function<bool(const caf::node_id&)> admit;
  /// The node name an admitted node proved (nullopt: not admitted). Set: the
  /// coordinator takes an engine's registration only from the engine's own
  /// node in the topology (this process standing for `node`); empty: any.
  std::function<std::optional<std::string>(const caf::node_id&)> node_name_of;
  /// The incarnation of the engines spawned here; 0: 1 at first, or the one
  /// on record when the coordinator starts from its state file.
  std::uint64_t incarnation = 0;
  /// Every round's figures as the round ends; may be empty.
  std::function<void(const sync_report&)> on_sync;
  /// One line per notable event (evictions, failures); empty: quiet.
  std::function<void(const std::string&)> log;
  /// Per registration; registration fails the deployment past it.
  std::chrono::milliseconds register_deadline{10000};
  /// Give every engine a fault gate (drills).
  bool fault_gates = false;
  /// The coordinator's phase and membership hooks (coordinator_config); may be empty.
  decltype(coordinator_config::on_phase) on_phase;
  decltype(coordinator_config::on_member) on_member;
  decltype(coordinator_config::on_router) on_router;
  /// One line per reroute from the router; empty: quiet.
  std::function<void(const std::string&)> router_log;
  /// How the engines here pull from trainer ranks hosted in other processes;
  /// empty: they cannot (one process hosts every rank).
  producer_puller_factory remote_pullers;
  /// Where the coordinator, router and engines here record their metrics; nullptr: nowhere.
  std::shared_ptr<metrics::registry> metrics;
  /// transfer.backend nccl: this process's end of the communicator
  /// (nccl_plane.hpp), which its ranks and engines join; nullptr: none
  /// (one process: every engine takes its rank's weights over the local plane).
  std::shared_ptr<gpu::nccl_membership> nccl;
  /// The devices the start-up check reads (backend_device_problem); empty:
  /// gpu::query_devices(). Tests whose links come from a fake NCCL world
  /// give the devices that world stands for.
  std::optional<gpu::device_info> devices;
};

/// The dtype the trainer sends, which every engine records its plans in:
/// the topology's (synthetic models), else the type of the source's
/// parameters (a checkpoint's tensors; bf16 for a checkpoint directory
/// before its first step), else bf16. The head announces it to the other
/// nodes in the join grant.
dtype source_dtype_of(const topology& t, const transfer::weight_source& source);

/// The incarnation of what a cluster node (or a Python trainer rank) spawns:
/// the milliseconds since the epoch, above every earlier call's in this
/// process, so a restarted node's engines, or a rank reopened in the same
/// process, replace their predecessors and count as restarts. A node calls
/// it once and keeps it across rejoins (a reconnect is not a restart).
std::uint64_t next_incarnation();

/// Replica `spec` as the coordinator sees it at registration.
engine_info engine_info_of(const engine_spec& spec, std::uint64_t incarnation, std::uint64_t version = 0,
                           bool dirty = true);

/// How long a new engine may take to come up: it faults in its staging
/// weights as it starts (about a second per GB here), before it answers.
inline constexpr std::chrono::minutes engine_ready_deadline{5};

/// Waits until a newly spawned `engine` answers (its construction, staging
/// included, is done), up to engine_ready_deadline: the failure (rendered),
/// or empty. Registering it before that would let the first round's pause
/// wait for the construction.
std::string await_engine_ready(caf::actor_system& sys, const caf::actor& engine);

/// Registers `engine` as `info` with `coordinator`, waiting up to
/// `deadline`: the refusal (rendered), or empty once registered.
std::string register_engine(caf::actor_system& sys, const coordinator_actor& coordinator, const engine_info& info,
                            const caf::actor& engine, std::chrono::milliseconds deadline);

/// Registers hosted rank `r` of `t` with `coordinator` (rank_info_of its
/// source), waiting up to `deadline`, and has it catch up to the version the
/// reply names (a restarted rank meets the others there): the refusal
/// (rendered), or empty once registered.
std::string register_rank(caf::actor_system& sys, const coordinator_actor& coordinator, const topology& t,
                          const hosted_rank& r, std::chrono::milliseconds deadline);

/// Spawns the trainer ranks placed on `node` (every rank when empty; none
/// when they are external: their own processes host them), each
/// with its own source, local data plane and trainer actor, admitting
/// `authorize`, and taking engine placements from `placements_from` (empty:
/// this process, where the coordinator runs). Throws what make_weight_source throws.
std::vector<hosted_rank> spawn_ranks(caf::actor_system& sys, const topology& t, const std::string& node,
                                     const sender_policy& authorize, std::uint64_t incarnation,
                                     const sender_policy& placements_from = {},
                                     std::shared_ptr<gpu::nccl_membership> nccl = nullptr);

/// Why this process cannot run `t`'s transfer backend on what `devices`
/// shows (gpu::query_devices()): with cuda_ipc or nccl, a node that hosts a
/// trainer rank or a built-in engine needs a CUDA device at start-up (one
/// that hosts only the coordinator or the router needs none), and so does
/// an engine with `device: cuda` on `node` (empty: every node, one process
/// plays them all). Empty when it can. Every deployment asks before it
/// starts anything.
std::string backend_device_problem(const topology& t, const gpu::device_info& devices, const std::string& node = "");

/// Whether the coordinator on `node` (empty: one process) follows one
/// trainer directly: the topology has one rank and it runs there. Otherwise
/// ranks register with rank_info.
bool follows_single_trainer(const topology& t, const std::string& node);

/// The producer_puller of engines in a process hosting `ranks`: a hosted
/// rank through its local data plane, any other through `remote` (nullptr
/// without it).
producer_puller_factory rank_pullers(const std::vector<hosted_rank>& ranks, producer_puller_factory remote);

/// Stops `actors` (exit reason user_shutdown) and waits up to `deadline`
/// until each has terminated; true if all did.
bool stop_and_await(caf::actor_system& sys, std::vector<caf::actor> actors,
                    std::chrono::milliseconds deadline = std::chrono::seconds(10));

/// An engine replica's configuration from the topology; `device: cuda`
/// serves from CUDA device `device` (throws gpu_error when there is none).
rollout_engine_config engine_config_from(const topology& t, const engine_spec& e,
                                         std::shared_ptr<transfer::weight_puller> puller, dtype source_dtype,
                                         int device = 0);

/// The adapter's configuration for an external server (kind vllm) from the
/// topology: the url, the server's tp, weights_dir, the phases' deadlines
/// (sync.deadlines_ms), health polls as often as heartbeats
/// (cluster.heartbeat_*), streams bounded by max_batch + queue_limit. Reads
/// api_key_file: throws std::runtime_error naming it when it cannot.
vllm_engine_config vllm_engine_config_from(const topology& t, const engine_spec& e,
                                           std::shared_ptr<transfer::weight_puller> puller, dtype source_dtype);

/// What an engine replica of either kind takes from the process it runs in.
struct replica_wiring {
  std::shared_ptr<transfer::weight_puller> puller;
  producer_puller_factory producer_puller;
  dtype source_dtype = dtype::bf16;
  sender_policy authorize;
  std::function<bool(const caf::strong_actor_ptr& sender, const caf::actor_addr& router)> vouched_router;
  std::function<void(const std::string&)> log;
  std::shared_ptr<metrics::registry> metrics;
  /// The built-in engine's drill faults; nullptr: none (an adapter has none).
  std::shared_ptr<engine_fault_gate> faults;
  /// kind vllm: the coordinator to register with again once the server
  /// answers after it was lost (it restarted with its initial weights: a
  /// restart, unroutable until a sync brought it current); asked then.
  std::function<coordinator_actor()> coordinator;
  /// The incarnation the replica registers with first; a recovery registers a higher one.
  std::uint64_t incarnation = 1;
  /// transfer.backend nccl: the process's membership, which a built-in
  /// engine joins with its workers; nullptr: it joins none.
  std::shared_ptr<gpu::nccl_membership> nccl;
  /// Makes a built-in engine's device, given the CUDA device it would
  /// serve from (engine_device), in place of the one its `device` key makes
  /// (the tests' CPU fake); empty: as the key says.
  std::function<std::shared_ptr<engine::device_backend>(int device)> make_device;
};

/// Spawns replica `spec` as its kind says: the built-in engine actor, or the
/// adapter in front of its vLLM server. Throws std::runtime_error for an
/// adapter whose api_key_file cannot be read.
rollout_engine_actor spawn_replica(caf::actor_system& sys, const topology& t, const engine_spec& spec,
                                   const replica_wiring& w);

/// Spawns and wires a head as `opts` says: the trainer, the router, the
/// coordinator (started from coordinator.state_file when it exists) and the
/// engines of opts.node (every engine when empty), registered. Throws
/// std::runtime_error naming the engine whose registration failed, or the
/// state file's place that is malformed; whatever had started is stopped
/// first.
local_deployment assemble_head(caf::actor_system& sys, const topology& t, const deployment_options& opts);

/// Spawns and wires everything the topology places anywhere: a head
/// hosting every engine (assemble_head with opts.node cleared). The
/// coordinator heartbeats members as cluster.heartbeat_* say and starts from
/// coordinator.state_file when it exists. Throws std::runtime_error naming
/// the engine whose registration failed, or the state file's place that is
/// malformed.
local_deployment deploy_local(caf::actor_system& sys, const topology& t, deployment_options opts);

} // namespace rlsync
