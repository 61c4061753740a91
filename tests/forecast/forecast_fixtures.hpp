#pragma once
// A small cluster to plan: a tiny Qwen3-MoE (tests/support/engine_fixtures)
// written as config.json beside a cluster file made from YAML text.
#include "runtime/config/model_config.hpp"
#include "runtime/forecast/cluster.hpp"
#include "tests/support/engine_fixtures.hpp"
#include "tests/support/scratch_dir.hpp"

#include <fstream>
#include <string>

namespace rlsync::test {

struct cluster_files {
  scratch_dir dir;
  explicit cluster_files(const model_config& c = tiny_moe_config()) { write_config_json(dir / "config.json", c); }
  /// Writes `yaml` as cluster.yaml and returns its path.
  std::string write(const std::string& yaml) const {
    std::ofstream(dir / "cluster.yaml") << yaml;
    return dir / "cluster.yaml";
  }
  forecast::cluster load(const std::string& yaml) const { return forecast::load_cluster(write(yaml)); }
};

/// Two trainer nodes of 2 GPUs (tp 2, pp 2, ep 2 over each stage's 2 ranks),
/// engines as given.
inline std::string small_cluster(const std::string& engines, const std::string& extra = "") {
  return "name: small\n"
         "model: {config: config.json, dtype: bf16}\n"
         "fabric: {gpus_per_node: 2, nic_gbytes_per_s: 10, intra_node_gbytes_per_s: 100}\n"
         "trainer: {nodes: 2, tp: 2, pp: 2, ep: 2}\n"
         "engines:\n"
         + engines + extra;
}

} // namespace rlsync::test
