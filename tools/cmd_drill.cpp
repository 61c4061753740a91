// rlsync drill: flags only; the drill itself is actors/jobs/drill_runner.
#include "actors/jobs/drill_runner.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <iostream>

namespace rlsync::tools {

namespace {

const char* description =
  "Runs the topology (one node: in this process) with its workload, fires the faults of its\n"
  "drill: section, heals everything, then checks the invariants: every request\n"
  "finished or was rejected, no token lost or duplicated, every live engine on the\n"
  "same version with the trainer's weights, no token from a dirty engine, rejoined\n"
  "replicas current, throughput back within 10%, never below\n"
  "sync.min_live_engines. Each is printed as held or violated with its evidence.\n"
  "--throughput report prints and writes the throughput figures marked \"reported,\n"
  "not judged\" instead of judging them (a shared machine's neighbours move them);\n"
  "every other invariant is judged. Default: judge.\n"
  "Writes report.json and report.html (a timeline to open in a browser) into DIR,\n"
  "by default a new folder it names on its last line. Exit status: 0 every judged\n"
  "invariant held, 1 one was violated (or a fault never fired), 2 bad usage.\n"
  "A topology with several nodes runs as one `rlsync node` process per node on this\n"
  "machine (with --netns, as root, each in its own network namespace): kill is\n"
  "SIGKILL of the node's process (duration_ms: started again after it; a killed\n"
  "head resumes from its state file), restart is SIGKILL and start, delay_acks is\n"
  "SIGSTOP then SIGCONT after its duration, partition/heal cut and restore the\n"
  "node's link (--netns only). at_ms counts from the head's first round.";

} // namespace

int cmd_drill(const arg_list& argv) {
  CLI::App app(description, "rlsync drill");
  cli::configure(app);
  std::vector<std::string> files;
  app.add_option("T.yaml", files, "the topology file");
  jobs::drill_options o;
  app.add_option("--report", o.report_dir, "where report.json and report.html go")->type_name("DIR");
  std::string throughput = "judge";
  app.add_option("--throughput", throughput, "judge or report")->capture_default_str();
  app.add_flag("--netns", o.netns, "several nodes: each in its own network namespace (root only; deploy/netns.sh)");
  app.add_option("--netns-script", o.netns_script, "deploy/netns.sh, if not found above the executable")
    ->type_name("FILE");
  if (!cli::parse(app, argv))
    return 0;
  if (files.size() != 1)
    throw cli::usage_error("expected one topology file (rlsync drill T.yaml)");
  auto verdict = jobs::parse_throughput_verdict(throughput);
  if (!verdict)
    throw cli::usage_error("--throughput: expected judge or report, got '" + throughput + "'");
  o.throughput = *verdict;
  return jobs::run_drill(files[0], o);
}

} // namespace rlsync::tools
