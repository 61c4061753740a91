// rlsync launch: every node of a topology that lives on this machine, each as
// its own `rlsync node` process, their output prefixed with the node's name,
// all stopped together (SIGTERM, a grace period, SIGKILL) on Ctrl-C or when
// one of them fails. The supervision itself is runtime/launcher.hpp.
#include "actors/tls.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/process/launcher.hpp"
#include "runtime/base/printable.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"
#include "tools/job_flags.hpp"

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <iostream>

namespace rlsync::tools {

namespace {

const char* description =
  "Starts every node of the topology whose address is on this machine (loopback,\n"
  "localhost, or an address of a local interface) as a separate process:\n"
  "  rlsync node --topology T.yaml --node NAME --supervised [--secret-file FILE]\n"
  "(FILE may contain {node}: each node reads its own). With cluster.tls every\n"
  "node's certificate and key are checked before any node starts.\n"
  "Each line a node prints is shown prefixed with [NAME]. Children inherit the\n"
  "environment (so a cluster secret in an environment variable reaches them).";

const char* footer =
  "Ctrl-C (or SIGTERM, or SIGHUP: its terminal closed) stops every node: SIGTERM,\n"
  "then SIGKILL after the grace period (a second Ctrl-C skips the wait). A node\n"
  "that fails on its own (non-zero exit or a signal) is started again when the\n"
  "topology gives it `restart: on-failure` (after 0.5 s, 1 s, 2 s... up to 30 s;\n"
  "at most its max_restarts times); otherwise, or once its restarts run out, it\n"
  "stops the others the same way. The coordinator's node is never restarted. Nodes\n"
  "also die if the launcher dies.\n"
  "Exit status: 0 every node exited 0, 1 a node failed (it is named) or no node is\n"
  "on this machine, 2 usage error, 128+N stopped by signal N (130 for Ctrl-C).";

constexpr std::uint64_t max_grace_ms = 24ull * 3600 * 1000;

std::vector<std::string> split_names(const std::string& list) {
  std::vector<std::string> names;
  std::size_t start = 0;
  for (;;) {
    std::size_t comma = list.find(',', start);
    std::string name = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (name.empty())
      throw cli::usage_error("--nodes: empty node name in '" + list + "'");
    if (std::find(names.begin(), names.end(), name) == names.end())
      names.push_back(name);
    if (comma == std::string::npos)
      return names;
    start = comma + 1;
  }
}

std::string defined_nodes(const topology& t) {
  std::string s;
  for (auto& n : t.nodes)
    s += (s.empty() ? "" : ", ") + n.name;
  return s;
}

} // namespace

int cmd_launch(const arg_list& argv) {
  CLI::App app(description, "rlsync launch");
  cli::configure(app);
  app.footer(footer);
  std::vector<std::string> files;
  app.add_option("T.yaml", files, "the topology file");
  std::optional<std::string> node_list, secret_file;
  auto keep = [](std::optional<std::string>& target) {
    return [&target](const std::string& value) { target = value; };
  };
  app.add_option_function<std::string>("--nodes", keep(node_list),
                                       "start exactly these nodes, wherever their addresses point")
    ->type_name("A,B");
  std::uint64_t grace_ms = 10000;
  cli::add_count(app, "--grace-ms", grace_ms, "after SIGTERM, how long nodes get before SIGKILL")
    ->default_val(grace_ms);
  app.add_option_function<std::string>("--secret-file", keep(secret_file), "passed on to every node as it is")
    ->type_name("FILE");
  auto allow_nonfinite = add_allow_nonfinite_flag(app);
  auto dry_run = app.add_flag("--dry-run", "print the command lines, one per node, and start nothing");
  auto run_job = app.add_flag("--run", "the coordinator's node runs the main job (as `rlsync run`) once every "
                                       "engine registered, then exits; the others are then stopped");
  // Passed on as given with --run; `rlsync node` checks them.
  const char* const workload_flags[] = {"--prompts", "--concurrency", "--max-tokens", "--json"};
  std::optional<std::string> workload_values[4];
  for (int i = 0; i < 4; ++i)
    app.add_option_function<std::string>(workload_flags[i], keep(workload_values[i]), "passed to the main job with --run");
  if (!cli::parse(app, argv))
    return 0;
  for (int i = 0; i < 4; ++i)
    if (workload_values[i] && run_job->count() == 0)
      throw cli::usage_error(std::string(workload_flags[i]) + " goes to the main job: give --run too");
  // Checked here, not first by the head once every node started.
  jobs::workload_overrides workload;
  if (workload_values[0])
    workload.prompts = cli::parse_count(*workload_values[0], "--prompts");
  if (workload_values[1])
    workload.concurrency = cli::parse_count(*workload_values[1], "--concurrency");
  if (workload_values[2])
    workload.max_tokens = cli::parse_count(*workload_values[2], "--max-tokens");
  check_workload_flags(workload);
  if (files.size() != 1)
    throw cli::usage_error("expected one topology file, got " + std::to_string(files.size()) + " (see --help)");
  const std::string path = files[0];
  if (grace_ms > max_grace_ms)
    throw cli::usage_error("--grace-ms: at most " + std::to_string(max_grace_ms) + " (a day), got "
                           + std::to_string(grace_ms));

  topology t;
  try {
    t = load_topology(path);
  } catch (const topology_error& e) {
    for (auto& line : e.errors)
      std::cerr << line << "\n";
    return 1;
  }

  std::vector<const node_spec*> nodes;
  if (node_list) {
    for (auto& name : split_names(*node_list)) {
      const node_spec* n = t.find_node(name);
      if (!n)
        throw cli::usage_error("--nodes: unknown node '" + printable(name) + "' (defined: " + defined_nodes(t) + ")");
      nodes.push_back(n);
    }
  } else {
    nodes = local_nodes(t);
    // A node hosting only external trainer ranks has nothing to start: the
    // ranks' own processes (rlsync.TrainerRank) join under its name.
    const auto local = nodes.size();
    nodes.erase(std::remove_if(nodes.begin(), nodes.end(),
                               [&](const node_spec* n) { return !t.node_runs_anything(n->name); }),
                nodes.end());
    for (auto& n : t.nodes)
      if (!t.node_runs_anything(n.name))
        std::cerr << "rlsync launch: node " << n.name << " runs nothing to start (external trainer ranks join "
                  << "from their own processes)\n";
    if (nodes.empty() && local > 0) {
      std::cerr << "rlsync launch: no node of " << path << " on this machine runs anything to start\n";
      return 1;
    }
    if (nodes.empty()) {
      std::string addresses;
      for (auto& n : t.nodes)
        addresses += (addresses.empty() ? "" : ", ") + n.name + " at " + n.address;
      std::cerr << "rlsync launch: no node of " << path << " is on this machine (" << addresses
                << "); choose nodes with --nodes\n";
      return 1;
    }
  }

  if (run_job->count() > 0
      && std::none_of(nodes.begin(), nodes.end(), [&](const node_spec* n) { return n->name == t.coordinator.node; }))
    throw cli::usage_error("--run: the main job runs on the coordinator's node, " + t.coordinator.node
                           + ", which is not among the nodes launched here");

  // Absolute, so that the command lines mean the same from anywhere.
  const std::string topology_path = std::filesystem::absolute(path).lexically_normal().string();
  const std::string exe = self_executable();
  std::vector<child_spec> children;
  for (auto* n : nodes) {
    child_spec c{n->name, {exe, "node", "--topology", topology_path, "--node", n->name, "--supervised"}};
    // Validation refuses restarts on the coordinator's node: the head failing ends the job.
    c.restart.on_failure = n->restart == node_restart::on_failure && n->name != t.coordinator.node;
    c.restart.max_restarts = static_cast<std::uint32_t>(std::clamp<std::int64_t>(n->max_restarts, 0, max_node_restarts));
    if (secret_file) {
      c.argv.push_back("--secret-file");
      c.argv.push_back(*secret_file);
    }
    // Every node whose trainer ranks publish weights checks them.
    const bool hosts_rank = t.trainer.ranks.empty()
                              ? n->name == t.trainer.node
                              : std::any_of(t.trainer.ranks.begin(), t.trainer.ranks.end(),
                                            [&](const trainer_rank& r) { return r.node == n->name; });
    if (allow_nonfinite->count() > 0 && hosts_rank)
      c.argv.push_back("--allow-nonfinite");
    // The main job runs on the coordinator's node; the workload flags go there.
    if (run_job->count() > 0 && n->name == t.coordinator.node) {
      c.ends_run = true; // members of a finished job are stopped, not restarted
      c.argv.push_back("--run");
      c.argv.push_back("--no-progress");
      for (int i = 0; i < 4; ++i)
        if (auto& v = workload_values[i]) {
          c.argv.push_back(workload_flags[i]);
          c.argv.push_back(std::string(workload_flags[i]) == "--json" ? std::filesystem::absolute(*v).string() : *v);
        }
    }
    children.push_back(std::move(c));
  }

  if (!t.drill.faults.empty())
    std::cerr << "rlsync launch: the topology's " << t.drill.faults.size()
              << " drill fault(s) are injected by rlsync drill, not by launch\n";
  if (dry_run->count() > 0) {
    for (auto& c : children)
      std::cout << shell_quote(c.argv) << "\n";
    return 0;
  }

  // Bad credentials are refused here, the file named, before any node starts
  // (each node checks its own again).
  if (t.cluster.tls)
    for (auto* n : nodes)
      try {
        check_tls_files(t.cluster.tls->for_node(n->name));
      } catch (const std::exception& e) {
        std::cerr << "rlsync launch: node " << n->name << ": " << e.what() << "\n";
        return 1;
      }

  supervisor_options options;
  options.grace = std::chrono::milliseconds(grace_ms);
  supervisor sup(options);
  stop_on_signals signals(sup);
  std::cout.flush(); // our own lines go out through write(2) from here on
  launch_result r = sup.run(children);
  // The last line may go to a reader that left: exit with our status, not SIGPIPE's.
  ::signal(SIGPIPE, SIG_IGN);
  switch (r.outcome) {
  case launch_outcome::succeeded:
    std::cerr << "rlsync launch: all " << r.exits.size() << " node(s) exited 0\n";
    return 0;
  case launch_outcome::child_failed: {
    std::string how;
    for (auto& e : r.exits)
      if (e.name == r.failed)
        how = e.describe();
    std::cerr << "rlsync launch: node '" << r.failed << "' failed (" << how << "); stopped the others\n";
    return 1;
  }
  case launch_outcome::stopped:
    break;
  }
  int sig = signals.received();
  std::cerr << "rlsync launch: stopped" << (sig ? " by signal " + std::to_string(sig) : std::string())
            << "\n";
  return sig ? 128 + sig : 1;
}

} // namespace rlsync::tools
