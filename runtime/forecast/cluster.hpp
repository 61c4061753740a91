#pragma once
// A cluster to plan for (`rlsync plan`): the fabric, a Megatron-style
// trainer layout and the engines, described without any weights. The file
// is YAML, read strictly (every key declared, file:line:col on every
// problem); configs/plan/ has the two published scenarios. Layouts here may
// be ones the runtime cannot run on this machine (engines spanning nodes,
// experts over dp x tp workers); planning applies the runtime's own loader
// and holder choice to them.
#include "runtime/base/dtype.hpp"
#include "runtime/config/model_config.hpp"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace rlsync::forecast {

namespace cluster_limits {
inline constexpr std::int64_t max_gpus_per_node = 64;
inline constexpr std::int64_t max_nodes = 4096;
inline constexpr std::int64_t max_parallel = 4096; // tp, pp, ep, dp, replicas
inline constexpr std::int64_t max_gpus = 65536;    // all engine workers, all trainer ranks
inline constexpr double max_gbytes_per_s = 100000;
inline constexpr std::int64_t max_engines = 4096; // engine replicas in all
/// Planning work: trainer ranks x the tensors of a stage (what they hold),
/// and recorded plans plus holder choices x the checkpoint's tensors. About
/// ten times Kimi-K2's 48-node scenario, which plans in a few seconds.
inline constexpr std::int64_t max_planning_work = 40'000'000;
} // namespace cluster_limits

enum class pp_order { serial, parallel };
enum class plan_mode { sharded, broadcast };

struct fabric_spec {
  std::int64_t gpus_per_node = 8;
  /// Each GPU's own NIC (rail-optimized, full bisection), per direction.
  double nic_bytes_per_s = 50e9;
  /// GPU to GPU inside a node (NVLink or PCIe), per GPU and direction.
  double intra_node_bytes_per_s = 450e9;
  std::string intra_node_link = "nvlink"; ///< nvlink | pcie: the name printed
};

/// Megatron's layout: rank r has tp rank r % tp, dp rank (r / tp) % dp and
/// pipeline stage r / (tp x dp); stage s holds an even share of the layers
/// (the first L % pp stages one more). Experts are split over `ep` ranks of
/// each stage, whole (etp 1), replicated tp x dp / ep times. Before serving a
/// group each tensor-parallel group gathers its dense tensors over the
/// intra-node link, so every rank of a stage holds them whole; experts are
/// never gathered.
struct trainer_layout {
  std::int64_t nodes = 1;
  std::int64_t tp = 1, pp = 1, ep = 1, etp = 1;
  std::int64_t dp = 1; ///< derived: nodes x gpus_per_node / (tp x pp)
  std::int64_t ranks() const { return tp * pp * dp; }
};

struct engine_layout {
  std::string name;
  std::int64_t replicas = 1;
  std::int64_t tp = 1;
  std::int64_t dp = 1;
  /// Experts placed whole over all dp x tp workers (EP = tp x dp).
  bool expert_parallel = false;
  std::int64_t workers() const { return tp * dp; }
};

/// Published figures the predictions are printed beside (seconds).
struct published_figures {
  std::optional<double> sharded, nccl_broadcast, light_serial, light_parallel;
  std::string source; ///< where they come from, printed
  /// The sharded figure is the one the model's constant was fitted on:
  /// printed as such, never as a check.
  bool sharded_is_calibration = false;
};

struct cluster {
  std::string name;
  std::string source; ///< the file as given
  model_config model;
  std::string model_config_path; ///< absolute
  dtype weights = dtype::bf16;
  std::string model_note; ///< printed under the model (e.g. what an approximation leaves out)
  fabric_spec fabric;
  trainer_layout trainer;
  std::vector<engine_layout> engines;
  plan_mode mode = plan_mode::sharded;
  std::int64_t groups_in_flight = 2;
  pp_order pp_groups = pp_order::serial;
  std::int64_t wave_size = 0; ///< engines per wave; 0: all at once
  published_figures published;

  std::int64_t engine_count() const;
  std::int64_t engine_gpus() const;
  std::int64_t engine_nodes() const;
};

/// Every problem, "<file>:<line>:<col>: <path>: <message>" each.
struct cluster_error : std::runtime_error {
  explicit cluster_error(std::vector<std::string> errors);
  std::vector<std::string> errors;
};

cluster parse_cluster(const std::string& yaml_text, const std::string& source_name, const std::string& base_dir);
cluster load_cluster(const std::string& path);

} // namespace rlsync::forecast
