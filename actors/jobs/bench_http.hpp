#pragma once
// `rlsync bench http`: streaming throughput through the fleet's endpoint
// (router.http_port) against the workload driver's direct path to the same
// router, in one in-process deployment. Each repeat runs the same prompts
// both ways, one after the other: the driver (CAF requests, tokens as
// messages) and C HTTP clients streaming /v1/completions (SSE, one keep-alive
// connection each). Greedy, no trainer steps during the runs.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace rlsync::jobs {

struct bench_http_options {
  std::uint64_t engines = 2;      ///< built-in engines (tp 1), 1..16
  std::uint32_t prompts = 64;     ///< requests per run
  std::uint32_t concurrency = 8;  ///< outstanding requests (driver) / HTTP clients
  std::uint32_t max_tokens = 64;  ///< per request
  int repeats = 3;                ///< runs of each path, alternating
  std::function<void(const std::string&)> note;
};

struct bench_http_result {
  bench_http_options options;
  unsigned cores = 0;
  std::vector<double> direct_tokens_per_s; ///< per repeat
  std::vector<double> http_tokens_per_s;   ///< per repeat
  std::uint64_t direct_tokens = 0;         ///< tokens of the last direct run
  std::uint64_t http_tokens = 0;           ///< tokens of the last HTTP run
  std::string error;                       ///< non-empty: the bench failed here
  double ratio() const;                    ///< median HTTP / median direct; 0 when not measured
};

bench_http_result run_bench_http(const bench_http_options& o);
std::string bench_http_report(const bench_http_result& r);
nlohmann::ordered_json bench_http_json(const bench_http_result& r);

} // namespace rlsync::jobs
