// Reading a topology: each section is read by one member of `reader`
// (topology_reader.hpp; the sections' own files define the rest), in
// dependency order (model and nodes first, so that later sections can check
// tensor parallelism, layer ranges and node references as they go). Every
// problem is recorded and reading continues; checks that depend on an
// earlier section run only when that section was valid, so one mistake
// gives one message, not a cascade.
#include "runtime/config/topology.hpp"

#include "runtime/config/topology_reader.hpp"

#include "runtime/base/regular_file.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

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

using namespace topology_reading;
namespace fs = std::filesystem;

namespace {
// A topology is a few kB; this only keeps a wrong file from being read whole.
constexpr std::size_t max_topology_bytes = 16 << 20;
} // namespace

namespace topology_reading {

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
  if (d.empty() && t.others_join_the_head() && !t.cluster.tls && !t.cluster.allow_insecure_network)
    root.error(root.has("cluster") ? "cluster" : "nodes",
               t.nodes.size() > 1 ? insecure_refusal : insecure_external_refusal);
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
  const bool arch_ok = ok;
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
    if (auto items = s.list("mlp_only_layers")) {
      if (items->size() > static_cast<std::size_t>(max_hidden_layers)) {
        s.error("mlp_only_layers", "expected a list of at most " + std::to_string(max_hidden_layers)
                                     + " layer indices, got " + std::to_string(items->size()));
        ok = false;
      }
      for (std::size_t i = 0; ok && i < items->size(); ++i) {
        const auto& item = (*items)[i];
        auto l = read_int(d, item.node, item.node.Mark(), item.path);
        if (!l) {
          ok = false;
        } else if (std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), *l) != c.mlp_only_layers.end()) {
          d.add(item.node.Mark(), item.path, "layer " + std::to_string(*l) + " is listed twice");
          ok = false;
        } else {
          c.mlp_only_layers.push_back(*l);
        }
      }
    } else {
      ok = false;
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
  if (s.has("seed"))
    synthetic_seed_at = std::make_pair(s.mark("seed"), s.path("seed"));
  // validate() refuses expert fields on a dense model by their values; one
  // written with its default value, or one validate() does not look at, is
  // refused here by its presence.
  if (ok && arch_ok && c.arch != model_arch::qwen3_moe) {
    const std::pair<const char*, bool> unseen_by_validate[] = {
      {"experts", c.num_experts == 0},
      {"experts_per_tok", c.num_experts_per_tok == 0},
      {"moe_intermediate_size", c.moe_intermediate_size == 0},
      {"mlp_only_layers", c.mlp_only_layers.empty()},
      {"expert_layout", !c.fused_experts},
      {"norm_topk_prob", true},
      {"decoder_sparse_step", true}};
    for (auto [key, unseen] : unseen_by_validate)
      if (unseen && s.has(key)) {
        s.error(key, std::string("only qwen3_moe models have experts (this is a ") + to_string(c.arch) + ")");
        ok = false;
      }
  }
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
    if (n.port != 0 && !n.name.empty())
      port_marks.emplace(n.name, std::make_pair(r.mark("port"), r.path("port")));
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
    const bool restart_ok = !r.has("restart") || r.read_choice("restart", n.restart, node_restart_choices);
    if (r.has("restart") && restart_ok && n.restart == node_restart::on_failure)
      restart_marks.emplace(n.name, std::make_pair(r.mark("restart"), r.path("restart")));
    if (r.read("max_restarts", n.max_restarts, between(0, max_node_restarts)) && restart_ok
        && n.restart != node_restart::on_failure)
      r.error("max_restarts", "only used with restart: on-failure (rlsync launch restarts the node's process up to "
                              "this many times)");
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
  if (c.read("allow_insecure_network", cl.allow_insecure_network) && cl.allow_insecure_network && c.has("tls"))
    c.error("allow_insecure_network", "has no effect beside cluster.tls (the nodes talk TLS): leave it out");
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

} // namespace topology_reading

namespace {

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

bool ucx_lends_shared_memory(const transfer_spec& t) {
  return t.backend == transfer_backend::ucx
         && (t.ucx_transports.empty()
             || std::find(t.ucx_transports.begin(), t.ucx_transports.end(), ucx_transport::shm) != t.ucx_transports.end());
}

bool trainer_versions_lendable(const transfer_spec& t) { return ucx_lends_shared_memory(t) && t.huge_pages; }

bool engine_near_trainer_rank(const topology& t, std::size_t rank) {
  if (rank >= t.trainer.ranks.size())
    return false;
  const std::string& node = t.trainer.ranks[rank].node;
  const node_spec* here = t.find_node(node);
  for (const auto& e : t.engines) {
    if (e.kind != engine_kind::builtin)
      continue; // a vLLM server maps no trainer memory
    if (e.node == node)
      return true;
    if (const node_spec* there = t.find_node(e.node); here && there && there->address == here->address)
      return true;
  }
  return false;
}

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

std::string topology_place(const std::string& path, const std::vector<std::string>& steps) {
  try {
    YAML::Node at = YAML::Load(read_regular_file(path, max_topology_bytes));
    YAML::Mark mark = at.Mark();
    // (reset() rebinds a YAML::Node; `=` would assign into the document.)
    for (const auto& step : steps) {
      YAML::Node next; // (a default Node is a defined null: `found` says whether one was)
      bool found = false;
      const bool in_list = step.rfind("name=", 0) == 0 || (step.size() > 2 && step.front() == '[');
      if (in_list) {
        if (!at.IsSequence())
          return path;
        for (std::size_t i = 0; i < at.size() && !found; ++i) {
          const YAML::Node entry = at[i];
          found = step.front() == '[' ? step == "[" + std::to_string(i) + "]"
                                      : entry.IsMap() && entry["name"] && entry["name"].IsScalar()
                                          && entry["name"].Scalar() == step.substr(5);
          if (found)
            next.reset(entry);
        }
        if (!found)
          return path; // an entry that is not there: the file alone
      } else if (at.IsMap() && at[step]) {
        next.reset(at[step]);
      } else {
        break; // a key absent (a default): its parent is the place
      }
      at.reset(next);
      mark = at.Mark();
    }
    if (!mark.is_null())
      return path + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
  } catch (const std::exception&) {
    // The file changed or went since it loaded: the path alone names it.
  }
  return path;
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
