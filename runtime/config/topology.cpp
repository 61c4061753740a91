// Reading a topology: each section is read by one member of `reader`, in
// dependency order (model and nodes first, so that later sections can check
// tensor parallelism, layer ranges and node references as they go). Every
// problem is recorded and reading continues; checks that depend on an
// earlier section run only when that section was valid, so one mistake
// gives one message, not a cascade.
#include "runtime/config/topology.hpp"

#include "runtime/base/printable.hpp"
#include "runtime/base/regular_file.hpp"
#include "runtime/config/build_features.hpp"
#include "runtime/config/topology_names.hpp"
#include "runtime/config/yaml_fields.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

namespace rlsync {

std::string format_layers(const std::vector<std::int64_t>& layers) {
  std::string out;
  for (std::size_t i = 0; i < layers.size();) {
    std::size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1)
      ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(layers[i]);
    if (j > i)
      out += "-" + std::to_string(layers[j]);
    i = j + 1;
  }
  return out;
}

namespace {

using namespace yaml_fields;
using namespace topology_names;
namespace fs = std::filesystem;

using namespace topology_limits;

// A topology is a few kB; this only keeps a wrong file from being read whole.
constexpr std::size_t max_topology_bytes = 16 << 20;

const char* const secret_message =
  "secrets are never read from the topology; use secret_file or secret_env";

// Keys that parse but whose feature does not exist yet are refused, never
// accepted and ignored; each message says which issue brings the feature.
const char* const insecure_refusal =
  "more than one node needs cluster.tls ({ca, cert, key}; `rlsync certs make` makes them): without it "
  "anyone who reaches a node's port can read and forge cluster traffic; set "
  "cluster.allow_insecure_network: true to run without TLS anyway";

/// "a, b, c", cut after `limit` names so that 64 replicas stay readable.
std::string list_names(const std::vector<std::string>& names, std::size_t limit = 8) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < limit; ++i)
    out += (i ? ", " : "") + names[i];
  if (names.size() > limit)
    out += ", ... (" + std::to_string(names.size()) + " in all)";
  return names.empty() ? "none" : out;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Names end up in actor names, logs and file names: keep them plain.
bool is_plain_name(const std::string& s) {
  if (s.empty())
    return false;
  return std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '.' || c == '_' || c == '-';
  });
}

bool is_host(const std::string& s) {
  if (s.empty())
    return false;
  return std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '.' || c == '_' || c == '-' || c == ':';
  });
}

bool is_env_name(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0])))
    return false;
  return std::all_of(s.begin(), s.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '_'; });
}

// HF config.json field names (as validate() reports them) -> synthetic keys.
std::string synthetic_key(const std::string& config_field) {
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
  reader(diagnostics& diag, fs::path dir, topology& topo) : d(diag), base_dir(std::move(dir)), t(topo) {}

  diagnostics& d;
  fs::path base_dir;
  topology& t;

  // What later sections may rely on (see the comment at the top).
  bool model_ok = false;   // t.model.config is a valid shape
  bool nodes_ok = false;   // every node entry has a valid name
  bool engines_ok = false; // every engine entry has a valid name and replica count
  std::vector<std::string> node_names;
  /// Nodes with restart: on-failure, and where that key is (the head may not have it).
  std::map<std::string, std::pair<YAML::Mark, std::string>> restart_marks;
  std::vector<std::string> engine_names;

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
    fs::path p(path);
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

void reader::read(const YAML::Node& root_node) {
  map_reader root(d, root_node, "",
                  {"name", "model", "nodes", "cluster", "trainer", "engines", "router", "coordinator",
                   "transfer", "sync", "workload", "drill"},
                  YAML::Mark(), {{"secret", secret_message}});
  if (!root.valid())
    return;
  read_name(root, "name", t.name);
  read_model(root);
  read_nodes(root);
  read_cluster(root);
  read_trainer(root);
  read_engines(root);
  read_router(root);
  read_coordinator(root);
  read_transfer(root);
  read_sync(root);
  read_workload(root);
  read_drill(root);
  // Whole-topology: checked only when everything else is valid (one mistake, one message).
  if (d.empty() && t.nodes.size() > 1 && !t.cluster.tls && !t.cluster.allow_insecure_network)
    root.error(root.has("cluster") ? "cluster" : "nodes", insecure_refusal);
}

void reader::read_model(const map_reader& root) {
  auto m = root.map("model", {"checkpoint", "synthetic"}, presence::required);
  if (!m.present())
    return;
  bool checkpoint = m.has("checkpoint"), synthetic = m.has("synthetic");
  if (checkpoint == synthetic) {
    m.error(std::string("exactly one of checkpoint or synthetic must be set, got ")
            + (checkpoint ? "both" : "neither"));
    return;
  }
  if (synthetic) {
    read_synthetic(m);
    return;
  }
  std::string dir;
  if (!read_path(m, "checkpoint", dir))
    return;
  try {
    // read_config_json also runs validate(); its message names the file.
    t.model.config = read_config_json((fs::path(dir) / "config.json").string());
  } catch (const std::exception& e) {
    m.error("checkpoint", e.what());
    return;
  }
  t.model.checkpoint = dir;
  t.model.weights_dtype = std::nullopt;
  model_ok = true;
}

void reader::read_synthetic(const map_reader& model) {
  auto s = model.map("synthetic",
                     {"arch", "layers", "hidden_size", "heads", "kv_heads", "head_dim", "intermediate_size",
                      "experts", "experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                      "decoder_sparse_step", "mlp_only_layers", "expert_layout", "vocab_size", "max_position_embeddings",
                      "rope_theta", "rms_norm_eps", "tie_word_embeddings", "dtype", "seed"});
  if (!s.present())
    return;
  auto& c = t.model.config;
  c.vocab_size = 320;
  // Ranges are left to validate() below, which knows the relations between
  // fields; it must only see fields that were read. An absent optional key
  // keeps its default and is fine.
  bool ok = !s.has("arch") || s.read_choice("arch", c.arch, arch_choices);
  ok &= s.read("layers", c.num_hidden_layers, {}, presence::required);
  ok &= s.read("hidden_size", c.hidden_size, {}, presence::required);
  ok &= s.read("heads", c.num_attention_heads, {}, presence::required);
  c.num_key_value_heads = c.num_attention_heads;
  ok &= !s.has("kv_heads") || s.read("kv_heads", c.num_key_value_heads);
  ok &= !s.has("head_dim") || s.read("head_dim", c.explicit_head_dim);
  ok &= s.read("intermediate_size", c.intermediate_size, {}, presence::required);
  // Qwen3-MoE's experts (validate() refuses them on another architecture).
  if (c.arch == model_arch::qwen3_moe)
    c.num_experts_per_tok = 2;
  ok &= !s.has("experts") || s.read("experts", c.num_experts);
  ok &= !s.has("experts_per_tok") || s.read("experts_per_tok", c.num_experts_per_tok);
  ok &= !s.has("moe_intermediate_size") || s.read("moe_intermediate_size", c.moe_intermediate_size);
  ok &= !s.has("norm_topk_prob") || s.read("norm_topk_prob", c.norm_topk_prob);
  ok &= !s.has("decoder_sparse_step") || s.read("decoder_sparse_step", c.decoder_sparse_step);
  ok &= !s.has("expert_layout") || s.read_choice("expert_layout", c.fused_experts, expert_layout_choices);
  if (s.has("mlp_only_layers")) {
    const YAML::Node list = s.get("mlp_only_layers");
    if (!list.IsSequence() || list.size() > static_cast<std::size_t>(max_hidden_layers)) {
      s.error("mlp_only_layers", "expected a list of at most " + std::to_string(max_hidden_layers)
                                   + " layer indices, got " + describe(list));
      ok = false;
    } else {
      for (std::size_t i = 0; i < list.size(); ++i) {
        std::int64_t l = 0;
        if (!YAML::convert<std::int64_t>::decode(list[i], l)) {
          d.add(list[i].Mark(), s.path("mlp_only_layers") + "[" + std::to_string(i) + "]",
                "expected a layer index, got " + describe(list[i]));
          ok = false;
        } else {
          c.mlp_only_layers.push_back(l);
        }
      }
    }
  }
  ok &= !s.has("vocab_size") || s.read("vocab_size", c.vocab_size);
  ok &= !s.has("max_position_embeddings") || s.read("max_position_embeddings", c.max_position_embeddings);
  ok &= !s.has("rope_theta") || s.read("rope_theta", c.rope_theta);
  ok &= !s.has("rms_norm_eps") || s.read("rms_norm_eps", c.rms_norm_eps);
  ok &= !s.has("tie_word_embeddings") || s.read("tie_word_embeddings", c.tie_word_embeddings);
  dtype type = dtype::bf16;
  ok &= !s.has("dtype") || s.read_choice("dtype", type, dtype_choices);
  t.model.weights_dtype = type;
  ok &= !s.has("seed") || s.read("seed", t.model.seed);
  if (!ok)
    return;
  auto problems = validate(c);
  for (auto& p : problems) {
    // "num_key_value_heads: must divide ..." -> at model.synthetic.kv_heads.
    auto colon = p.find(": ");
    if (colon == std::string::npos)
      s.error(p);
    else
      s.error(synthetic_key(p.substr(0, colon)), p.substr(colon + 2));
  }
  model_ok = problems.empty();
}

void reader::read_nodes(const map_reader& root) {
  auto items = root.list("nodes", presence::required);
  if (!items)
    return;
  if (items->empty()) {
    root.error("nodes", "must list at least one node");
    return;
  }
  if (static_cast<std::int64_t>(items->size()) > max_nodes) {
    root.error("nodes", "must list at most " + std::to_string(max_nodes) + " nodes, got "
                          + std::to_string(items->size()));
    return;
  }
  nodes_ok = true;
  std::map<std::string, std::string> endpoints; // "address:port" -> node name
  for (auto& item : *items) {
    map_reader r(d, item.node, item.path, {"name", "address", "port", "restart", "max_restarts", "metrics_port"},
                 root.mark("nodes"));
    if (!r.valid()) {
      nodes_ok = false;
      continue;
    }
    node_spec n;
    if (!read_name(r, "name", n.name)) {
      nodes_ok = false;
    } else if (contains(node_names, n.name)) {
      r.error("name", "duplicate node name '" + n.name + "'");
    } else {
      node_names.push_back(n.name);
    }
    if (r.read("address", n.address) && !is_host(n.address))
      r.error("address", "must be a host name or IP address, got '" + printable(n.address) + "'");
    std::int64_t port = 0;
    if (r.read("port", port, between(0, 65535)))
      n.port = static_cast<std::uint16_t>(port);
    // Two nodes cannot listen on the same fixed endpoint.
    if (n.port != 0) {
      std::string endpoint = n.address + ":" + std::to_string(n.port);
      auto [it, fresh] = endpoints.emplace(endpoint, n.name);
      if (!fresh)
        r.error("port", endpoint + " is already used by node '" + it->second + "'");
    }
    std::int64_t metrics_port = 0;
    if (r.read("metrics_port", metrics_port, between(0, 65535))) {
      n.metrics_port = static_cast<std::uint16_t>(metrics_port);
      std::string endpoint = n.address + ":" + std::to_string(metrics_port);
      if (metrics_port != 0 && metrics_port == n.port)
        r.error("metrics_port", "must differ from the node's port " + std::to_string(n.port));
      else if (metrics_port != 0)
        if (auto [it, fresh] = endpoints.emplace(endpoint, n.name); !fresh)
          r.error("metrics_port", endpoint + " is already used by node '" + it->second + "'");
    }
    if (r.read_choice("restart", n.restart, node_restart_choices) && n.restart == node_restart::on_failure)
      restart_marks.emplace(n.name, std::make_pair(r.mark("restart"), r.path("restart")));
    r.read("max_restarts", n.max_restarts, between(0, max_node_restarts));
    t.nodes.push_back(std::move(n));
  }
}

void reader::read_cluster(const map_reader& root) {
  const std::vector<std::pair<std::string, std::string>> forbidden = {{"secret", secret_message}};
  auto c = root.map("cluster",
                    {"secret_file", "secret_env", "tls", "allow_insecure_network", "heartbeat_interval_ms",
                     "heartbeat_timeout_ms", "connect_deadline_ms", "http_api_key_file"},
                    presence::optional, forbidden);
  auto& cl = t.cluster;
  if (c.has("secret_file") && c.has("secret_env"))
    c.error("secret_env", "set at most one of secret_file and secret_env");
  read_path(c, "secret_file", cl.secret_file);
  read_path(c, "http_api_key_file", cl.http_api_key_file);
  if (c.read("secret_env", cl.secret_env) && !is_env_name(cl.secret_env)) {
    // The value is not echoed: it may be the secret itself, pasted by mistake.
    c.error("secret_env", "must be the name of an environment variable (letters, digits, '_'), "
                          "not the secret itself");
    cl.secret_env.clear();
  }
  auto tls = c.map("tls", {"ca", "cert", "key"}, presence::optional, forbidden);
  if (tls.present()) {
    tls_spec spec;
    bool ok = read_path(tls, "ca", spec.ca, presence::required);
    ok &= read_path(tls, "cert", spec.cert, presence::required);
    ok &= read_path(tls, "key", spec.key, presence::required);
    if (ok && spec.ca.find("{node}") != std::string::npos) {
      tls.error("ca", "must not contain {node}: every node trusts the same CA");
      ok = false;
    }
    if (ok)
      cl.tls = spec;
  }
  c.read("allow_insecure_network", cl.allow_insecure_network);
  bool interval = c.read_ms("heartbeat_interval_ms", cl.heartbeat_interval, between(1, max_duration_ms));
  bool timeout = c.read_ms("heartbeat_timeout_ms", cl.heartbeat_timeout, between(1, max_duration_ms));
  c.read_ms("connect_deadline_ms", cl.connect_deadline, between(1, max_duration_ms));
  // Checked only when both were read (or defaulted) cleanly.
  if ((interval || !c.has("heartbeat_interval_ms")) && (timeout || !c.has("heartbeat_timeout_ms"))
      && cl.heartbeat_timeout <= cl.heartbeat_interval)
    c.error("heartbeat_timeout_ms", "must exceed heartbeat_interval_ms ("
                                      + std::to_string(cl.heartbeat_interval.count()) + "), got "
                                      + std::to_string(cl.heartbeat_timeout.count()));
}

void reader::read_trainer(const map_reader& root) {
  auto r = root.map("trainer", {"node", "source", "dir", "step_time_ms", "perturb", "seed", "ranks"},
                    presence::required);
  if (!r.present())
    return;
  auto& tr = t.trainer;
  read_node_ref(r, "node", tr.node, presence::required);
  bool source_ok = !r.has("source") || r.read_choice("source", tr.source, trainer_source_choices);
  if (source_ok) {
    if (tr.source == trainer_source::checkpoint_dir)
      read_path(r, "dir", tr.dir, presence::required);
    else if (r.has("dir"))
      r.error("dir", "only used with source: checkpoint_dir");
  }
  // An outside process decides when its versions appear and what they hold.
  if (source_ok && tr.source == trainer_source::external)
    for (const char* key : {"step_time_ms", "perturb", "seed"})
      if (r.has(key))
        r.error(key, "not used with source: external (the rank's own process publishes its versions)");
  r.read_ms("step_time_ms", tr.step_time, between(0, max_duration_ms));
  if (r.read("perturb", tr.perturb) && !(tr.perturb > 0))
    r.error("perturb", "must be positive, got " + format_double(tr.perturb));
  r.read("seed", tr.seed);
  read_ranks(r);
}

void reader::read_ranks(const map_reader& trainer) {
  auto& tr = t.trainer;
  std::int64_t layers = model_ok ? t.model.config.num_hidden_layers : 0;
  auto all_layers = [&] {
    std::vector<std::int64_t> v(static_cast<std::size_t>(layers));
    for (std::int64_t i = 0; i < layers; ++i)
      v[static_cast<std::size_t>(i)] = i;
    return v;
  };
  if (!trainer.has("ranks")) {
    tr.ranks.push_back({tr.node, all_layers()});
    return;
  }
  auto items = trainer.list("ranks");
  if (!items)
    return;
  if (items->empty()) {
    trainer.error("ranks", "must list at least one rank (or leave ranks out: one rank holds all layers)");
    return;
  }
  if (items->size() > static_cast<std::size_t>(max_ranks)) {
    trainer.error("ranks", "must list at most " + std::to_string(max_ranks) + " ranks, got "
                             + std::to_string(items->size()));
    return;
  }
  // Each rank runs on its own node (default: the trainer's); several may
  // share one, and ranks holding the same layers are replicas of them.
  bool ok = true;
  for (auto& item : *items) {
    map_reader r(d, item.node, item.path, {"node", "layers", "experts"}, trainer.mark("ranks"));
    if (!r.valid()) {
      ok = false;
      continue;
    }
    trainer_rank rank;
    rank.node = tr.node;
    if (r.has("node") && !read_node_ref(r, "node", rank.node))
      ok = false;
    auto held = read_layers(r);
    if (!held) {
      ok = false;
      continue;
    }
    rank.layers = std::move(*held);
    if (r.has("experts") && model_ok) {
      const auto& c = t.model.config;
      if (c.arch != model_arch::qwen3_moe) {
        r.error("experts", "needs a mixture-of-experts model (arch qwen3_moe), not " + std::string(to_string(c.arch)));
        ok = false;
      } else if (c.fused_experts) {
        r.error("experts", "the model's experts are fused (mlp.experts.gate_up_proj holds every expert of a "
                           "layer): a rank holds all of a layer's experts or none");
        ok = false;
      } else if (!(rank.experts = read_indices(r, "experts", "expert", c.num_experts, max_experts))) {
        ok = false;
      }
    }
    tr.ranks.push_back(std::move(rank));
  }
  if (!ok || !model_ok)
    return;
  std::vector<bool> covered(static_cast<std::size_t>(layers), false);
  for (auto& rank : tr.ranks)
    for (auto l : rank.layers)
      covered[static_cast<std::size_t>(l)] = true;
  std::vector<std::int64_t> missing;
  for (std::int64_t l = 0; l < layers; ++l)
    if (!covered[static_cast<std::size_t>(l)])
      missing.push_back(l);
  if (!missing.empty())
    trainer.error("ranks", std::string(missing.size() == 1 ? "layer " : "layers ")
                             + format_layers(missing) + (missing.size() == 1 ? " is" : " are")
                             + " held by no rank (the model has " + std::to_string(layers)
                             + " layers)");
  // Every expert of every sparse layer, by some rank holding that layer.
  const auto& c = t.model.config;
  if (!missing.empty() || c.arch != model_arch::qwen3_moe)
    return;
  // Bounded work: the (layer, listed expert) pairs to mark.
  std::int64_t pairs = 0;
  for (auto& rank : tr.ranks)
    if (rank.experts)
      pairs += static_cast<std::int64_t>(rank.layers.size()) * static_cast<std::int64_t>(rank.experts->size());
  if (pairs > (std::int64_t(1) << 26)) {
    trainer.error("ranks", "the ranks list " + std::to_string(pairs) + " (layer, expert) pairs, more than 2^26");
    return;
  }
  for (std::int64_t l = 0; l < layers; ++l) {
    if (!c.sparse_layer(l))
      continue;
    std::vector<bool> held(static_cast<std::size_t>(c.num_experts), false);
    for (auto& rank : tr.ranks) {
      if (!std::binary_search(rank.layers.begin(), rank.layers.end(), l))
        continue;
      if (!rank.experts) { // every expert of the layer
        held.assign(held.size(), true);
        break;
      }
      for (auto e : *rank.experts)
        held[static_cast<std::size_t>(e)] = true;
    }
    std::vector<std::int64_t> unheld;
    for (std::int64_t e = 0; e < c.num_experts; ++e)
      if (!held[static_cast<std::size_t>(e)])
        unheld.push_back(e);
    if (!unheld.empty()) {
      trainer.error("ranks", "layer " + std::to_string(l) + ": " + (unheld.size() == 1 ? "expert " : "experts ")
                               + format_layers(unheld) + (unheld.size() == 1 ? " is" : " are")
                               + " held by no rank holding the layer (the model has "
                               + std::to_string(c.num_experts) + " experts)");
      return; // one layer says it; the others are usually the same
    }
  }
}

// `all`, a list of indices, or a range string "a-b" (inclusive; "a" alone is
// one index) of a rank's `key` (layers, experts): `count` of them, each a
// `unit`. Indices are checked against the model when its shape is known.
std::optional<std::vector<std::int64_t>> reader::read_indices(const map_reader& rank, const char* key,
                                                              const std::string& unit, std::int64_t count,
                                                              std::int64_t max_listed) {
  const std::string path = rank.path(key);
  YAML::Node node = rank.get(key);
  const std::string expected = "expected `all`, a list of " + unit + " indices or a range like \"0-3\", got ";
  std::vector<std::int64_t> layers;
  bool ok = true;
  auto in_range = [&](std::int64_t l, const YAML::Mark& at, const std::string& p) {
    if (!model_ok || l < count)
      return true;
    d.add(at, p, unit + " " + std::to_string(l) + " out of range: the model has " + std::to_string(count) + " "
                   + unit + "s (0-" + std::to_string(count - 1) + ")");
    return false;
  };
  if (node.IsScalar()) {
    const std::string& text = node.Scalar();
    if (text == "all") {
      for (std::int64_t i = 0; i < count; ++i)
        layers.push_back(i);
      return layers;
    }
    auto dash = text.find('-');
    std::string first = text.substr(0, dash), last = dash == std::string::npos ? first : text.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() < 10
             && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
    };
    if (!digits(first) || !digits(last)) {
      rank.error(key, expected + describe(node));
      return std::nullopt;
    }
    std::int64_t a = std::stoll(first), b = std::stoll(last);
    if (a > b) {
      rank.error(key, "range start must not exceed its end, got '" + printable(text) + "'");
      return std::nullopt;
    }
    if (!in_range(b, rank.mark(key), path))
      return std::nullopt;
    if (!model_ok)
      return layers; // unchecked: do not expand "0-999999999"
    for (std::int64_t i = a; i <= b; ++i)
      layers.push_back(i);
    return layers;
  }
  if (!node.IsSequence()) {
    rank.error(key, expected + describe(node));
    return std::nullopt;
  }
  // Each index at most once: a longer list is wrong, and checking repeats
  // in it would take quadratic time.
  if (node.size() > static_cast<std::size_t>(max_listed)) {
    rank.error(key, "must list at most " + std::to_string(max_listed) + " " + unit + "s, got "
                      + std::to_string(node.size()));
    return std::nullopt;
  }
  std::size_t i = 0;
  for (auto it = node.begin(); it != node.end(); ++it, ++i) {
    YAML::Node item = *it;
    std::string item_path = index_path(path, i);
    auto l = read_int(d, item, item.Mark(), item_path, non_negative());
    if (!l || !in_range(*l, item.Mark(), item_path)) {
      ok = false;
      continue;
    }
    if (std::find(layers.begin(), layers.end(), *l) != layers.end()) {
      d.add(item.Mark(), item_path, unit + " " + std::to_string(*l) + " is listed twice");
      ok = false;
      continue;
    }
    layers.push_back(*l);
  }
  if (!ok)
    return std::nullopt;
  if (layers.empty()) {
    rank.error(key, "must name at least one " + unit);
    return std::nullopt;
  }
  std::sort(layers.begin(), layers.end());
  return layers;
}

std::optional<std::vector<std::int64_t>> reader::read_layers(const map_reader& rank) {
  if (!rank.require("layers"))
    return std::nullopt;
  return read_indices(rank, "layers", "layer", model_ok ? t.model.config.num_hidden_layers : 0, max_hidden_layers);
}

void reader::read_engines(const map_reader& root) {
  auto items = root.list("engines", presence::required);
  if (!items)
    return;
  if (items->empty()) {
    root.error("engines", "must list at least one engine");
    return;
  }
  engines_ok = true;
  std::map<std::string, std::string> owner; // replica name -> the entry's path
  for (auto& item : *items) {
    map_reader r(d, item.node, item.path,
                 {"name", "node", "replicas", "tp", "dp", "dp_balance", "expert_parallel", "weights", "device", "max_batch", "queue_limit",
                  "kv_block_tokens", "prefix_cache_blocks", "kind", "url", "api_key_file", "weights_dir"},
                 root.mark("engines"));
    if (!r.valid()) {
      engines_ok = false;
      continue;
    }
    engine_spec e;
    bool named = read_name(r, "name", e.group);
    read_node_ref(r, "node", e.node, presence::required);
    std::int64_t replicas = 1;
    // The cap catches typos (replicas: 1000000) before they expand.
    bool counted = r.read("replicas", replicas, between(1, max_replicas)) || !r.has("replicas");
    const bool ep_ok = !r.has("expert_parallel") || r.read("expert_parallel", e.expert_parallel);
    const bool tp_ok = r.read("tp", e.tp, between(1, max_tp)) || !r.has("tp");
    if (tp_ok && model_ok && ep_ok) {
      for (auto& problem : validate_tp(t.model.config, e.tp, e.expert_parallel))
        r.error(problem.rfind("expert parallelism needs", 0) == 0 ? "expert_parallel" : "tp", problem);
    }
    if (r.read("dp", e.dp, between(1, max_dp)) && tp_ok && model_ok && ep_ok)
      for (auto& problem : validate_dp(t.model.config, e.tp, e.dp, e.expert_parallel))
        r.error("dp", problem);
    if (r.read("dp_balance", e.dp_balance) && e.dp_balance != "least_outstanding"
        && e.dp_balance != "prefix_affinity")
      r.error("dp_balance", "expected least_outstanding or prefix_affinity, got '" + printable(e.dp_balance) + "'");
    if (r.read("weights", e.weights) && e.weights != "received" && e.weights != "int8")
      r.error("weights", "expected received or int8, got '" + printable(e.weights) + "'");
    if (r.read("device", e.device) && e.device != "cpu" && e.device != "cuda")
      r.error("device", "expected cpu or cuda, got '" + printable(e.device) + "'");
    r.read("max_batch", e.max_batch, between(1, max_batch_limit));
    r.read("queue_limit", e.queue_limit, between(1, max_queue_limit));
    r.read("kv_block_tokens", e.kv_block_tokens, between(1, max_kv_block_tokens));
    r.read("prefix_cache_blocks", e.prefix_cache_blocks, between(0, max_prefix_cache_blocks));
    r.read_choice("kind", e.kind, engine_kind_choices);
    if (e.kind == engine_kind::vllm) {
      read_vllm_server(r, e);
      // One adapter fronts one server of its own: these are the built-in engine's.
      for (const char* key : {"kv_block_tokens", "prefix_cache_blocks"})
        if (r.has(key))
          r.error(key, "applies to the built-in engine only; a vLLM server sets its own caches");
      for (const char* key : {"dp", "dp_balance"})
        if (r.has(key))
          r.error(key, "applies to the built-in engine only; start the vLLM server with --data-parallel-size "
                       "(its internal load balancer pauses every rank on the adapter's one pause call)");
      if (r.has("device"))
        r.error("device", "applies to the built-in engine only; a vLLM server runs on the devices it was started on");
      if (r.has("weights"))
        r.error("weights", "applies to the built-in engine only; a vLLM server quantizes with its own --quantization "
                           "(the adapter hands it the weights as received)");
      if (r.has("expert_parallel"))
        r.error("expert_parallel",
                "applies to the built-in engine only; rlsync's vLLM adapter serves servers without expert "
                "parallelism (its weight check compares the sliced layout)");
      if (replicas != 1)
        r.error("replicas", "must be 1 for kind vllm: each server is its own entry with its own url");
    } else {
      for (const char* key : {"url", "api_key_file", "weights_dir"})
        if (r.has(key))
          r.error(key, "applies to kind vllm only (this entry runs the built-in engine)");
      if (e.device == "cuda" && !cuda_compiled_in())
        r.error("device", "'cuda' needs rlsync built with CUDA, and this build has none (nvcc was not found when "
                          "it was configured); use cpu");
    }
    if (!named || !counted) {
      engines_ok = false;
      continue;
    }
    // Drill targets name engines, nodes and the three singletons: keep them apart.
    if (e.group == "trainer" || e.group == "router" || e.group == "coordinator") {
      r.error("name", "'" + e.group + "' is reserved (trainer, router and coordinator name those actors)");
      engines_ok = false;
      continue;
    }
    if (static_cast<std::int64_t>(t.engines.size()) + replicas > max_replicas) {
      r.error(r.has("replicas") ? "replicas" : "name",
              "more than " + std::to_string(max_replicas) + " engine replicas in all");
      engines_ok = false;
      break;
    }
    for (std::int64_t i = 0; i < replicas; ++i) {
      e.replica = i;
      e.name = replicas == 1 ? e.group : e.group + "-" + std::to_string(i);
      if (auto [it, fresh] = owner.emplace(e.name, item.path); !fresh) {
        r.error("name", "duplicate engine name '" + e.name + "' (also from " + it->second + ")");
        engines_ok = false;
        break;
      }
      if (contains(node_names, e.name)) {
        r.error("name", "engine '" + e.name + "' has the name of a node; drill targets would be ambiguous");
        engines_ok = false;
        break;
      }
      engine_names.push_back(e.name);
      t.engines.push_back(e);
      if (e.kind == engine_kind::vllm && e.weights_dir.empty())
        t.engines.back().weights_dir = "/dev/shm/rlsync-" + e.name; // tmpfs: versions never touch a disk
    }
  }
}

void reader::read_vllm_server(const map_reader& r, engine_spec& e) {
  if (r.read("url", e.url, presence::required)) {
    // Plain http://host:port[/]: the adapter's client speaks HTTP/1.1 without TLS.
    static const std::regex form(R"(^http://([^/:\[\]]+|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})/?$)");
    std::smatch m;
    if (e.url.rfind("https://", 0) == 0) {
      r.error("url", "https is not supported (no TLS in rlsync's HTTP client): reach the server over "
                     "loopback or a private network, e.g. http://127.0.0.1:8000");
    } else if (!std::regex_match(e.url, m, form)) {
      r.error("url", "must be http://HOST:PORT, got '" + printable(e.url) + "'");
    } else {
      std::string host = m[1].str();
      if (host.front() == '[')
        host = host.substr(1, host.size() - 2);
      const long port = std::stol(m[2].str());
      if (!is_host(host))
        r.error("url", "must name a host name or IP address, got '" + printable(host) + "'");
      else if (port < 1 || port > 65535)
        r.error("url", "port must be between 1 and 65535, got " + std::to_string(port));
      else {
        e.url_host = host;
        e.url_port = static_cast<std::uint16_t>(port);
      }
    }
  }
  read_path(r, "api_key_file", e.api_key_file);
  read_path(r, "weights_dir", e.weights_dir);
}

void reader::read_router(const map_reader& root) {
  auto r = root.map("router", {"node", "policy", "queue_limit", "http_port"});
  t.router.node = first_node();
  read_node_ref(r, "node", t.router.node);
  r.read_choice("policy", t.router.policy, router_policy_choices);
  r.read("queue_limit", t.router.queue_limit, between(1, max_queue_limit));
  std::int64_t http_port = 0;
  if (r.read("http_port", http_port, between(0, 65535))) {
    t.router.http_port = static_cast<std::uint16_t>(http_port);
    // It binds the router node's address: no other port of the topology there.
    const node_spec* home = t.find_node(t.router.node);
    if (http_port != 0 && home)
      for (const auto& n : t.nodes) {
        if (n.address != home->address)
          continue;
        if (n.port == http_port || (n.metrics_port && *n.metrics_port == http_port)) {
          r.error("http_port", home->address + ":" + std::to_string(http_port) + " is already used by node '"
                                 + n.name + "'");
          break;
        }
      }
  }
}

void reader::read_coordinator(const map_reader& root) {
  auto r = root.map("coordinator", {"node", "state_file"});
  t.coordinator.node = first_node();
  read_node_ref(r, "node", t.coordinator.node);
  // The head holds the coordinator's state and runs the job: a restarted head
  // would strand every member, so its failure ends the job instead.
  if (auto i = restart_marks.find(t.coordinator.node); i != restart_marks.end())
    d.add(i->second.first, i->second.second,
          "the coordinator's node (" + t.coordinator.node
            + ") is never restarted: its failure ends the job; use never here");
  read_path(r, "state_file", t.coordinator.state_file);
}

// Parameters of the model's largest group (groups.hpp: one transformer
// block; the first also holds the embeddings, the last the final norm and
// the LM head unless tied), and which group that is.
std::pair<std::int64_t, std::int64_t> largest_group_parameters(const model_config& c) {
  const std::int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim(),
                     kv = c.num_key_value_heads * c.head_dim();
  const std::int64_t attention = 2 * h + 2 * q * h + 2 * kv * h + (c.qk_norm() ? 2 * c.head_dim() : 0);
  auto block = [&](std::int64_t l) {
    return attention
           + (c.sparse_layer(l) ? c.num_experts * h * (1 + 3 * c.moe_intermediate_size) : 3 * h * c.intermediate_size);
  };
  const std::int64_t last = c.num_hidden_layers - 1;
  if (last == 0)
    return {0, block(0) + c.vocab_size * h + h + (c.tie_word_embeddings ? 0 : c.vocab_size * h)};
  std::pair<std::int64_t, std::int64_t> best{0, block(0) + c.vocab_size * h};
  for (std::int64_t l = 1; l <= last; ++l) {
    const std::int64_t g = block(l) + (l == last ? h + (c.tie_word_embeddings ? 0 : c.vocab_size * h) : 0);
    if (g > best.second)
      best = {l, g};
  }
  return best;
}

// cuda_ipc: engines in other processes map the trainer's exported device
// buffer (ipc_puller.hpp), which needs CUDA in this build, one host, and
// whole groups (it does not pack shards on the device yet). The device
// itself is checked at start-up, where it is used.
void reader::check_cuda_ipc(const map_reader& r) {
  if (!cuda_compiled_in()) {
    r.error("backend", "'cuda_ipc' needs rlsync built with CUDA, and this build has none (nvcc was not found "
                       "when it was configured); use local or ucx");
    return;
  }
  for (const auto& n : t.nodes)
    if (n.address != t.nodes.front().address) {
      r.error("backend", "'cuda_ipc' maps the trainer's GPU memory into the engines' processes, so every node "
                         "runs on one host: node '" + n.name + "' is at " + n.address + ", node '"
                           + t.nodes.front().name + "' at " + t.nodes.front().address + "; use ucx across hosts");
      return;
    }
  if (t.transfer.mode != transfer_mode::broadcast)
    r.error("backend", "'cuda_ipc' moves whole groups, which every engine worker slices itself: set "
                       "transfer.mode: broadcast (sharded pulls over cuda_ipc need packing on the device, not "
                       "built yet)");
}

// nccl: each engine worker in another process than a trainer rank is a
// member of the coordinator's communicator and receives its groups point
// to point (nccl_puller.hpp: whole in broadcast mode, its plan's entries
// packed by the rank in sharded mode); it needs CUDA and NCCL in this
// build and rlsync's own engines (a vLLM server's GPUs are not the node's).
// The device itself is checked at start-up.
void reader::check_nccl(const map_reader& r) {
  if (!cuda_compiled_in() || !nccl_compiled_in()) {
    r.error("backend", std::string("'nccl' needs rlsync built with CUDA and NCCL, and this build has ")
                         + (cuda_compiled_in() ? "no NCCL (nccl.h or libnccl was not found" : "no CUDA (nvcc was not found")
                         + " when it was configured); use local or ucx");
    return;
  }
  std::int64_t members = static_cast<std::int64_t>(t.trainer.ranks.size()); // each term bounded: no overflow
  for (const auto& e : t.engines) {
    if (e.kind == engine_kind::vllm) {
      r.error("backend", "'nccl' delivers into rlsync's own engines, and engine '" + e.name
                           + "' is a vLLM server, whose GPUs this node does not hold; use ucx");
      return;
    }
    members += e.tp;
  }
  if (members > topology_limits::max_nccl_members)
    r.error("backend", "'nccl' puts every trainer rank and engine worker in one communicator, at most "
                         + std::to_string(topology_limits::max_nccl_members) + " members; this topology has "
                         + std::to_string(members));
}

void reader::read_transfer(const map_reader& root) {
  auto r = root.map("transfer", {"backend", "mode", "bucket_bytes", "groups_in_flight", "ucx_transports",
                                 "packed_budget_bytes", "collective"});
  auto& tr = t.transfer;
  const bool backend_read = r.read_choice("backend", tr.backend, backend_choices);
  r.read_choice("mode", tr.mode, mode_choices);
  if (r.has("collective") && r.read("collective", tr.collective) && tr.collective) {
    if (tr.backend != transfer_backend::nccl || tr.mode != transfer_mode::broadcast)
      r.error("collective", "a collective broadcast runs over NCCL and sends whole groups: it needs backend: nccl "
                            "and mode: broadcast");
    else if (t.trainer.ranks.size() != 1)
      r.error("collective", "a collective broadcast has one root: it needs one trainer rank, this topology has "
                              + std::to_string(t.trainer.ranks.size()));
  }
  if (backend_read && tr.backend == transfer_backend::nccl)
    check_nccl(r);
  if (backend_read && tr.backend == transfer_backend::cuda_ipc)
    check_cuda_ipc(r);
  const std::int64_t default_bucket = transfer_spec{}.bucket_bytes;
  if (r.read_size("bucket_bytes", tr.bucket_bytes, positive()) && tr.bucket_bytes != default_bucket)
    r.error("bucket_bytes", "only the default " + human_size(default_bucket)
                              + " is accepted for now: every data plane moves one whole parameter group "
                                "(a transformer block) per message or buffer and does not cut it into "
                                "buckets yet; got "
                              + std::to_string(tr.bucket_bytes)
                              + (human_size(tr.bucket_bytes).empty() ? "" : " (" + human_size(tr.bucket_bytes) + ")"));
  r.read("groups_in_flight", tr.groups_in_flight, between(1, max_groups_in_flight));
  if (auto items = r.list("ucx_transports")) {
    for (auto& item : *items) {
      auto v = read_choice(d, item.node, item.node.Mark(), item.path, ucx_transport_choices);
      if (!v)
        continue;
      if (std::find(tr.ucx_transports.begin(), tr.ucx_transports.end(), *v) != tr.ucx_transports.end())
        d.add(item.node.Mark(), item.path, "'" + item.node.Scalar() + "' is listed twice");
      else
        tr.ucx_transports.push_back(*v);
    }
  }
  // The producer packs one whole group at a time: a budget below the
  // largest group one consumer needs could never be met. Sharded, a
  // worker's share of a group is at least 1/tp of it (every element goes to
  // some worker); broadcast sends it whole. A checkpoint's dtype is not
  // known yet: its smallest possible element (2 bytes) gives the bound.
  if (r.read_size("packed_budget_bytes", tr.packed_budget_bytes, non_negative()) && tr.packed_budget_bytes > 0
      && model_ok && !t.engines.empty()) {
    const auto [group, parameters] = largest_group_parameters(t.model.config);
    const std::int64_t element = t.model.weights_dtype ? static_cast<std::int64_t>(dtype_size(*t.model.weights_dtype)) : 2;
    std::int64_t tp = 0; // the engine whose share is largest: the smallest tp
    for (const auto& e : t.engines)
      tp = tp == 0 ? e.tp : std::min(tp, e.tp);
    if (tr.mode == transfer_mode::broadcast)
      tp = 1;
    const std::int64_t needed = (parameters + tp - 1) / tp * element;
    if (tr.packed_budget_bytes < needed)
      r.error("packed_budget_bytes",
              std::to_string(tr.packed_budget_bytes) + " bytes is less than one packed group: group "
                + std::to_string(group) + " of the model is " + std::to_string(parameters * element) + " bytes"
                + (t.model.weights_dtype ? "" : " (at 2 bytes a parameter)")
                + (tp > 1 ? ", of which a worker of tp " + std::to_string(tp) + " needs at least "
                              + std::to_string(needed)
                          : std::string(tr.mode == transfer_mode::broadcast ? ", sent whole in broadcast" : ""))
                + "; the producer packs whole groups, so give at least " + std::to_string(needed)
                + " (or 0 for the default)");
  }
}

void reader::read_sync(const map_reader& root) {
  auto r = root.map("sync", {"every_versions", "staleness", "wave_size", "deadlines_ms", "pause",
                             "min_live_engines", "max_restarts"});
  auto& s = t.sync;
  bool every_ok = r.read("every_versions", s.every_versions, between(1, max_version_count)) || !r.has("every_versions");
  bool staleness_ok = r.read("staleness", s.staleness, between(0, max_version_count)) || !r.has("staleness");
  // Between rounds engines trail the trainer by up to every_versions - 1:
  // a smaller bound would hold every request back until the next round.
  if (every_ok && staleness_ok && s.staleness < s.every_versions - 1)
    r.error(r.has("staleness") ? "staleness" : "every_versions",
            "staleness (" + std::to_string(s.staleness) + ") must be at least every_versions - 1 ("
              + std::to_string(s.every_versions - 1) + "): engines sync every "
              + std::to_string(s.every_versions) + " versions, so between rounds they trail the trainer by up to "
              + std::to_string(s.every_versions - 1));
  r.read("wave_size", s.wave_size, between(0, max_replicas));
  auto pause = r.map("pause", {"mode", "clear_cache"});
  pause.read_choice("mode", s.pause.mode, pause_mode_choices);
  pause.read("clear_cache", s.pause.clear_cache);
  auto dl = r.map("deadlines_ms", {"pause", "flush", "start", "transfer", "finish", "continue"});
  const auto deadline = between(1, max_duration_ms);
  dl.read_ms("pause", s.deadlines.pause, deadline);
  dl.read_ms("flush", s.deadlines.flush, deadline);
  dl.read_ms("start", s.deadlines.start, deadline);
  dl.read_ms("transfer", s.deadlines.transfer, deadline);
  dl.read_ms("finish", s.deadlines.finish, deadline);
  dl.read_ms("continue", s.deadlines.resume, deadline);
  // A round needing more live engines than exist could never complete.
  if (r.read("min_live_engines", s.min_live_engines, between(1, max_replicas)) && engines_ok
      && s.min_live_engines > static_cast<std::int64_t>(t.engines.size()))
    r.error("min_live_engines", "must not exceed the number of engine replicas ("
                                  + std::to_string(t.engines.size()) + "), got "
                                  + std::to_string(s.min_live_engines));
  r.read("max_restarts", s.max_restarts, between(0, max_restarts_limit));
}

void reader::read_workload(const map_reader& root) {
  auto r = root.map("workload",
                    {"prompts", "concurrency", "max_tokens", "temperature", "top_p", "seed", "request_deadline_ms"});
  auto& w = t.workload;
  r.read("prompts", w.prompts, between(0, max_prompts));
  r.read("concurrency", w.concurrency, between(1, max_concurrency));
  r.read("max_tokens", w.max_tokens, between(1, max_tokens));
  if (r.read("temperature", w.temperature) && w.temperature < 0)
    r.error("temperature", "must not be negative, got " + format_double(w.temperature));
  if (r.read("top_p", w.top_p) && !(w.top_p > 0 && w.top_p <= 1))
    r.error("top_p", "must be in (0, 1], got " + format_double(w.top_p));
  r.read("seed", w.seed);
  r.read_ms("request_deadline_ms", w.request_deadline, between(1, max_request_deadline_ms));
}

void reader::read_drill(const map_reader& root) {
  auto drill = root.map("drill", {"faults"});
  auto items = drill.list("faults");
  if (!items)
    return;
  if (static_cast<std::int64_t>(items->size()) > max_faults) {
    drill.error("faults", "must list at most " + std::to_string(max_faults) + " faults, got "
                            + std::to_string(items->size()));
    return;
  }
  for (auto& item : *items) {
    map_reader r(d, item.node, item.path, {"at_sync", "phase", "at_ms", "action", "target", "duration_ms", "dp_rank", "worker"},
                 drill.mark("faults"));
    if (!r.valid())
      continue;
    fault_spec f;
    if (r.has("at_sync") && r.has("at_ms")) {
      r.error("at_ms", "set either at_sync or at_ms, not both");
    } else if (!r.has("at_sync") && !r.has("at_ms")) {
      r.error("needs at_sync (a sync round, from 1) or at_ms (time since start) to say when it fires");
    } else if (r.has("at_sync")) {
      std::int64_t v = 0;
      if (r.read("at_sync", v, between(1, max_version_count)))
        f.at_sync = v;
    } else {
      milliseconds v{};
      if (r.read_ms("at_ms", v, between(0, max_duration_ms)))
        f.at = v;
    }
    if (r.has("phase") && !r.has("at_sync"))
      r.error("phase", "only used with at_sync (the phase of that round the fault fires in)");
    else if (r.has("phase"))
      r.read_choice("phase", f.phase, phase_choices);
    bool action_ok = r.read_choice("action", f.action, action_choices, presence::required);
    bool target_ok = r.read("target", f.target, presence::required);
    if (r.has("duration_ms")) {
      milliseconds v{};
      if (action_ok && f.action != fault_action::partition && f.action != fault_action::delay_acks
          && f.action != fault_action::kill && f.action != fault_action::kill_worker)
        r.error("duration_ms", "only used with kill or kill_worker (restart after it), partition or delay_acks");
      else if (r.read_ms("duration_ms", v, between(1, max_duration_ms)))
        f.duration = v;
    }
    for (const char* key : {"dp_rank", "worker"})
      if (r.has(key) && action_ok && f.action != fault_action::kill_worker)
        r.error(key, "only used with kill_worker (which rank's worker thread dies)");
    const bool rank_ok = r.read("dp_rank", f.dp_rank, between(0, max_dp - 1)) || !r.has("dp_rank");
    const bool worker_ok = r.read("worker", f.worker, between(0, max_tp - 1)) || !r.has("worker");
    if (!action_ok || !target_ok || !nodes_ok || !engines_ok || !rank_ok || !worker_ok)
      continue;
    // Which kinds of target each action accepts, most specific first.
    std::vector<fault_target> kinds;
    switch (f.action) {
    case fault_action::kill:
    case fault_action::restart:
      kinds = {fault_target::engine, fault_target::node, fault_target::trainer, fault_target::router,
               fault_target::coordinator};
      break;
    case fault_action::partition:
    case fault_action::heal:
      kinds = {fault_target::engine, fault_target::node};
      break;
    case fault_action::delay_acks:
    case fault_action::corrupt:
    case fault_action::kill_worker:
      kinds = {fault_target::engine};
      break;
    }
    bool found = false;
    std::vector<std::string> wanted;
    for (auto kind : kinds) {
      switch (kind) {
      case fault_target::engine:
        found = contains(engine_names, f.target);
        wanted.push_back("an engine (" + list_names(engine_names) + ")");
        break;
      case fault_target::node:
        found = contains(node_names, f.target);
        wanted.push_back("a node (" + list_names(node_names) + ")");
        break;
      default:
        found = f.target == name_of(target_choices, kind);
        wanted.emplace_back(name_of(target_choices, kind));
      }
      if (found) {
        f.target_kind = kind;
        break;
      }
    }
    if (!found) {
      std::string expected;
      for (std::size_t i = 0; i < wanted.size(); ++i)
        expected += (i == 0 ? "" : i + 1 == wanted.size() ? " or " : ", ") + wanted[i];
      r.error("target", "unknown target '" + printable(f.target) + "' for " + std::string(name_of(action_choices, f.action))
                          + " (expected " + expected + ")");
      continue;
    }
    // An external rank's process is the user's: no node process can kill or restart it.
    if (f.target_kind == fault_target::trainer && t.trainer.source == trainer_source::external) {
      r.error("target", std::string(name_of(action_choices, f.action))
                          + " cannot act on the trainer: its ranks are outside processes (source: external); "
                            "stop them yourself");
      continue;
    }
    // Partitions and held acknowledgements act on the built-in engine's
    // fault gate; an external server has none (kill its process instead).
    if (f.action == fault_action::partition || f.action == fault_action::heal || f.action == fault_action::delay_acks) {
      const engine_spec* server = nullptr;
      for (const auto& e : t.engines)
        if (e.kind == engine_kind::vllm
            && (f.target_kind == fault_target::engine ? e.name == f.target : e.node == f.target)) {
          server = &e;
          break;
        }
      if (server) {
        r.error("action", std::string(name_of(action_choices, f.action)) + " cannot act on engine '" + server->name
                            + "' (kind vllm: an external server has no fault gate; kill its server instead)");
        continue;
      }
    }
    if (f.action == fault_action::kill_worker) {
      const auto& e = *std::find_if(t.engines.begin(), t.engines.end(),
                                    [&](const engine_spec& x) { return x.name == f.target; });
      if (e.kind == engine_kind::vllm) {
        r.error("action", "kill_worker cannot act on engine '" + e.name
                            + "' (kind vllm: rlsync does not own its worker processes; kill its server instead)");
        continue;
      }
      if (f.dp_rank >= e.dp) {
        r.error("dp_rank", "engine '" + e.name + "' has " + std::to_string(e.dp) + " data-parallel rank"
                             + (e.dp == 1 ? "" : "s") + " (0.." + std::to_string(e.dp - 1) + ")");
        continue;
      }
      if (f.worker >= e.tp) {
        r.error("worker", "engine '" + e.name + "' has " + std::to_string(e.tp) + " tp worker"
                            + (e.tp == 1 ? "" : "s") + " per rank (0.." + std::to_string(e.tp - 1) + ")");
        continue;
      }
    }
    t.drill.faults.push_back(std::move(f));
  }
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (auto& l : lines)
    out += (out.empty() ? "" : "\n") + l;
  return out;
}

} // namespace

std::string_view to_string(trainer_source v) { return name_of(trainer_source_choices, v); }
std::string_view to_string(router_policy v) { return name_of(router_policy_choices, v); }
std::string_view to_string(transfer_backend v) { return name_of(backend_choices, v); }
std::string_view to_string(ucx_transport v) { return name_of(ucx_transport_choices, v); }
std::string_view to_string(fault_action v) { return name_of(action_choices, v); }
std::string_view to_string(fault_target v) { return name_of(target_choices, v); }
std::string_view to_string(node_restart v) { return name_of(node_restart_choices, v); }
std::string_view to_string(engine_kind v) { return name_of(engine_kind_choices, v); }

bool is_topology_name(std::string_view name) { return is_plain_name(std::string(name)); }

std::string with_node_name(std::string path, const std::string& node) {
  const std::string placeholder = "{node}";
  for (auto at = path.find(placeholder); at != std::string::npos; at = path.find(placeholder, at + node.size()))
    path.replace(at, placeholder.size(), node);
  return path;
}

tls_spec tls_spec::for_node(const std::string& node) const {
  return {ca, with_node_name(cert, node), with_node_name(key, node)};
}

const node_spec* topology::find_node(std::string_view name) const {
  for (auto& n : nodes)
    if (n.name == name)
      return &n;
  return nullptr;
}

bool topology::node_runs_anything(std::string_view name) const {
  if (coordinator.node == name || router.node == name)
    return true;
  for (const auto& e : engines)
    if (e.node == name)
      return true;
  if (trainer.source != trainer_source::external)
    for (const auto& r : trainer.ranks)
      if (r.node == name)
        return true;
  return false;
}

const engine_spec* topology::find_engine(std::string_view name) const {
  for (auto& e : engines)
    if (e.name == name)
      return &e;
  return nullptr;
}

topology_error::topology_error(std::vector<std::string> errs)
    : std::runtime_error(join_lines(errs)), errors(std::move(errs)) {}

topology parse_topology(const std::string& yaml_text, const std::string& source_name,
                        const std::string& base_dir) {
  diagnostics d(source_name);
  topology t;
  t.source = source_name;
  t.base_dir = fs::absolute(base_dir.empty() ? fs::path(".") : fs::path(base_dir)).lexically_normal().string();
  auto doc = load_one_document(d, yaml_text, "topology");
  if (!doc)
    throw topology_error(d.lines());
  reader r(d, fs::path(t.base_dir), t);
  r.read(*doc);
  if (!d.empty())
    throw topology_error(d.lines());
  return t;
}

topology load_topology(const std::string& path) {
  std::string text;
  try {
    text = read_regular_file(path, max_topology_bytes);
  } catch (const file_error& e) {
    throw topology_error({e.what()});
  }
  auto dir = fs::path(path).parent_path();
  return parse_topology(text, path, dir.empty() ? "." : dir.string());
}

} // namespace rlsync
