// rlsync status: the fleet as the head sees it (flags only; the job is
// actors/jobs/status).
#include "actors/gatekeeper.hpp"
#include "actors/jobs/main_job.hpp"
#include "actors/jobs/status.hpp"
#include "actors/system_config.hpp"
#include "actors/tls.hpp"
#include "runtime/base/printable.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <caf/actor_system.hpp>

#include <iostream>
#include <optional>

namespace rlsync::tools {

namespace {

const char* description =
  "Prints the fleet as the head's coordinator and router see it: each engine's state,\n"
  "version and outstanding requests, why it was last evicted, the last round's figures\n"
  "and the router's queue. It joins through the head's gatekeeper as a member node does:\n"
  "with T.yaml, as the first node other than the coordinator's that hosts something\n"
  "(--as picks another), with that node's secret and TLS files; --head overrides the\n"
  "head's address. Without T.yaml: --head, --as and --secret-file (and --ca/--cert/--key\n"
  "when the cluster talks TLS).\n";

std::pair<std::string, std::uint16_t> split_host_port(const std::string& text) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw cli::usage_error("--head: expected HOST:PORT, got '" + printable(text) + "'");
  auto port = cli::parse_count(text.substr(colon + 1), "--head port");
  if (port == 0 || port > 65535)
    throw cli::usage_error("--head: port must be in 1..65535, got '" + printable(text) + "'");
  return {text.substr(0, colon), static_cast<std::uint16_t>(port)};
}

/// The first node, other than the head's, that hosts an engine, a trainer rank or the router.
std::string default_member(const topology& t) {
  for (const auto& n : t.nodes) {
    if (n.name == t.coordinator.node)
      continue;
    bool hosts = t.router.node == n.name;
    for (const auto& e : t.engines)
      hosts = hosts || e.node == n.name;
    for (const auto& r : t.trainer.ranks)
      hosts = hosts || r.node == n.name;
    if (hosts)
      return n.name;
  }
  return {};
}

} // namespace

int cmd_status(const arg_list& argv) {
  CLI::App app(description, "rlsync status");
  cli::configure(app);
  std::string path, head_at, as_node, secret_file;
  std::uint64_t deadline_ms = 10000;
  app.add_option("topology", path, "the topology file")->type_name("T.yaml");
  auto head_flag = app.add_option("--head", head_at, "the head's gatekeeper (default: from T.yaml)")
                     ->type_name("HOST:PORT");
  app.add_option("--as", as_node, "the member node to join as")->type_name("NODE");
  auto secret_flag =
    app.add_option("--secret-file", secret_file, "that node's secret (default: from T.yaml)")->type_name("FILE");
  auto json_flag = app.add_flag("--json", "print the fleet as JSON");
  cli::add_count(app, "--deadline-ms", deadline_ms, "give up on each step after this long")->default_val(deadline_ms);
  tls_spec tls;
  auto ca_flag = app.add_option("--ca", tls.ca, "without T.yaml: mutual TLS, the CA's certificate (PEM)")
                   ->type_name("FILE");
  auto cert_flag = app.add_option("--cert", tls.cert, "without T.yaml: this side's certificate (PEM)")->type_name("FILE");
  auto key_flag = app.add_option("--key", tls.key, "without T.yaml: this side's key (PEM)")->type_name("FILE");
  if (!cli::parse(app, argv))
    return 0;
  if (deadline_ms == 0 || deadline_ms > 3'600'000)
    throw cli::usage_error("--deadline-ms: must be in 1..3600000, got " + std::to_string(deadline_ms));
  const auto tls_flags = ca_flag->count() + cert_flag->count() + key_flag->count();
  if (tls_flags != 0 && tls_flags != 3)
    throw cli::usage_error("--ca, --cert and --key go together");

  jobs::status_target target;
  target.deadline = std::chrono::milliseconds(deadline_ms);
  system_config cfg;
  try {
    if (!path.empty()) {
      if (tls_flags != 0)
        throw cli::usage_error("--ca/--cert/--key: with T.yaml the node's TLS files come from cluster.tls");
      auto loaded = jobs::load_topology_or_report(path);
      if (!loaded)
        return 1;
      const topology& t = *loaded;
      const node_spec* head = t.find_node(t.coordinator.node);
      target.host = head->address;
      target.port = head->port;
      target.node = as_node.empty() ? default_member(t) : as_node;
      if (target.node.empty())
        throw cli::usage_error(path + ": no node but the coordinator's hosts anything: nothing to join as");
      if (!t.find_node(target.node) || target.node == head->name)
        throw cli::usage_error("--as: '" + printable(target.node) + "' is not a member node of " + path);
      target.secret = read_cluster_secret(secret_flag->count() ? secret_file : t.cluster.secret_file_for(target.node),
                                          secret_flag->count() ? std::string{} : t.cluster.secret_env);
      configure_node_tls(cfg, t, target.node);
    } else {
      if (!head_flag->count() || as_node.empty() || !secret_flag->count())
        throw cli::usage_error("without T.yaml, --head, --as and --secret-file are required");
      target.node = as_node;
      target.secret = read_cluster_secret(secret_file, {});
      if (tls_flags == 3)
        enable_tls(cfg, tls);
    }
    if (head_flag->count())
      std::tie(target.host, target.port) = split_host_port(head_at);
    if (target.port == 0)
      throw cli::usage_error("the coordinator's node has an ephemeral port in " + path + ": give --head HOST:PORT");
  } catch (const cli::usage_error&) {
    throw;
  } catch (const std::exception& e) {
    std::cerr << "rlsync status: " << e.what() << "\n";
    return 1;
  }
  caf::actor_system sys{cfg};
  std::string why;
  auto view = jobs::fetch_fleet(sys, target, why);
  if (!view) {
    std::cerr << "rlsync status: " << why << "\n";
    return 1;
  }
  if (json_flag->count())
    std::cout << jobs::fleet_json(*view).dump(2) << std::endl;
  else
    std::cout << jobs::fleet_text(*view) << std::flush;
  return 0;
}

} // namespace rlsync::tools
