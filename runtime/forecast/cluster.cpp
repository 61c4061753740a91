#include "runtime/forecast/cluster.hpp"

#include "runtime/base/regular_file.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/config/topology_names.hpp"
#include "runtime/config/yaml_fields.hpp"

#include <filesystem>

namespace rlsync::forecast {

namespace {

using namespace yaml_fields;
using namespace cluster_limits;
namespace fs = std::filesystem;

constexpr std::size_t max_cluster_bytes = 1 << 20;

const choices<pp_order> pp_order_choices = {{"serial", pp_order::serial}, {"parallel", pp_order::parallel}};
const choices<plan_mode> mode_choices = {{"sharded", plan_mode::sharded}, {"broadcast", plan_mode::broadcast}};
const choices<std::string> link_choices = {{"nvlink", "nvlink"}, {"pcie", "pcie"}};

// A bandwidth in GB/s (10^9 bytes per second), positive and bounded.
bool read_bandwidth(const map_reader& r, const std::string& key, double& out, presence p) {
  double v = 0;
  if (!r.read(key, v, p))
    return false;
  if (!(v > 0) || v > max_gbytes_per_s) {
    r.error(key, "must be in (0, " + std::to_string(static_cast<std::int64_t>(max_gbytes_per_s)) + "] GB/s, got "
                   + std::to_string(v));
    return false;
  }
  out = v * 1e9;
  return true;
}

bool read_seconds(const map_reader& r, const std::string& key, std::optional<double>& out) {
  if (!r.has(key))
    return true;
  double v = 0;
  if (!r.read(key, v))
    return false;
  if (!(v > 0) || v > 1e6) {
    r.error(key, "must be a positive number of seconds (at most 10^6), got " + std::to_string(v));
    return false;
  }
  out = v;
  return true;
}

class reader {
public:
  reader(diagnostics& d, fs::path base, cluster& c) : d_(d), base_(std::move(base)), c_(c) {}

  void read(const YAML::Node& doc) {
    map_reader root(d_, doc, "", {"name", "model", "fabric", "trainer", "engines", "transfer", "sync", "published"});
    if (!root.valid())
      return;
    root.read("name", c_.name, presence::required);
    const bool model_ok = read_model(root);
    const bool fabric_ok = read_fabric(root);
    const bool trainer_ok = read_trainer(root, model_ok && fabric_ok);
    const bool engines_ok = read_engines(root, model_ok);
    read_transfer(root);
    read_sync(root, engines_ok);
    read_published(root);
    if (trainer_ok && engines_ok && fabric_ok)
      check_size(root);
  }

private:
  // Bounds on what planning will do, so that no accepted file runs for hours.
  void check_size(const map_reader& root) {
    if (c_.trainer.ranks() + c_.engine_gpus() > max_gpus) {
      root.error("the trainer's " + std::to_string(c_.trainer.ranks()) + " GPUs and the engines' "
                 + std::to_string(c_.engine_gpus()) + " exceed " + std::to_string(max_gpus));
      return;
    }
    if (c_.engine_count() > max_engines) {
      root.error("engines", std::to_string(c_.engine_count()) + " engine replicas, more than "
                              + std::to_string(max_engines));
      return;
    }
    const auto tensors = static_cast<std::int64_t>(llama_parameter_specs(c_.model, c_.weights).size());
    const std::int64_t trainer_work = c_.trainer.ranks() * (tensors / c_.trainer.pp + 1);
    std::int64_t engine_work = 0;
    for (const auto& e : c_.engines)
      engine_work += ((e.expert_parallel ? e.workers() : e.tp) + e.workers()) * tensors;
    if (trainer_work > max_planning_work)
      root.error("trainer", "planning would list " + std::to_string(trainer_work)
                              + " held tensors (ranks x a stage's tensors), more than "
                              + std::to_string(max_planning_work) + "; plan a smaller slice of the cluster");
    if (engine_work > max_planning_work)
      root.error("engines", "planning would record and assign " + std::to_string(engine_work)
                              + " plan entries (engine workers x the model's tensors), more than "
                              + std::to_string(max_planning_work) + "; plan fewer engine shapes");
  }

  bool read_model(const map_reader& root) {
    auto m = root.map("model", {"config", "dtype", "note"}, presence::required);
    if (!m.present())
      return false;
    std::string path;
    if (!m.read("config", path, presence::required))
      return false;
    m.read_choice("dtype", c_.weights, topology_names::dtype_choices);
    m.read("note", c_.model_note);
    c_.model_config_path = (base_ / path).lexically_normal().string();
    try {
      c_.model = read_config_json(c_.model_config_path); // runs validate(); names the file
    } catch (const std::exception& e) {
      m.error("config", e.what());
      return false;
    }
    return true;
  }

  bool read_fabric(const map_reader& root) {
    auto f = root.map("fabric", {"gpus_per_node", "nic_gbytes_per_s", "intra_node_gbytes_per_s", "intra_node_link"},
                      presence::required);
    if (!f.present())
      return false;
    bool ok = f.read("gpus_per_node", c_.fabric.gpus_per_node, between(1, max_gpus_per_node), presence::required);
    ok &= read_bandwidth(f, "nic_gbytes_per_s", c_.fabric.nic_bytes_per_s, presence::required);
    ok &= read_bandwidth(f, "intra_node_gbytes_per_s", c_.fabric.intra_node_bytes_per_s, presence::required);
    if (f.has("intra_node_link"))
      ok &= f.read_choice("intra_node_link", c_.fabric.intra_node_link, link_choices);
    return ok;
  }

  bool read_trainer(const map_reader& root, bool can_check) {
    auto t = root.map("trainer", {"nodes", "tp", "pp", "ep", "etp"}, presence::required);
    if (!t.present())
      return false;
    auto& L = c_.trainer;
    bool ok = t.read("nodes", L.nodes, between(1, max_nodes), presence::required);
    ok &= t.read("tp", L.tp, between(1, max_parallel), presence::required);
    ok &= t.read("pp", L.pp, between(1, max_parallel), presence::required);
    ok &= !t.has("ep") || t.read("ep", L.ep, between(1, max_parallel));
    ok &= !t.has("etp") || t.read("etp", L.etp, between(1, max_parallel));
    if (!ok || !can_check)
      return false;
    if (L.etp != 1) {
      // Experts sliced over ranks would have to be gathered before serving;
      // the planner (as the runtime) never gathers experts.
      t.error("etp", "only 1 is supported: experts are served whole by the rank holding them, never gathered");
      return false;
    }
    const std::int64_t gpus = L.nodes * c_.fabric.gpus_per_node;
    if (gpus % (L.tp * L.pp) != 0) {
      t.error("tp", "tp x pp (" + std::to_string(L.tp * L.pp) + ") must divide the trainer's "
                      + std::to_string(gpus) + " GPUs (nodes x gpus_per_node)");
      return false;
    }
    L.dp = gpus / (L.tp * L.pp);
    if (L.tp > c_.fabric.gpus_per_node || c_.fabric.gpus_per_node % L.tp != 0) {
      t.error("tp", "must divide gpus_per_node (" + std::to_string(c_.fabric.gpus_per_node)
                      + "): a tensor-parallel group gathers over the intra-node link");
      return false;
    }
    if (L.pp > c_.model.num_hidden_layers) {
      t.error("pp", "more stages than the model's " + std::to_string(c_.model.num_hidden_layers) + " layers");
      return false;
    }
    if (L.ep > 1) {
      if (c_.model.arch != model_arch::qwen3_moe || c_.model.fused_experts) {
        t.error("ep", "expert parallelism needs a mixture-of-experts model with one tensor per expert");
        return false;
      }
      if ((L.tp * L.dp) % L.ep != 0 || c_.model.num_experts % L.ep != 0) {
        t.error("ep", "must divide the ranks of a stage (tp x dp = " + std::to_string(L.tp * L.dp)
                        + ") and the experts (" + std::to_string(c_.model.num_experts) + ")");
        return false;
      }
    }
    return true;
  }

  bool read_engines(const map_reader& root, bool can_check) {
    auto list = root.list("engines", presence::required);
    if (!list)
      return false;
    if (list->empty()) {
      root.error("engines", "at least one engine is needed");
      return false;
    }
    bool all_ok = true;
    for (const auto& item : *list) {
      map_reader e(d_, item.node, item.path, {"name", "replicas", "tp", "dp", "expert_parallel"});
      if (!e.valid()) {
        all_ok = false;
        continue;
      }
      engine_layout x;
      bool ok = e.read("name", x.name, presence::required);
      ok &= !e.has("replicas") || e.read("replicas", x.replicas, between(1, max_parallel));
      ok &= e.read("tp", x.tp, between(1, max_parallel), presence::required);
      ok &= !e.has("dp") || e.read("dp", x.dp, between(1, max_parallel));
      ok &= !e.has("expert_parallel") || e.read("expert_parallel", x.expert_parallel);
      if (ok && can_check) {
        for (auto& problem : validate_tp(c_.model, x.tp, x.expert_parallel)) {
          e.error(problem.rfind("expert parallelism needs", 0) == 0 ? "expert_parallel" : "tp", problem);
          ok = false;
        }
        if (ok && x.expert_parallel && c_.model.num_experts < x.tp * x.dp) {
          e.error("dp", "tp x dp (" + std::to_string(x.tp * x.dp) + ") workers exceed the "
                          + std::to_string(c_.model.num_experts) + " experts: every worker must hold one");
          ok = false;
        }
      }
      all_ok &= ok && can_check;
      if (ok)
        c_.engines.push_back(x);
    }
    return all_ok;
  }

  void read_transfer(const map_reader& root) {
    auto t = root.map("transfer", {"mode", "groups_in_flight", "pp_groups"});
    if (!t.present())
      return;
    t.read_choice("mode", c_.mode, mode_choices);
    t.read("groups_in_flight", c_.groups_in_flight, between(1, 1024));
    t.read_choice("pp_groups", c_.pp_groups, pp_order_choices);
  }

  void read_sync(const map_reader& root, bool engines_ok) {
    auto s = root.map("sync", {"wave_size"});
    if (!s.present() || !s.read("wave_size", c_.wave_size, non_negative()) || !engines_ok)
      return;
    if (c_.wave_size > c_.engine_count())
      s.error("wave_size", "more than the " + std::to_string(c_.engine_count()) + " engines");
  }

  void read_published(const map_reader& root) {
    auto p = root.map("published", {"source", "sharded_s", "sharded_is_calibration", "nccl_broadcast_s", "light_serial_s",
                                     "light_parallel_s"});
    if (!p.present())
      return;
    p.read("source", c_.published.source);
    p.read("sharded_is_calibration", c_.published.sharded_is_calibration);
    if (c_.published.sharded_is_calibration && !p.has("sharded_s"))
      p.error("sharded_is_calibration", "names no figure: sharded_s is not set");
    read_seconds(p, "sharded_s", c_.published.sharded);
    read_seconds(p, "nccl_broadcast_s", c_.published.nccl_broadcast);
    read_seconds(p, "light_serial_s", c_.published.light_serial);
    read_seconds(p, "light_parallel_s", c_.published.light_parallel);
  }

  diagnostics& d_;
  fs::path base_;
  cluster& c_;
};

std::string join(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines)
    out += (out.empty() ? "" : "\n") + l;
  return out;
}

} // namespace

std::int64_t cluster::engine_count() const {
  std::int64_t n = 0;
  for (const auto& e : engines)
    n += e.replicas;
  return n;
}

std::int64_t cluster::engine_gpus() const {
  std::int64_t n = 0;
  for (const auto& e : engines)
    n += e.replicas * e.workers();
  return n;
}

std::int64_t cluster::engine_nodes() const {
  return (engine_gpus() + fabric.gpus_per_node - 1) / fabric.gpus_per_node;
}

cluster_error::cluster_error(std::vector<std::string> errs) : std::runtime_error(join(errs)), errors(std::move(errs)) {}

cluster parse_cluster(const std::string& yaml_text, const std::string& source_name, const std::string& base_dir) {
  diagnostics d(source_name);
  cluster c;
  c.source = source_name;
  auto doc = load_one_document(d, yaml_text, "cluster");
  if (!doc)
    throw cluster_error(d.lines());
  reader r(d, fs::absolute(base_dir.empty() ? fs::path(".") : fs::path(base_dir)), c);
  r.read(*doc);
  if (!d.empty())
    throw cluster_error(d.lines());
  return c;
}

cluster load_cluster(const std::string& path) {
  std::string text;
  try {
    text = read_regular_file(path, max_cluster_bytes);
  } catch (const file_error& e) {
    throw cluster_error({e.what()});
  }
  auto dir = fs::path(path).parent_path();
  return parse_cluster(text, path, dir.empty() ? "." : dir.string());
}

} // namespace rlsync::forecast
