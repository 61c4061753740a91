// rlsync bench sync / bench control: flags, one call into actors/jobs/
// (bench_sync.hpp, bench_control.hpp), the report and the exit status.
#include "actors/jobs/bench_control.hpp"
#include "actors/jobs/bench_sync.hpp"
#include "actors/jobs/main_job.hpp"
#include "runtime/process/launcher.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <fstream>
#include <iostream>
#include <sstream>

namespace rlsync::tools {

using namespace rlsync::jobs;

namespace {

const char* sync_usage =
  "usage: rlsync bench sync --topology T.yaml [--model-bytes N] [--syncs K] [--modes sharded,broadcast]\n"
  "                         [--json FILE] [--verbose]\n"
  "Deploys the topology (every node must be on this machine: the coordinator's node in this\n"
  "process, the others as `rlsync node` processes) with a synthetic bf16 model of about N bytes\n"
  "(default 256MiB; suffixes KiB MiB GiB), and for each mode runs the cold sync, then K warm\n"
  "syncs (default 5): stall, transfer, effective GB/s against the speed of light measured in\n"
  "this run, and control-plane overhead. Then K rounds of a near-empty model (the control plane\n"
  "alone). Prints a table; --json FILE writes every figure.\n";

const char* control_usage =
  "usage: rlsync bench control [--engines N] [--rounds K] [--json FILE] [--verbose]\n"
  "Starts N engine processes (default 8, one engine each, tp 1) on loopback around a head in\n"
  "this process, and runs K (default 20) sync rounds of a near-empty model: the control plane\n"
  "alone. Each round is compared with six waves of CAF round trips to every engine (pause,\n"
  "flush, start, transfer, finish and continue are six waves) measured between the rounds.\n";

/// Progress lines on stderr, whole lines at once (the head's actors call it too).
void note(const std::string& line) {
  std::cerr << (line + "\n") << std::flush;
}

/// Writes `json` to `path`; false (with the reason on stderr) when it cannot.
bool write_json(const std::string& command, const std::string& path, const nlohmann::ordered_json& json) {
  std::ofstream f(path);
  f << json.dump(2) << "\n";
  if (f)
    return true;
  std::cerr << "rlsync " << command << ": --json: cannot write " << path << "\n";
  return false;
}

std::vector<transfer_mode> parse_modes(const std::string& text) {
  std::vector<transfer_mode> modes;
  std::stringstream ss(text);
  for (std::string m; std::getline(ss, m, ',');) {
    if (m == "sharded")
      modes.push_back(transfer_mode::sharded);
    else if (m == "broadcast")
      modes.push_back(transfer_mode::broadcast);
    else
      throw cli::usage_error("--modes: 'sharded' or 'broadcast', got '" + m + "'");
  }
  return modes;
}

} // namespace

int bench_sync(const arg_list& argv) {
  cli::args a(argv, {"topology", "model-bytes", "syncs", "modes", "json"}, {"verbose", "help"});
  if (a.has("help")) {
    std::cout << sync_usage;
    return 0;
  }
  bench_sync_options o;
  o.path = a.required("topology");
  if (a.has("model-bytes"))
    o.model_bytes = cli::parse_size(*a.get("model-bytes"), "--model-bytes");
  const auto syncs = a.get_u64("syncs", 5);
  if (syncs == 0 || syncs > 1000)
    throw cli::usage_error("--syncs: between 1 and 1000, got " + std::to_string(syncs));
  o.syncs = static_cast<int>(syncs);
  o.modes = parse_modes(a.get_or("modes", "sharded,broadcast"));
  o.verbose = a.has("verbose");
  o.exe = self_executable();
  o.note = note;
  auto loaded = load_topology_or_report(o.path);
  if (!loaded)
    return 1;
  if (auto problem = bench_sync_problem(*loaded, o.path, model_of_size(o.model_bytes)); !problem.empty()) {
    std::cerr << "rlsync bench sync: " << problem << "\n";
    return 1;
  }
  auto r = run_bench_sync(*loaded, o);
  std::cout << bench_sync_report(r) << std::flush;
  if (auto json = a.get("json"); json && !write_json("bench sync", *json, bench_sync_json(r)))
    return 1;
  return r.failed() ? 1 : 0;
}

int bench_control(const arg_list& argv) {
  cli::args a(argv, {"engines", "rounds", "json"}, {"verbose", "help"});
  if (a.has("help")) {
    std::cout << control_usage;
    return 0;
  }
  bench_control_options o;
  o.engines = a.get_u64("engines", 8);
  const auto rounds = a.get_u64("rounds", 20);
  if (o.engines == 0 || o.engines > 64)
    throw cli::usage_error("--engines: between 1 and 64, got " + std::to_string(o.engines));
  if (rounds == 0 || rounds > 10000)
    throw cli::usage_error("--rounds: between 1 and 10000, got " + std::to_string(rounds));
  o.rounds = static_cast<int>(rounds);
  o.verbose = a.has("verbose");
  o.exe = self_executable();
  o.note = note;
  auto r = run_bench_control(o);
  if (!r.control.error.empty()) {
    std::cerr << "rlsync bench control: " << r.control.error << "\n";
    return 1;
  }
  std::cout << bench_control_report(r) << std::flush;
  if (auto json = a.get("json"); json && !write_json("bench control", *json, bench_control_json(r)))
    return 1;
  return 0;
}

} // namespace rlsync::tools
