#include "actors/jobs/bench_http.hpp"

#include "actors/assembly/local_deployment.hpp"
#include "actors/system_config.hpp"
#include "actors/workload.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/base/stats.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "runtime/http/client.hpp"

#include <caf/scoped_actor.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <mutex>
#include <thread>

namespace rlsync::jobs {

namespace {

using steady = std::chrono::steady_clock;

std::string bench_topology(std::uint64_t engines) {
  return "name: bench-http\n"
         "model: {synthetic: {layers: 4, hidden_size: 256, heads: 8, kv_heads: 4, intermediate_size: 704}}\n"
         "nodes: [{name: a}]\n"
         // No version during the runs: the two paths serve the same weights.
         "trainer: {node: a, step_time_ms: 3600000}\n"
         "engines: [{name: e, node: a, replicas: " + std::to_string(engines) + "}]\n"
         "router: {node: a, http_port: 0}\n";
}

double seconds_since(steady::time_point t0) {
  return std::chrono::duration<double>(steady::now() - t0).count();
}

/// The workload driver's run: tokens per second, tokens.
std::pair<double, std::uint64_t> run_direct(caf::actor_system& sys, const router_actor& router,
                                            const bench_http_options& o, std::string& error) {
  workload_options w;
  w.prompts = o.prompts;
  w.concurrency = o.concurrency;
  w.max_tokens = o.max_tokens;
  auto done = std::make_shared<std::promise<workload_result>>();
  auto result = done->get_future();
  auto t0 = steady::now();
  spawn_workload(sys, router, w, {}, done);
  if (result.wait_for(std::chrono::minutes(10)) != std::future_status::ready) {
    error = "the workload driver did not finish within 10 minutes";
    return {0, 0};
  }
  auto r = result.get();
  const double s = seconds_since(t0);
  if (r.completed != o.prompts)
    error = "the workload driver completed " + std::to_string(r.completed) + " of " + std::to_string(o.prompts)
            + (r.errors.empty() ? std::string{} : ": " + r.errors.front());
  return {s > 0 ? static_cast<double>(r.tokens) / s : 0, r.tokens};
}

/// C clients streaming the same prompts through the endpoint: tokens per second, tokens.
std::pair<double, std::uint64_t> run_http(std::uint16_t port, const bench_http_options& o, std::string& error) {
  std::atomic<std::uint32_t> next{0};
  std::atomic<std::uint64_t> tokens{0};
  std::mutex mu;
  auto t0 = steady::now();
  std::vector<std::thread> clients;
  for (std::uint32_t c = 0; c < std::max<std::uint32_t>(1, o.concurrency); ++c)
    clients.emplace_back([&] {
      try {
        http::client client("127.0.0.1", port, std::chrono::seconds(120));
        for (auto i = next++; i < o.prompts; i = next++) {
          nlohmann::json body = {{"model", "bench-http"},
                                 {"prompt", engine::encode(workload_prompt(i))},
                                 {"max_tokens", o.max_tokens},
                                 {"temperature", 0},
                                 {"stream", true},
                                 {"return_token_ids", true}};
          auto head = client.open_stream({"POST", "/v1/completions", body.dump(), "application/json", {}});
          if (head.status != 200)
            throw http::client_error("HTTP " + std::to_string(head.status) + ": " + printable(head.body));
          while (auto ev = client.next_event()) {
            if (*ev == "[DONE]")
              continue;
            auto chunk = nlohmann::json::parse(*ev);
            for (const auto& choice : chunk["choices"])
              tokens += choice.value("token_ids", nlohmann::json::array()).size();
          }
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (error.empty())
          error = std::string("an HTTP client failed: ") + e.what();
      }
    });
  for (auto& t : clients)
    t.join();
  const double s = seconds_since(t0);
  return {s > 0 ? static_cast<double>(tokens.load()) / s : 0, tokens.load()};
}

} // namespace

double bench_http_result::ratio() const {
  const double direct = median(direct_tokens_per_s);
  return direct > 0 ? median(http_tokens_per_s) / direct : 0;
}

bench_http_result run_bench_http(const bench_http_options& o) {
  bench_http_result r;
  r.options = o;
  r.cores = std::thread::hardware_concurrency();
  auto note = [&](const std::string& line) {
    if (o.note)
      o.note(line);
  };
  system_config cfg;
  caf::actor_system sys{cfg};
  auto t = parse_topology(bench_topology(o.engines), "bench-http.yaml", "/tmp");
  local_deployment d;
  try {
    d = deploy_local(sys, t, {});
  } catch (const std::exception& e) {
    r.error = e.what();
    return r;
  }
  struct stop_on_exit {
    caf::actor_system& sys;
    local_deployment& d;
    ~stop_on_exit() {
      if (d.http)
        d.http->stop();
      stop_and_await(sys, d.actors());
    }
  } guard{sys, d};
  // One sync: every engine current before the runs.
  caf::scoped_actor self{sys};
  std::uint64_t version = 0;
  for (int attempt = 0; attempt < 200 && version == 0; ++attempt) {
    self->request(d.coordinator, std::chrono::seconds(60), sync_atom::value)
      .receive([&](const sync_report& s) { version = s.version; }, [&](caf::error& e) { r.error = sys.render(e); });
    if (version == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(50)); // the trainer's first version is on its way
  }
  if (version == 0) {
    r.error = "no sync completed: " + r.error;
    return r;
  }
  r.error.clear();
  note("rlsync bench http: " + std::to_string(o.engines) + " engines at version " + std::to_string(version)
       + ", endpoint " + d.http->url());
  for (int i = 0; i < o.repeats; ++i) {
    std::string error;
    auto [direct, direct_tokens] = run_direct(sys, d.router, o, error);
    if (!error.empty()) {
      r.error = "direct run " + std::to_string(i + 1) + ": " + error;
      return r;
    }
    auto [over_http, http_tokens] = run_http(d.http->port(), o, error);
    if (!error.empty()) {
      r.error = "HTTP run " + std::to_string(i + 1) + ": " + error;
      return r;
    }
    r.direct_tokens_per_s.push_back(direct);
    r.http_tokens_per_s.push_back(over_http);
    r.direct_tokens = direct_tokens;
    r.http_tokens = http_tokens;
    char buf[160];
    std::snprintf(buf, sizeof buf, "run %d: direct %.0f tokens/s, HTTP %.0f tokens/s", i + 1, direct, over_http);
    note(buf);
  }
  return r;
}

std::string bench_http_report(const bench_http_result& r) {
  auto line = [](const char* what, const std::vector<double>& v, std::uint64_t tokens) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "%-40s %10.0f %10.0f %10.0f  (%llu tokens)\n", what, median(v),
                  v.empty() ? 0.0 : *std::min_element(v.begin(), v.end()),
                  v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()), static_cast<unsigned long long>(tokens));
    return std::string(buf);
  };
  char buf[300];
  std::string out;
  const auto& o = r.options;
  std::snprintf(buf, sizeof buf,
                "rlsync bench http: %llu engines in one process; %u prompts x %u tokens, %u at a time, %d runs "
                "each way; %u cores\n",
                static_cast<unsigned long long>(o.engines), o.prompts, o.max_tokens, o.concurrency, o.repeats,
                r.cores);
  out += buf;
  std::snprintf(buf, sizeof buf, "%-40s %10s %10s %10s\n", "tokens/s", "median", "min", "max");
  out += buf;
  out += line("  workload driver -> router (CAF)", r.direct_tokens_per_s, r.direct_tokens);
  out += line("  HTTP clients -> /v1/completions (SSE)", r.http_tokens_per_s, r.http_tokens);
  std::snprintf(buf, sizeof buf, "HTTP / direct: %.2fx (goal at least 0.9x)\n", r.ratio());
  out += buf;
  return out;
}

nlohmann::ordered_json bench_http_json(const bench_http_result& r) {
  const auto& o = r.options;
  return {{"engines", o.engines},
          {"prompts", o.prompts},
          {"max_tokens", o.max_tokens},
          {"concurrency", o.concurrency},
          {"repeats", o.repeats},
          {"cores", r.cores},
          {"direct_tokens_per_s", r.direct_tokens_per_s},
          {"http_tokens_per_s", r.http_tokens_per_s},
          {"direct_median_tokens_per_s", median(r.direct_tokens_per_s)},
          {"http_median_tokens_per_s", median(r.http_tokens_per_s)},
          {"ratio", r.ratio()}};
}

} // namespace rlsync::jobs
