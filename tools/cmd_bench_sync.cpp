// rlsync bench sync / bench control / bench http: flags, one call into actors/jobs/
// (bench_sync.hpp, bench_control.hpp), the report and the exit status.
#include "actors/jobs/bench_control.hpp"
#include "actors/jobs/bench_http.hpp"
#include "actors/jobs/bench_sync.hpp"
#include "actors/jobs/main_job.hpp"
#include "actors/jobs/speed_of_light.hpp"
#include "runtime/config/topology_names.hpp"
#include "runtime/process/launcher.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

namespace rlsync::tools {

using namespace rlsync::jobs;

namespace {

const char* sync_description =
  "Deploys the topology (every node must be on this machine: the coordinator's node in this\n"
  "process, the others as `rlsync node` processes) with a synthetic bf16 model of about N bytes\n"
  "(default 256MiB; suffixes KiB MiB GiB), and for each mode runs the cold sync, then K warm\n"
  "syncs (default 5): stall, transfer, effective GB/s against the speed of light measured in\n"
  "this run, and control-plane overhead. Then K rounds of a near-empty model (the control plane\n"
  "alone). Prints a table; --json FILE writes every figure.\n"
  "--ranks 1,2 runs each mode with one trainer rank and with two, each holding its share of\n"
  "the layers (every rank on the coordinator's node), and reports per rank how often each\n"
  "(plan, group) was packed per version; with a count above 1 a trainer rank is then killed\n"
  "mid-transfer and restarted (the abort, the dirty engines, the first complete round).\n";

const char* control_description =
  "Starts N engine processes (default 8, one engine each, tp 1) on loopback around a head in\n"
  "this process, and runs K (default 20) zero-byte sync rounds: a near-empty model the trainer's\n"
  "steps leave unchanged, so engines serving it skip the data plane (the control plane alone).\n"
  "Each round is compared with six waves of CAF round trips to every engine (pause, flush,\n"
  "start, transfer, finish and continue are six waves) measured between the rounds. Then K\n"
  "rounds moving the model (changed every step) in a second deployment, for comparison.\n";

const char* http_description =
  "Deploys N built-in engines (default 2, tp 1) in this process with the fleet's endpoint\n"
  "(router.http_port) and compares streaming throughput: P prompts (default 64) of M tokens\n"
  "(default 64), C at a time (default 8), sent by the workload driver to the router over CAF,\n"
  "then by C HTTP clients streaming /v1/completions through the endpoint; R runs each way\n"
  "(default 3), alternating. Prints tokens/s both ways and their ratio.\n";

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

std::vector<int> parse_rank_counts(const std::string& text) {
  std::vector<int> counts;
  std::stringstream ss(text);
  for (std::string n; std::getline(ss, n, ',');) {
    if (n.empty() || n.size() > 4 || n.find_first_not_of("0123456789") != std::string::npos || std::stoi(n) < 1)
      throw cli::usage_error("--ranks: a list of rank counts like 1,2, got '" + text + "'");
    counts.push_back(std::stoi(n));
  }
  if (counts.empty())
    throw cli::usage_error("--ranks: a list of rank counts like 1,2, got '" + text + "'");
  return counts;
}

/// "tcp" or "shm,cma,tcp": each a ucx_transport, none twice.
std::vector<ucx_transport> parse_ucx_transports(const std::string& text) {
  std::vector<ucx_transport> out;
  std::vector<std::string> names;
  for (std::size_t from = 0;;) { // every field, an empty last one too ("tcp,")
    const auto comma = text.find(',', from);
    names.push_back(text.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
    if (comma == std::string::npos)
      break;
    from = comma + 1;
  }
  const auto& known = topology_names::ucx_transport_choices; // the topology's own spellings
  for (const auto& name : names) {
    std::optional<ucx_transport> found;
    std::string one_of;
    for (const auto& [spelling, u] : known) {
      one_of += (one_of.empty() ? "" : ", ") + std::string(spelling);
      if (name == spelling)
        found = u;
    }
    if (!found)
      throw cli::usage_error("--ucx-transports: a list like tcp or shm,cma,tcp, each one of " + one_of + "; got '"
                             + name + "' in '" + text + "'");
    if (std::find(out.begin(), out.end(), *found) != out.end())
      throw cli::usage_error("--ucx-transports: '" + name + "' is listed twice");
    out.push_back(*found);
  }
  return out;
}

} // namespace

int bench_sync(const arg_list& argv) {
  CLI::App app(sync_description, "rlsync bench sync");
  cli::configure(app);
  std::string path, modes = "sharded,broadcast";
  std::optional<std::uint64_t> model_bytes;
  std::uint64_t syncs = 5;
  std::optional<std::string> json_path;
  auto topology_flag = app.add_option("--topology", path, "the topology file")->type_name("T.yaml");
  app.add_option_function<std::string>(
       "--model-bytes", [&](const std::string& t) { model_bytes = cli::parse_size(t, "--model-bytes"); },
       "model size (default 256MiB; KiB MiB GiB)")
    ->type_name("N");
  cli::add_count(app, "--syncs", syncs, "warm syncs per mode (1..1000)")->type_name("K");
  app.add_option("--modes", modes, "sharded, broadcast or both")->capture_default_str();
  std::optional<std::string> ranks;
  app.add_option_function<std::string>(
       "--ranks", [&](const std::string& r) { ranks = r; },
       "trainer rank counts, e.g. 1,2 (default: 1, and the topology's count when it has several)")
    ->type_name("N,M");
  app.add_option_function<std::string>(
       "--json", [&](const std::string& p) { json_path = p; }, "write every figure as JSON to FILE")
    ->type_name("FILE");
  std::optional<std::string> transports;
  app.add_option_function<std::string>(
       "--ucx-transports", [&](const std::string& t) { transports = t; },
       "instead of the topology's transfer.ucx_transports, e.g. tcp: the path between hosts, on this one (groups "
       "by tag, none lent in shared memory; MPI_Bcast then over tcp too)")
    ->type_name("LIST");
  auto verbose = app.add_flag("--verbose", "the nodes' own output too");
  auto no_mpi = app.add_flag("--no-mpi", "without the MPI_Bcast baseline (engines in other processes otherwise "
                                         "need Open MPI: the bench refuses to run without it)");
  if (!cli::parse(app, argv))
    return 0;
  cli::require(topology_flag);
  bench_sync_options o;
  o.mpi = no_mpi->count() == 0;
  o.path = path;
  if (model_bytes)
    o.model_bytes = *model_bytes;
  if (syncs == 0 || syncs > 1000)
    throw cli::usage_error("--syncs: between 1 and 1000, got " + std::to_string(syncs));
  o.syncs = static_cast<int>(syncs);
  o.modes = parse_modes(modes);
  o.verbose = verbose->count() > 0;
  o.exe = self_executable();
  o.note = note;
  std::optional<std::vector<int>> rank_counts;
  if (ranks)
    rank_counts = parse_rank_counts(*ranks);
  std::optional<std::vector<ucx_transport>> named_transports;
  if (transports)
    named_transports = parse_ucx_transports(*transports);
  auto loaded = load_topology_or_report(o.path);
  if (!loaded)
    return 1;
  const bool remote = std::any_of(loaded->engines.begin(), loaded->engines.end(),
                                  [&](const engine_spec& e) { return e.node != loaded->coordinator.node; });
  if (named_transports) {
    if (loaded->transfer.backend != transfer_backend::ucx) {
      std::cerr << "rlsync bench sync: --ucx-transports: " << o.path << " has transfer.backend "
                << to_string(loaded->transfer.backend) << ", not ucx\n";
      return 1;
    }
    if (!remote) {
      std::cerr << "rlsync bench sync: --ucx-transports: every engine of " << o.path << " runs on the coordinator's "
                << "node, in the bench's process, and pulls without UCX\n";
      return 1;
    }
    loaded->transfer.ucx_transports = *named_transports;
  }
  o.ranks = rank_counts ? *rank_counts : default_rank_counts(*loaded);
  if (auto problem = bench_sync_problem(*loaded, o.path, bench_model(o.model_bytes, o.ranks, loaded->model.config.arch), o.ranks); !problem.empty()) {
    std::cerr << "rlsync bench sync: " << problem << "\n";
    return 1;
  }
  // Engines in other processes are judged against MPI_Bcast: without it the
  // run would lack its yardstick, so it does not start (it installs nothing).
  if (o.mpi && remote)
    if (auto missing = mpi_bcast_missing(o.exe); !missing.empty()) {
      std::cerr << "rlsync bench sync: " << o.path << " has engines in other processes, whose baseline is "
                << "MPI_Bcast, and " << missing << "; or pass --no-mpi to bench without the baseline\n";
      return 1;
    }
  auto r = run_bench_sync(*loaded, o);
  std::cout << bench_sync_report(r) << std::flush;
  if (json_path && !write_json("bench sync", *json_path, bench_sync_json(r)))
    return 1;
  return r.failed() ? 1 : 0;
}

int bench_control(const arg_list& argv) {
  CLI::App app(control_description, "rlsync bench control");
  cli::configure(app);
  std::uint64_t engines = 8, rounds = 20;
  std::optional<std::string> json_path;
  cli::add_count(app, "--engines", engines, "engine processes (1..64)")->type_name("N");
  cli::add_count(app, "--rounds", rounds, "sync rounds (1..10000)")->type_name("K");
  app.add_option_function<std::string>(
       "--json", [&](const std::string& p) { json_path = p; }, "write every figure as JSON to FILE")
    ->type_name("FILE");
  auto verbose = app.add_flag("--verbose", "the nodes' own output too");
  auto over_http = app.add_flag("--http", "instead: a zero-byte round's control phases over vLLM's HTTP routes "
                                          "against rlsync serve servers in this process vs CAF requests to the "
                                          "same engines, and the ratio");
  if (!cli::parse(app, argv))
    return 0;
  bench_control_options o;
  o.engines = engines;
  if (o.engines == 0 || o.engines > 64)
    throw cli::usage_error("--engines: between 1 and 64, got " + std::to_string(o.engines));
  if (rounds == 0 || rounds > 10000)
    throw cli::usage_error("--rounds: between 1 and 10000, got " + std::to_string(rounds));
  o.rounds = static_cast<int>(rounds);
  if (over_http->count() > 0) {
    auto r = run_bench_control_http(o.engines, o.rounds, note);
    if (!r.error.empty()) {
      std::cerr << "rlsync bench control --http: " << r.error << "\n";
      return 1;
    }
    std::cout << bench_control_http_report(r) << std::flush;
    if (json_path && !write_json("bench control --http", *json_path, bench_control_http_json(r)))
      return 1;
    return 0;
  }
  o.verbose = verbose->count() > 0;
  o.exe = self_executable();
  o.note = note;
  auto r = run_bench_control(o);
  for (const auto* c : {&r.control, &r.moving})
    if (!c->error.empty()) {
      std::cerr << "rlsync bench control: " << c->error << "\n";
      return 1;
    }
  std::cout << bench_control_report(r) << std::flush;
  if (json_path && !write_json("bench control", *json_path, bench_control_json(r)))
    return 1;
  return 0;
}

int bench_http(const arg_list& argv) {
  CLI::App app(http_description, "rlsync bench http");
  cli::configure(app);
  bench_http_options o;
  std::uint64_t engines = o.engines, prompts = o.prompts, concurrency = o.concurrency, max_tokens = o.max_tokens,
                repeats = static_cast<std::uint64_t>(o.repeats);
  std::optional<std::string> json_path;
  cli::add_count(app, "--engines", engines, "engines (1..16)")->type_name("N");
  cli::add_count(app, "--prompts", prompts, "prompts per run (1..100000)")->type_name("P");
  cli::add_count(app, "--max-tokens", max_tokens, "tokens per prompt (1..1024)")->type_name("M");
  cli::add_count(app, "--concurrency", concurrency, "requests at a time and HTTP clients (1..256)")->type_name("C");
  cli::add_count(app, "--repeats", repeats, "runs each way (1..100)")->type_name("R");
  app.add_option_function<std::string>(
       "--json", [&](const std::string& p) { json_path = p; }, "write every figure as JSON to FILE")
    ->type_name("FILE");
  if (!cli::parse(app, argv))
    return 0;
  auto check = [](const char* flag, std::uint64_t v, std::uint64_t lo, std::uint64_t hi) {
    if (v < lo || v > hi)
      throw cli::usage_error(std::string(flag) + ": between " + std::to_string(lo) + " and " + std::to_string(hi)
                             + ", got " + std::to_string(v));
  };
  check("--engines", engines, 1, 16);
  check("--prompts", prompts, 1, 100000);
  check("--max-tokens", max_tokens, 1, 1024);
  check("--concurrency", concurrency, 1, 256);
  check("--repeats", repeats, 1, 100);
  o.engines = engines;
  o.prompts = static_cast<std::uint32_t>(prompts);
  o.max_tokens = static_cast<std::uint32_t>(max_tokens);
  o.concurrency = static_cast<std::uint32_t>(concurrency);
  o.repeats = static_cast<int>(repeats);
  o.note = note;
  auto r = run_bench_http(o);
  if (!r.error.empty()) {
    std::cerr << "rlsync bench http: " << r.error << "\n";
    return 1;
  }
  std::cout << bench_http_report(r) << std::flush;
  if (json_path && !write_json("bench http", *json_path, bench_http_json(r)))
    return 1;
  return 0;
}

} // namespace rlsync::tools
