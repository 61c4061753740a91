// rlsync plan: predicts a cluster's sync from its description, without any
// weights (runtime/forecast/).
#include "runtime/forecast/report.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <iostream>

namespace rlsync::tools {

int cmd_plan(const arg_list& argv) {
  CLI::App app("Predicts one weight sync of a cluster described in CLUSTER.yaml (nodes, GPUs, NIC and\n"
               "NVLink bandwidth, the trainer's tp/pp/ep layout, the engines' tp/dp/ep): records every\n"
               "engine worker's plan with the engine's loader on shape-only views, chooses holders with\n"
               "the data plane's rule, and runs a flow model of the fabric. Prints bytes per producer,\n"
               "consumer and link, memory per side, the sync time with its bottleneck and speed of light,\n"
               "the effect of each knob, the per-tensor NCCL broadcast baseline and waves. configs/plan/\n"
               "has the published scenarios. Exits 1 on a bad file (FILE:LINE:COLUMN: FIELD: MESSAGE).",
               "rlsync plan");
  cli::configure(app);
  std::vector<std::string> files;
  bool json = false;
  app.add_option("CLUSTER.yaml", files, "the cluster description");
  app.add_flag("--json", json, "print the figures as one JSON object");
  if (!cli::parse(app, argv))
    return 0;
  if (files.size() != 1)
    throw cli::usage_error("expected one cluster file, got " + std::to_string(files.size()) + " (see --help)");
  forecast::cluster c;
  try {
    c = forecast::load_cluster(files[0]);
  } catch (const forecast::cluster_error& e) {
    for (auto& line : e.errors)
      std::cerr << line << "\n";
    return 1;
  }
  const auto layout = forecast::build_layout(c);
  const auto report = forecast::make_report(c, layout);
  if (json)
    std::cout << forecast::to_json(c, layout, report).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  else
    std::cout << forecast::to_text(c, layout, report);
  return 0;
}

} // namespace rlsync::tools
