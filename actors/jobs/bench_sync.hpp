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

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rlsync::jobs {

// -- models and bytes -----------------------------------------------------------

/// Bytes of `c`'s parameters in bf16.
std::uint64_t bf16_model_bytes(const model_config& c);

/// A synthetic bf16 llama of about `bytes` (never less than one layer):
/// hidden 1024 (16 heads, 8 kv heads), intermediate 2816, vocab 320, as many
/// layers as fit.
model_config model_of_size(std::uint64_t bytes);

/// The smallest model the engines accept at tp up to 8 (a few hundred kB).
model_config tiny_model();

/// Bytes engine `e` receives per sync: its workers' plan entries (sharded),
/// or every parameter once per worker (broadcast).
std::uint64_t engine_bytes(const model_config& c, const engine_spec& e, transfer_mode mode);

/// The bytes all engines receive per sync, and their speed-of-light time.
struct light_budget {
  std::uint64_t bytes = 0;
  double light_ms = 0; ///< -1: some engine's path was not measured (bandwidth 0)
};

/// Sums over `t`'s engines: engines on the coordinator's node move at
/// `memcpy_gbps`, the others at `ucx_gbps` (GB/s; 0: not measured).
light_budget light_of(const topology& t, const model_config& model, transfer_mode mode, double memcpy_gbps,
                      double ucx_gbps);

// -- one case's figures -----------------------------------------------------------

/// One deployment's figures.
struct case_result {
  std::string name; ///< sharded, broadcast, control
  transfer_mode mode = transfer_mode::sharded;
  std::uint64_t model_bytes = 0;
  std::uint64_t bytes_per_sync = 0; ///< received by every engine together, expected
  double light_ms = 0;              ///< speed-of-light transfer time; -1 not measured
  std::vector<sync_report> cold;
  std::vector<sync_report> warm;
  std::vector<double> probe_ms;          ///< six waves of round trips, one per warm round
  std::size_t producer_peak_groups = 0;  ///< UCX producer: packed groups alive at once
  std::uint64_t local_peak_bytes = 0;    ///< local data plane: one pass's buffers at once
  std::uint64_t largest_group = 0;
  std::string error;
};

/// Medians of the warm rounds (ms, and GB/s of the rounds that moved bytes).
struct case_medians {
  double stall_ms = 0, transfer_ms = 0, control_ms = 0, gbps = 0, probe_ms = 0;
};
case_medians medians_of(const case_result& c);

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
/// `rounds` warm rounds (a trainer step and a sync each), probing six waves
/// of round trips before each when `probe`. A failure is the result's error.
case_result run_case(bench_session& s, topology t, const std::string& name, const model_config& model,
                     transfer_mode mode, int rounds, bool probe);

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
  bool verbose = false;
  std::string exe;
  std::function<void(const std::string&)> note;
};

/// Why `t` cannot be benched (it must run as one process per node, every
/// node must be on this machine, every engine's tp must fit `model`),
/// naming `path`; empty when it can.
std::string bench_sync_problem(const topology& t, const std::string& path, const model_config& model);

struct bench_sync_result {
  std::string path;
  std::size_t engines = 0, nodes = 0;
  transfer_backend backend = transfer_backend::ucx;
  unsigned cores = 0;
  std::uint64_t model_bytes = 0; ///< as requested
  double memcpy_gbps = 0;
  bool remote = false;      ///< some engine outside this process
  double ucx_gbps = 0;      ///< 0: not measured (ucx_why)
  std::string ucx_why, ucx_tls;
  std::vector<case_result> cases;
  double mpi_bcast_s = 0; ///< 0: not measured (mpi_why)
  std::string mpi_why;

  bool failed() const;
};

/// Runs every mode, then the control case, then the MPI_Bcast baseline.
bench_sync_result run_bench_sync(const topology& t, const bench_sync_options& o);

/// What `rlsync bench sync` prints: the speeds of light, the table, the
/// ratios, the memory bound, the control plane and the MPI baseline.
std::string bench_sync_report(const bench_sync_result& r);

nlohmann::ordered_json bench_sync_json(const bench_sync_result& r);

} // namespace rlsync::jobs
