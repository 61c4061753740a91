#pragma once
// `rlsync bench sync`: the figures every benchmark owes, for the data plane
// and the control plane, each against a speed of light measured in the same
// run on the same machine (speed_of_light.hpp).
//
// For each mode (sharded, broadcast) the topology is deployed with a
// synthetic model of the requested size (the head in this process, every
// other node as an `rlsync node` child), the cold syncs awaited, then K warm
// syncs run, each one trainer step and one round. Then the same deployment
// with a near-empty model: the control plane alone, against six waves of CAF
// round trips (the coordinator's probe) measured between the rounds.
//
// Speed of light of a transfer: the bytes each engine must receive over the
// path it takes, divided by that path's raw bandwidth, summed over engines
// (they share the machine): memcpy for engines in this process, raw UCX for
// engines in other processes.
//
// The figures are plain values; the table, the summary lines and the JSON
// are functions of them.
#include "actors/system_config.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/control/protocol.hpp"

#include <caf/actor_system.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace rlsync::jobs {

// -- models and bytes -----------------------------------------------------------

/// Bytes of `c`'s parameters in bf16.
std::uint64_t bf16_model_bytes(const model_config& c);

/// A synthetic bf16 model of about `bytes` (never less than one layer),
/// as many layers as fit, vocab 320: a llama of hidden 1024 (16 heads, 8 kv
/// heads), intermediate 2816; a qwen3 shaped as Qwen3-0.6B's layers (hidden
/// 1024, 16 heads of 128, 8 kv heads, intermediate 3072); a qwen3_moe with
/// qwen3's attention and 16 experts of 768 (2 per token) in every layer.
model_config model_of_size(std::uint64_t bytes, model_arch arch = model_arch::llama);

/// The bench's model: model_of_size(bytes, arch), with at least as many
/// layers as the largest of `ranks` (each rank holds at least one layer).
model_config bench_model(std::uint64_t bytes, const std::vector<int>& ranks, model_arch arch = model_arch::llama);

/// The most trainer ranks one bench case deploys (each is a producer with
/// its own threads, all on the coordinator's node).
inline constexpr int max_bench_ranks = 16;

/// The smallest model the engines accept at tp up to 8 (a few hundred kB).
model_config tiny_model();

/// Bytes engine `e` receives per sync: its workers' plan entries (sharded),
/// or every parameter once per worker (broadcast).
std::uint64_t engine_bytes(const model_config& c, const engine_spec& e, transfer_mode mode);

/// What one engine worker receives per sync, for each engine shape (tp,
/// expert parallelism) of the topology: the largest and smallest of its
/// workers' plan bytes (sharded), against the whole model (broadcast).
struct worker_bytes {
  std::int64_t tp = 1;
  bool expert_parallel = false;
  std::uint64_t sharded_max = 0, sharded_min = 0, broadcast = 0;
};
std::vector<worker_bytes> bytes_per_worker(const model_config& c, const topology& t);

/// The bytes all engines receive per sync, and their speed-of-light time.
struct light_budget {
  std::uint64_t bytes = 0;
  double light_ms = 0; ///< -1: some engine's path was not measured (bandwidth 0)
};

/// Sums over `t`'s engines: engines on the coordinator's node move at
/// `memcpy_gbps`, the others at `ucx_gbps` (GB/s; 0: not measured).
light_budget light_of(const topology& t, const model_config& model, transfer_mode mode, double memcpy_gbps,
                      double ucx_gbps);

// -- trainer ranks -------------------------------------------------------------------

/// `ranks` trainer ranks on `node`, each holding a contiguous share of
/// `layers` (the first ones one layer more when it does not divide): the
/// pipeline-parallel layout. Empty when ranks < 1 or ranks > layers.
std::vector<trainer_rank> split_layers(const std::string& node, std::int64_t layers, int ranks);

/// The distinct packings the engines of `t` ask a producer for: a plan per
/// (tp, worker) sharded, one broadcast. `in_process`: the engines on the
/// coordinator's node (they pull from the rank's local data plane), else
/// the others (they pull from its UCX producer).
std::size_t distinct_plans(const topology& t, transfer_mode mode, bool in_process);

/// One producer's packing over the warm rounds of a case: how often each
/// (plan, group) it holds was packed per version, however many replicas pulled.
struct rank_packs {
  std::uint32_t rank = 0;
  std::size_t groups = 0;       ///< groups the rank holds
  std::uint64_t versions = 0;   ///< warm rounds counted
  std::size_t local_plans = 0;  ///< distinct plans of the in-process engines
  std::uint64_t local_packs = 0, local_passes = 0; ///< local data plane, over the warm rounds
  std::uint64_t local_lent = 0; ///< of local_packs, groups lent in place (checksummed where they lie)
  std::size_t ucx_plans = 0;    ///< distinct plans of the other nodes' engines
  std::uint64_t ucx_packs = 0;  ///< UCX producer, over the warm rounds
  bool ucx = false;             ///< the rank has a UCX producer
};

/// Packs per version of each (plan, group), rounded up: 1 when every
/// (plan, group) was packed once per version; 0 when nothing was packed.
double local_packs_per_plan_group(const rank_packs& p);
double ucx_packs_per_plan_group(const rank_packs& p);
/// Whether no (plan, group) was packed twice for one version: packs never
/// exceed versions x plans x groups, on either data plane.
bool packed_at_most_once(const rank_packs& p);

// -- one case's figures -----------------------------------------------------------

/// One deployment's figures.
struct case_result {
  std::string name; ///< sharded, broadcast, control; "sharded/2r" with two ranks
  transfer_mode mode = transfer_mode::sharded;
  int ranks = 1; ///< trainer ranks, each holding its share of the layers
  std::vector<rank_packs> packs; ///< per rank, over the warm rounds
  std::uint64_t model_bytes = 0;
  std::uint64_t bytes_per_sync = 0; ///< received by every engine together, expected
  double light_ms = 0;              ///< speed-of-light transfer time; -1 not measured
  std::vector<sync_report> cold;
  std::vector<sync_report> warm;
  std::vector<double> probe_ms;          ///< six waves of round trips, one per warm round
  std::size_t producer_peak_groups = 0;  ///< UCX producer: packed groups alive at once
  std::uint64_t producer_peak_bytes = 0; ///< UCX producer: packed bytes held at once (spares included)
  std::uint64_t producer_budget_bytes = 0; ///< UCX producer: its packed budget (transfer.packed_budget_bytes)
  std::uint64_t producer_packs_ahead = 0;  ///< UCX producer: groups packed before a get asked, warm rounds
  std::uint64_t producer_evictions = 0;    ///< UCX producer: groups dropped while a replica needed them, warm rounds
  std::uint64_t producer_buffers_made = 0; ///< UCX producer: packed buffers allocated in the warm rounds (not reused)
  std::uint64_t producer_buffers_prewarmed = 0; ///< UCX producers: packed buffers made and written at start, before v1
  std::uint64_t producer_huge_buffers = 0; ///< UCX producers: of all their shared buffers, those in huge pages
  /// UCX producers' progress threads (every send and answer), per warm round,
  /// summed over ranks: on a core, and runnable waiting for one (0: not known).
  double producer_ran_ms = 0, producer_queued_ms = 0;
  /// Whether this host's kernel keeps run-queue waits (schedstat): where it
  /// does not, the waits read 0 and the lines leave them out.
  bool queued_known = true;
  std::uint64_t local_peak_bytes = 0;    ///< local data plane: one pass's buffers at once
  std::set<std::string> ucx_transports;  ///< UCX producers: the data transports their connections used
  /// Every group the UCX producers sent in the warm rounds was lent in
  /// shared memory: the engines copied it once, so its light is memcpy's.
  bool lent = false;
  /// Every group went straight from the version's memory into the engines,
  /// nothing packed: each UCX lend in place, or each group the local data
  /// plane offered (it lends in place unless a group's runs are too short).
  bool in_place = false;
  /// The trainer's steps changed nothing (trainer.perturb 0): the warm
  /// rounds are zero-byte rounds, bytes_per_sync what they moved (none
  /// when every engine skipped the data plane) and no light applies.
  bool zero_byte = false;
  std::uint64_t largest_group = 0;
  std::string error;
};

/// Medians of the warm rounds (ms, and GB/s of the rounds that moved bytes).
struct case_medians {
  double stall_ms = 0, transfer_ms = 0, control_ms = 0, gbps = 0, probe_ms = 0;
  /// The slowest engine's pull per round (sync_report::slowest_*), of the
  /// rounds whose data plane measured where it went (all 0: none did): its
  /// duration; its slowest worker's time waiting for the producer, storing,
  /// and the rest of the pull (duration minus both, at least 0).
  double pull_ms = 0, wait_ms = 0, store_ms = 0, rest_ms = 0;
  /// ... and how long that worker's thread ran on a core and waited
  /// runnable for one, of the rounds that measured it (0: none did).
  double ran_ms = 0, queued_ms = 0;
};
case_medians medians_of(const case_result& c);

/// Per case whose data plane measured it, where the slowest engine's pull
/// went (medians of the warm rounds): waiting for the producer, storing,
/// the rest; and, where measured, how long its thread ran on a core and
/// how long it waited for one; then the UCX producers' progress threads'
/// figures per warm round, where known.
std::vector<std::string> pull_lines(const std::vector<case_result>& cases);

/// The slowest cold transfer, ms.
double cold_transfer_ms(const case_result& c);

/// How close the median warm transfer came to the speed of light, in
/// percent; nullopt when either is unknown.
std::optional<double> percent_of_light(const case_result& c);

/// Broadcast against sharded: ratios of bytes, median transfer and stall.
struct mode_ratios {
  double bytes = 0, transfer = 0, stall = 0;
};
mode_ratios compare_modes(const case_result& broadcast, const case_result& sharded);

/// `ranks` against one rank, same mode and model: ratios of median transfer
/// and stall (below 1: faster with the ranks).
struct rank_ratios {
  double transfer = 0, stall = 0;
};
rank_ratios compare_ranks(const case_result& ranks, const case_result& one);

/// A control round against six waves of round trips: median stall over
/// median probe.
double control_overhead(const case_result& c);

/// The producer's memory bound: peak packed groups times the largest group.
std::uint64_t producer_bound_bytes(const case_result& c);

/// The table: a header line, then one line per case (its failure instead,
/// for a case that failed).
std::vector<std::string> case_table(const std::vector<case_result>& cases);

/// A case as JSON: its figures, every cold and warm round, the probes.
nlohmann::ordered_json case_json(const case_result& c);

// -- running cases ----------------------------------------------------------------

/// What one bench run shares: a temporary directory for the nodes'
/// topologies (removed at the end), a fresh cluster secret in
/// RLSYNC_BENCH_SECRET (the node children inherit it), an actor system with
/// the topology's heartbeats, and the speeds of light.
class bench_session {
public:
  /// `exe`: the rlsync executable the node children run. `note`: progress
  /// and, with `verbose`, every log line of the head and the nodes.
  bench_session(const topology& t, std::string exe, bool verbose, std::function<void(const std::string&)> note);
  ~bench_session();
  bench_session(const bench_session&) = delete;
  bench_session& operator=(const bench_session&) = delete;

  caf::actor_system& system() { return *sys_; }
  const std::string& exe() const { return exe_; }
  const std::string& dir() const { return dir_; }
  const std::string& secret() const { return secret_; }
  /// The session's own credentials (a CA and a certificate per node of the
  /// topology, in dir()/certs): the bench's nodes talk mutual TLS.
  const tls_spec& tls() const { return tls_; }
  bool verbose() const { return verbose_; }
  void note(const std::string& line) const;

  double memcpy_gbps = 0;
  double ucx_gbps = 0; ///< 0: not measured
  std::string ucx_why;

private:
  std::string exe_, dir_, secret_;
  tls_spec tls_;
  bool verbose_ = false;
  std::function<void(const std::string&)> note_;
  std::unique_ptr<system_config> cfg_;
  std::unique_ptr<caf::actor_system> sys_;
};

/// Deploys `t` with `model` and `mode` (a synthetic source, this process
/// driving every step and round), waits for the cold syncs, then runs
/// `rounds` warm rounds (every rank steps, then a sync), probing six waves
/// of round trips before each when `probe`. `ranks` trainer ranks on the
/// coordinator's node share the layers (split_layers). A failure is the
/// result's error.
case_result run_case(bench_session& s, topology t, const std::string& name, const model_config& model,
                     transfer_mode mode, int rounds, bool probe, int ranks = 1);

/// A trainer rank killed mid-transfer, and brought back.
struct rank_kill_result {
  int ranks = 0;
  std::uint32_t killed_rank = 0;
  double transfer_deadline_ms = 0;
  double kill_to_abort_ms = -1;     ///< -1: the round was not aborted
  bool aborted = false;             ///< the round of the kill ended aborted
  std::size_t dirty_after_abort = 0;    ///< engines left dirty by the abort
  std::size_t dirty_routable = 0;       ///< dirty engines the coordinator routes to (must be 0)
  std::uint64_t dirty_tokens = 0;       ///< tokens served while dirty, in-process engines (must be 0)
  double restart_ms = 0;                ///< the rank's restart and registration
  double restart_to_complete_ms = -1;   ///< restart to the end of the first complete round; -1: none
  int rounds_to_complete = 0;           ///< rounds asked after the restart until one completed
  sync_report first_complete;           ///< that round
  std::string error;

  /// Aborted within the transfer deadline, no dirty engine served, and a
  /// round completed after the restart.
  bool held() const;
};

/// Deploys `t` sharded with `ranks` (>= 2) ranks, runs a warm round, then
/// kills the last rank's trainer actor as the transfer phase is sent (its
/// producers withhold a group that round, so the kill lands mid-transfer
/// whatever the model's size), awaits the aborted round, checks that no
/// dirty engine is routed or served, restarts the rank and runs rounds
/// until one completes with every engine.
rank_kill_result run_rank_kill(bench_session& s, topology t, const model_config& model, int ranks);

/// The rank-kill lines of the report.
std::vector<std::string> rank_kill_lines(const rank_kill_result& k);

/// What an engine node needs of `t` as topology YAML: the (synthetic)
/// model, the nodes, the cluster's secret, TLS and heartbeats, where the trainer,
/// router and coordinator are, each engine replica, and the transfer.
std::string node_yaml(const topology& t);

// -- bench sync -------------------------------------------------------------------

struct bench_sync_options {
  std::string path; ///< the topology file, for the report
  std::uint64_t model_bytes = std::uint64_t(256) << 20;
  int syncs = 5;
  std::vector<transfer_mode> modes{transfer_mode::sharded, transfer_mode::broadcast};
  /// Trainer rank counts to run each mode with; a count above 1 also runs
  /// the rank-kill case with the largest.
  std::vector<int> ranks{1};
  bool verbose = false;
  bool mpi = true; ///< run the MPI_Bcast baseline (rlsync bench sync refuses without Open MPI unless --no-mpi)
  std::string exe;
  std::function<void(const std::string&)> note;
};

/// Why `t` cannot be benched (it must run as one process per node, every
/// node must be on this machine, every engine's tp must fit `model`, the
/// router must run on the coordinator's node, each of `ranks` must be
/// between 1 and max_bench_ranks and `model`'s layers), naming `path`; empty when it can. The
/// bench places the trainer ranks on the coordinator's node itself (it
/// steps them), whatever nodes the topology gives them.
std::string bench_sync_problem(const topology& t, const std::string& path, const model_config& model,
                               const std::vector<int>& ranks = {1});

/// The rank counts to run when --ranks is not given: 1, and the topology's
/// count when it declares several ranks.
std::vector<int> default_rank_counts(const topology& t);

/// A speed of light measured before and after the cases (0: not measured):
/// the machine may change under a bench, and the spread shows by how much.
struct light_pair {
  double before = 0, after = 0;
  double best() const { return std::max(before, after); } ///< what % light compares with
  /// |before - after| / best; 0 when either is missing.
  double spread() const;
};

struct bench_sync_result {
  std::string path;
  model_arch arch = model_arch::llama; ///< the topology's architecture, which the bench's model takes
  bool fused_experts = false;          ///< ... and its expert layout
  std::size_t engines = 0, nodes = 0;
  transfer_backend backend = transfer_backend::ucx;
  unsigned cores = 0;
  std::uint64_t model_bytes = 0; ///< as requested
  double memcpy_gbps = 0;    ///< memcpy_light.best()
  bool remote = false;      ///< some engine outside this process
  double ucx_gbps = 0;      ///< ucx_light.best(); 0: not measured (ucx_why)
  std::string ucx_why, ucx_tls;
  light_pair memcpy_light, ucx_light;
  /// UCX_TLS of the second raw UCX measure: the data transports the UCX
  /// producers' connection logs named during the cases (empty: none seen,
  /// measured as the first).
  std::string ucx_tls_after;
  std::vector<case_result> cases;
  std::vector<worker_bytes> per_worker; ///< of the bench's model, per engine shape
  std::optional<rank_kill_result> rank_kill; ///< run when some rank count is above 1
  double mpi_bcast_s = 0; ///< the fastest of the four below; 0: not measured (mpi_why)
  double mpi_bcast_defaults_s = 0;       ///< Open MPI's defaults
  double mpi_bcast_no_single_copy_s = 0; ///< vader's single-copy mechanism off
  double mpi_bcast_huge_pages_s = 0;     ///< defaults, buffers in transparent huge pages
  /// Open MPI's tcp transport alone, measured instead of the three above
  /// where the topology's ucx_transports are tcp alone (mpi_over_tcp).
  double mpi_bcast_tcp_s = 0;
  bool mpi_over_tcp = false;
  std::string mpi_why;

  bool failed() const;
};

/// Whether the MPI_Bcast baseline runs over Open MPI's tcp transport: the
/// ucx data plane's transports are tcp alone, so the engines' bytes cross
/// a socket, and MPI's are made to as well (with rdma named, UCX may use it
/// on one host, and MPI keeps its shared-memory runs).
bool mpi_over_tcp(const topology& t);

/// Runs every mode, then the control case, then the MPI_Bcast baseline.
bench_sync_result run_bench_sync(const topology& t, const bench_sync_options& o);

/// Per case and rank: its packs per (plan, group) per version on each data
/// plane, and whether any was packed twice for one version.
std::vector<std::string> packs_lines(const std::vector<case_result>& cases);

/// One of the data plane's targets, as one run measured it.
struct target_check {
  std::string target;      ///< what is asked
  std::string measured;    ///< this run's figures
  std::optional<bool> met; ///< nullopt: not judged (a case or a baseline is missing)
};

/// What a sync bench judges, in order: the sharded warm transfer against
/// MPI_Bcast and against the raw transport, broadcast against sharded,
/// each case's cold transfer against its warm one, each UCX producer's peak
/// against its budget, the control round against six round-trip waves.
std::vector<target_check> sync_targets(const bench_sync_result& r);

/// What `rlsync bench sync` prints: the speeds of light, the table, the
/// ratios, the memory bound, the control plane, the MPI baseline, and the
/// targets (sync_targets).
std::string bench_sync_report(const bench_sync_result& r);

nlohmann::ordered_json bench_sync_json(const bench_sync_result& r);

} // namespace rlsync::jobs
