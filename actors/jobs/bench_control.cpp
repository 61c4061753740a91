#include "actors/jobs/bench_control.hpp"

#include "actors/assembly/local_deployment.hpp"
#include "actors/assembly/serve_node.hpp"
#include "actors/system_config.hpp"
#include "runtime/base/format.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/http/client.hpp"

#include <caf/scoped_actor.hpp>

#include <stdlib.h>
#include <unistd.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <sstream>
#include <thread>

namespace rlsync::jobs {

std::string control_topology_yaml(std::uint64_t engines, int port) {
  std::ostringstream y;
  y << "name: bench-control\nmodel:\n  synthetic: {layers: 1, hidden_size: 64, heads: 8, kv_heads: 8, "
       "intermediate_size: 128, vocab_size: 320, dtype: bf16, seed: 1}\nnodes:\n  - {name: head, address: "
       "127.0.0.1, port: "
    << port << "}\n";
  for (std::uint64_t i = 0; i < engines; ++i)
    y << "  - {name: n" << i << ", address: 127.0.0.1}\n";
  // The bench session replaces these paths with its own CA's (bench_session::tls).
  y << "cluster: {secret_env: RLSYNC_BENCH_SECRET, heartbeat_interval_ms: 500, heartbeat_timeout_ms: 5000, "
       "tls: {ca: ca.pem, cert: '{node}.pem', key: '{node}.key'}}\n"
       "trainer: {node: head}\nengines:\n";
  for (std::uint64_t i = 0; i < engines; ++i)
    y << "  - {name: e" << i << ", node: n" << i << ", tp: 1}\n";
  y << "router: {node: head}\ncoordinator: {node: head}\ntransfer: {backend: ucx, mode: sharded}\n";
  return y.str();
}

bench_control_result run_bench_control(const bench_control_options& o) {
  bench_control_result r;
  r.engines = o.engines;
  r.rounds = o.rounds;
  r.cores = std::thread::hardware_concurrency();
  std::mt19937 rng{static_cast<unsigned>(::getpid())};
  int port = 20000 + static_cast<int>(rng() % 6000) * 2; // even: the bench test script takes odd ones
  // A synthetic model and no paths: nothing is relative to the directory.
  topology t = parse_topology(control_topology_yaml(o.engines, port), "bench-control.yaml",
                              std::filesystem::temp_directory_path().string());
  bench_session s(t, o.exe, o.verbose, o.note);
  s.note("bench control: " + std::to_string(o.engines) + " engine processes, " + std::to_string(o.rounds)
         + " zero-byte rounds...");
  auto unchanged = t;
  unchanged.trainer.perturb = 0; // every step publishes the same bytes: engines skip the data plane
  r.control = run_case(s, unchanged, "control", t.model.config, transfer_mode::sharded, o.rounds, true);
  if (!r.control.error.empty())
    return r;
  s.note("bench control: " + std::to_string(o.rounds) + " rounds moving the model...");
  r.moving = run_case(s, t, "moving", t.model.config, transfer_mode::sharded, o.rounds, true);
  return r;
}

std::string bench_control_report(const bench_control_result& r) {
  auto first = [](const std::vector<double>& v) { return v.empty() ? 0.0 : v.front(); };
  auto last = [](const std::vector<double>& v) { return v.empty() ? 0.0 : v.back(); };
  auto sorted = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  auto stalls_of = [&](const case_result& c) {
    std::vector<double> v;
    for (auto& x : c.warm)
      v.push_back(x.stall_ns / 1e6);
    return sorted(v);
  };
  std::string out = format("rlsync bench control: %llu engine processes on loopback, %d rounds, %u cores\n",
                           static_cast<unsigned long long>(r.engines), r.rounds, r.cores);
  out += format("%-36s %9s %9s %9s\n", "", "median", "min", "max");
  auto round_rows = [&](const case_result& c, const char* title) {
    auto m = medians_of(c);
    auto stalls = stalls_of(c);
    out += format("%-36s %9.2f %9.2f %9.2f ms\n", title, m.stall_ms, first(stalls), last(stalls));
    out += format("%-36s %9.2f ms (%zu kB moved per round)\n", "  of which transfer", m.transfer_ms,
                  static_cast<std::size_t>(c.bytes_per_sync / 1000));
  };
  const bool moved = r.moving.error.empty() && !r.moving.warm.empty(); // it ran
  round_rows(r.control, "zero-byte round (pause..continue)");
  if (moved)
    round_rows(r.moving, "round moving the model");
  auto probes = sorted(r.control.probe_ms);
  out += format("%-36s %9.2f %9.2f %9.2f ms\n", "six CAF round-trip waves", medians_of(r.control).probe_ms,
                first(probes), last(probes));
  out += format("zero-byte round / six round trips: %.2fx\n", control_overhead(r.control));
  if (moved)
    out += format("round moving %zu kB / six round trips (measured beside it): %.2fx\n",
                  static_cast<std::size_t>(r.moving.bytes_per_sync / 1000), control_overhead(r.moving));
  const bool judged = medians_of(r.control).probe_ms > 0;
  out += format("target, the zero-byte round <= 1.15x six round-trip waves across 8 engine processes: %s%s\n",
                !judged ? "n/a (no round trips probed)" : control_overhead(r.control) <= 1.15 ? "met" : "NOT met",
                r.engines == 8 ? "" : format(" (this run: %llu engines)", static_cast<unsigned long long>(r.engines)).c_str());
  return out;
}

nlohmann::ordered_json bench_control_json(const bench_control_result& r) {
  // No speed of light is measured here (the figure is the round against the
  // round trips): 0, as in the sync JSON for a path not measured.
  return {{"engines", r.engines},
          {"memcpy_gbps", 0.0},
          {"ucx_gbps", 0.0},
          {"cores", r.cores},
          {"control", case_json(r.control)},
          {"moving", case_json(r.moving)}};
}

} // namespace rlsync::jobs

// -- the HTTP case ---------------------------------------------------------------------

namespace rlsync::jobs {

namespace {

double median_of(std::vector<double> v) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

/// One thread per engine, each with its keep-alive client, running one
/// HTTP call per wave: the HTTP side of a wave is as parallel as the CAF side.
class http_wave_pool {
public:
  explicit http_wave_pool(const std::vector<std::uint16_t>& ports) {
    for (auto port : ports)
      clients_.push_back(std::make_unique<http::client>("127.0.0.1", port, std::chrono::seconds(30)));
    for (std::size_t i = 0; i < clients_.size(); ++i)
      threads_.emplace_back([this, i] { work(i); });
  }
  ~http_wave_pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_)
      t.join();
  }
  /// POSTs `target` to every engine at once; returns when all answered
  /// (bounded by the clients' 30 s deadline). Throws naming the first failure.
  void wave(const std::string& target) {
    std::unique_lock<std::mutex> lock(mu_);
    target_ = target;
    answered_ = 0;
    failure_.clear();
    ++generation_;
    wake_.notify_all();
    done_.wait(lock, [&] { return answered_ == clients_.size(); });
    if (!failure_.empty())
      throw std::runtime_error(failure_);
  }

private:
  void work(std::size_t i) {
    std::uint64_t seen = 0;
    for (;;) {
      std::string target;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return quit_ || generation_ != seen; });
        if (quit_)
          return;
        seen = generation_;
        target = target_;
      }
      std::string failure;
      try {
        auto r = clients_[i]->send({"POST", target, "", "application/json", {}});
        if (r.status != 200)
          failure = "POST " + target + " answered " + std::to_string(r.status) + ": " + r.body;
      } catch (const std::exception& e) {
        failure = "POST " + target + ": " + e.what();
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure.empty() && failure_.empty())
        failure_ = failure;
      if (++answered_ == clients_.size())
        done_.notify_one();
    }
  }

  std::vector<std::unique_ptr<http::client>> clients_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::string target_;
  std::uint64_t generation_ = 0;
  std::size_t answered_ = 0;
  std::string failure_;
  bool quit_ = false;
};

/// One CAF wave: `make_message(engine)` to every engine at once, every reply
/// awaited (each within `deadline`). Throws naming the first failure.
template <class Reply, class... Ts>
void caf_wave(caf::scoped_actor& self, const std::vector<rollout_engine_impl>& engines, const std::string& what,
              Ts... xs) {
  const auto deadline = std::chrono::seconds(30);
  // Every request goes out before the first reply is awaited.
  using handle = decltype(self->request(engines.front(), deadline, xs...));
  std::vector<handle> pending;
  pending.reserve(engines.size());
  for (const auto& e : engines)
    pending.push_back(self->request(e, deadline, xs...));
  std::string failure;
  for (auto& h : pending)
    h.receive([](Reply&) {}, [&](caf::error& err) {
      if (failure.empty())
        failure = what + ": " + self->system().render(err);
    });
  if (!failure.empty())
    throw std::runtime_error(failure);
}

/// The stall of `rounds` whole rounds of topology `yaml` in this process
/// (after the cold one and one more to warm up): the coordinator starts a
/// round at each version the trainer publishes. Throws naming the failure.
std::vector<double> coordinator_rounds(caf::actor_system& sys, const std::string& yaml, std::size_t engines,
                                       int rounds) {
  auto t = parse_topology(yaml, "bench-control-http.yaml", "/");
  struct collected {
    std::mutex mu;
    std::condition_variable changed;
    std::vector<sync_report> reports;
  };
  auto seen = std::make_shared<collected>();
  deployment_options opts;
  opts.on_sync = [seen](const sync_report& r) {
    std::lock_guard<std::mutex> lock(seen->mu);
    seen->reports.push_back(r);
    seen->changed.notify_all();
  };
  auto d = deploy_local(sys, t, opts);
  struct stop_on_exit {
    caf::actor_system& sys;
    local_deployment& d;
    ~stop_on_exit() { stop_and_await(sys, d.actors()); }
  } guard{sys, d};
  const std::size_t wanted = static_cast<std::size_t>(rounds) + 2; // the cold round and a warm-up first
  std::vector<double> out;
  std::unique_lock<std::mutex> lock(seen->mu);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30) * wanted;
  for (std::size_t next = 0; out.size() + 2 < wanted;) {
    if (!seen->changed.wait_until(lock, give_up, [&] { return seen->reports.size() > next; }))
      throw std::runtime_error(std::to_string(out.size()) + " of " + std::to_string(rounds) + " rounds in time");
    const auto& r = seen->reports[next++];
    if (r.aborted || !r.evicted.empty())
      throw std::runtime_error("round of version " + std::to_string(r.version) + ": "
                               + (r.aborted ? std::string("aborted") : "evicted " + r.evicted.front()));
    if (r.engines_synced != engines)
      continue; // every engine already current
    if (next > 2)
      out.push_back(static_cast<double>(r.stall_ns) / 1e6);
  }
  return out;
}

std::string rounds_topology(const std::string& model_dir, const std::vector<std::uint16_t>& servers,
                            std::uint64_t engines, const std::string& weights_dir) {
  std::ostringstream y;
  y << "name: bench-control-http\nmodel: {checkpoint: " << model_dir << "}\nnodes: [{name: a}]\n"
    << "trainer: {node: a, step_time_ms: 50}\nengines:\n";
  if (servers.empty())
    y << "  - {name: e, node: a, replicas: " << engines << "}\n";
  for (std::size_t i = 0; i < servers.size(); ++i)
    y << "  - {name: v" << i << ", node: a, kind: vllm, url: \"http://127.0.0.1:" << servers[i]
      << "\", weights_dir: " << weights_dir << "/v" << i << "}\n";
  return y.str();
}

} // namespace

double bench_control_http_result::ratio() const {
  const double b = median_of(builtin_ms);
  return b > 0 ? median_of(http_ms) / b : 0;
}

double bench_control_http_result::round_ratio() const {
  const double b = median_of(builtin_round_ms);
  return b > 0 ? median_of(http_round_ms) / b : 0;
}

bench_control_http_result run_bench_control_http(std::uint64_t engines, int rounds,
                                                 const std::function<void(const std::string&)>& note) {
  bench_control_http_result r;
  r.engines = engines;
  r.rounds = rounds;
  r.cores = std::thread::hardware_concurrency();
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / "rlsync-bench-http-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) {
    r.error = "cannot make a directory under " + fs::temp_directory_path().string();
    return r;
  }
  const std::string dir = tmpl;
  struct remove_dir {
    std::string path;
    ~remove_dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } cleanup{dir};
  if (note)
    note("bench control --http: " + std::to_string(engines) + " engines behind rlsync serve in this process, "
         + std::to_string(rounds) + " rounds...");
  try {
    model_config c; // the process bench's near-empty model
    c.vocab_size = 320;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 256;
    make_synthetic_checkpoint(dir + "/model", c, dtype::bf16, 1);
    system_config cfg;
    caf::actor_system sys{cfg};
    std::vector<std::unique_ptr<serve_node>> servers;
    std::vector<rollout_engine_impl> handles;
    std::vector<std::uint16_t> ports;
    for (std::uint64_t i = 0; i < engines; ++i) {
      serve_node_options o;
      o.checkpoint_dir = dir + "/model";
      o.http.port = 0;
      servers.push_back(std::make_unique<serve_node>(sys, o));
      ports.push_back(servers.back()->start());
      handles.push_back(servers.back()->engine());
    }
    http_wave_pool pool(ports);
    caf::scoped_actor self{sys};
    using clock = std::chrono::steady_clock;
    auto ms_since = [](clock::time_point t0) {
      return std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    };
    // Every engine serves version 1 (the checkpoint) throughout: each
    // session opens version 2 and is abandoned by the continue.
    for (int round = 0; round <= rounds; ++round) { // round 0 warms both paths up
      auto t0 = clock::now();
      caf_wave<pause_report>(self, handles, "pause", pause_atom::value, pause_request{pause_mode::keep, false});
      caf_wave<phase_ack>(self, handles, "flush", flush_atom::value);
      caf_wave<phase_ack>(self, handles, "start", start_atom::value, std::uint64_t{2});
      caf_wave<phase_ack>(self, handles, "continue", resume_atom::value);
      double builtin = ms_since(t0);
      t0 = clock::now();
      pool.wave("/pause?mode=keep&clear_cache=false");
      pool.wave("/reset_prefix_cache");
      pool.wave("/start_weight_update");
      pool.wave("/resume");
      double over_http = ms_since(t0);
      if (round > 0) {
        r.builtin_ms.push_back(builtin);
        r.http_ms.push_back(over_http);
      }
    }
    // Whole rounds: the built-in engines, then engines of kind vllm in front
    // of the same servers (the waves above left each unpaused, its session
    // abandoned, on the checkpoint's weights).
    if (note)
      note("bench control --http: whole rounds, built-in engines, then engines of kind vllm...");
    r.builtin_round_ms = coordinator_rounds(sys, rounds_topology(dir + "/model", {}, engines, ""), engines, rounds);
    r.http_round_ms =
      coordinator_rounds(sys, rounds_topology(dir + "/model", ports, engines, dir + "/weights"), engines, rounds);
    for (auto& s : servers)
      s->stop();
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

std::string bench_control_http_report(const bench_control_http_result& r) {
  auto line = [](const char* what, const std::vector<double>& v) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%-34s %9.3f %9.3f %9.3f ms\n", what, median_of(v),
                  v.empty() ? 0.0 : *std::min_element(v.begin(), v.end()),
                  v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()));
    return std::string(buf);
  };
  char buf[256];
  std::string out;
  std::snprintf(buf, sizeof buf,
                "rlsync bench control --http: %llu engines in one process, each behind rlsync serve; %d zero-byte "
                "rounds, %u cores\n",
                static_cast<unsigned long long>(r.engines), r.rounds, r.cores);
  out += buf;
  std::snprintf(buf, sizeof buf, "%-34s %9s %9s %9s\n", "pause, flush, start, continue", "median", "min", "max");
  out += buf;
  out += line("  built-in engines (CAF requests)", r.builtin_ms);
  out += line("  the same engines over vLLM's HTTP", r.http_ms);
  std::snprintf(buf, sizeof buf, "HTTP / built-in: %.2fx\n", r.ratio());
  out += buf;
  std::snprintf(buf, sizeof buf, "%-34s %9s %9s %9s\n", "whole rounds (stall)", "median", "min", "max");
  out += buf;
  out += line("  built-in engines", r.builtin_round_ms);
  out += line("  engines of kind vllm (HTTP, disk)", r.http_round_ms);
  std::snprintf(buf, sizeof buf, "HTTP engines / built-in: %.2fx (goal at most 1.5x)\n", r.round_ratio());
  out += buf;
  return out;
}

nlohmann::ordered_json bench_control_http_json(const bench_control_http_result& r) {
  return {{"engines", r.engines},
          {"rounds", r.rounds},
          {"cores", r.cores},
          {"phases", {"pause", "flush", "start", "continue"}},
          {"builtin_ms", r.builtin_ms},
          {"http_ms", r.http_ms},
          {"builtin_median_ms", median_of(r.builtin_ms)},
          {"http_median_ms", median_of(r.http_ms)},
          {"ratio", r.ratio()},
          {"builtin_round_ms", r.builtin_round_ms},
          {"http_round_ms", r.http_round_ms},
          {"builtin_round_median_ms", median_of(r.builtin_round_ms)},
          {"http_round_median_ms", median_of(r.http_round_ms)},
          {"round_ratio", r.round_ratio()}};
}

} // namespace rlsync::jobs
