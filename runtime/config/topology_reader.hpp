#pragma once
// The topology reader's shared parts (topology.cpp and its section files,
// not for other users): the helpers every section uses and `reader`, one
// member per section, each defined in the file of its section:
//
//   topology.cpp           the order of sections; model, nodes, cluster
//   topology_trainer.cpp   trainer, its ranks and their layers/experts
//   topology_engines.cpp   engines (built-in and vLLM servers), router, coordinator
//   topology_transfer.cpp  transfer (and the nccl/cuda_ipc checks), sync, workload
//   topology_drill.cpp     drill faults
#include "runtime/config/topology.hpp"

#include "runtime/base/printable.hpp"
#include "runtime/config/topology_names.hpp"
#include "runtime/config/yaml_fields.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rlsync::topology_reading {

using namespace yaml_fields;
using namespace topology_names;

using namespace topology_limits;

inline const char* const secret_message =
  "secrets are never read from the topology; use secret_file or secret_env";

// Keys that parse but whose feature does not exist yet are refused, never
// accepted and ignored; each message says which issue brings the feature.
inline const char* const insecure_refusal =
  "more than one node needs cluster.tls ({ca, cert, key}; `rlsync certs make` makes them): without it "
  "anyone who reaches a node's port can read and forge cluster traffic; set "
  "cluster.allow_insecure_network: true to run without TLS anyway";
inline const char* const insecure_external_refusal =
  "external trainer ranks (trainer.source: external) join the coordinator's node over the network, which "
  "needs cluster.tls ({ca, cert, key}; `rlsync certs make` makes them): without it anyone who reaches its "
  "port can read and forge cluster traffic; set cluster.allow_insecure_network: true to run without TLS anyway";

/// "a, b, c", cut after `limit` names so that 64 replicas stay readable.
inline std::string list_names(const std::vector<std::string>& names, std::size_t limit = 8) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < limit; ++i)
    out += (i ? ", " : "") + names[i];
  if (names.size() > limit)
    out += ", ... (" + std::to_string(names.size()) + " in all)";
  return names.empty() ? "none" : out;
}

inline bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Names end up in actor names, logs and file names: keep them plain.
inline bool is_plain_name(const std::string& s) {
  if (s.empty())
    return false;
  return std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '.' || c == '_' || c == '-';
  });
}

inline bool is_host(const std::string& s) {
  if (s.empty())
    return false;
  return std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '.' || c == '_' || c == '-' || c == ':';
  });
}

inline bool is_env_name(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0])))
    return false;
  return std::all_of(s.begin(), s.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '_'; });
}

// HF config.json field names (as validate() reports them) -> synthetic keys.
inline std::string synthetic_key(const std::string& config_field) {
  if (config_field == "num_hidden_layers")
    return "layers";
  if (config_field == "num_experts")
    return "experts";
  if (config_field == "num_experts_per_tok")
    return "experts_per_tok";
  if (config_field == "num_attention_heads")
    return "heads";
  if (config_field == "num_key_value_heads")
    return "kv_heads";
  return config_field;
}

struct reader {
  reader(diagnostics& diag, std::filesystem::path dir, topology& topo) : d(diag), base_dir(std::move(dir)), t(topo) {}

  diagnostics& d;
  std::filesystem::path base_dir;
  topology& t;

  // What later sections may rely on (see the comment at the top).
  bool model_ok = false;   // t.model.config is a valid shape
  bool nodes_ok = false;   // every node entry has a valid name
  bool engines_ok = false; // every engine entry has a valid name and replica count
  std::vector<std::string> node_names;
  /// Nodes with restart: on-failure, and where that key is (the head may not have it).
  std::map<std::string, std::pair<YAML::Mark, std::string>> restart_marks;
  /// Nodes with a fixed port, and where it is (only the head listens).
  std::map<std::string, std::pair<YAML::Mark, std::string>> port_marks;
  std::vector<std::string> engine_names;
  /// Where model.synthetic.seed was given: only a synthetic trainer uses it.
  std::optional<std::pair<YAML::Mark, std::string>> synthetic_seed_at;

  void read(const YAML::Node& root_node);

  void read_model(const map_reader& root);
  void read_synthetic(const map_reader& model);
  void read_nodes(const map_reader& root);
  void read_cluster(const map_reader& root);
  void read_trainer(const map_reader& root);
  void read_ranks(const map_reader& trainer);
  std::optional<std::vector<std::int64_t>> read_layers(const map_reader& rank);
  std::optional<std::vector<std::int64_t>> read_indices(const map_reader& rank, const char* key, const std::string& unit,
                                                        std::int64_t count, std::int64_t max_listed);
  void read_engines(const map_reader& root);
  void read_router(const map_reader& root);
  void read_vllm_server(const map_reader& r, engine_spec& e);
  void read_coordinator(const map_reader& root);
  void read_transfer(const map_reader& root);
  void check_cuda_ipc(const map_reader& r);
  void check_nccl(const map_reader& r);
  void read_sync(const map_reader& root);
  void read_workload(const map_reader& root);
  void read_drill(const map_reader& root);

  std::string resolve(const std::string& path) const {
    std::filesystem::path p(path);
    return (p.is_absolute() ? p : base_dir / p).lexically_normal().string();
  }

  // A path field: a non-empty string, resolved against the file's directory.
  bool read_path(const map_reader& r, const std::string& key, std::string& out,
                 presence p = presence::optional) const {
    std::string v;
    if (!r.read(key, v, p))
      return false;
    if (v.empty()) {
      r.error(key, "must not be empty");
      return false;
    }
    out = resolve(v);
    return true;
  }

  bool read_name(const map_reader& r, const std::string& key, std::string& out) const {
    std::string v;
    if (!r.read(key, v, presence::required))
      return false;
    if (!is_plain_name(v)) {
      r.error(key, "must be non-empty and use only letters, digits, '.', '_' and '-', got '" + printable(v) + "'");
      return false;
    }
    out = v;
    return true;
  }

  // A reference to a node; checked once the node list is known to be complete.
  bool read_node_ref(const map_reader& r, const std::string& key, std::string& out,
                     presence p = presence::optional) const {
    std::string v;
    if (!r.read(key, v, p))
      return false;
    if (nodes_ok && !contains(node_names, v)) {
      r.error(key, "unknown node '" + printable(v) + "' (defined: " + list_names(node_names) + ")");
      return false;
    }
    out = v;
    return true;
  }

  std::string first_node() const { return t.nodes.empty() ? std::string() : t.nodes.front().name; }
};

/// Parameters of the model's largest group, and which group that is.
std::pair<std::int64_t, std::int64_t> largest_group_parameters(const model_config& c);

} // namespace rlsync::topology_reading
