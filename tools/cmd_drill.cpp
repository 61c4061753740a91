// rlsync drill: flags only; the drill itself is actors/jobs/drill_runner.
#include "actors/jobs/drill_runner.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <iostream>

namespace rlsync::tools {

namespace {

const char* usage =
  "usage: rlsync drill T.yaml [--report DIR] [--throughput judge|report]\n"
  "Runs the topology in this process with its workload, fires the faults of its\n"
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
  "invariant held, 1 one was violated (or a fault never fired), 2 bad usage.\n";

} // namespace

int cmd_drill(const arg_list& argv) {
  cli::args a(argv, {"report", "throughput"}, {"help"});
  if (a.has("help")) {
    std::cout << usage;
    return 0;
  }
  if (a.positional().size() != 1)
    throw cli::usage_error("expected one topology file (rlsync drill T.yaml)");
  jobs::drill_options o;
  o.report_dir = a.get_or("report", "");
  auto verdict = jobs::parse_throughput_verdict(a.get_or("throughput", "judge"));
  if (!verdict)
    throw cli::usage_error("--throughput: expected judge or report, got '" + *a.get("throughput") + "'");
  o.throughput = *verdict;
  return jobs::run_drill(a.positional()[0], o);
}

} // namespace rlsync::tools
