#include "actors/jobs/speed_of_light.hpp"

#include "runtime/base/json.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>
#include <thread>

#include <unistd.h>

namespace rlsync::jobs {

namespace {

/// Runs `command` through the shell and returns its output (stdout and
/// stderr); the commands bound their own time (timeout N).
std::string capture(const std::string& command) {
  std::string out;
  if (FILE* p = ::popen((command + " 2>&1").c_str(), "r")) {
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, p))
      if (out.size() < (std::size_t(1) << 20)) // a runaway tool's output stays bounded
        out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

} // namespace

double measure_memcpy_gbps(std::size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2); // touched: the copies below hit no page faults
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, bytes / s / 1e9);
    a[static_cast<std::size_t>(i)] = b[bytes - 1]; // keep the copies observable
  }
  return best;
}

std::string ucx_tls(const std::vector<ucx_transport>& transports) {
  std::string tls;
  for (auto t : transports) {
    std::string name{to_string(t)};
    if (name == "shm")
      name = "sm"; // UCX's alias for every shared-memory transport
    tls += (tls.empty() ? "" : ",") + name;
  }
  return tls;
}

std::optional<double> parse_ucx_perftest_gbps(const std::string& output) {
  auto at = output.find("Final:");
  if (at == std::string::npos)
    return std::nullopt;
  std::istringstream line(output.substr(at + 6, output.find('\n', at) - at - 6));
  double fields[6] = {};
  for (double& x : fields)
    if (!(line >> x))
      return std::nullopt;
  return fields[5] * 1048576.0 / 1e9;
}

std::string ucx_tls_of(const std::set<std::string>& data_transports) {
  std::string tls;
  for (const auto& t : data_transports)
    tls += (tls.empty() ? "" : ",") + t;
  return tls;
}

probe_result measure_ucx_gbps(const std::vector<ucx_transport>& transports, std::uint64_t message_bytes,
                              std::uint64_t total_bytes) {
  return measure_ucx_gbps(ucx_tls(transports), message_bytes, total_bytes);
}

probe_result measure_ucx_gbps(const std::string& tls, std::uint64_t message_bytes, std::uint64_t total_bytes) {
  if (tls.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_,") != std::string::npos)
    return {0, "not a UCX transport list: '" + tls + "'"}; // it goes into a shell command
  if (::system("command -v ucx_perftest >/dev/null 2>&1") != 0)
    return {0, "ucx_perftest not installed (apt-get install ucx-utils)"};
  message_bytes = std::clamp<std::uint64_t>(message_bytes, 1 << 20, std::uint64_t(256) << 20);
  auto iterations = std::clamp<std::uint64_t>(total_bytes / message_bytes, 8, 256);
  std::mt19937 rng{static_cast<unsigned>(::getpid())};
  int port = 30000 + static_cast<int>(rng() % 2000);
  std::string env;
  if (!tls.empty()) // tcp too: UCX needs it to connect client and server (ucx_transfer.hpp).
    env = "UCX_TLS=" + tls + (tls.find("tcp") == std::string::npos ? ",tcp" : "") + " ";
  std::string server = env + "timeout 60 ucx_perftest -p " + std::to_string(port) + " >/dev/null 2>&1 &";
  if (::system(server.c_str()) != 0)
    return {0, "could not start ucx_perftest"};
  std::string client = env + "timeout 60 ucx_perftest 127.0.0.1 -p " + std::to_string(port) + " -t tag_bw -s "
                       + std::to_string(message_bytes) + " -n " + std::to_string(iterations);
  std::string out;
  for (int attempt = 0; attempt < 20; ++attempt) { // the server needs a moment to listen
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    out = capture(client);
    if (out.find("Final:") != std::string::npos)
      break;
  }
  if (auto gbps = parse_ucx_perftest_gbps(out))
    return {*gbps, {}};
  return {0, "ucx_perftest failed: " + out.substr(0, 200)};
}

std::optional<double> parse_mpi_bcast_median_s(const std::string& output) {
  // Its result is the last line that is a JSON object; mpirun may print
  // warnings around it.
  std::istringstream lines(output);
  std::optional<double> found;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line.front() != '{')
      continue;
    // A flat object: the strict reader's default depth limit holds it.
    nlohmann::json j;
    try {
      j = read_json_strict(line);
    } catch (const json_read_error&) {
      continue;
    }
    if (!j.is_object())
      continue;
    auto it = j.find("median_s");
    if (it != j.end() && it->is_number() && it->get<double>() > 0)
      found = it->get<double>();
    else
      found.reset();
  }
  return found;
}

namespace {

std::string mpi_bcast_binary(const std::string& exe) {
  return (std::filesystem::path(exe).parent_path() / "rlsync-mpi-bcast").string();
}

} // namespace

std::string mpi_bcast_missing(const std::string& exe) {
  const bool mpirun = ::system("command -v mpirun >/dev/null 2>&1") == 0;
  const bool bin = std::filesystem::exists(mpi_bcast_binary(exe));
  if (mpirun && bin)
    return {};
  std::string what = !mpirun ? "Open MPI's mpirun is not installed" : "rlsync-mpi-bcast was not built beside " + exe;
  return what + ": apt-get install openmpi-bin libopenmpi-dev, then rebuild (CMake builds rlsync-mpi-bcast when "
                "it finds MPI; tools/check and tools/quickstart install both)";
}

mpi_bcast_result measure_mpi_bcast(const std::string& exe, std::uint64_t bytes, std::size_t receivers,
                                   std::uint64_t iterations, bool over_tcp) {
  mpi_bcast_result r;
  const auto bin = mpi_bcast_binary(exe);
  if (auto missing = mpi_bcast_missing(exe); !missing.empty()) {
    r.why = "not measured: " + missing;
    return r;
  }
  auto run = [&](const std::string& mca, const std::string& flags, double& median, std::string& failure) {
    auto out = capture("timeout 300 mpirun --allow-run-as-root --oversubscribe " + mca + "-np "
                       + std::to_string(receivers + 1) + " " + bin + " --bytes " + std::to_string(bytes)
                       + " --iterations " + std::to_string(iterations) + flags);
    if (auto s = parse_mpi_bcast_median_s(out))
      median = *s;
    else
      failure += (failure.empty() ? "failed: " : "; ") + out.substr(0, 300);
  };
  std::string failures;
  if (over_tcp) {
    run("--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo ", "", r.tcp_s,
        failures);
    if (r.best_s() == 0)
      r.why = failures;
    return r;
  }
  run("", "", r.defaults_s, failures);
  run("--mca btl_vader_single_copy_mechanism none ", "", r.no_single_copy_s, failures);
  run("", " --huge-pages", r.huge_pages_s, failures);
  if (r.best_s() == 0)
    r.why = failures;
  return r;
}

} // namespace rlsync::jobs
