// rlsync: one executable, one subcommand per job.
#include "runtime/base/printable.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <cstdio>
#include <exception>
#include <iostream>

namespace {

using rlsync::tools::arg_list;

struct subcommand {
  const char* name;
  const char* summary;
  int (*run)(const arg_list&);
};

const subcommand subcommands[] = {
  {"run", "the main job: every actor of a topology in one process, with a rollout workload",
   rlsync::tools::cmd_run},
  {"node", "run the actors a topology places on one node (connects to the coordinator's node)",
   rlsync::tools::cmd_node},
  {"version", "print the rlsync version", rlsync::tools::cmd_version},
  {"devices", "show what the GPU layer was built with and which devices it sees",
   rlsync::tools::cmd_devices},
  {"checkpoint", "make, perturb and inspect safetensors checkpoints", rlsync::tools::cmd_checkpoint},
  {"validate", "check a topology file and print what it resolves to", rlsync::tools::cmd_validate},
  {"plan", "predict a cluster's sync: bytes per link, memory, time, bottleneck, speed of light",
   rlsync::tools::cmd_plan},
  {"generate", "run the built-in engine on a checkpoint and print the text", rlsync::tools::cmd_generate},
  {"bench", "measure: engine (throughput, update time)", rlsync::tools::cmd_bench},
  {"status", "print the fleet as the head sees it: engines, versions, evictions, last round",
   rlsync::tools::cmd_status},
  {"ping", "heartbeat round trip to another rlsync process (connectivity check)",
   rlsync::tools::cmd_ping},
  {"drill", "rehearse failures: run a topology's drill faults, check the invariants, write a report",
   rlsync::tools::cmd_drill},
  {"launch", "start the nodes of a topology that live on this machine, one process each",
   rlsync::tools::cmd_launch},
  {"certs", "make a cluster's CA, per-node certificates, keys and secrets (mutual TLS)",
   rlsync::tools::cmd_certs},
  {"soak", "syncs back to back; memory, descriptors and threads per 1,000 syncs", rlsync::tools::cmd_soak},
  {"serve", "serve the built-in engine over vLLM's RL HTTP API (pause, weight updates, health)",
   rlsync::tools::cmd_serve},
};

void print_help(std::ostream& out) {
  out << "usage: rlsync <subcommand> [options]\n\n"
         "Keeps a fleet of LLM rollout engines in step with their trainer.\n\n"
         "subcommands:\n";
  for (auto& s : subcommands) {
    std::string name = s.name;
    name.resize(12, ' ');
    out << "  " << name << s.summary << "\n";
  }
  out << "\nRun 'rlsync <subcommand> --help' for the options of one subcommand.\n";
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_help(std::cerr);
    return 2;
  }
  std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    print_help(std::cout);
    return 0;
  }
  arg_list args(argv + 2, argv + argc);
  for (auto& s : subcommands) {
    if (name != s.name)
      continue;
    try {
      return s.run(args);
    } catch (const rlsync::cli::usage_error& e) {
      std::cerr << "rlsync " << name << ": " << e.what() << "\n";
      return 2;
    } catch (const std::exception& e) {
      std::cerr << "rlsync " << name << ": error: " << e.what() << "\n";
      return 1;
    }
  }
  std::cerr << "rlsync: unknown subcommand '" << rlsync::printable(name) << "'\n\n";
  print_help(std::cerr);
  return 2;
}
