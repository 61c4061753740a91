#pragma once
// The topology: one YAML file describing where everything runs (nodes, the
// trainer and its ranks, engine replicas, router, coordinator), how weights
// move (transfer), when (sync), what load to generate (workload) and which
// faults to inject (drill). Loading validates everything and resolves it:
// defaults filled in, engine replicas expanded, paths made absolute, the
// model's shape known. See configs/local.yaml for an annotated example.
#include "runtime/base/dtype.hpp"
#include "runtime/config/model_config.hpp"
#include "runtime/config/modes.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace rlsync {

using std::chrono::milliseconds;

/// The longest request deadline (workload.request_deadline_ms, a request's
/// own deadline_ms): one hour.
inline constexpr std::int64_t max_request_deadline_ms = 3600 * 1000;
/// The most restarts a node's max_restarts may allow.
inline constexpr std::int64_t max_node_restarts = 100;

/// Where trainer versions come from: generated here (synthetic), read from
/// step directories (checkpoint_dir), or handed in by an outside process per
/// rank (external: the `rlsync` Python module's TrainerRank joins the cluster
/// as that rank; nodes start nothing for it).
enum class trainer_source { synthetic, checkpoint_dir, external };
enum class router_policy { least_outstanding, round_robin, prefix_affinity };
// nccl and cuda_ipc need a CUDA build (validation) and a device (start-up).
enum class transfer_backend { local, ucx, nccl, cuda_ipc };
// transfer_mode (sharded, broadcast) comes from config/modes.hpp.
enum class ucx_transport { shm, cma, tcp, rdma };
enum class fault_action { kill, restart, partition, heal, delay_acks, corrupt, kill_worker };
enum class fault_target { engine, node, trainer, router, coordinator };
/// What `rlsync launch` does when a node's process fails on its own.
enum class node_restart { never, on_failure };
/// What an engine entry runs: rlsync's own engine in the node's process, or
/// an external server that speaks vLLM's HTTP API, fronted by an adapter
/// actor on the node.
enum class engine_kind { builtin, vllm };

/// The YAML spellings ("least_outstanding", "cuda_ipc", ...).
std::string_view to_string(trainer_source v);
std::string_view to_string(router_policy v);
std::string_view to_string(transfer_backend v);
std::string_view to_string(ucx_transport v);
std::string_view to_string(fault_action v);
std::string_view to_string(fault_target v);
std::string_view to_string(node_restart v);
std::string_view to_string(engine_kind v);

struct model_spec {
  model_config config;
  /// Absolute path of the checkpoint directory; empty for a synthetic model.
  std::string checkpoint;
  /// Synthetic models: the element type to generate. Checkpoints: nullopt,
  /// their tensors say.
  std::optional<dtype> weights_dtype = dtype::bf16;
  /// Synthetic models: the seed of the generated weights.
  std::uint64_t seed = 1;

  bool synthetic() const { return checkpoint.empty(); }
};

struct node_spec {
  std::string name;
  std::string address = "127.0.0.1";
  std::uint16_t port = 0; // CAF middleman port; 0 = ephemeral
  /// `rlsync launch` restarts the node's process after a failure (non-zero
  /// exit or a signal), at most max_restarts times, with exponential backoff.
  /// Never on the coordinator's node: the head failing ends the job.
  node_restart restart = node_restart::never;
  std::int64_t max_restarts = 3;
  /// Serve GET /metrics (and /health) over HTTP on the node's address at
  /// this port; 0: ephemeral; absent: no metrics port.
  std::optional<std::uint16_t> metrics_port;
};

namespace topology_limits {
// Upper bounds on every count and duration a topology sets: far above any
// real deployment, low enough that nothing derived from them (expanded
// replicas, queue memory, deadline arithmetic on steady_clock) can overflow
// or hang. README.md lists them under "Limits".
inline constexpr std::int64_t max_replicas = 4096;     // per engine entry, and engines in all
inline constexpr std::int64_t max_nodes = 4096;
inline constexpr std::int64_t max_ranks = 4096;        // trainer ranks (the producers one order may name)
inline constexpr std::int64_t max_tp = 1024;
/// Data-parallel scheduler ranks of one built-in engine (the engine refuses more).
inline constexpr std::int64_t max_dp = 64;
inline constexpr std::int64_t max_batch_limit = 65536;
inline constexpr std::int64_t max_queue_limit = 1 << 20;
/// A vLLM engine's streams open at once (max_batch + queue_limit): the adapter holds a thread each.
inline constexpr std::int64_t max_vllm_streams = 4096;
inline constexpr std::int64_t max_kv_block_tokens = 65536;
inline constexpr std::int64_t max_prefix_cache_blocks = 1 << 24;
inline constexpr std::int64_t max_groups_in_flight = 1024;
/// With backend ucx: an engine worker's gets on its producer connection, all
/// carried by its open (the wire's prefetch limit), each answer read in turn.
inline constexpr std::int64_t max_ucx_groups_in_flight = 64;
/// transfer.bucket_bytes with the nccl collective: each member's device staging holds one bucket.
inline constexpr std::int64_t max_bucket_bytes = std::int64_t(16) << 30;
/// The UCX producer's packed budget: a whole version of the largest model at
/// most (2^40 parameters of 4 bytes).
inline constexpr std::int64_t max_packed_budget_bytes = std::int64_t(4) << 40;
inline constexpr std::int64_t max_version_count = 1 << 20; // every_versions, staleness, at_sync
inline constexpr std::int64_t max_restarts_limit = 1000;
inline constexpr std::int64_t max_prompts = 1 << 24;
inline constexpr std::int64_t max_concurrency = 65536;
inline constexpr std::int64_t max_tokens = 1 << 20;
inline constexpr std::int64_t max_faults = 1024;
inline constexpr std::int64_t max_duration_ms = 24 * 3600 * 1000; // one day: deadlines, intervals, delays
/// transfer.backend nccl: trainer ranks plus engine workers in one communicator (gpu::max_comm_members).
inline constexpr std::int64_t max_nccl_members = 65536;
/// Sampling, wherever it enters (the topology's workload, `generate`'s
/// flags, HTTP bodies): temperature in [0, 100]; top_p in (0, 1] and not
/// below the smallest normal float, which it is carried as.
inline constexpr double max_temperature = 100;
inline constexpr double min_top_p = 1.1754943508222875e-38; // FLT_MIN
/// trainer.perturb: the synthetic trainer's per-step noise scale (a float).
inline constexpr double max_perturb = 1000;
} // namespace topology_limits

/// PEM files for mutual TLS between nodes. `cert` and `key` may contain
/// `{node}`, replaced by a node's name (see for_node), so one topology
/// serves every node; the CA is the cluster's, shared by all.
struct tls_spec {
  std::string ca, cert, key; // absolute paths
  tls_spec for_node(const std::string& node) const;
};

/// "0-3, 5, 7-8" for a sorted list of layers.
std::string format_layers(const std::vector<std::int64_t>& layers);

/// `path` with every `{node}` replaced by `node`.
std::string with_node_name(std::string path, const std::string& node);

struct cluster_spec {
  /// Where the cluster secret comes from: at most one is set; both empty
  /// means no secret. The secret itself is never in the topology.
  /// secret_file may contain `{node}`: each node then proves a secret of its
  /// own and the head checks each against that node's file.
  std::string secret_file; // absolute path
  std::string secret_env;  // environment variable name
  /// Set: nodes connect over mutual TLS. Required when others join the
  /// head (others_join_the_head), unless allow_insecure_network says otherwise.
  std::optional<tls_spec> tls;
  /// Plaintext between nodes on purpose; every start warns loudly.
  bool allow_insecure_network = false;

  /// The secret file of `node` ({node} replaced); empty when there is none.
  std::string secret_file_for(const std::string& node) const { return with_node_name(secret_file, node); }
  /// Each node has a secret of its own (secret_file names {node}).
  bool per_node_secrets() const { return secret_file.find("{node}") != std::string::npos; }
  milliseconds heartbeat_interval{500};
  milliseconds heartbeat_timeout{2000};
  milliseconds connect_deadline{10000};
  /// The bearer token of the cluster's HTTP ports (the first line of this
  /// file, absolute path): every route but /health requires it; empty: none.
  std::string http_api_key_file;
};

struct trainer_rank {
  std::string node;
  std::vector<std::int64_t> layers; // ascending, no repeats
  /// Qwen3-MoE with separate expert tensors: the experts this rank holds of
  /// each of its sparse layers (expert parallelism in the trainer),
  /// ascending, no repeats; nullopt: all of them.
  std::optional<std::vector<std::int64_t>> experts;
};

struct trainer_spec {
  std::string node;
  trainer_source source = trainer_source::synthetic;
  std::string dir; // absolute; set iff source == checkpoint_dir
  milliseconds step_time{200};
  double perturb = 0.01;
  std::uint64_t seed = 7;
  /// At least one once loaded (left out: one rank on `node` holding every
  /// layer). Each runs on its own node, several may share one; together
  /// they hold every layer, and ranks holding the same layer are replicas
  /// (several holders engines may pull it from).
  std::vector<trainer_rank> ranks;
  /// Publish weights holding NaN or infinity instead of refusing the step.
  /// Never read from the file: set by --allow-nonfinite on the command line.
  bool allow_nonfinite = false;
};

/// One engine replica. A YAML entry with `replicas: n` becomes n of these.
struct engine_spec {
  std::string name;          // "rollout-1", or the group name when replicas == 1
  std::string group;         // the YAML entry's name
  std::int64_t replica = 0;  // index within the group
  std::string node;
  std::int64_t tp = 1;
  /// Experts placed whole over the tp workers (EP size = tp) instead of
  /// sliced by tp; the built-in engine only, a mixture-of-experts model only.
  bool expert_parallel = false;
  /// Data-parallel scheduler ranks behind the one engine (built-in engine):
  /// each with its own batch, queue and KV cache, all sharing one copy of the
  /// weights; one pause covers them all.
  std::int64_t dp = 1;
  /// Which rank takes a new request: "least_outstanding" or "prefix_affinity".
  std::string dp_balance = "least_outstanding";
  /// What the built-in engine serves from: "received" (the weights as the
  /// trainer sends them) or "int8" (quantized per output channel on the
  /// engine after each update: the process step).
  std::string weights = "received";
  /// Where the built-in engine holds its weights and runs its matrix
  /// products: "cpu", or "cuda" (CUDA device 0 of its process, cuBLAS; a
  /// CUDA build only, and a device at start-up).
  std::string device = "cpu";
  std::int64_t max_batch = 32;
  std::int64_t queue_limit = 256;
  std::int64_t kv_block_tokens = 16;
  std::int64_t prefix_cache_blocks = 1024;
  engine_kind kind = engine_kind::builtin;
  /// kind vllm: the server's base URL as written ("http://host:port") and
  /// its parts.
  std::string url;
  std::string url_host;
  std::uint16_t url_port = 0;
  /// kind vllm: the file holding the server's API key (absolute); empty: none.
  std::string api_key_file;
  /// kind vllm: where the node writes each version's checkpoint for the
  /// server to load (absolute; default /dev/shm/rlsync-<name>, tmpfs).
  std::string weights_dir;
};

/// The workers an engine pulls its weights with: its tp for the built-in
/// engine; one for a vLLM server's adapter, which takes every tensor whole
/// and leaves the sharding to the server.
inline std::int64_t pulling_workers(const engine_spec& e) {
  return e.kind == engine_kind::vllm ? 1 : e.tp;
}

struct router_spec {
  std::string node; // default: the first node
  router_policy policy = router_policy::least_outstanding;
  std::int64_t queue_limit = 1024;
  /// The fleet's HTTP endpoint on the router's node (its address):
  /// /v1/completions, /health, /v1/models, /metrics. 0: an ephemeral port;
  /// none: no endpoint.
  std::optional<std::uint16_t> http_port;
};

struct coordinator_spec {
  std::string node;       // default: the first node
  std::string state_file; // absolute; empty = the version counter is not persisted
};

struct transfer_spec {
  transfer_backend backend = transfer_backend::local;
  transfer_mode mode = transfer_mode::sharded;
  /// The collective's broadcasts: whole groups up to this many bytes.
  /// Without the collective validation accepts only this default: the other
  /// data planes move one whole parameter group per message or buffer.
  std::int64_t bucket_bytes = std::int64_t(64) << 20;
  std::int64_t groups_in_flight = 2;
  std::vector<ucx_transport> ucx_transports; // empty = UCX decides
  /// The ucx producer's memory bound: bytes of packed groups it holds at
  /// once, packed ahead and kept until every replica pulled them. 0 (the
  /// default): 2 x groups_in_flight (at least 2) of the model's largest group.
  std::int64_t packed_budget_bytes = 0;
  /// The ucx producer's shared buffers of 2 MiB and more come from the
  /// host's hugetlb pool (vm.nr_hugepages) while it has free pages; false:
  /// always 4 KiB pages, leaving the pool to others.
  bool huge_pages = true;
  /// backend nccl, mode broadcast: the collective baseline (vLLM's packed
  /// NCCL broadcast): the rank broadcasts the version to every member of
  /// the communicator at once (with several ranks, each its groups in a
  /// communicator of its own with every worker), whole groups per bucket of
  /// bucket_bytes, packing the next while one is on the wire.
  /// Every member takes part in every version, so one that stops holds all
  /// others up to the phase deadline. false: each worker pulls whole groups
  /// point to point.
  bool collective = false;
};

/// Whether the ucx backend may lend groups in shared memory, a memfd that
/// engines on the trainer's host map and copy from. UCX's transports do not
/// carry those bytes, so a topology naming `ucx_transports` without `shm`
/// gets its groups by tag over what it named, on one host too.
bool ucx_lends_shared_memory(const transfer_spec& t);
/// Whether trainer versions are kept where same-host engines are lent them
/// in place: in huge pages, so only with transfer.huge_pages (false leaves
/// the pool to others, and the groups are packed).
bool trainer_versions_lendable(const transfer_spec& t);

/// Per-phase deadlines of a sync round.
struct sync_deadlines {
  milliseconds pause{5000};
  milliseconds flush{1000};
  milliseconds start{1000};
  milliseconds transfer{60000};
  milliseconds finish{5000};
  milliseconds resume{1000}; // the `continue` phase (a C++ keyword)
};

struct sync_spec {
  std::int64_t every_versions = 1;
  /// Versions a rollout may trail the trainer's newest published version.
  /// At least every_versions - 1 (engines trail that far between rounds).
  std::int64_t staleness = 1;
  std::int64_t wave_size = 0; // 0 = all engines at once
  sync_deadlines deadlines;
  /// How each round's pause treats running requests: keep (frozen, continue
  /// after the update), wait (run to completion) or abort; clear_cache
  /// drops the prefix cache and the frozen requests' KV (recomputed with the
  /// new weights).
  pause_request pause;
  /// Engines that must be live and serving within `staleness`; fewer is an alert.
  std::int64_t min_live_engines = 1;
  std::int64_t max_restarts = 3; // per replica
  /// At start, the first round waits until every engine replica of the
  /// topology registered, or this long after the coordinator started: the
  /// fleet's first sync is one round for all, not one per engine as each
  /// registers (while the others still start beside it). 0: a newcomer's
  /// cold sync starts as it registers. A round asked for (`sync_atom`) is
  /// not held.
  milliseconds first_round_wait{0};
};

struct workload_spec {
  std::int64_t prompts = 64;
  std::int64_t concurrency = 8;
  std::int64_t max_tokens = 32;
  double temperature = 0.0;
  double top_p = 1.0;
  std::uint64_t seed = 1;
  /// Longest the router holds one request while no engine can serve it
  /// (carried in each request as generate_request::deadline_ms).
  milliseconds request_deadline{30000};
};

struct fault_spec {
  std::optional<std::int64_t> at_sync; // exactly one of at_sync / at is set
  sync_phase phase = sync_phase::pause; // with at_sync: fires as that phase of the round is sent
  std::optional<milliseconds> at;
  fault_action action = fault_action::kill;
  std::string target;       // an engine replica or node name, or trainer/router/coordinator
                            // (partition/heal: a node, or one engine: its messages are dropped)
  fault_target target_kind = fault_target::engine;
  /// partition, delay_acks: how long they last; kill, kill_worker: restart after it. Else unset.
  std::optional<milliseconds> duration;
  /// kill_worker: which data-parallel rank's tp worker thread dies.
  std::int64_t dp_rank = 0;
  std::int64_t worker = 0;
};

struct drill_spec {
  std::vector<fault_spec> faults; // empty = no drill
};

struct topology {
  std::string name;
  std::string source;   // the file as given
  std::string base_dir; // absolute; relative paths in the file are resolved against it
  model_spec model;
  std::vector<node_spec> nodes;
  cluster_spec cluster;
  trainer_spec trainer;
  std::vector<engine_spec> engines; // replicas, expanded
  router_spec router;
  coordinator_spec coordinator;
  transfer_spec transfer;
  sync_spec sync;
  workload_spec workload;
  drill_spec drill;

  const node_spec* find_node(std::string_view name) const;
  const engine_spec* find_engine(std::string_view name) const;
  /// Whether `rlsync node` has anything to run on node `name`: the
  /// coordinator, the router, an engine or a trainer rank that is not
  /// external (an external rank's own process joins on its own).
  bool node_runs_anything(std::string_view name) const;
  /// Whether other processes join the coordinator's node over the network
  /// (more than one node, or external trainer ranks): the head then
  /// listens on a port, which needs cluster.tls or allow_insecure_network.
  bool others_join_the_head() const { return nodes.size() > 1 || trainer.source == trainer_source::external; }
};

/// Whether a built-in engine may run on the host of trainer rank `rank`'s
/// node: on the same node, or on one with the same address. Nodes in network
/// namespaces of one machine have addresses of their own, so this may say
/// false for engines a probe would find on the same host: their groups are
/// then packed, not lent in place (slower, not wrong).
bool engine_near_trainer_rank(const topology& t, std::size_t rank);

/// A valid node, engine or topology name: non-empty, letters, digits, '.', '_', '-'.
bool is_topology_name(std::string_view name);

/// Every problem in a topology file, one "<file>:<line>:<col>: <path>: <message>"
/// per entry of `errors`; what() joins them one per line.
struct topology_error : std::runtime_error {
  explicit topology_error(std::vector<std::string> errors);
  std::vector<std::string> errors;
};

/// Reads and validates the file at `path`; relative paths in it are resolved
/// against its directory. Throws topology_error listing all problems found.
topology load_topology(const std::string& path);

/// As load_topology, from text: `source_name` prefixes messages and
/// `base_dir` resolves relative paths.
topology parse_topology(const std::string& yaml_text, const std::string& source_name,
                        const std::string& base_dir);

/// "path:line:col" of a key in the topology file at `path`, for a problem
/// only some command refuses (validation has the places of its own). Each
/// step is a map key, "name=X" (the entry of a list named X) or "[i]" (its
/// i-th entry). A key that is absent (a default) leaves its parent as the
/// place; a list entry that is not there, or a file that can no longer be
/// read, leaves `path` alone.
std::string topology_place(const std::string& path, const std::vector<std::string>& steps);

/// The resolved topology as YAML: defaults filled in, replicas expanded,
/// paths absolute, sizes in bytes, and the model's derived dimensions. For
/// people and logs; it is not meant to be read back.
std::string to_yaml(const topology& t);

} // namespace rlsync
