// The one assembly of a head: its rule for the dtype every engine records
// its plans in (the head announces it to the other nodes in the join grant),
// and how trainer ranks are placed, followed and pulled from.
#include "actors/assembly/head_node.hpp"
#include "actors/assembly/local_deployment.hpp"
#include "actors/assembly/member_node.hpp"
#include "actors/assembly/verify_weights.hpp"
#include "actors/gatekeeper.hpp"
#include "actors/system_config.hpp"
#include "runtime/config/build_features.hpp"
#include "gpu/ipc_producer.hpp"
#include "runtime/plan/groups.hpp"
#include "tests/gpu/fake_ipc_memory.hpp"
#include "tests/support/scratch_dir.hpp"
#include "tests/support/threaded_system.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <thread>
#include <vector>

using namespace rlsync;

TEST_CASE("assembly: the source dtype is the topology's, else the trainer's tensors'") {
  struct row {
    std::optional<dtype> topology_dtype; ///< nullopt: a checkpoint, whose tensors say
    dtype tensors;
    dtype expected;
  };
  const std::vector<row> rows = {
    {dtype::bf16, dtype::bf16, dtype::bf16},
    {dtype::f16, dtype::f16, dtype::f16},
    {std::nullopt, dtype::f32, dtype::f32}, // an f32 checkpoint stays f32 on every engine
    {std::nullopt, dtype::f16, dtype::f16},
    {dtype::f32, dtype::bf16, dtype::f32},  // the topology's word wins
  };
  for (const auto& r : rows) {
    CAPTURE(static_cast<int>(r.tensors));
    topology t;
    t.model.config = test::small_model(1);
    t.model.weights_dtype = r.topology_dtype;
    transfer::synthetic_options o;
    o.config = t.model.config;
    o.type = r.tensors;
    o.threads = 1;
    transfer::synthetic_source source(o);
    CHECK(source_dtype_of(t, source) == r.expected); // before the trainer's first version
    source.produce_next();
    CHECK(source_dtype_of(t, source) == r.expected);
  }
}

TEST_CASE("assembly: engines register as their replica, in the incarnation given") {
  engine_spec spec;
  spec.name = "rollout-b";
  spec.node = "workers";
  spec.tp = 4;
  auto fresh = engine_info_of(spec, 1700000000000);
  CHECK(fresh.name == "rollout-b");
  CHECK(fresh.node == "workers");
  CHECK(fresh.tp == 4);
  CHECK(fresh.version == 0);
  CHECK(fresh.dirty); // a fresh engine holds no weights yet
  CHECK(fresh.incarnation == 1700000000000);
  auto rejoined = engine_info_of(spec, 3, 12, false); // a coordinator's roll call: as it is
  CHECK(rejoined.version == 12);
  CHECK(!rejoined.dirty);
  CHECK(rejoined.incarnation == 3);
  const auto first = next_incarnation(), second = next_incarnation();
  CHECK(first > 1700000000000); // the milliseconds since the epoch
  CHECK(second > first);        // even within one millisecond: each call replaces the last
}

TEST_CASE("assembly: the coordinator follows one trainer only when the one rank runs with it") {
  struct row {
    const char* ranks;
    std::string node; ///< the coordinator's process hosts this node; empty: every node
    bool single;
  };
  const std::vector<row> rows = {
    {"", "", true},                                                    // one process, one rank
    {"", "a", true},                                                   // the rank on the head's node
    {", ranks: [{node: b, layers: all}]", "a", false},                 // the one rank elsewhere: it registers
    {", ranks: [{layers: 0-1}, {layers: 2-3}]", "", false},            // several ranks always register
    {", ranks: [{layers: 0-1}, {node: b, layers: 2-3}]", "a", false},
  };
  for (const auto& r : rows) {
    CAPTURE(r.ranks);
    CAPTURE(r.node);
    auto t = parse_topology("name: t\nmodel: {synthetic: {layers: 4, hidden_size: 64, heads: 4, kv_heads: 2, "
                            "intermediate_size: 128}}\nnodes: [{name: a, port: 7000}, {name: b}]\n"
                            "cluster: {allow_insecure_network: true}\ntrainer: {node: a"
                              + std::string(r.ranks) + "}\nengines: [{name: e, node: b}]\n",
                            "t.yaml", "/tmp");
    CHECK(follows_single_trainer(t, r.node) == r.single);
    CHECK(cluster_layout_problem(t).empty()); // ranks, router and engines may run anywhere
  }
}

TEST_CASE("assembly: engines pull from a rank in their process locally, from any other as told") {
  transfer::synthetic_options o;
  o.config = test::small_model(2);
  o.threads = 1;
  auto source = std::make_shared<transfer::synthetic_source>(o);
  hosted_rank here;
  here.rank = 1;
  here.trainer.source = source;
  here.trainer.transfer = std::make_shared<transfer::local_transfer>(source, transfer::local_transfer_options{});
  auto elsewhere = std::make_shared<transfer::local_transfer>(source, transfer::local_transfer_options{});
  std::vector<std::uint32_t> asked;
  producer_puller_factory remote = [&](const producer_holding& h, const trainer_actor&) {
    asked.push_back(h.rank);
    return std::shared_ptr<transfer::weight_puller>(elsewhere);
  };
  struct row {
    std::uint32_t rank;
    bool with_remote;
    std::shared_ptr<transfer::weight_puller> expected;
  };
  const std::vector<row> rows = {
    {1, true, here.trainer.transfer}, // hosted: the in-process data plane, never the remote factory
    {1, false, here.trainer.transfer},
    {0, true, elsewhere},             // another process's rank: as the remote factory says
    {0, false, nullptr},              // and none without it: the engine refuses the order
  };
  for (const auto& r : rows) {
    CAPTURE(r.rank);
    CAPTURE(r.with_remote);
    asked.clear();
    auto pullers = rank_pullers({here}, r.with_remote ? remote : producer_puller_factory{});
    producer_holding h;
    h.rank = r.rank;
    CHECK(pullers(h, trainer_actor{}) == r.expected);
    CHECK(asked == (r.with_remote && r.rank != 1 ? std::vector<std::uint32_t>{r.rank} : std::vector<std::uint32_t>{}));
  }
}

TEST_CASE("assembly: two trainer ranks in one process sync every engine to the whole model") {
  system_config cfg;
  caf::actor_system sys{cfg};
  auto t = parse_topology("name: t\nmodel: {synthetic: {layers: 4, hidden_size: 64, heads: 4, kv_heads: 2, "
                          "intermediate_size: 128}}\nnodes: [{name: a}]\n"
                          "trainer: {node: a, step_time_ms: 3600000, ranks: [{layers: 0-1}, {layers: 2-3}]}\n"
                          "engines: [{name: e, node: a, replicas: 2, tp: 2}]\n",
                          "t.yaml", "/tmp");
  auto d = deploy_local(sys, t, {});
  struct stop_on_exit { // a failed REQUIRE must not leave actors the system's destructor waits for
    caf::actor_system& sys;
    local_deployment& d;
    ~stop_on_exit() { stop_and_await(sys, d.actors()); }
  } guard{sys, d};
  REQUIRE(d.ranks.size() == 2);
  CHECK_FALSE(d.single_trainer);
  CHECK(d.ranks[0].trainer.source != d.ranks[1].trainer.source); // each rank its own source
  CHECK(d.ranks[0].trainer.source->holds(d.ranks[0].trainer.source->parameters().front().name));
  CHECK(d.ranks[0].trainer.source->parameters().size() + d.ranks[1].trainer.source->parameters().size()
        >= t.model.config.num_hidden_layers);
  caf::scoped_actor self{sys};
  std::optional<sync_report> report;
  std::string failure;
  // Each rank publishes its first version as it starts; a round before both did finds nothing to sync.
  for (int attempt = 0; attempt < 100 && !(report && report->version > 0); ++attempt) {
    self->request(d.coordinator, std::chrono::seconds(30), sync_atom::value)
      .receive([&](const sync_report& r) { report = r; }, [&](caf::error& err) { failure = sys.render(err); });
    if (!(report && report->version > 0))
      std::this_thread::sleep_for(std::chrono::milliseconds(50)); // the ranks' first step runs off their mailboxes
  }
  REQUIRE_MESSAGE((report && report->version > 0), failure);
  std::vector<weight_digest> digests;
  self->request(d.coordinator, std::chrono::seconds(30), digest_atom::value)
    .receive([&](std::vector<weight_digest>& x) { digests = std::move(x); }, [](caf::error&) {});
  REQUIRE(digests.size() == 2);
  auto both = verify_weights(t, {d.ranks[0].trainer.source.get(), d.ranks[1].trainer.source.get()}, digests);
  for (const auto& v : both) {
    CAPTURE(v.engine);
    CAPTURE(v.error);
    CHECK(v.ok());
  }
  // The check can fail: one rank's half is not the model.
  auto half = verify_weights(t, {d.ranks[0].trainer.source.get()}, digests);
  CHECK(std::none_of(half.begin(), half.end(), [](auto& v) { return v.ok(); }));
}

TEST_CASE("assembly: a head that fails halfway stops what it started, and the error names the field") {
  test::scratch_dir dir;
  const auto key = dir.path() + "/v.key";
  {
    std::ofstream(key) << "token\n";
  }
  ::chmod(key.c_str(), 0644); // readable by others: refused, after the trainer and engine e started
  system_config cfg;
  caf::actor_system sys{cfg};
  auto t = parse_topology("name: t\nmodel: {synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, "
                          "intermediate_size: 128}}\nnodes: [{name: a}]\n"
                          "trainer: {node: a, step_time_ms: 50}\n"
                          "engines: [{name: e, node: a}, {name: v, node: a, kind: vllm, url: 'http://127.0.0.1:1', "
                          "api_key_file: '" + key + "', weights_dir: '" + dir.path() + "/w'}]\n",
                          "t.yaml", "/tmp");
  std::string error;
  try {
    deploy_local(sys, t, {});
  } catch (const std::exception& e) {
    error = e.what();
  }
  CHECK_MESSAGE(error.find("engines 'v' api_key_file " + key + ": accessible by group or others") != std::string::npos,
                error);
  // The ticking trainer and engine e are gone: the system's end (which
  // waits for every actor) does not hang.
  bool none_left = false;
  for (int i = 0; i < 200 && !none_left; ++i) {
    none_left = sys.registry().running() == 0;
    if (!none_left)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(none_left);
}

TEST_CASE("assembly: a rank's UCX producer takes as many gets per connection as an engine keeps in flight") {
  struct row {
    const char* transfer;
    std::size_t gets;
    std::size_t default_budget_groups;
  };
  const row rows[] = {
    {"{backend: ucx}", 16, 4},                      // the producer's own bound: above the default 2
    {"{backend: ucx, groups_in_flight: 16}", 16, 32},
    {"{backend: ucx, groups_in_flight: 40}", 40, 80},
  };
  for (const auto& r : rows) {
    CAPTURE(r.transfer);
    auto t = parse_topology("name: t\nmodel: {synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, "
                            "intermediate_size: 128}}\nnodes: [{name: a}]\ntrainer: {node: a}\n"
                            "engines: [{name: e, node: a, tp: 2}]\ntransfer: " + std::string(r.transfer) + "\n",
                            "t.yaml", "/tmp");
    const auto o = rank_producer_options(t, t.nodes.front(), {});
    CHECK(o.max_outstanding_per_connection == r.gets);
    CHECK(o.default_budget_groups == r.default_budget_groups);
    CHECK(o.prewarm_split == 2); // sharded by default: the smallest tp's shards
  }
}

TEST_CASE("assembly: cuda_ipc and nccl need a CUDA device at start-up, the other backends none") {
  struct row {
    transfer_backend backend;
    int devices;
    const char* detail;
    const char* problem; ///< "" when the deployment may start
  };
  const std::vector<row> rows = {
    {transfer_backend::cuda_ipc, 0, "no CUDA device",
     "transfer.backend cuda_ipc needs a CUDA device at start-up, and this process sees none (no CUDA device)"},
    {transfer_backend::cuda_ipc, 0, "", // a runtime that said nothing
     "transfer.backend cuda_ipc needs a CUDA device at start-up, and this process sees none (no CUDA device)"},
    {transfer_backend::cuda_ipc, 0, "rlsync was built without CUDA",
     "transfer.backend cuda_ipc needs a CUDA device at start-up, and this process sees none (rlsync was built "
     "without CUDA)"},
    {transfer_backend::cuda_ipc, 1, "NVIDIA H200", ""},
    {transfer_backend::nccl, 0, "no CUDA device",
     "transfer.backend nccl needs a CUDA device at start-up, and this process sees none (no CUDA device)"},
    {transfer_backend::nccl, 1, "NVIDIA H200", ""},
    {transfer_backend::ucx, 0, "no CUDA device", ""},
    {transfer_backend::local, 0, "no CUDA device", ""},
  };
  for (const auto& r : rows) {
    CAPTURE(to_string(r.backend));
    CAPTURE(r.devices);
    topology t;
    t.transfer.backend = r.backend;
    gpu::device_info info;
    info.device_count = r.devices;
    info.detail = r.detail;
    CHECK(backend_device_problem(t, info) == r.problem);
  }
}

TEST_CASE("assembly: with a GPU backend, the nodes of ranks and built-in engines need a device, the others none") {
  topology t;
  t.trainer.ranks = {trainer_rank{"ranks", {0}}};
  engine_spec builtin, server;
  builtin.name = "e";
  builtin.node = "engines";
  server.name = "v";
  server.node = "servers";
  server.kind = engine_kind::vllm;
  t.engines = {builtin, server};
  gpu::device_info none;
  none.detail = "no CUDA device";
  for (auto backend : {transfer_backend::nccl, transfer_backend::cuda_ipc}) {
    CAPTURE(to_string(backend));
    t.transfer.backend = backend;
    const std::string problem = "transfer.backend " + std::string{to_string(backend)}
                                + " needs a CUDA device at start-up, and this process sees none (no CUDA device)";
    CHECK(backend_device_problem(t, none, "ranks") == problem);
    CHECK(backend_device_problem(t, none, "engines") == problem);
    CHECK(backend_device_problem(t, none) == problem); // one process plays every node
    CHECK(backend_device_problem(t, none, "head").empty()); // the coordinator alone
    CHECK(backend_device_problem(t, none, "servers").empty()); // a vLLM server holds its own GPUs
  }
  t.trainer.ranks.clear(); // as before ranks existed: the trainer's node
  t.trainer.node = "head";
  t.transfer.backend = transfer_backend::nccl;
  CHECK_FALSE(backend_device_problem(t, none, "head").empty());
}

namespace {

/// A head `a` listening on `head_port` and a member `b` hosting `engines`,
/// on loopback without TLS; `transfer`: the topology's transfer section.
topology head_and_member(const std::string& engines, std::uint16_t head_port, const std::string& transfer = "") {
  return parse_topology("name: t\nmodel: {synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, "
                        "intermediate_size: 128}}\n"
                        "nodes: [{name: a, address: 127.0.0.1, port: " + std::to_string(head_port)
                          + "}, {name: b, address: 127.0.0.1}]\n"
                          "trainer: {node: a}\nengines: [" + engines + "]\n"
                          + (transfer.empty() ? "" : "transfer: " + transfer + "\n")
                          + "cluster: {allow_insecure_network: true}\n",
                        "t.yaml", "/tmp");
}

} // namespace

TEST_CASE("assembly: a head or member node that sees no device for nccl stops at start-up, joining nothing") {
  if (!nccl_compiled_in()) {
    MESSAGE("skipped: rlsync was built without NCCL, which validation refuses first");
    return;
  }
  const auto t = head_and_member("{name: e, node: b}", 0, "{backend: nccl}");
  gpu::device_info none;
  none.detail = "no CUDA device";
  const std::string problem =
    "transfer.backend nccl needs a CUDA device at start-up, and this process sees none (no CUDA device)";
  system_config cfg;
  caf::actor_system sys{cfg};
  head_hooks hooks;
  hooks.devices = none;
  std::string thrown;
  try {
    head_node head(sys, t, *t.find_node("a"), member_secrets(t, "a", "s"), hooks);
  } catch (const std::runtime_error& e) {
    thrown = e.what();
  }
  // Which check speaks first depends on the machine: the membership's count
  // of GPUs against its members (read from the device itself), or the
  // start-up check (the devices given).
  CAPTURE(thrown);
  CHECK(thrown.rfind("transfer.backend nccl", 0) == 0);
  CHECK(thrown.find("CUDA device") != std::string::npos);
  // The member refuses before it connects: the head's port (0) is never dialled.
  member_node_options mo;
  mo.devices = none;
  std::vector<std::string> lines;
  mo.log = [&](const std::string& l) { lines.push_back(l); };
  const auto end = run_member_node(sys, t, *t.find_node("b"), *t.find_node("a"), "s", mo);
  CHECK(end.exit_code == 1);
  CHECK(lines == std::vector<std::string>{problem});
}

TEST_CASE("assembly: a member node short of a GPU for each member it hosts stops before joining") {
  if (!nccl_compiled_in()) {
    MESSAGE("skipped: rlsync was built without NCCL, which validation refuses first");
    return;
  }
  // 16 members on node b: more than this machine's GPUs (or any the tests run on).
  const auto t = head_and_member("{name: e, node: b, replicas: 16}", 0, "{backend: nccl}");
  system_config cfg;
  caf::actor_system sys{cfg};
  member_node_options mo;
  gpu::device_info one; // the start-up check passes: the membership counts members against the device itself
  one.device_count = 1;
  mo.devices = one;
  std::vector<std::string> lines;
  mo.log = [&](const std::string& l) { lines.push_back(l); };
  const auto end = run_member_node(sys, t, *t.find_node("b"), *t.find_node("a"), "s", mo);
  CHECK(end.exit_code == 1);
  REQUIRE(lines.size() == 1); // nothing about the head: it never dialled it
  CHECK_MESSAGE(lines[0].rfind("transfer.backend nccl: this process hosts 16 communicator members", 0) == 0, lines[0]);
}

TEST_CASE("assembly: a member node stopped while it joins ends cleanly") {
  const auto t = head_and_member("{name: e, node: b}", 1); // nothing listens on port 1
  system_config cfg;
  caf::actor_system sys{cfg};
  member_node_options mo;
  mo.stop_requested = [] { return true; }; // SIGTERM came while the head is still out of reach
  std::vector<std::string> lines;
  mo.log = [&](const std::string& l) { lines.push_back(l); };
  const auto end = run_member_node(sys, t, *t.find_node("b"), *t.find_node("a"), "s", mo);
  CHECK(end.exit_code == 0);
  CHECK(lines == std::vector<std::string>{"stopped before a admitted this node"});
}

TEST_CASE("assembly: an engine on device cuda needs a CUDA device in the process that runs it") {
  topology t;
  engine_spec on_gpu, on_cpu;
  on_gpu.name = "g";
  on_gpu.node = "b";
  on_gpu.device = "cuda";
  on_cpu.name = "c";
  on_cpu.node = "a";
  t.engines = {on_cpu, on_gpu};
  gpu::device_info none;
  none.detail = "no CUDA device";
  CHECK(backend_device_problem(t, none)
        == "engine 'g' runs on device cuda, and this process sees no CUDA device (no CUDA device)");
  CHECK(backend_device_problem(t, none, "b") == backend_device_problem(t, none));
  CHECK(backend_device_problem(t, none, "a").empty()); // node a runs only the CPU engine
  gpu::device_info one;
  one.device_count = 1;
  CHECK(backend_device_problem(t, one).empty());
}

TEST_CASE("assembly: cuda_ipc producers: a slot per tp worker of engines elsewhere, the largest tp per engine") {
  test::rlsync_config cfg;
  caf::actor_system sys{cfg};
  topology t = test::small_topology(2);
  t.transfer.backend = transfer_backend::cuda_ipc;
  t.transfer.mode = transfer_mode::broadcast;
  auto engine = [](std::string name, std::string node, std::int64_t tp, std::int64_t dp) {
    engine_spec e;
    e.name = std::move(name);
    e.node = std::move(node);
    e.tp = tp;
    e.dp = dp;
    return e;
  };
  t.engines = {engine("here", "a", 4, 1),   // the rank's own process: the local plane, no slot
               engine("b-0", "b", 2, 1),
               engine("c-0", "c", 1, 3)};  // data-parallel ranks share the engine's weights: one slot
  std::vector<hosted_rank> ranks;
  ranks.push_back({0, 1, make_local_trainer(sys, t)});
  test::stop_on_exit stop{caf::actor_cast<caf::actor>(ranks[0].trainer.actor)};
  auto memory = std::make_shared<test::fake_ipc_memory>();
  open_ipc_producers(t, ranks, memory);
  auto producer = ranks[0].trainer.cuda_ipc->producer();
  REQUIRE(producer);
  std::uint64_t largest = 0;
  for (std::uint32_t g = 0; g < plan::group_count(t.model.config); ++g) {
    std::uint64_t bytes = 0;
    for (const auto& p : ranks[0].trainer.source->parameters())
      if (plan::group_of(t.model.config, p.name) == g)
        bytes += p.bytes();
    largest = std::max(largest, bytes);
  }
  CHECK(producer->stats().buffer_bytes == 3 * largest); // b-0's two workers and c-0's one
  CHECK(producer->workers_per_engine() == 4);           // the largest tp of any engine
  CHECK(memory->allocations == 1);                      // made at start
  ranks[0].trainer.cuda_ipc->close();
  CHECK_FALSE(ranks[0].trainer.cuda_ipc->producer());

  // An external trainer's rank runs alone in its process, whatever node it
  // names: every engine pulls from it.
  auto external = t;
  external.trainer.source = trainer_source::external;
  open_ipc_producers(external, ranks, memory);
  CHECK(ranks[0].trainer.cuda_ipc->producer()->stats().buffer_bytes == 7 * largest);
  // A checkpoint's dtype is not known at start: slots hold its groups as f32.
  auto checkpoint = t;
  checkpoint.model.weights_dtype.reset();
  open_ipc_producers(checkpoint, ranks, memory);
  CHECK(ranks[0].trainer.cuda_ipc->producer()->stats().buffer_bytes == 3 * 2 * largest);
  ranks[0].trainer.cuda_ipc->close();
}
