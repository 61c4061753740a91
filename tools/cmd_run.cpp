// rlsync run: the main job with every actor of a topology in this process.
#include "actors/assembly/local_deployment.hpp"
#include "actors/jobs/main_job.hpp"
#include "actors/system_config.hpp"
#include "runtime/base/allocation.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"
#include "tools/job_flags.hpp"

#include <iostream>
#include <unistd.h>

namespace rlsync::tools {

using namespace rlsync::jobs;

namespace {

const char* description =
  "Starts every actor of the topology in this process (trainer, engines, router,\n"
  "coordinator), drives the rollout workload through the router while the trainer\n"
  "produces versions and the coordinator syncs, prints one line per sync and a\n"
  "summary, and verifies that every engine ends with the trainer's weights.\n"
  "Flags override the topology's workload section. Ctrl-C stops sending; requests\n"
  "in flight finish and are reported. Exit status: 0 all well, 1 a request failed\n"
  "or a check did not hold, 3 engines live and serving within sync.staleness fell\n"
  "below sync.min_live_engines,\n"
  "130 interrupted.";

} // namespace

int cmd_run(const arg_list& argv) {
  CLI::App app(description, "rlsync run");
  cli::configure(app);
  std::vector<std::string> files;
  app.add_option("T.yaml", files, "the topology file");
  workload_overrides overrides;
  add_workload_flags(app, overrides);
  std::optional<std::string> json_path;
  app.add_option_function<std::string>(
       "--json", [&](const std::string& p) { json_path = p; }, "also write the summary as JSON to FILE")
    ->type_name("FILE");
  auto no_progress = app.add_flag("--no-progress", "no progress line on a terminal");
  auto allow_nonfinite = add_allow_nonfinite_flag(app);
  if (!cli::parse(app, argv))
    return 0;
  if (files.size() != 1)
    throw cli::usage_error("expected one topology file (rlsync run T.yaml)");
  check_workload_flags(overrides);
  const std::string path = files[0];
  auto loaded = load_topology_or_report(path);
  if (!loaded)
    return 1;
  loaded->trainer.allow_nonfinite = allow_nonfinite->count() > 0;
  const topology& t = *loaded;
  // Each engine serves fp32 weights: a model that cannot fit is refused
  // here, before any actor starts and fails on its own.
  const auto engine_bytes = static_cast<std::uint64_t>(parameter_count(t.model.config).value_or(0)) * 4;
  if (auto problem = beyond_host_memory("the engine's fp32 weights", engine_bytes); !problem.empty()) {
    std::cerr << "rlsync run: " << path << ": " << problem << "\n";
    return 1;
  }
  auto w = workload_from(t, overrides);
  job_console out(no_progress->count() == 0 && isatty(STDERR_FILENO));
  system_config cfg;
  caf::actor_system sys{cfg};
  std::cerr << "rlsync run " << path << ": " << t.engines.size() << " engines (tp " << t.engines.front().tp
            << "), transfer local/" << to_string(t.transfer.mode)
            << (t.transfer.backend == transfer_backend::local
                  ? std::string()
                  : " (one process: the topology's " + std::string(to_string(t.transfer.backend))
                      + " moves weights between processes, under rlsync launch)")
            << ", "
            << w.prompts << " prompts x " << w.max_tokens << " tokens, concurrency " << w.concurrency
            << "; memcpy " << out.memcpy_gbps() << " GB/s" << std::endl;
  // Keys for the other ways of running this topology: said, not silently passed over.
  for (const auto& n : t.nodes)
    if (n.metrics_port)
      std::cerr << "rlsync run " << path << ": nodes '" << n.name
                << "' metrics_port is served by rlsync node and launch; in one process the router's http_port serves /metrics"
                << std::endl;
  if (!t.drill.faults.empty())
    std::cerr << "rlsync run " << path << ": the topology's " << t.drill.faults.size()
              << " drill fault(s) are injected by rlsync drill, not by run" << std::endl;
  deployment_options opts;
  opts.on_sync = [&](const sync_report& r) { out.on_sync(r); };
  opts.log = [&](const std::string& line) { out.on_log(line); };
  auto d = deploy_local(sys, t, opts);
  if (d.http)
    std::cerr << "rlsync run " << path << ": completions on " << d.http->url() << "/v1/completions" << std::endl;
  job_handles h;
  h.router = d.router;
  h.coordinator = d.coordinator;
  h.trainer = d.trainer.actor;
  h.source = d.trainer.source;
  for (const auto& r : d.ranks) { // several ranks: each frozen, all together the reference
    h.ranks.push_back(r.trainer.actor);
    h.sources.push_back(r.trainer.source);
  }
  auto rc = run_main_job(sys, t, path, w, h, out, json_path);
  d.shutdown();
  return rc;
}

} // namespace rlsync::tools
