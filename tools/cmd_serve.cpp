// rlsync serve: the built-in engine as a standalone server that speaks
// vLLM's RL HTTP API (actors/assembly/serve_node.hpp). Parses flags only.
#include "actors/assembly/serve_node.hpp"
#include "actors/system_config.hpp"
#include "runtime/base/printable.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <iostream>
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
  "SIGINT or SIGTERM.";

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

} // namespace

int cmd_serve(const arg_list& argv) {
  CLI::App app(description, "rlsync serve");
  cli::configure(app);
  std::string dir, host = "127.0.0.1", api_key_file, topology, node;
  std::uint64_t tp = 1, port = 8000;
  auto dir_flag = app.add_option("--checkpoint", dir, "checkpoint directory (required)")->type_name("DIR");
  cli::add_size(app, "--tp", tp, "tensor-parallel degree, 1..64")->default_val(tp);
  app.add_option("--host", host, "address to listen on")->default_val(host);
  cli::add_size(app, "--port", port, "TCP port, 0 for an ephemeral one")->default_val(port);
  auto key_flag = app.add_option("--api-key-file", api_key_file, "file holding the bearer token POST routes need")
                    ->type_name("FILE");
  auto strict = app.add_flag("--strict-vllm", "answer exactly as vLLM does: 500 for ordering mistakes, no extras");
  auto topology_flag = app.add_option("--topology", topology, "not yet: serving as a node of a topology")->type_name("T");
  auto node_flag = app.add_option("--node", node, "not yet: serving as a node of a topology")->type_name("N");
  if (!cli::parse(app, argv))
    return 0;
  cli::require(dir_flag);
  if (topology_flag->count() > 0 || node_flag->count() > 0)
    throw cli::usage_error("--topology/--node: serving as a node of a topology (weights pulled over rlsync's data "
                           "plane) is not available yet; use the disk backend (update_weights {\"update_info\": "
                           "{\"path\": dir}})");
  if (tp == 0 || tp > 64)
    throw cli::usage_error("--tp: must be in 1..64");
  if (port > 65535)
    throw cli::usage_error("--port: must be in 0..65535");

  serve_node_options options;
  options.checkpoint_dir = dir;
  options.tp = static_cast<int>(tp);
  options.http.host = host;
  options.http.port = static_cast<std::uint16_t>(port);
  options.strict_vllm = strict->count() > 0;
  if (key_flag->count() > 0)
    options.http.bearer_token = read_api_key(api_key_file);
  if (!loopback(host) && !options.http.bearer_token)
    std::cerr << "rlsync serve: warning: listening on " << printable(host)
              << " without --api-key-file: anyone who reaches this port can pause the engine and replace its "
                 "weights\n";

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
