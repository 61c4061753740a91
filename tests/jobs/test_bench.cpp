// The benches' pure parts: the figures (% of light, ratios, MB/sync, the
// control plane's overhead), the probes' output parsing, the table row by
// row, the JSON, and the topologies the benches write for their nodes.
#include "actors/jobs/bench_control.hpp"
#include "actors/jobs/bench_sync.hpp"
#include "actors/jobs/speed_of_light.hpp"
#include "tests/support/scratch_dir.hpp"
#include "tests/support/ucx_transport_cases.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <unistd.h>
#include <vector>

using namespace rlsync;
using namespace rlsync::jobs;

namespace {

constexpr std::uint64_t ms_ns = 1000000;

sync_report round_of(std::uint64_t stall_ms, std::uint64_t transfer_ms, std::uint64_t control_ms,
                     std::uint64_t bytes) {
  sync_report r;
  r.engines_synced = 3;
  r.stall_ns = stall_ms * ms_ns;
  r.transfer_ns = transfer_ms * ms_ns;
  r.control_ns = control_ms * ms_ns;
  r.bytes = bytes;
  return r;
}

/// Three warm rounds: stall 10/12/14 ms, transfer 8/9/10 ms, control 2/3/4
/// ms, 9 MB each (1.125, 1.0, 0.9 GB/s); cold transfers 20 and 30 ms.
case_result sharded_case() {
  case_result c;
  c.name = "sharded";
  c.model_bytes = 24'900'000;
  c.bytes_per_sync = 74'700'000;
  c.light_ms = 4.5;
  c.cold = {round_of(40, 20, 20, 9'000'000), round_of(50, 30, 20, 9'000'000)};
  c.warm = {round_of(14, 10, 4, 9'000'000), round_of(10, 8, 2, 9'000'000), round_of(12, 9, 3, 9'000'000)};
  c.producer_peak_groups = 4;
  c.producer_peak_bytes = 49'800'000;
  c.producer_budget_bytes = 99'600'000;
  c.producer_packs_ahead = 6;
  c.producer_buffers_made = 2;
  c.producer_buffers_prewarmed = 8;
  c.producer_huge_buffers = 10;
  c.largest_group = 24'900'000;
  return c;
}

topology two_node_topology(const std::string& transfer = "{backend: ucx, mode: sharded}") {
  return parse_topology("name: two\n"
                        "model: {synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, "
                        "intermediate_size: 128, vocab_size: 320, dtype: bf16, seed: 7}}\n"
                        "nodes: [{name: head, address: 127.0.0.1, port: 24001}, {name: workers, address: 127.0.0.1}]\n"
                        "cluster: {allow_insecure_network: true}\n"
                        "trainer: {node: head}\n"
                        "engines: [{name: local, node: head, tp: 2}, {name: remote, node: workers, replicas: 2, tp: 2}]\n"
                        "router: {node: head}\ncoordinator: {node: head}\n"
                        "transfer: " + transfer + "\n",
                        "two.yaml", ".");
}

} // namespace

TEST_CASE("bench figures: medians of the warm rounds, the slowest cold transfer") {
  auto c = sharded_case();
  auto m = medians_of(c);
  CHECK(m.stall_ms == doctest::Approx(12));
  CHECK(m.transfer_ms == doctest::Approx(9));
  CHECK(m.control_ms == doctest::Approx(3));
  CHECK(m.gbps == doctest::Approx(1.0));
  CHECK(m.probe_ms == 0);
  CHECK(cold_transfer_ms(c) == doctest::Approx(30));
  c.warm.push_back(round_of(5, 0, 5, 0)); // a round that moved nothing counts for time, not for GB/s
  m = medians_of(c);
  CHECK(m.stall_ms == doctest::Approx(11));
  CHECK(m.gbps == doctest::Approx(1.0));
}

TEST_CASE("bench figures: where the slowest engine's pull went, medians of the rounds that measured it") {
  auto c = sharded_case();
  CHECK(pull_lines({c}).empty()); // no data plane measured its pulls: no line
  auto measured = [](sync_report r, std::uint64_t pull_ms, std::uint64_t wait_ms, std::uint64_t store_ms) {
    r.slowest_pull_ns = pull_ms * ms_ns;
    r.slowest_wait_ns = wait_ms * ms_ns;
    r.slowest_store_ns = store_ms * ms_ns;
    return r;
  };
  c.warm = {measured(c.warm[0], 10, 2, 6), measured(c.warm[1], 8, 1, 5), measured(c.warm[2], 9, 4, 7)};
  auto m = medians_of(c);
  CHECK(m.pull_ms == doctest::Approx(9));
  CHECK(m.wait_ms == doctest::Approx(2));
  CHECK(m.store_ms == doctest::Approx(6));
  CHECK(m.rest_ms == doctest::Approx(2)); // per round 2, 2, 0 (9 - 4 - 7 is below 0: none)
  auto lines = pull_lines({c});
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] == "sharded pulls (medians): the slowest engine's 9.00 ms; its slowest worker waited 2.00 ms for "
                    "the producer and stored (copy, checksum) for 6.00 ms, the rest 2.00 ms");
  // Where its thread ran and queued for a core, from the rounds that measured it.
  c.warm[0].slowest_ran_ns = 5 * ms_ns;
  c.warm[0].slowest_queued_ns = 3 * ms_ns;
  c.warm[2].slowest_ran_ns = 7 * ms_ns;
  c.warm[2].slowest_queued_ns = 1 * ms_ns;
  m = medians_of(c);
  CHECK(m.ran_ms == doctest::Approx(6));
  CHECK(m.queued_ms == doctest::Approx(2));
  CHECK(pull_lines({c})[0] == "sharded pulls (medians): the slowest engine's 9.00 ms; its slowest worker waited 2.00 ms "
                              "for the producer and stored (copy, checksum) for 6.00 ms, the rest 2.00 ms; its thread "
                              "ran on a core for 6.00 ms and waited for one for 2.00 ms");
  for (auto& x : c.warm)
    x.slowest_ran_ns = x.slowest_queued_ns = 0;
  // The producer's progress thread, where known, on a line after its pulls.
  c.producer_ran_ms = 31.5;
  c.producer_queued_ms = 4.25;
  REQUIRE(pull_lines({c}).size() == 2);
  CHECK(pull_lines({c})[1] == "sharded producer, per warm round: its progress thread ran on a core for 31.50 ms and "
                              "waited for one for 4.25 ms (the trainer's steps between rounds included)");
  // A kernel that keeps no run-queue waits: they read 0, and the lines leave them out.
  c.queued_known = false;
  CHECK(pull_lines({c})[1] == "sharded producer, per warm round: its progress thread ran on a core for 31.50 ms "
                              "(the trainer's steps between rounds included)");
  c.warm[1].slowest_ran_ns = 4 * ms_ns;
  CHECK(pull_lines({c})[0] == "sharded pulls (medians): the slowest engine's 9.00 ms; its slowest worker waited 2.00 ms "
                              "for the producer and stored (copy, checksum) for 6.00 ms, the rest 2.00 ms; its thread "
                              "ran on a core for 4.00 ms");
  c.warm[1].slowest_ran_ns = 0;
  c.queued_known = true;
  c.producer_ran_ms = c.producer_queued_ms = 0;
  // The slowest cold round, where it measured, on a line of its own.
  c.cold[0] = measured(c.cold[0], 18, 1, 5); // 20 ms transfer: not the slowest
  CHECK(pull_lines({c}).size() == 1);       // the slowest (30 ms) measured nothing
  c.cold[1] = measured(c.cold[1], 28, 3, 15);
  lines = pull_lines({c});
  REQUIRE(lines.size() == 2);
  CHECK(lines[1] == "sharded cold pull: the slowest engine's 28.00 ms of a 30.00 ms transfer; its slowest worker "
                    "waited 3.00 ms for the producer and stored for 15.00 ms, the rest 10.00 ms");
  c.cold[1].slowest_ran_ns = 12 * ms_ns;
  c.cold[1].slowest_queued_ns = 9 * ms_ns;
  CHECK(pull_lines({c})[1] == "sharded cold pull: the slowest engine's 28.00 ms of a 30.00 ms transfer; its slowest "
                              "worker waited 3.00 ms for the producer and stored for 15.00 ms, the rest 10.00 ms; its "
                              "thread ran on a core for 12.00 ms and waited for one for 9.00 ms");
  // A round whose data plane did not measure where its pull went (its
  // slowest engine on the local plane) counts for none of the figures.
  c.warm.push_back(measured(c.warm[0], 30, 0, 0));
  m = medians_of(c);
  CHECK(m.pull_ms == doctest::Approx(9));
  CHECK(m.wait_ms == doctest::Approx(2));
  // Failed and zero-byte cases say nothing.
  auto failed = c;
  failed.error = "boom";
  auto zero = c;
  zero.zero_byte = true;
  CHECK(pull_lines({failed, zero}).empty());
}

TEST_CASE("bench figures: percent of light") {
  struct row {
    double light_ms;
    std::vector<std::uint64_t> transfers_ms;
    std::optional<double> percent;
  };
  const std::vector<row> rows = {
    {4.5, {8, 9, 10}, 50.0},  // median 9 ms
    {9, {9}, 100.0},
    {18, {9}, 200.0},         // a light measured slower than the transfer shows as over 100%
    {-1, {9}, std::nullopt},  // a path not measured
    {0, {9}, std::nullopt},
    {4.5, {0}, std::nullopt}, // no transfer time
    {4.5, {}, std::nullopt},  // no warm rounds
  };
  for (const auto& r : rows) {
    case_result c;
    c.light_ms = r.light_ms;
    for (auto t : r.transfers_ms)
      c.warm.push_back(round_of(t + 1, t, 1, 1000));
    CAPTURE(r.light_ms);
    auto p = percent_of_light(c);
    REQUIRE(p.has_value() == r.percent.has_value());
    if (p)
      CHECK(*p == doctest::Approx(*r.percent));
  }
}

TEST_CASE("bench figures: broadcast against sharded, the control plane against round trips") {
  auto sharded = sharded_case();
  auto broadcast = sharded_case();
  broadcast.bytes_per_sync = 2 * sharded.bytes_per_sync;
  broadcast.warm = {round_of(24, 18, 6, 18'000'000), round_of(30, 27, 3, 18'000'000)}; // medians 27 and 22.5
  auto x = compare_modes(broadcast, sharded);
  CHECK(x.bytes == doctest::Approx(2.0));
  CHECK(x.transfer == doctest::Approx(22.5 / 9));
  CHECK(x.stall == doctest::Approx(27.0 / 12));
  sharded.bytes_per_sync = 0; // no division by zero: counted as one byte
  CHECK(compare_modes(broadcast, sharded).bytes == doctest::Approx(149'400'000.0));

  case_result control;
  control.warm = {round_of(3, 1, 2, 164'224), round_of(5, 2, 3, 164'224), round_of(4, 1, 3, 164'224)};
  control.probe_ms = {2.0, 2.5, 1.5};
  CHECK(control_overhead(control) == doctest::Approx(4.0 / 2.0));
  control.probe_ms.clear(); // unmeasured probes give a large ratio, never a division by zero
  CHECK(control_overhead(control) > 1e6);

  CHECK(producer_bound_bytes(sharded_case()) == 4u * 24'900'000u);
}

TEST_CASE("bench figures: bytes per sync and the speed of light of a topology") {
  auto t = two_node_topology();
  const auto& model = t.model.config;
  const auto whole = bf16_model_bytes(model);
  // Broadcast: every worker receives the whole model; sharded: each its shard.
  for (const auto& e : t.engines) {
    CHECK(engine_bytes(model, e, transfer_mode::broadcast) == 2 * whole);
    CHECK(engine_bytes(model, e, transfer_mode::sharded) >= whole);
    CHECK(engine_bytes(model, e, transfer_mode::sharded) < 2 * whole);
  }
  engine_spec single;
  single.tp = 1;
  CHECK(engine_bytes(model, single, transfer_mode::sharded) == whole);

  const auto per_engine = engine_bytes(model, t.engines[0], transfer_mode::sharded);
  struct row {
    double memcpy_gbps, ucx_gbps, light_ms;
  };
  // One engine in this process (memcpy), two in the workers' process (UCX).
  const std::vector<row> rows = {
    {10, 5, per_engine / 10.0 / 1e6 + 2 * per_engine / 5.0 / 1e6},
    {10, 0, -1}, // the remote path was not measured
    {0, 5, -1},
  };
  for (const auto& r : rows) {
    CAPTURE(r.memcpy_gbps);
    CAPTURE(r.ucx_gbps);
    auto b = light_of(t, model, transfer_mode::sharded, r.memcpy_gbps, r.ucx_gbps);
    CHECK(b.bytes == 3 * per_engine);
    CHECK(b.light_ms == doctest::Approx(r.light_ms));
  }
  CHECK(light_of(t, model, transfer_mode::broadcast, 10, 5).bytes == 3 * 2 * whole);
}

TEST_CASE("bench figures: bytes per worker of a MoE model, sharded (experts sliced or whole) against broadcast") {
  auto t = parse_topology("name: moe\n"
                          "model: {synthetic: {arch: qwen3_moe, layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, "
                          "intermediate_size: 128, experts: 6, moe_intermediate_size: 32, vocab_size: 320}}\n"
                          "nodes: [{name: head, address: 127.0.0.1, port: 24001}, {name: workers, address: 127.0.0.1}]\n"
                          "cluster: {allow_insecure_network: true}\n"
                          "trainer: {node: head}\n"
                          "engines: [{name: ep, node: head, tp: 4, expert_parallel: true}, {name: sliced, node: workers, "
                          "replicas: 2, tp: 4, dp: 2, dp_balance: prefix_affinity}, {name: one, node: head, weights: int8}]\n",
                          "moe.yaml", ".");
  const auto& model = t.model.config;
  const auto whole = bf16_model_bytes(model);
  auto per_worker = bytes_per_worker(model, t);
  REQUIRE(per_worker.size() == 3); // the two sliced replicas share a shape
  const auto& ep = per_worker[0];
  const auto& sliced = per_worker[1];
  CHECK(ep.expert_parallel);
  CHECK_FALSE(sliced.expert_parallel);
  CHECK(per_worker[2].sharded_max == whole);
  for (const auto& b : per_worker)
    CHECK(b.broadcast == whole);
  // 6 experts over 4 workers: 2, 2, 1, 1 whole experts; sliced, every worker alike.
  CHECK(ep.sharded_min < ep.sharded_max);
  CHECK(sliced.sharded_min == sliced.sharded_max);
  CHECK(sliced.sharded_max < whole / 3);
  CHECK(ep.sharded_max < whole / 2);
  bench_sync_result r;
  r.path = "moe.yaml";
  r.arch = model.arch;
  r.per_worker = per_worker;
  const auto report = bench_sync_report(r);
  CHECK(report.find(", a qwen3_moe model") != std::string::npos);
  CHECK(report.find("bytes per worker, tp 4 with expert parallelism: sharded ") != std::string::npos);
  CHECK(report.find("MB the least), broadcast ") != std::string::npos);
  CHECK(bench_sync_json(r)["bytes_per_worker"][0]["expert_parallel"] == true);
  // The nodes' copy keeps expert parallelism.
  t.cluster.secret_env = "RLSYNC_BENCH_SECRET";
  auto back = parse_topology(node_yaml(t), "node.yaml", ".");
  CHECK(back.engines[0].expert_parallel);
  CHECK_FALSE(back.engines[1].expert_parallel);
  CHECK(back.engines[3].weights == "int8"); // and the process step
  CHECK(back.engines[0].weights == "received");
  CHECK(back.engines[1].dp == 2); // and data parallelism
  CHECK(back.engines[1].dp_balance == "prefix_affinity");
  CHECK(back.engines[0].dp == 1);
}

TEST_CASE("bench models: about the requested size, never empty") {
  const auto one_layer = [] {
    auto c = model_of_size(0);
    return bf16_model_bytes(c);
  }();
  CHECK(model_of_size(0).num_hidden_layers == 1);
  CHECK(model_of_size(8 << 20).num_hidden_layers == 1); // below one layer (about 25 MB): one layer
  CHECK(model_of_size(one_layer).num_hidden_layers == 1);
  for (std::uint64_t target : {std::uint64_t(64) << 20, std::uint64_t(256) << 20, std::uint64_t(1) << 30}) {
    auto c = model_of_size(target);
    auto bytes = bf16_model_bytes(c);
    CAPTURE(target);
    CHECK(bytes <= target);
    auto bigger = c;
    ++bigger.num_hidden_layers;
    CHECK(bf16_model_bytes(bigger) > target); // as many layers as fit
    CHECK(bytes >= one_layer);
  }
  CHECK(bf16_model_bytes(tiny_model()) == 164'224);
  // A qwen3 topology's bench model is a qwen3 too: Qwen3-0.6B's layer shape.
  auto q = model_of_size(std::uint64_t(256) << 20, model_arch::qwen3);
  CHECK(q.arch == model_arch::qwen3);
  CHECK(q.head_dim() == 128);
  CHECK(validate(q).empty());
  CHECK(bf16_model_bytes(q) <= std::uint64_t(256) << 20);
  auto bigger = q;
  ++bigger.num_hidden_layers;
  CHECK(bf16_model_bytes(bigger) > std::uint64_t(256) << 20);
}

TEST_CASE("bench table: one row per case") {
  auto sharded = sharded_case();
  case_result unmeasured = sharded_case();
  unmeasured.name = "broadcast";
  unmeasured.light_ms = -1;
  case_result control;
  control.name = "control";
  control.bytes_per_sync = 492'672;
  control.light_ms = 0.05;
  control.cold = {round_of(90, 80, 10, 492'672)};
  control.warm = {round_of(3, 1, 2, 492'672), round_of(5, 2, 3, 492'672), round_of(4, 1, 3, 492'672)};
  control.probe_ms = {2.0, 2.5, 1.5};
  case_result failed;
  failed.name = "broadcast";
  failed.error = "sync 2 evicted remote-1";

  auto lines = case_table({sharded, unmeasured, control, failed});
  REQUIRE(lines.size() == 5);
  CHECK(lines[0] == "mode          MB/sync  stall ms   xfer ms   cold xfer      GB/s  % light    control  6 RTT ms");
  CHECK(lines[1] == "sharded          74.7     12.00      9.00       30.00      1.00      50%       3.00         -");
  CHECK(lines[2] == "broadcast        74.7     12.00      9.00       30.00      1.00      n/a       3.00         -");
  // control: medians 4 ms stall, 1 ms transfer (5% of a 0.05 ms light), 3 ms control, 2 ms probes.
  CHECK(lines[3] == "control           0.5      4.00      1.00       80.00      0.49       5%       3.00      2.00");
  CHECK(lines[4] == "broadcast  failed: sync 2 evicted remote-1");
  CHECK(case_table({}).size() == 1);
}

TEST_CASE("bench JSON: every round and figure of a case, in order") {
  auto c = sharded_case();
  c.probe_ms = {1.23456, 2.0};
  c.error = "a \"quoted\" failure";
  auto j = case_json(c);
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it)
    keys.push_back(it.key());
  CHECK(keys == std::vector<std::string>{"case", "model_bytes", "bytes_per_sync", "zero_byte", "light_ms", "cold", "warm",
                                         "probe6_ms", "producer_peak_groups", "producer_peak_bytes",
                                         "producer_budget_bytes", "producer_packs_ahead", "producer_evictions",
                                         "producer_ran_ms_per_round", "producer_queued_ms_per_round",
                                         "producer_buffers_made", "producer_buffers_prewarmed", "producer_huge_buffers",
                                         "largest_group_bytes", "ucx_transports", "lent", "ranks", "packs",
                                         "error"});
  CHECK(j["case"] == "sharded");
  CHECK(j["bytes_per_sync"] == 74'700'000);
  CHECK(j["cold"].size() == 2);
  REQUIRE(j["warm"].size() == 3);
  CHECK(j["warm"][0]["stall_ms"] == 14.0);
  CHECK(j["warm"][0]["transfer_ms"] == 10.0);
  CHECK(j["warm"][0]["control_ms"] == 4.0);
  CHECK(j["warm"][0]["bytes"] == 9'000'000);
  CHECK(j["warm"][0]["engines"] == 3);
  CHECK(j["probe6_ms"][0] == 1.235); // three decimals
  CHECK(j["ucx_transports"] == nlohmann::ordered_json::array()); // the lanes UCX producers' connections used: none here
  c.ucx_transports = {"tcp"};
  c.lent = true;
  CHECK(case_json(c)["ucx_transports"] == nlohmann::ordered_json::array({"tcp"}));
  CHECK(case_json(c)["lent"] == true);
  CHECK(j["error"] == "a \"quoted\" failure");
  // What the integration test and readers grep for: pretty-printed keys.
  CHECK(j.dump(2).find("\"error\": \"a \\\"quoted\\\" failure\"") != std::string::npos);
}

TEST_CASE("bench sync report: ratios, memory, control plane and the MPI baseline") {
  bench_sync_result r;
  r.path = "two.yaml";
  r.engines = 3;
  r.nodes = 2;
  r.cores = 2;
  r.model_bytes = 8 << 20;
  r.memcpy_gbps = 13.84;
  r.remote = true;
  r.ucx_gbps = 1.224;
  r.ucx_tls = "sm,cma";
  auto sharded = sharded_case();
  auto broadcast = sharded_case();
  broadcast.name = "broadcast";
  broadcast.bytes_per_sync *= 2;
  case_result control;
  control.name = "control";
  control.model_bytes = 164'224;
  control.warm = {round_of(4, 1, 3, 164'224)};
  control.probe_ms = {2.0};
  r.cases = {sharded, broadcast, control};
  r.memcpy_light = {13.84, 12.1};
  r.ucx_light = {1.1, 1.224};
  r.ucx_tls_after = "cma,sysv";
  r.mpi_bcast_s = 0.0045;
  r.mpi_bcast_defaults_s = 0.0045;
  r.mpi_bcast_no_single_copy_s = 0; // that run failed
  r.mpi_bcast_huge_pages_s = 0.0051;
  auto text = bench_sync_report(r);
  CAPTURE(text);
  CHECK(text.find("rlsync bench sync two.yaml: 3 engines on 2 node(s), backend ucx, 2 cores\n") == 0);
  {
    auto qwen3 = r;
    qwen3.arch = model_arch::qwen3;
    CHECK(bench_sync_report(qwen3).find("backend ucx, 2 cores, a qwen3 model\n") != std::string::npos);
  }
  CHECK(text.find("speed of light: memcpy 13.8 GB/s (engines in this process), raw UCX 1.22 GB/s "
                  "(ucx_perftest tag_bw, UCX_TLS sm,cma, other processes)\n"
                  "measured before / after the cases: memcpy 13.8 / 12.1 GB/s (spread 13%); raw UCX 1.10 / 1.22 GB/s "
                  "(spread 10%), after over cma,sysv, the transports the data plane's connections used; % light uses "
                  "the faster\n\nmode ")
        != std::string::npos);
  CHECK(text.find("lent in shared memory") == std::string::npos); // no case was
  {
    auto lent = r;
    lent.cases[0].lent = true;
    CHECK(bench_sync_report(lent).find("\nlent in shared memory, copied once (their light is memcpy's): sharded\n")
          != std::string::npos);
  }
  CHECK(text.find("broadcast / sharded: 2.00x the bytes, 1.00x the transfer time, 1.00x the stall\n")
        != std::string::npos);
  CHECK(text.find("sharded memory: largest group 24.9 MB; UCX producer peak 49.8 MB packed (4 groups) of its "
                  "99.6 MB budget (8 buffers made at start; 10 of all made in huge pages); warm rounds: 6 groups packed ahead, 0 "
                  "dropped while needed, 2 buffers made\n")
        != std::string::npos);
  {
    auto local = r; // the local data plane alone: its buffers, no UCX producer
    local.cases[0].producer_budget_bytes = 0;
    local.cases[0].local_peak_bytes = 50'000'000;
    CHECK(bench_sync_report(local).find("sharded memory: largest group 24.9 MB; local data plane peak 50.0 MB of "
                                        "buffers\n")
          != std::string::npos);
  }
  CHECK(text.find("control plane: median round 4.00 ms (164 kB model) vs six CAF round-trip waves 2.00 ms: 2.00x\n")
        != std::string::npos);
  {
    auto zero = r; // the trainer's steps changed nothing: every engine skipped the data plane
    for (auto& c : zero.cases)
      if (c.name == "control")
        c.zero_byte = true;
    CHECK(bench_sync_report(zero).find("control plane: median zero-byte round 4.00 ms (164 kB model, unchanged by the "
                                       "trainer's steps) vs six CAF round-trip waves 2.00 ms: 2.00x\n")
          != std::string::npos);
  }
  CHECK(text.find("MPI_Bcast (Open MPI) of the 8 MB model to 3 ranks: median 4.50 ms (defaults 4.50 ms, vader "
                  "single copy off failed, buffers in huge pages 5.10 ms: the fastest counts); sharded transfer "
                  "9.00 ms: 0.50x (slower)\n")
        != std::string::npos);
  {
    auto tcp = r; // the data plane kept off shared memory, and MPI with it
    tcp.mpi_over_tcp = true;
    tcp.mpi_bcast_s = tcp.mpi_bcast_tcp_s = 0.012;
    tcp.mpi_bcast_defaults_s = tcp.mpi_bcast_huge_pages_s = 0;
    const auto tcp_text = bench_sync_report(tcp);
    CHECK(tcp_text.find("MPI_Bcast (Open MPI) of the 8 MB model to 3 ranks: median 12.00 ms (btl tcp,self on "
                        "loopback: the topology's ucx_transports are tcp alone); sharded transfer 9.00 ms: "
                        "1.33x faster\n")
          != std::string::npos);
    CHECK(tcp_text.find("met      sharded warm transfer <= MPI_Bcast of the same model: 9.00 ms against 12.00 ms "
                        "(Open MPI over tcp, as the engines' bytes go): 1.33x\n")
          != std::string::npos);
  }
  CHECK(!r.failed());

  r.remote = true;
  r.ucx_gbps = 0;
  r.ucx_why = "ucx_perftest not installed";
  r.mpi_bcast_s = 0;
  r.mpi_why = "not measured: no mpirun";
  r.cases[1].error = "sync failed";
  text = bench_sync_report(r);
  CHECK(text.find(", not measured: ucx_perftest not installed\n") != std::string::npos);
  CHECK(text.find("broadcast / sharded: ") == std::string::npos); // one side failed: no ratio
  CHECK(text.find("MPI_Bcast baseline not measured: no mpirun\n") != std::string::npos);
  CHECK(r.failed());
  auto j = bench_sync_json(r);
  CHECK(j["topology"] == "two.yaml");
  CHECK(j["cases"].size() == 3);
  CHECK(j["cases"][1]["error"] == "sync failed");
}

namespace {

/// A run whose figures meet every target: sharded 9 ms warm (cold 18),
/// broadcast twice the bytes in 18 ms, MPI_Bcast 10 ms, raw UCX 1 GB/s,
/// the producer within its budget, the control round 1.1x its probes.
bench_sync_result run_meeting_targets() {
  bench_sync_result r;
  r.engines = 2;
  r.remote = true;
  r.ucx_gbps = 1.0;
  auto sharded = sharded_case();
  sharded.cold = {round_of(30, 18, 12, 9'000'000)};
  auto broadcast = sharded;
  broadcast.name = "broadcast";
  broadcast.bytes_per_sync *= 2;
  broadcast.cold = {round_of(40, 30, 10, 18'000'000)};
  broadcast.warm = {round_of(20, 18, 2, 18'000'000)};
  case_result control;
  control.name = "control";
  control.zero_byte = true;
  control.warm = {round_of(0, 0, 0, 0)};
  control.warm[0].stall_ns = 2'200'000;
  control.probe_ms = {2.0};
  r.cases = {sharded, broadcast, control};
  r.mpi_bcast_s = 0.010;
  return r;
}

std::optional<bool> met_of(const std::vector<target_check>& targets, const std::string& starts) {
  for (const auto& t : targets)
    if (t.target.rfind(starts, 0) == 0)
      return t.met;
  FAIL("no target starting with " << starts);
  return std::nullopt;
}

} // namespace

TEST_CASE("bench sync targets: each judged from the run's figures") {
  const auto good = run_meeting_targets();
  const auto all = sync_targets(good);
  REQUIRE(all.size() == 8); // MPI, raw, modes, two cold, two memory, control
  for (const auto& t : all) {
    CAPTURE(t.target);
    CAPTURE(t.measured);
    CHECK(t.met == std::optional<bool>(true));
  }
  CHECK(all[0].measured == "9.00 ms against 10.00 ms (the fastest of Open MPI's three): 1.11x");
  CHECK(all[1].measured
        == "8.30 GB/s for 74.7 MB against raw UCX 1.00 GB/s (one stream, the engines' bytes in turn): 8.30x");
  CHECK(all[2].measured == "2.00x the bytes, 2.00x the transfer time (18.00 against 9.00 ms)");
  CHECK(all[3].target == "sharded cold transfer <= 2x a warm one");
  CHECK(all[3].measured == "18.00 ms against 9.00 ms: 2.00x"); // exactly 2x still meets it
  CHECK(all[5].measured == "49.8 MB of 99.6 MB (the model: 24.9 MB)");
  CHECK(all[7].measured == "zero-byte round 2.20 ms against 2.00 ms with 2 engines: 1.10x");

  struct row {
    const char* what;
    void (*spoil)(bench_sync_result&);
    const char* target;
    std::optional<bool> met;
  };
  const row rows[] = {
    {"MPI_Bcast faster", [](bench_sync_result& r) { r.mpi_bcast_s = 0.008; }, "sharded warm transfer <= MPI", false},
    {"no MPI_Bcast", [](bench_sync_result& r) { r.mpi_bcast_s = 0; }, "sharded warm transfer <= MPI", std::nullopt},
    {"raw UCX faster", [](bench_sync_result& r) { r.ucx_gbps = 10.4; }, "sharded warm transfer >= 0.8x", false},
    {"raw UCX not measured", [](bench_sync_result& r) { r.ucx_gbps = 0; }, "sharded warm transfer >= 0.8x",
     std::nullopt},
    {"engines in process", [](bench_sync_result& r) { r.remote = false; }, "sharded warm transfer >= 0.8x",
     std::nullopt},
    {"engines in process, against MPI", [](bench_sync_result& r) { r.remote = false; },
     "sharded warm transfer <= MPI", std::nullopt},
    {"broadcast too fast", [](bench_sync_result& r) { r.cases[1].warm[0].transfer_ns = 16 * ms_ns; },
     "broadcast / sharded", false},
    {"no broadcast", [](bench_sync_result& r) { r.cases[1].error = "failed"; }, "broadcast / sharded", std::nullopt},
    {"cold too slow", [](bench_sync_result& r) { r.cases[0].cold[0].transfer_ns = 19 * ms_ns; },
     "sharded cold transfer", false},
    {"no cold round", [](bench_sync_result& r) { r.cases[0].cold.clear(); }, "sharded cold transfer", std::nullopt},
    {"over budget", [](bench_sync_result& r) { r.cases[1].producer_peak_bytes = 99'600'001; },
     "broadcast producer's peak", false},
    {"control slow", [](bench_sync_result& r) { r.cases[2].warm[0].stall_ns = 2'400'000; }, "control round", false},
    {"no probes", [](bench_sync_result& r) { r.cases[2].probe_ms.clear(); }, "control round", std::nullopt},
  };
  for (const auto& x : rows) {
    CAPTURE(x.what);
    auto r = good;
    x.spoil(r);
    CHECK(met_of(sync_targets(r), x.target) == x.met);
  }

  // Every engine in this process: memcpy is the light, judged in its own row.
  auto in_process = good;
  in_process.remote = false;
  in_process.memcpy_gbps = 16.6;
  const auto local_targets = sync_targets(in_process);
  REQUIRE(local_targets.size() == 9);
  CHECK(local_targets[1].target
        == "sharded warm transfer in one process >= 50% of memcpy for the bytes the engines keep");
  CHECK(local_targets[1].measured == "9.00 ms for 74.7 MB: 50% of memcpy's 16.6 GB/s"); // light 4.5 ms
  CHECK(local_targets[1].met == std::optional<bool>(true));
  CHECK(local_targets[0].measured == "every engine in this process: the target is across processes");
  in_process.cases[0].light_ms = 4.4;
  CHECK(met_of(sync_targets(in_process), "sharded warm transfer in one process") == std::optional<bool>(false));
  in_process.cases[0].light_ms = 0; // not measured
  CHECK(met_of(sync_targets(in_process), "sharded warm transfer in one process") == std::nullopt);

  // Without a UCX producer there is no budget to judge; without the cases,
  // only what can be said.
  auto local = good;
  for (auto& c : local.cases)
    c.producer_budget_bytes = 0;
  CHECK(sync_targets(local).size() == 6);
  bench_sync_result empty;
  empty.remote = true;
  const auto none = sync_targets(empty);
  REQUIRE(none.size() == 3);
  for (const auto& t : none)
    CHECK(!t.met.has_value());
  CHECK(none[0].measured == "no sharded case");
}

TEST_CASE("bench sync report: the targets block, and the targets in the JSON") {
  auto r = run_meeting_targets();
  r.cases[0].cold[0].transfer_ns = 19 * ms_ns;
  r.mpi_bcast_s = 0;
  r.mpi_why = "not measured: no mpirun";
  const auto text = bench_sync_report(r);
  CAPTURE(text);
  CHECK(text.find("\ntargets, this run:\n"
                  "  n/a      sharded warm transfer <= MPI_Bcast of the same model: MPI_Bcast not measured: no mpirun\n")
        != std::string::npos);
  CHECK(text.find("\n  NOT met  sharded cold transfer <= 2x a warm one: 19.00 ms against 9.00 ms: 2.11x\n")
        != std::string::npos);
  CHECK(text.find("\n  met      broadcast cold transfer <= 2x a warm one: 30.00 ms against 18.00 ms: 1.67x\n")
        != std::string::npos);
  const auto j = bench_sync_json(r);
  REQUIRE(j["targets"].size() == 8);
  CHECK(j["targets"][0]["met"].is_null());
  CHECK(j["targets"][3]["met"] == false);
  CHECK(j["targets"][4]["met"] == true);
  CHECK(j["targets"][4]["measured"] == "30.00 ms against 18.00 ms: 1.67x");
}

TEST_CASE("bench control report: the zero-byte round against six round-trip waves, the moving round beside it") {
  bench_control_result r;
  r.engines = 2;
  r.rounds = 3;
  r.cores = 2;
  r.control.zero_byte = true;
  r.control.warm = {round_of(6, 2, 4, 0), round_of(19, 3, 16, 0), round_of(11, 3, 8, 0)};
  r.control.probe_ms = {3.0, 57.5, 29.25};
  r.moving.bytes_per_sync = 328'448;
  r.moving.warm = {round_of(12, 4, 8, 328'448), round_of(13, 4, 9, 328'448), round_of(14, 5, 9, 328'448)};
  r.moving.probe_ms = {10.0, 10.0, 10.0};
  auto text = bench_control_report(r);
  CHECK(text == "rlsync bench control: 2 engine processes on loopback, 3 rounds, 2 cores\n"
                "                                        median       min       max\n"
                "zero-byte round (pause..continue)        11.00      6.00     19.00 ms\n"
                "  of which transfer                       3.00 ms (0 kB moved per round)\n"
                "round moving the model                   13.00     12.00     14.00 ms\n"
                "  of which transfer                       4.00 ms (328 kB moved per round)\n"
                "six CAF round-trip waves                 29.25      3.00     57.50 ms\n"
                "zero-byte round / six round trips: 0.38x\n"
                "round moving 328 kB / six round trips (measured beside it): 1.30x\n"
                "target, the zero-byte round <= 1.15x six round-trip waves across 8 engine processes: met (this "
                "run: 2 engines)\n");
  auto j = bench_control_json(r);
  CHECK(j["engines"] == 2);
  CHECK(j["control"]["probe6_ms"].size() == 3);
  CHECK(j["control"]["zero_byte"] == true);
  CHECK(j["moving"]["zero_byte"] == false);
  r.moving = {}; // it failed or did not run: the zero-byte rows alone
  CHECK(bench_control_report(r).find("moving") == std::string::npos);
  r.engines = 8;
  r.control.probe_ms = {9.0, 9.0, 9.0}; // 11 ms against 9: 1.22x
  CHECK(bench_control_report(r).find("\ntarget, the zero-byte round <= 1.15x six round-trip waves across 8 engine "
                                     "processes: NOT met\n")
        != std::string::npos);
  r.control.probe_ms.clear();
  CHECK(bench_control_report(r).find("processes: n/a (no round trips probed)\n") != std::string::npos);
}

TEST_CASE("ucx_perftest output: the overall bandwidth of the Final line") {
  const std::string sample =
    "+--------------+--------------+------------------------------+---------------------+-----------------------+\n"
    "|              |              |       overhead (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |\n"
    "+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+\n"
    "|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |\n"
    "+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+\n"
    "Final:                    16      0.170   319.436   319.436     3130.52    3130.52        3131        3131\n";
  struct row {
    std::string output;
    std::optional<double> gbps;
  };
  const std::vector<row> rows = {
    {sample, 3130.52 * 1048576 / 1e9}, // MB/s there are MiB/s
    {"Final: 16 0.1 300 300 1000 2000 1 1\n", 2000 * 1048576 / 1e9},
    {"Final: 16 0.1 300 300 1000\n2000 1 1\n", std::nullopt}, // the line ends early
    {"[1700000000.1] ucp_context.c:1000 UCX ERROR no usable transports\n", std::nullopt},
    {"", std::nullopt},
  };
  for (const auto& r : rows) {
    CAPTURE(r.output);
    auto gbps = parse_ucx_perftest_gbps(r.output);
    REQUIRE(gbps.has_value() == r.gbps.has_value());
    if (gbps)
      CHECK(*gbps == doctest::Approx(*r.gbps));
  }
}

TEST_CASE("rlsync-mpi-bcast output: the median seconds") {
  struct row {
    std::string output;
    std::optional<double> seconds;
  };
  const std::vector<row> rows = {
    {"{\"bytes\": 268435456, \"ranks\": 3, \"iterations\": 5, \"median_s\": 0.04335, \"min_s\": 0.04}\n", 0.04335},
    {"warning: something\n{\"median_s\": 1.5e-3}\n", 0.0015},
    {"{\"bytes\":1024,\"ranks\":2,\"median_s\":0.25}\n", 0.25}, // compact, as nlohmann dumps it
    {"{\"median_s\": x}", std::nullopt},
    {"{\"median_s\": 0}", std::nullopt},
    {"mpirun was unable to launch", std::nullopt},
  };
  for (const auto& r : rows) {
    CAPTURE(r.output);
    auto s = parse_mpi_bcast_median_s(r.output);
    REQUIRE(s.has_value() == r.seconds.has_value());
    if (s)
      CHECK(*s == doctest::Approx(*r.seconds));
  }
}

TEST_CASE("MPI_Bcast baseline: the fastest of defaults, single copy off and huge pages counts") {
  struct row {
    double defaults, no_single_copy, huge_pages, tcp, best;
  };
  const row rows[] = {{0.05, 0.06, 0.07, 0, 0.05},  {0.07, 0.055, 0.06, 0, 0.055}, {0.07, 0.06, 0.04, 0, 0.04},
                      {0, 0.06, 0, 0, 0.06},        {0.05, 0, 0, 0, 0.05},         {0, 0, 0.03, 0, 0.03},
                      {0, 0.06, 0.05, 0, 0.05},     {0, 0, 0, 0, 0},               {0, 0, 0, 0.12, 0.12}};
  for (const auto& r : rows) {
    CAPTURE(r.defaults);
    CAPTURE(r.no_single_copy);
    CAPTURE(r.huge_pages);
    CAPTURE(r.tcp);
    CHECK(mpi_bcast_result{r.defaults, r.no_single_copy, r.huge_pages, r.tcp, {}}.best_s() == r.best);
  }
}

TEST_CASE("MPI_Bcast baseline: over tcp where the ucx data plane's transports name no shm or cma") {
  for (const auto& c : test::ucx_transport_cases()) {
    CAPTURE(c.name);
    topology t;
    t.transfer = c.spec();
    CHECK(mpi_over_tcp(t) == c.mpi_over_tcp);
  }
}

TEST_CASE("speed of light before and after: the faster counts, the spread is relative to it") {
  struct row {
    double before, after, best, spread;
  };
  const row rows[] = {{10, 10, 10, 0}, {10, 8, 10, 0.2}, {8, 10, 10, 0.2}, {0, 10, 10, 0}, {10, 0, 10, 0}, {0, 0, 0, 0}};
  for (const auto& r : rows) {
    CAPTURE(r.before);
    CAPTURE(r.after);
    const light_pair l{r.before, r.after};
    CHECK(l.best() == r.best);
    CHECK(l.spread() == doctest::Approx(r.spread));
  }
}

TEST_CASE("MPI_Bcast baseline: missing pieces are named with how to get them") {
  // No rlsync-mpi-bcast beside an executable in a directory of its own.
  auto why = mpi_bcast_missing("/nonexistent-rlsync-dir/rlsync");
  CHECK(why.find("apt-get install openmpi-bin libopenmpi-dev") != std::string::npos);
  CHECK((why.find("rlsync-mpi-bcast was not built beside /nonexistent-rlsync-dir/rlsync") != std::string::npos
         || why.find("mpirun is not installed") != std::string::npos));
}

TEST_CASE("MPI_Bcast baseline: with mpirun on PATH and rlsync-mpi-bcast beside the executable nothing is missing") {
  const auto dir = std::filesystem::temp_directory_path() / ("rlsync-mpi-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const char* name : {"mpirun", "rlsync-mpi-bcast"}) {
    std::ofstream(dir / name) << "#!/bin/sh\nexit 0\n";
    std::filesystem::permissions(dir / name, std::filesystem::perms::owner_all);
  }
  const std::string old_path = std::getenv("PATH") ? std::getenv("PATH") : "";
  ::setenv("PATH", (dir.string() + ":" + old_path).c_str(), 1);
  CHECK(mpi_bcast_missing((dir / "rlsync").string()) == "");
  ::setenv("PATH", "/nonexistent", 1); // no mpirun: named first
  CHECK(mpi_bcast_missing((dir / "rlsync").string()).find("Open MPI's mpirun is not installed") == 0);
  ::setenv("PATH", old_path.c_str(), 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("UCX_TLS of the transports a connection log named") {
  CHECK(ucx_tls_of({}) == "");
  CHECK(ucx_tls_of({"sysv", "cma"}) == "cma,sysv");
  CHECK(ucx_tls_of({"tcp"}) == "tcp");
  // The list goes into a shell command: anything but transport names is refused unrun.
  auto r = measure_ucx_gbps(std::string("sysv;touch /tmp/x"), 1 << 20, 1 << 20);
  CHECK(r.value == 0);
  CHECK(r.why == "not a UCX transport list: 'sysv;touch /tmp/x'");
}

TEST_CASE("UCX_TLS of the topology's transports") {
  CHECK(ucx_tls({}) == "");
  CHECK(ucx_tls({ucx_transport::shm}) == "sm");
  CHECK(ucx_tls({ucx_transport::rdma, ucx_transport::shm, ucx_transport::cma}) == "rdma,sm,cma");
  CHECK(ucx_tls({ucx_transport::tcp}) == "tcp");
}

TEST_CASE("bench topologies: the nodes' copy reads back as the same deployment") {
  auto t = two_node_topology("{backend: ucx, mode: broadcast, ucx_transports: [shm, tcp]}");
  t.model.config = tiny_model();
  t.cluster.secret_env = "RLSYNC_BENCH_SECRET";
  auto back = parse_topology(node_yaml(t), "node.yaml", ".");
  CHECK(back.model.config.num_hidden_layers == t.model.config.num_hidden_layers);
  CHECK(back.model.config.hidden_size == t.model.config.hidden_size);
  CHECK(back.model.config.intermediate_size == t.model.config.intermediate_size);
  CHECK(back.model.seed == 7);
  REQUIRE(back.nodes.size() == 2);
  CHECK(back.nodes[0].port == 24001);
  REQUIRE(back.engines.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(back.engines[i].name == t.engines[i].name);
    CHECK(back.engines[i].node == t.engines[i].node);
    CHECK(back.engines[i].tp == t.engines[i].tp);
  }
  CHECK(back.transfer.mode == transfer_mode::broadcast);
  CHECK(back.transfer.ucx_transports == t.transfer.ucx_transports);
  CHECK(back.cluster.secret_env == "RLSYNC_BENCH_SECRET");
  CHECK(back.cluster.heartbeat_timeout == t.cluster.heartbeat_timeout);
  CHECK(back.cluster.allow_insecure_network);
  // What the members' engines and pullers read comes along too.
  auto tuned = t;
  tuned.engines[1].kv_block_tokens = 32;
  tuned.engines[1].prefix_cache_blocks = 77;
  tuned.sync.deadlines.transfer = std::chrono::milliseconds(4321);
  tuned.sync.deadlines.resume = std::chrono::milliseconds(1234);
  auto tuned_back = parse_topology(node_yaml(tuned), "node.yaml", ".");
  CHECK(tuned_back.engines[1].kv_block_tokens == 32);
  CHECK(tuned_back.engines[1].prefix_cache_blocks == 77);
  CHECK(tuned_back.engines[1].device == "cpu");
  CHECK(tuned_back.sync.deadlines.transfer == std::chrono::milliseconds(4321));
  CHECK(tuned_back.sync.deadlines.resume == std::chrono::milliseconds(1234));
  // The session's credentials reach the nodes, {node} kept for each to fill in.
  t.cluster.tls = tls_spec{"/c/ca.pem", "/c/{node}.pem", "/c/{node}.key"};
  auto with_tls = parse_topology(node_yaml(t), "node.yaml", ".");
  REQUIRE(with_tls.cluster.tls);
  CHECK(with_tls.cluster.tls->cert == "/c/{node}.pem");
  CHECK(with_tls.cluster.tls->for_node("workers").key == "/c/workers.key");
  CHECK(!with_tls.cluster.allow_insecure_network);

  for (std::uint64_t n : {1, 8}) {
    auto c = parse_topology(control_topology_yaml(n, 20000), "bench-control.yaml", ".");
    CHECK(c.engines.size() == n);
    CHECK(c.nodes.size() == n + 1);
    CHECK(c.nodes[0].port == 20000);
    CHECK(bf16_model_bytes(c.model.config) == bf16_model_bytes(tiny_model()));
  }
}

TEST_CASE("bench sync refuses what it cannot deploy, naming the place") {
  auto t = two_node_topology();
  CHECK(bench_sync_problem(t, "two.yaml", model_of_size(8 << 20)) == "");
  // The bench places the ranks on the coordinator's node itself: a rank
  // elsewhere in the file, or several, are accepted.
  auto remote_trainer = t;
  remote_trainer.trainer.ranks[0].node = "workers";
  CHECK(bench_sync_problem(remote_trainer, "two.yaml", model_of_size(8 << 20)) == "");
  auto remote_router = t;
  remote_router.router.node = "workers";
  CHECK(bench_sync_problem(remote_router, "two.yaml", model_of_size(8 << 20))
        == "two.yaml: the router must run on the coordinator's node (head) for the benchmark");
  CHECK(bench_sync_problem(t, "two.yaml", bench_model(8 << 20, {1, 2}), {1, 2}) == "");
  CHECK(bench_sync_problem(t, "two.yaml", model_of_size(8 << 20), {2})
        == "--ranks 2: between 1 and 16 and at most the model's 1 layers (each rank holds at least one)");
  CHECK(bench_sync_problem(t, "two.yaml", bench_model(8 << 20, {0}), {0}).find("--ranks 0: ") == 0);
  CHECK(bench_sync_problem(t, "two.yaml", bench_model(8 << 20, {17}), {17}).find("--ranks 17: ") == 0);
  auto no_port = t;
  no_port.nodes[0].port = 0; // the bench's nodes could not reach the head
  CHECK(bench_sync_problem(no_port, "two.yaml", model_of_size(8 << 20))
        == "two.yaml: nodes 'head': the coordinator's node needs a fixed port for the others to reach it (port: 0)");
  auto far = t;
  far.nodes[1].address = "192.0.2.1"; // TEST-NET: never this machine
  CHECK(bench_sync_problem(far, "two.yaml", model_of_size(8 << 20))
        == "two.yaml: node 'workers' (192.0.2.1) is not on this machine; the benchmark starts every node itself");
  auto odd = tiny_model();
  odd.num_attention_heads = 3; // tp 2 cannot split three heads
  odd.num_key_value_heads = 3;
  CHECK(bench_sync_problem(t, "two.yaml", odd).find("engine local: tp 2: ") == 0);
}

TEST_CASE("bench sync names the line and column of what it refuses in the file") {
  test::scratch_dir dir;
  const std::string path = dir / "t.yaml";
  auto write = [&](const std::string& router_node, const std::string& remote_kind, int head_port) {
    std::ofstream(path) << "name: two\n"
                           "model: {synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, "
                           "intermediate_size: 128, vocab_size: 320, dtype: bf16, seed: 7}}\n"
                           "nodes: [{name: head, address: 127.0.0.1, port: " << head_port << "}, {name: workers, address: 127.0.0.1}]\n"
                           "cluster: {allow_insecure_network: true}\n"
                           "trainer: {node: head}\n"
                           "engines:\n"
                           "  - {name: local, node: head, tp: 2}\n"
                           "  - {name: remote, node: workers, " << remote_kind << "}\n"
                           "router: {node: " << router_node << "}\ncoordinator: {node: head}\n"
                           "transfer: {backend: ucx}\n";
    return load_topology(path);
  };
  const auto model = model_of_size(8 << 20);
  CHECK(bench_sync_problem(write("workers", "tp: 2", 24001), path, model)
        == path + ":9:16: the router must run on the coordinator's node (head) for the benchmark");
  CHECK(bench_sync_problem(write("head", "kind: vllm, url: 'http://127.0.0.1:9'", 24001), path, model)
        == path + ":8:41: engine 'remote' is kind vllm: the benchmark measures rlsync's own engines, which it starts "
                  "with their model");
  CHECK(bench_sync_problem(write("head", "tp: 2", 0), path, model)
        == path + ":3:48: nodes 'head': the coordinator's node needs a fixed port for the others to reach it (port: 0)");
}

TEST_CASE("bench ranks: layers split as pipeline stages, and the default rank counts") {
  struct row {
    std::int64_t layers;
    int ranks;
    std::vector<std::vector<std::int64_t>> expected; // empty: refused
  };
  const std::vector<row> rows{
    {2, 1, {{0, 1}}},
    {2, 2, {{0}, {1}}},
    {5, 2, {{0, 1, 2}, {3, 4}}}, // the first ranks one layer more
    {7, 3, {{0, 1, 2}, {3, 4}, {5, 6}}},
    {3, 3, {{0}, {1}, {2}}},
    {2, 3, {}}, // a rank would hold nothing
    {2, 0, {}},
  };
  for (const auto& r : rows) {
    CAPTURE(r.layers);
    CAPTURE(r.ranks);
    auto split = split_layers("head", r.layers, r.ranks);
    REQUIRE(split.size() == r.expected.size());
    for (std::size_t i = 0; i < split.size(); ++i) {
      CHECK(split[i].node == "head");
      CHECK(split[i].layers == r.expected[i]);
    }
  }
  auto t = two_node_topology();
  CHECK(default_rank_counts(t) == std::vector<int>{1});
  t.trainer.ranks = split_layers("head", 2, 2);
  CHECK(default_rank_counts(t) == std::vector<int>{1, 2});
  CHECK(bench_model(8 << 20, {1}).num_hidden_layers == 1);
  CHECK(bench_model(8 << 20, {1, 3}).num_hidden_layers == 3);
  CHECK(bench_model(8 << 20, {1, 99}).num_hidden_layers == max_bench_ranks);
}

TEST_CASE("bench ranks: the nodes' copy carries the ranks and their layers") {
  auto t = two_node_topology();
  t.model.config = tiny_model();
  t.model.config.num_hidden_layers = 3;
  t.trainer.ranks = split_layers("head", 3, 2);
  t.cluster.secret_env = "RLSYNC_BENCH_SECRET";
  auto back = parse_topology(node_yaml(t), "node.yaml", ".");
  REQUIRE(back.trainer.ranks.size() == 2);
  CHECK(back.trainer.ranks[0].node == "head");
  CHECK(back.trainer.ranks[0].layers == std::vector<std::int64_t>{0, 1});
  CHECK(back.trainer.ranks[1].layers == std::vector<std::int64_t>{2});
}

TEST_CASE("bench ranks: the nodes' copy keeps a mixture of experts' dense layers and ranks' experts") {
  auto t = two_node_topology();
  auto& c = t.model.config;
  c = tiny_model();
  c.arch = model_arch::qwen3_moe;
  c.num_hidden_layers = 2;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.mlp_only_layers = {0};
  t.trainer.ranks = {trainer_rank{"head", {0, 1}, std::vector<std::int64_t>{0, 1}},
                     trainer_rank{"head", {0, 1}, std::vector<std::int64_t>{2, 3}}};
  t.cluster.secret_env = "RLSYNC_BENCH_SECRET";
  auto back = parse_topology(node_yaml(t), "node.yaml", ".");
  CHECK(back.model.config.mlp_only_layers == std::vector<std::int64_t>{0});
  REQUIRE(back.trainer.ranks.size() == 2);
  REQUIRE(back.trainer.ranks[1].experts);
  CHECK(*back.trainer.ranks[1].experts == std::vector<std::int64_t>{2, 3});
}

TEST_CASE("bench packs: distinct plans per data plane, and packed at most once") {
  // engines: local (head, tp 2), remote-0 and remote-1 (workers, tp 2).
  auto t = two_node_topology();
  CHECK(distinct_plans(t, transfer_mode::sharded, true) == 2);  // local's workers 0 and 1
  CHECK(distinct_plans(t, transfer_mode::sharded, false) == 2); // both replicas share workers 0 and 1
  CHECK(distinct_plans(t, transfer_mode::broadcast, true) == 1);
  CHECK(distinct_plans(t, transfer_mode::broadcast, false) == 1);
  t.engines[1].tp = 1; // remote-0 at tp 1: its worker 0 packs differently
  CHECK(distinct_plans(t, transfer_mode::sharded, false) == 3);
  t.engines.erase(t.engines.begin()); // no engine in the coordinator's process
  CHECK(distinct_plans(t, transfer_mode::sharded, true) == 0);

  struct row {
    std::uint64_t local_packs, ucx_packs;
    bool once;
    double local_ratio, ucx_ratio;
  };
  // 2 versions, 3 groups, 2 local plans, 2 UCX plans: 12 packs each is once.
  const std::vector<row> rows{
    {12, 12, true, 1.0, 1.0},
    {6, 0, true, 0.5, 0.0},   // fewer: some (plan, group) not asked for
    {13, 12, false, 13.0 / 12, 1.0}, // one packed twice on the local data plane
    {12, 24, false, 1.0, 2.0},       // every UCX one packed twice (a replica each)
  };
  for (const auto& r : rows) {
    CAPTURE(r.local_packs);
    CAPTURE(r.ucx_packs);
    rank_packs p;
    p.groups = 3;
    p.versions = 2;
    p.local_plans = 2;
    p.ucx_plans = 2;
    p.ucx = true;
    p.local_packs = r.local_packs;
    p.ucx_packs = r.ucx_packs;
    CHECK(packed_at_most_once(p) == r.once);
    CHECK(local_packs_per_plan_group(p) == doctest::Approx(r.local_ratio));
    CHECK(ucx_packs_per_plan_group(p) == doctest::Approx(r.ucx_ratio));
  }
}

TEST_CASE("bench ranks: the comparison with one rank and the packs in the report") {
  auto one = sharded_case();
  auto two = sharded_case();
  two.name = "sharded/2r";
  two.ranks = 2;
  two.warm = {round_of(6, 5, 1, 9'000'000), round_of(5, 4, 1, 9'000'000), round_of(7, 6, 1, 9'000'000)};
  auto x = compare_ranks(two, one);
  CHECK(x.transfer == doctest::Approx(5.0 / 9));
  CHECK(x.stall == doctest::Approx(6.0 / 12));
  rank_packs p;
  p.rank = 1;
  p.groups = 2;
  p.versions = 3;
  p.local_plans = 2;
  p.local_packs = 12;
  p.local_passes = 6;
  p.local_lent = 10;
  p.ucx_plans = 2;
  p.ucx_packs = 14;
  p.ucx = true;
  two.packs = {p};
  auto lines = packs_lines({one, two});
  REQUIRE(lines.size() == 1);
  CHECK(lines[0]
        == "sharded/2r packs, rank 1 (2 groups, 3 versions): local 12 packs in 6 passes for 2 plan(s), 1.00 per "
           "(plan, group) per version (10 lent in place); UCX 14 packs for 2 plan(s), 1.17 per (plan, group) per version; SOME PACKED "
           "TWICE IN A VERSION");
  bench_sync_result r;
  r.cases = {one, two};
  auto report = bench_sync_report(r);
  CHECK(report.find("sharded/2r / sharded: 0.56x the transfer time, 0.50x the stall") != std::string::npos);
  CHECK(bench_sync_json(r)["cases"][1]["packs"][0]["packed_at_most_once"] == false);
}

TEST_CASE("bench rank kill: what held means, and the lines") {
  rank_kill_result k;
  k.ranks = 2;
  k.killed_rank = 1;
  k.transfer_deadline_ms = 60000;
  k.aborted = true;
  k.kill_to_abort_ms = 19.5;
  k.dirty_after_abort = 3;
  k.restart_ms = 6;
  k.restart_to_complete_ms = 2100;
  k.rounds_to_complete = 1;
  k.first_complete = round_of(1800, 500, 1300, 9'000'000);
  CHECK(k.held());
  auto lines = rank_kill_lines(k);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0]
        == "rank kill (2 ranks, rank 1 killed as the transfer phase began): round aborted 19.5 ms after the kill "
           "(transfer deadline 60000 ms: within)");
  CHECK(lines[1] == "rank kill: 3 engine(s) left dirty, 0 of them routed, 0 token(s) served dirty (no dirty engine served)");
  CHECK(lines[2].find("first complete round 2100.0 ms after the restart (round 1 after it, 3 engines") != std::string::npos);

  struct row {
    const char* what;
    void (*spoil)(rank_kill_result&);
  };
  const std::vector<row> rows{
    {"not aborted", [](rank_kill_result& x) { x.aborted = false; }},
    {"past the deadline", [](rank_kill_result& x) { x.kill_to_abort_ms = 60001; }},
    {"a dirty engine routed", [](rank_kill_result& x) { x.dirty_routable = 1; }},
    {"a dirty token", [](rank_kill_result& x) { x.dirty_tokens = 1; }},
    {"no complete round", [](rank_kill_result& x) { x.restart_to_complete_ms = -1; }},
    {"an error", [](rank_kill_result& x) { x.error = "boom"; }},
  };
  for (const auto& r : rows) {
    CAPTURE(r.what);
    auto spoiled = k;
    r.spoil(spoiled);
    CHECK(!spoiled.held());
    bench_sync_result result;
    result.rank_kill = spoiled;
    CHECK(result.failed());
  }
  bench_sync_result result;
  result.rank_kill = k;
  CHECK(!result.failed());
  CHECK(bench_sync_json(result)["rank_kill"]["held"] == true);
}
