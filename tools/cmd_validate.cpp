// rlsync validate: reads a topology, reports every problem in it, or prints
// what it resolves to (defaults, replicas, absolute paths, model shape).
#include "runtime/config/topology.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <iostream>

namespace rlsync::tools {

int cmd_validate(const arg_list& argv) {
  CLI::App app("Checks a topology file. On success prints the resolved topology as YAML\n"
               "(defaults filled in, engine replicas expanded, paths absolute, sizes in\n"
               "bytes, the model's dimensions) and exits 0. Otherwise prints every problem,\n"
               "one per line as FILE:LINE:COLUMN: FIELD: MESSAGE, to stderr and exits 1.",
               "rlsync validate");
  cli::configure(app);
  std::vector<std::string> files;
  app.add_option("TOPOLOGY.yaml", files, "the topology file");
  if (!cli::parse(app, argv))
    return 0;
  if (files.size() != 1)
    throw cli::usage_error("expected one topology file, got " + std::to_string(files.size()) + " (see --help)");
  try {
    std::cout << to_yaml(load_topology(files[0]));
  } catch (const topology_error& e) {
    for (auto& line : e.errors)
      std::cerr << line << "\n";
    return 1;
  }
  return 0;
}

} // namespace rlsync::tools
