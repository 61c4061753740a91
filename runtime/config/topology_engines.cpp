// The engines section (built-in engines and vLLM servers), the router and
// the coordinator.
#include "runtime/config/topology_reader.hpp"

#include "runtime/config/build_features.hpp"

#include <regex>

namespace rlsync::topology_reading {

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
    const bool dp_ok = !r.has("dp") || r.read("dp", e.dp, between(1, max_dp));
    if (r.has("dp") && dp_ok && tp_ok && model_ok && ep_ok)
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
    const bool kind_ok = !r.has("kind") || r.read_choice("kind", e.kind, engine_kind_choices);
    if (kind_ok && model_ok && e.kind == engine_kind::builtin && !t.model.config.not_computed.empty())
      r.error(r.has("kind") ? "kind" : "name", "the model's config.json: " + t.model.config.not_computed.front()
                                                 + " (a vLLM engine computes it: kind: vllm)");
    if (kind_ok && dp_ok && e.kind != engine_kind::vllm && r.has("dp_balance") && e.dp == 1)
      r.error("dp_balance", std::string("balances requests over data-parallel ranks, and this engine has one (dp: 1")
                              + (r.has("dp") ? ")" : ", the default)"));
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
      // The adapter holds a thread per open stream, up to max_batch + queue_limit.
      if (e.max_batch + e.queue_limit > max_vllm_streams)
        r.error(r.has("queue_limit") ? "queue_limit" : "max_batch",
                "max_batch + queue_limit is at most " + std::to_string(max_vllm_streams)
                  + " for kind vllm (the adapter holds a thread per open stream); got "
                  + std::to_string(e.max_batch + e.queue_limit));
    } else {
      for (const char* key : {"url", "api_key_file", "weights_dir"})
        if (r.has(key))
          r.error(key, "applies to kind vllm only (this entry runs the built-in engine)");
      if (e.device == "cuda" && !validated_features().cuda)
        r.error("device", std::string("'cuda' needs rlsync built with CUDA, and this build has none (") + why_no_cuda()
                            + "); use cpu");
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
  const bool node_known = read_node_ref(r, "node", t.coordinator.node) || !r.has("node");
  // The head holds the coordinator's state and runs the job: a restarted head
  // would strand every member, so its failure ends the job instead.
  if (auto i = restart_marks.find(t.coordinator.node); i != restart_marks.end())
    d.add(i->second.first, i->second.second,
          "the coordinator's node (" + t.coordinator.node
            + ") is never restarted: its failure ends the job; use never here");
  // Members dial the head and publish nothing: a port of theirs would say otherwise.
  for (const auto& [node, at] : port_marks)
    if (node_known && node != t.coordinator.node)
      d.add(at.first, at.second,
            "only the coordinator's node (" + t.coordinator.node
              + ") listens; the others dial it and open no port: leave it out (or 0)");
  read_path(r, "state_file", t.coordinator.state_file);
}

} // namespace rlsync::topology_reading
