// rlsync serve: the built-in engine as a standalone server that speaks
// vLLM's RL HTTP API (actors/assembly/serve_node.hpp). Parses flags only.
#include "actors/assembly/head_node.hpp"
#include "actors/assembly/member_node.hpp"
#include "actors/assembly/serve_node.hpp"
#include "actors/gatekeeper.hpp"
#include "actors/jobs/main_job.hpp"
#include "actors/system_config.hpp"
#include "actors/tls.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/metrics/http_endpoint.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

namespace rlsync::tools {

namespace {

const char* description =
  "Serves the built-in engine on a checkpoint over HTTP, speaking vLLM's RL API\n"
  "(pause/resume, weight updates from disk, weight checker, health, models), so\n"
  "that an RL framework drives it as it drives `vllm serve`. Binds to loopback\n"
  "unless --host says otherwise; with --api-key-file, every POST route needs\n"
  "`Authorization: Bearer <key>`. Prints the URL once it listens; stops on\n"
  "SIGINT or SIGTERM.\n\n"
  "--topology T --node N (instead of --checkpoint): the server is node N of the\n"
  "topology, which must place exactly one engine there. It joins through the\n"
  "coordinator's gatekeeper as `rlsync node` does (TLS and secret from the\n"
  "topology, --secret-file overrides cluster.secret_file), the coordinator keeps\n"
  "its engine current with rlsync's own transfer, and the HTTP routes front that\n"
  "engine meanwhile: completions, health, status, /weight_info (the coordinator's\n"
  "version numbers as labels), /weight_checker. The routes that would fight the\n"
  "coordinator (weight transfer, pause/resume, sleep, reset_prefix_cache,\n"
  "update_weight_version, collective_rpc) answer 409. Stops with the coordinator.";

std::atomic<int> serve_stop_signal{0};
extern "C" void on_serve_stop_signal(int sig) { serve_stop_signal = sig; }

/// The key in `path`, surrounding whitespace removed; an empty key is refused.
std::string read_api_key(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw cli::usage_error("--api-key-file: cannot read " + printable(path));
  std::ostringstream text;
  text << in.rdbuf();
  auto key = text.str();
  auto first = key.find_first_not_of(" \t\r\n");
  if (first == std::string::npos)
    throw cli::usage_error("--api-key-file: " + printable(path) + " is empty");
  key = key.substr(first, key.find_last_not_of(" \t\r\n") - first + 1);
  if (key.size() > 4096 || key.find_first_of(" \t\r\n") != std::string::npos)
    throw cli::usage_error("--api-key-file: " + printable(path) + " must hold one key on one line (at most 4096 bytes)");
  return key;
}

bool loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "::1" || host == "localhost" || host.rfind("127.", 0) == 0;
}

/// `rlsync serve --topology T --node N`: a member node whose one engine the
/// HTTP routes front once it registered.
int serve_topology_node(const std::string& path, const std::string& name, const std::optional<std::string>& secret_file,
                        serve_node_options options) {
  auto loaded = jobs::load_topology_or_report(path);
  if (!loaded)
    return 1;
  const topology& t = *loaded;
  const node_spec* node = t.find_node(name);
  if (!node)
    throw cli::usage_error("--node: no node '" + printable(name) + "' in " + printable(path));
  if (auto problem = cluster_layout_problem(t); !problem.empty()) {
    std::cerr << "rlsync serve: " << problem << "\n";
    return 1;
  }
  const node_spec* head = t.find_node(t.coordinator.node);
  if (name == head->name)
    throw cli::usage_error("--node: " + printable(name) + " is the coordinator's node; serve a node that only "
                           "runs engines (the coordinator's node runs `rlsync node`)");
  // One engine behind one set of routes: with several, which one a
  // /pause or a completion meant would be a guess.
  std::vector<const engine_spec*> placed;
  for (const auto& e : t.engines)
    if (e.node == name)
      placed.push_back(&e);
  if (placed.size() != 1)
    throw cli::usage_error("--node: " + printable(path) + " places " + std::to_string(placed.size()) +
                           " engines on node " + printable(name) +
                           "; rlsync serve --topology fronts exactly one (give each served engine a node of its own)");
  if (placed.front()->kind == engine_kind::vllm)
    throw cli::usage_error("--node: engine " + printable(placed.front()->name) + " on node " + printable(name) +
                           " is kind vllm: its own server already serves vLLM's API (run `rlsync node` there)");
  options.tp = static_cast<int>(placed.front()->tp);
  options.expert_parallel = placed.front()->expert_parallel;
  options.dp = static_cast<int>(placed.front()->dp);
  options.weights = engine::weight_format_of(placed.front()->weights).value_or(engine::weight_format::received);
  const std::string file = secret_file.value_or(t.cluster.secret_file);
  std::string secret;
  system_config cfg;
  try {
    secret = read_cluster_secret(with_node_name(file, name), t.cluster.secret_env);
    configure_node_tls(cfg, t, name);
  } catch (const std::exception& e) {
    std::cerr << "rlsync serve " << name << ": " << e.what() << "\n";
    return 1;
  }
  if (auto warning = insecure_network_warning(t); !warning.empty())
    std::cerr << warning << std::flush;
  cfg.set("middleman.heartbeat-interval", caf::timespan{t.cluster.heartbeat_interval});
  cfg.set("middleman.connection-timeout", caf::timespan{t.cluster.heartbeat_timeout});
  caf::actor_system sys{cfg};
  std::signal(SIGINT, on_serve_stop_signal);
  std::signal(SIGTERM, on_serve_stop_signal);
  std::unique_ptr<serve_node> server;
  const std::string model_name = t.model.synthetic() ? t.name : t.model.checkpoint;
  // The engine records its metrics where GET /metrics reads them.
  options.metrics = std::make_shared<metrics::registry>();
  // Without --api-key-file the cluster's HTTP key guards the routes, as on every other port.
  if (!options.http.bearer_token && !t.cluster.http_api_key_file.empty()) {
    try {
      options.http.bearer_token = metrics::read_api_key_file(t.cluster.http_api_key_file);
    } catch (const std::exception& e) {
      std::cerr << "rlsync serve " << name << ": " << e.what() << "\n";
      return 1;
    }
  }
  member_node_options mo;
  mo.metrics = options.metrics;
  mo.stop_requested = [] { return serve_stop_signal != 0; };
  mo.log = [name](const std::string& line) { std::cerr << ("rlsync serve " + name + ": " + line + "\n") << std::flush; };
  mo.on_registered = [&](const std::vector<std::pair<std::string, caf::actor>>& engines) -> std::string {
    if (engines.size() != 1)
      return "expected one engine on this node, registered " + std::to_string(engines.size());
    server = std::make_unique<serve_node>(sys, options,
                                          caf::actor_cast<rollout_engine_impl>(engines.front().second),
                                          t.model.config, model_name);
    auto bound = server->start();
    const auto& host = options.http.host;
    std::cout << "rlsync serve: listening on http://" << (host.find(':') != std::string::npos ? "[" + host + "]" : host)
              << ":" << bound << " (engine " << printable(engines.front().first) << " of node " << printable(name)
              << ", weights from the coordinator)" << std::endl;
    return "";
  };
  auto end = run_member_node(sys, t, *node, *head, secret, mo);
  if (server)
    server->stop();
  std::cout << "rlsync serve: stopping" << (serve_stop_signal ? " (signal " + std::to_string(serve_stop_signal.load()) + ")" : std::string(" (the coordinator ended)")) << std::endl;
  // As `rlsync node`: once every actor terminated, a reference CAF's
  // middleman may still hold to a remote peer's proxy must not hang the exit.
  std::cout.flush();
  std::_Exit(end.exit_code);
}

} // namespace

int cmd_serve(const arg_list& argv) {
  CLI::App app(description, "rlsync serve");
  cli::configure(app);
  std::string dir, host = "127.0.0.1", api_key_file, topology, node;
  std::uint64_t tp = 1, port = 8000;
  auto dir_flag = app.add_option("--checkpoint", dir, "checkpoint directory (required)")->type_name("DIR");
  cli::add_count(app, "--tp", tp, "tensor-parallel degree, 1..64")->default_val(tp);
  auto ep_flag = app.add_flag("--expert-parallel", "place whole experts over the tp workers (MoE models)");
  std::uint64_t dp = 1;
  cli::add_count(app, "--dp", dp, "data-parallel scheduler ranks, 1..64 (one pause covers them all)")->default_val(dp);
  std::string weights = "received";
  auto weights_flag = app.add_option("--weights", weights, "serve from the weights as received, or int8 computed from them")
                        ->default_val(weights)
                        ->type_name("received|int8");
  std::string device = "cpu";
  auto device_flag = app.add_option("--device", device, "run the matrix products on the CPU, or on CUDA device 0 (cuBLAS)")
                       ->default_val(device)
                       ->type_name("cpu|cuda");
  app.add_option("--host", host, "address to listen on")->default_val(host);
  cli::add_count(app, "--port", port, "TCP port, 0 for an ephemeral one")->default_val(port);
  auto key_flag = app.add_option("--api-key-file", api_key_file, "file holding the bearer token POST routes need")
                    ->type_name("FILE");
  auto strict = app.add_flag("--strict-vllm", "answer exactly as vLLM does: 500 for ordering mistakes, no extras");
  auto topology_flag =
    app.add_option("--topology", topology, "serve node N of this topology (with --node, instead of --checkpoint)")
      ->type_name("T");
  auto node_flag = app.add_option("--node", node, "the topology's node to serve (its one engine)")->type_name("N");
  std::optional<std::string> secret_file;
  auto secret_flag = app.add_option_function<std::string>(
                           "--secret-file", [&](const std::string& f) { secret_file = f; },
                           "with --topology: overrides cluster.secret_file")
                       ->type_name("FILE");
  if (!cli::parse(app, argv))
    return 0;
  const bool topology_mode = topology_flag->count() > 0 || node_flag->count() > 0;
  if (topology_mode) {
    cli::require(topology_flag);
    cli::require(node_flag);
    if (dir_flag->count() > 0)
      throw cli::usage_error("--checkpoint: with --topology the model and its weights come from the topology's "
                             "trainer; leave --checkpoint out");
    if (app.get_option("--tp")->count() > 0)
      throw cli::usage_error("--tp: with --topology the engine's tp is the topology's");
    if (ep_flag->count() > 0)
      throw cli::usage_error("--expert-parallel: with --topology the engine's expert_parallel is the topology's");
    if (app.get_option("--dp")->count() > 0)
      throw cli::usage_error("--dp: with --topology the engine's dp is the topology's");
    if (weights_flag->count() > 0)
      throw cli::usage_error("--weights: with --topology the engine's weights are the topology's");
    if (device_flag->count() > 0)
      throw cli::usage_error("--device: with --topology the engine's device is the topology's");
  } else {
    cli::require(dir_flag);
    if (secret_flag->count() > 0)
      throw cli::usage_error("--secret-file: only with --topology");
  }
  if (tp == 0 || tp > 64)
    throw cli::usage_error("--tp: must be in 1..64");
  if (dp == 0 || dp > 64)
    throw cli::usage_error("--dp: must be in 1..64");
  if (port > 65535)
    throw cli::usage_error("--port: must be in 0..65535");

  serve_node_options options;
  options.checkpoint_dir = dir;
  options.tp = static_cast<int>(tp);
  options.expert_parallel = ep_flag->count() > 0;
  options.dp = static_cast<int>(dp);
  if (auto f = engine::weight_format_of(weights))
    options.weights = *f;
  else
    throw cli::usage_error("--weights: expected received or int8, got '" + printable(weights) + "'");
  if (device != "cpu" && device != "cuda")
    throw cli::usage_error("--device: expected cpu or cuda, got '" + printable(device) + "'");
  options.on_cuda = device == "cuda";
  options.http.host = host;
  options.http.port = static_cast<std::uint16_t>(port);
  options.strict_vllm = strict->count() > 0;
  if (key_flag->count() > 0)
    options.http.bearer_token = read_api_key(api_key_file);
  if (!loopback(host) && !options.http.bearer_token)
    std::cerr << "rlsync serve: warning: listening on " << printable(host)
              << " without --api-key-file: anyone who reaches this port can pause the engine and replace its "
                 "weights\n";

  if (topology_mode)
    return serve_topology_node(topology, node, secret_file, std::move(options));

  system_config cfg;
  caf::actor_system sys{cfg};
  std::signal(SIGINT, on_serve_stop_signal);
  std::signal(SIGTERM, on_serve_stop_signal);
  serve_node server(sys, options);
  auto bound = server.start();
  std::cout << "rlsync serve: listening on http://" << (host.find(':') != std::string::npos ? "[" + host + "]" : host)
            << ":" << bound << " (model " << printable(dir) << ", tp " << tp << ")" << std::endl;
  while (serve_stop_signal == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::cout << "rlsync serve: stopping (signal " << serve_stop_signal.load() << ")" << std::endl;
  server.stop();
  return 0;
}

} // namespace rlsync::tools
