// transfer.backend nccl assembled (actors/assembly/nccl_plane.hpp): which
// members a process hosts and on which device, an engine's join, and a
// whole sync over the plane — the coordinator's rendezvous, the trainer's
// sender, the engines' pullers — on NCCL's semantics in host memory
// (tests/gpu/fake_nccl_world.hpp); and two trainer ranks on a head node
// broadcasting to a member node's engines, the two nodes connected over
// loopback.
#include "actors/assembly/head_node.hpp"
#include "actors/assembly/local_deployment.hpp"
#include "actors/assembly/member_node.hpp"
#include "actors/assembly/nccl_plane.hpp"
#include "actors/assembly/verify_weights.hpp"
#include "actors/coordinator.hpp"
#include "actors/gatekeeper.hpp"
#include "actors/system_config.hpp"
#include "gpu/nccl_sender.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/config/build_features.hpp"
#include "runtime/plan/groups.hpp"
#include "tests/gpu/fake_nccl_world.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/fake_engine_device.hpp"
#include "tests/support/threaded_system.hpp"
#include "tests/support/whole_group_pulls.hpp"

#include <caf/scoped_actor.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

using namespace rlsync;

namespace {

topology two_node_topology() {
  auto t = test::small_topology(2);
  t.nodes = {node_spec{}, node_spec{}};
  t.nodes[0].name = "a";
  t.nodes[1].name = "b";
  t.trainer.ranks = {trainer_rank{"a", {0}}, trainer_rank{"b", {1}}};
  t.engines.resize(3);
  t.engines[0].name = "e-1";
  t.engines[0].node = "b";
  t.engines[0].tp = 2;
  t.engines[1].name = "e-0";
  t.engines[1].node = "b";
  t.engines[1].tp = 1;
  t.engines[2].name = "f";
  t.engines[2].node = "a";
  t.engines[2].tp = 1;
  return t;
}

std::string described(const std::vector<gpu::comm_member>& ms) {
  std::string out;
  for (const auto& m : ms)
    out += (out.empty() ? "" : ", ") + m.describe();
  return out;
}

} // namespace

TEST_CASE("nccl plane: a process hosts its ranks, then its engines' workers, each on the next device") {
  const auto t = two_node_topology();
  struct row {
    const char* node;
    std::optional<std::size_t> external_rank;
    const char* members;
  };
  const std::vector<row> rows = {
    {"a", std::nullopt, "trainer rank 0, engine f worker 0"},
    {"b", std::nullopt, "trainer rank 1, engine e-0 worker 0, engine e-1 worker 0, engine e-1 worker 1"},
    {"", std::nullopt, "trainer rank 0, trainer rank 1"}, // one process: every engine takes the local plane
    {"b", std::size_t{1}, "trainer rank 1"}, // an external rank's own process: the rank alone
    {"c", std::nullopt, ""},
  };
  for (const auto& r : rows) {
    CAPTURE(r.node);
    CHECK(described(hosted_members(t, r.node, r.external_rank)) == r.members);
  }
  const auto b = hosted_members(t, "b");
  CHECK(device_of(b, gpu::comm_member::trainer_rank(1)) == 0);
  CHECK(device_of(b, gpu::comm_member::worker("e-1", 1)) == 3);
  CHECK_THROWS_WITH(device_of(b, gpu::comm_member::worker("f", 0)), "engine f worker 0 does not run in this process");
  // External ranks run in processes of their own: no node hosts them.
  auto external = t;
  external.trainer.source = trainer_source::external;
  CHECK(described(hosted_members(external, "a")) == "engine f worker 0");
  // Every rank on a: a's engines take their weights locally and need no GPU; b's join.
  auto one_rank = t;
  one_rank.trainer.ranks = {trainer_rank{"a", {0, 1}}};
  CHECK(described(hosted_members(one_rank, "a")) == "trainer rank 0");
  CHECK(described(hosted_members(one_rank, "b")) == "engine e-0 worker 0, engine e-1 worker 0, engine e-1 worker 1");
}

namespace {

// A pack device that only says which device it is on.
class placed_pack_device final : public gpu::pack_device {
public:
  explicit placed_pack_device(int ordinal) : ordinal_(ordinal) {}
  int ordinal() const override { return ordinal_; }
  std::shared_ptr<void> allocate(std::size_t) override { throw gpu::gpu_error("placed only"); }
  void upload(void*, const void*, std::size_t) override { throw gpu::gpu_error("placed only"); }
  void download(void*, const void*, std::size_t) override { throw gpu::gpu_error("placed only"); }
  void pack(const gpu::pack_layout&, const std::vector<const void*>&, void*) override {
    throw gpu::gpu_error("placed only");
  }
  void concat(const std::vector<piece>&, void*) override { throw gpu::gpu_error("placed only"); }

private:
  int ordinal_;
};

} // namespace

TEST_CASE("nccl plane: an engine on a device serves from the GPU of its worker 0's link, else device 0") {
  const auto t = two_node_topology();
  const auto b = hosted_members(t, "b");
  // As make_nccl_membership places them: one device per hosted member, in order.
  gpu::nccl_membership m([](const gpu::nccl_id&, const gpu::comm_layout&, int) -> std::unique_ptr<gpu::p2p_link> {
                           throw gpu::gpu_error("no links here");
                         },
                         [b](const gpu::comm_member& member) -> std::shared_ptr<gpu::pack_device> {
                           return std::make_shared<placed_pack_device>(device_of(b, member));
                         });
  CHECK(engine_device_ordinal(&m, "e-0") == 1);
  CHECK(engine_device_ordinal(&m, "e-1") == 2); // worker 0's; worker 1 is on 3
  CHECK(engine_device_ordinal(&m, "f") == 0);   // not hosted by b: it joins nothing here
  CHECK(engine_device_ordinal(nullptr, "e-1") == 0);
}

TEST_CASE("nccl plane: a process needs a GPU per member it hosts, or it does not start") {
  const auto t = two_node_topology();
  const auto b = hosted_members(t, "b"); // four members
  struct row {
    int devices;
    const char* detail;
    const char* problem;
  };
  const std::vector<row> rows = {
    {4, "", ""},
    {8, "", ""},
    {3, "", "transfer.backend nccl: this process hosts 4 communicator members (trainer rank 1 ... engine e-1 "
            "worker 1), each on a GPU of its own, and sees 3 CUDA devices"},
    {0, "no CUDA device", "transfer.backend nccl: this process hosts 4 communicator members (trainer rank 1 ... "
                          "engine e-1 worker 1), each on a GPU of its own, and sees 0 CUDA devices (no CUDA device)"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.devices);
    gpu::device_info info;
    info.device_count = r.devices;
    info.detail = r.detail;
    CHECK(nccl_device_problem(b, info) == r.problem);
  }
  CHECK(nccl_device_problem({}, gpu::device_info{}).empty()); // a process that hosts no member
  if (gpu::query_devices().device_count < 4) // the start-up refuses before any link
    CHECK_THROWS_WITH_AS(make_nccl_membership(t, b), doctest::Contains("communicator members"), std::runtime_error);
}

TEST_CASE("nccl plane: an engine joins with its workers, and a mangled rendezvous is refused, not thrown") {
  const auto t = two_node_topology();
  auto world = test::fake_nccl_world::make();
  auto membership = make_nccl_membership(
    t, hosted_members(t, "b"), [world](const gpu::nccl_id&, const gpu::comm_layout& l, int rank) -> std::unique_ptr<gpu::p2p_link> {
      return test::fake_nccl_world::join(world, l, rank, 1024);
    });
  auto join = engine_nccl_join(membership, "e-1", 2);
  gpu::nccl_rendezvous r;
  r.epoch = 1;
  r.id.fill(7);
  r.members = gpu::make_layout(1, {gpu::comm_member::trainer_rank(0), gpu::comm_member::worker("e-1", 0),
                                   gpu::comm_member::worker("e-1", 1)})
                .members;
  auto mangled = gpu::to_wire(r);
  mangled.id.resize(5);
  CHECK(join(mangled).find("128") != std::string::npos); // names NCCL's id size
  CHECK(membership->epoch() == 0);
  CHECK(join(gpu::to_wire(r)).empty());
  CHECK(membership->link(gpu::comm_member::worker("e-1", 0)) != nullptr);
  CHECK(membership->link(gpu::comm_member::worker("e-1", 1)) != nullptr);
  CHECK(membership->link(gpu::comm_member::worker("e-0", 0)) == nullptr); // not named: no link
  CHECK(nccl_links(membership)("e-1", 1) == membership->link(gpu::comm_member::worker("e-1", 1)));
  CHECK_FALSE(join(gpu::to_wire(r)).empty()); // the same workers twice: refused

  // The collective with two ranks: rank r's puller joins its collective on
  // the worker's link into rank r's own communicator.
  auto two = r;
  two.epoch = 2;
  two.members = gpu::make_layout(2, {gpu::comm_member::trainer_rank(0), gpu::comm_member::trainer_rank(1),
                                     gpu::comm_member::worker("e-1", 0), gpu::comm_member::worker("e-1", 1)})
                  .members;
  two.root_ids.resize(2);
  two.root_ids[0].fill(8);
  two.root_ids[1].fill(9);
  CHECK(join(gpu::to_wire(two)).empty());
  for (int rank : {0, 1})
    for (int worker : {0, 1}) {
      CAPTURE(rank);
      CAPTURE(worker);
      const auto link = nccl_root_links(membership, rank)("e-1", worker);
      REQUIRE(link.get() != nullptr);
      CHECK(link.get() == membership->root_link(gpu::comm_member::worker("e-1", worker), rank).get());
      CHECK(link->layout().members.front() == gpu::comm_member::trainer_rank(rank));
      CHECK(link->rank() == 1 + worker);
    }
  CHECK(nccl_root_links(membership, 2)("e-1", 0).get() == nullptr); // no such rank
}

namespace {

// One round over a fake NCCL world, through the nodes' own wiring; with
// `devices`, each engine serves from a fake device of its own, made where
// the wiring places it (appended in the engines' order).
void round_over_nccl(transfer_mode mode, bool collective,
                     std::vector<std::shared_ptr<test::fake_device>>* devices = nullptr) {
  test::rlsync_config cfg;
  caf::actor_system sys{cfg};
  auto t = test::small_topology(2);
  t.trainer.step_time = std::chrono::hours(1); // one version: the first
  t.transfer.backend = transfer_backend::nccl;
  t.transfer.mode = mode;
  t.transfer.collective = collective;
  t.engines.resize(2);
  for (std::size_t i = 0; i < 2; ++i) {
    t.engines[i].name = "e-" + std::to_string(i);
    t.engines[i].node = "a";
    t.engines[i].tp = static_cast<std::int64_t>(i + 1);
  }
  // The trainer's process and the engines' share one fake world, as
  // processes on one host share NCCL's; each process its own membership.
  auto world = test::fake_nccl_world::make();
  const auto staging = nccl_staging_bytes(t);
  // Each member's staging stands for the device the process would give it.
  auto fake_links = [world, staging](std::vector<gpu::comm_member> hosted) {
    return [world, staging, hosted](const gpu::nccl_id&, const gpu::comm_layout& l,
                                    int rank) -> std::unique_ptr<gpu::p2p_link> {
      const int device = device_of(hosted, l.members.at(static_cast<std::size_t>(rank)));
      return test::fake_nccl_world::join(world, l, rank, static_cast<std::size_t>(staging), device);
    };
  };
  const std::vector<gpu::comm_member> ranks{gpu::comm_member::trainer_rank(0)};
  auto trainer_process = make_nccl_membership(t, ranks, fake_links(ranks));
  // The engines' process hosts their workers (as it would with the rank apart), in order.
  std::vector<gpu::comm_member> workers{gpu::comm_member::worker("e-0", 0), gpu::comm_member::worker("e-1", 0),
                                        gpu::comm_member::worker("e-1", 1)};
  auto engine_process =
    make_nccl_membership(t, hosted_members(t, "a"), fake_links(workers), [workers](const gpu::comm_member& m) {
      return gpu::host_pack_device(device_of(workers, m)); // each worker packs on its link's device
    });
  trainer_config tc; // make_local_trainer's, but for the id
  tc.source = transfer::make_weight_source(t, 0);
  tc.step_time = t.trainer.step_time;
  tc.nccl = std::make_shared<nccl_desk>();
  tc.engines = std::make_shared<engine_nodes>();
  serve_over_nccl(tc, trainer_process, 0);
  // No NCCL bootstrap socket in a unit test (and no NCCL at all in the stub build).
  tc.make_nccl_id = [] { return std::vector<std::uint8_t>(128, 7); };
  const auto source = tc.source;
  const auto trainer = spawn_trainer(sys, tc);
  std::mutex log_mutex; // before the guard: the actors log while it stops them
  std::vector<std::string> lines;
  std::vector<caf::actor> actors{caf::actor_cast<caf::actor>(trainer)};
  struct stop_all {
    caf::actor_system& sys;
    std::vector<caf::actor>& actors;
    ~stop_all() { stop_and_await(sys, actors); }
  } guard{sys, actors};
  for (const auto& e : t.engines) {
    replica_wiring w;
    w.puller = std::make_shared<nccl_puller>(sys, [trainer] { return trainer; }, t.model.config,
                                             nccl_links(engine_process), std::nullopt, gpu::wait_hooks{},
                                             t.transfer.collective, nccl_packers(engine_process));
    w.source_dtype = dtype::bf16;
    w.nccl = engine_process;
    if (devices)
      w.make_device = [devices](int ordinal) {
        auto d = std::make_shared<test::fake_device>(ordinal);
        devices->push_back(d);
        return d;
      };
    actors.push_back(caf::actor_cast<caf::actor>(spawn_replica(sys, t, e, w)));
    REQUIRE(await_engine_ready(sys, actors.back()).empty());
  }
  auto cc = coordinator_config_from(t);
  cc.trainer = trainer;
  cc.shares_process = [](const caf::actor_addr&, const caf::actor_addr&) { return false; }; // as if apart
  cc.log = [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(log_mutex);
    lines.push_back(line);
  };
  auto coord = sys.spawn(coordinator, cc);
  actors.push_back(caf::actor_cast<caf::actor>(coord));
  for (std::size_t i = 0; i < t.engines.size(); ++i)
    REQUIRE(register_engine(sys, coord, engine_info_of(t.engines[i], 1), actors[i + 1], std::chrono::seconds(10))
              .empty());
  caf::scoped_actor self{sys};
  auto routable = [&] {
    std::size_t n = 0;
    self->request(coord, std::chrono::seconds(10), status_atom::value)
      .receive([&](const coordinator_status& s) { n = s.routable.size(); }, [](caf::error&) {});
    return n;
  };
  std::string failure;
  std::vector<std::string> evicted;
  // The engines may register on either side of the trainer's first version:
  // one round or two bring both current.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (routable() < 2 && std::chrono::steady_clock::now() < give_up) {
    self->request(coord, std::chrono::seconds(10), sync_atom::value)
      .receive([&](const sync_report& r) { evicted.insert(evicted.end(), r.evicted.begin(), r.evicted.end()); }, [&](caf::error& err) { failure = sys.render(err); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20)); // the trainer's first step runs off its mailbox
  }
  REQUIRE_MESSAGE(routable() == 2, failure);
  CHECK(evicted.empty());
  std::vector<weight_digest> digests;
  self->request(coord, std::chrono::seconds(30), digest_atom::value)
    .receive([&](std::vector<weight_digest>& x) { digests = std::move(x); }, [](caf::error&) {});
  REQUIRE(digests.size() == 2);
  for (const auto& v : verify_weights(t, *source, digests)) {
    CAPTURE(v.engine);
    CAPTURE(v.error);
    CHECK(v.ok());
  }
  // One communicator: the trainer's rank and the three workers.
  CHECK(engine_process->epoch() == trainer_process->epoch());
  CHECK(engine_process->link(gpu::comm_member::worker("e-1", 1)) != nullptr);
  // Point to point, nothing is broadcast. The collective broadcasts when a
  // round holds both engines; a newcomer's cold sync may hold one alone,
  // which the rank moves point to point once its join window passed.
  const auto sender = tc.nccl->producer();
  REQUIRE(sender);
  if (!collective)
    CHECK(sender->broadcast() == 0);
  CHECK(sender->broadcast() + sender->sent() > 0);
  if (collective) {
    // Both engines current: a round holding both broadcasts the next version,
    // its groups packed into one bucket (the staging holds 64 MiB), each
    // verified and landed from its place in the bucket.
    const auto before = sender->broadcast();
    const auto v = test::step_trainer(sys, trainer); // a version starts a round (or the next sync does)
    self->request(coord, std::chrono::seconds(30), sync_atom::value)
      .receive([](const sync_report&) {}, [&](caf::error& err) { failure = sys.render(err); });
    std::optional<sync_report> round; // the one that brought both engines to v
    self->request(coord, std::chrono::seconds(10), status_atom::value)
      .receive(
        [&](const coordinator_status& s) {
          for (const auto& r : s.history)
            if (r.version == v && r.engines_synced > 0)
              round = r;
        },
        [](caf::error&) {});
    REQUIRE_MESSAGE(round.has_value(), failure);
    CHECK(round->engines_synced == 2);
    CHECK(round->evicted.empty());
    CHECK(sender->broadcast() == before + 1);
  }
  // Engine e-0 dies: the coordinator tells the trainer rank and e-1, so
  // both processes' memberships hold it and every wait on this epoch's
  // links aborts at its next poll instead of at its deadline.
  CHECK_FALSE(trainer_process->dead_member().has_value());
  CHECK_FALSE(engine_process->dead_member().has_value());
  caf::anon_send_exit(actors[1], caf::exit_reason::kill);
  CHECK(test::eventually([&] { return trainer_process->dead_member() && engine_process->dead_member(); }));
  CHECK(trainer_process->dead_member().value_or("").find("engine e-0 died") != std::string::npos);
  std::lock_guard<std::mutex> lock(log_mutex);
  CHECK(std::any_of(lines.begin(), lines.end(),
                    [](const std::string& l) { return l.find("joined by 4 members") != std::string::npos; }));
}

} // namespace

TEST_CASE("nccl plane: a member's staging holds the largest group as f32 and its checksum, or a collective's bucket") {
  auto t = test::small_topology(2);
  const auto group = plan::largest_group_bytes(t.model.config, llama_parameter_specs(t.model.config, dtype::f32),
                                               dtype::f32) + 8;
  REQUIRE(group < 1000000);
  CHECK(nccl_staging_bytes(t) == group);
  t.transfer.bucket_bytes = 1 << 30; // not the collective's: no bucket to hold
  CHECK(nccl_staging_bytes(t) == group);
  t.transfer.collective = true;
  CHECK(nccl_staging_bytes(t) == std::size_t(1) << 30);
  t.transfer.bucket_bytes = 1000; // a bucket smaller than a group: the group still fits
  CHECK(nccl_staging_bytes(t) == group);
}

TEST_CASE("nccl plane: a round moves every engine's weights from the trainer over the communicator") {
  for (auto mode : {transfer_mode::broadcast, transfer_mode::sharded}) {
    CAPTURE(to_string(mode));
    round_over_nccl(mode, false);
  }
}

TEST_CASE("nccl plane: an engine on a device serves from its worker 0's GPU and takes every group received "
          "there from the link's staging into the copy it serves") {
  struct row {
    const char* name;
    transfer_mode mode;
    bool collective;
  };
  for (const auto& r : {row{"sharded", transfer_mode::sharded, false},
                        row{"whole groups point to point", transfer_mode::broadcast, false},
                        row{"the collective", transfer_mode::broadcast, true}}) {
    CAPTURE(r.name);
    std::vector<std::shared_ptr<test::fake_device>> devices;
    round_over_nccl(r.mode, r.collective, &devices);
    REQUIRE(devices.size() == 2);
    // The engines' process hosts e-0 worker 0, e-1 workers 0 and 1: devices 0, 1, 2.
    CHECK(devices[0]->ordinal == 0);
    CHECK(devices[1]->ordinal == 1);
    // e-0's one worker is on its engine's device: everything lands.
    const auto& first = *devices[0]->counts;
    CHECK(first.mirrors >= 1);
    CHECK(first.landed_runs > 0);
    CHECK(first.refused_runs == 0);
    CHECK(first.matrices_landed > 0);
    CHECK(first.matrices_copied == 0); // every matrix of every version served came through a landing
    CHECK(first.landed_unlike_host == 0);
    CHECK(first.released == first.landings); // each closed once served (or dropped)
    // e-1's worker 0 lands; worker 1's runs, on device 2, are refused and
    // its matrices copied from the host set.
    const auto& second = *devices[1]->counts;
    CHECK(second.mirrors >= 1);
    CHECK(second.landed_runs > 0);
    CHECK(second.refused_runs > 0);
    CHECK(second.matrices_landed > 0);
    CHECK(second.matrices_copied > 0);
    CHECK(second.landed_unlike_host == 0);
  }
}

TEST_CASE("nccl plane: a round broadcasts the version to every engine worker at once (the collective baseline)") {
  round_over_nccl(transfer_mode::broadcast, true);
}

namespace {

// Two actor systems in one process, connected over loopback as a head and
// a member node are: the head runs the coordinator and trainer ranks 0 and
// 1, the member engines e-0 (tp 1) and e-1 (tp 2). The ranks make real NCCL
// ids (no device needed), and each id names a fake world of its own, as an
// id names a communicator. `transfer` is the topology's transfer section.
void two_ranks_across_nodes(const std::string& transfer, bool collective) {
  auto t = parse_topology("name: t\nmodel: {synthetic: {layers: 4, hidden_size: 64, heads: 4, kv_heads: 2, "
                          "intermediate_size: 128}}\n"
                          "nodes: [{name: a, address: 127.0.0.1, port: 0}, {name: b, address: 127.0.0.1}]\n"
                          "trainer: {node: a, step_time_ms: 3600000, ranks: [{layers: 0-1}, {layers: 2-3}]}\n"
                          "engines: [{name: e-0, node: b, tp: 1}, {name: e-1, node: b, tp: 2}]\n"
                          "transfer: " + transfer + "\n"
                          "cluster: {allow_insecure_network: true}\n", // loopback only
                          "t.yaml", "/tmp");
  struct worlds {
    std::mutex mutex;
    std::map<gpu::nccl_id, std::shared_ptr<test::fake_nccl_world>> by_id;
    std::vector<gpu::comm_layout> joined; // every link's layout, as made
  };
  auto w = std::make_shared<worlds>();
  const auto staging = nccl_staging_bytes(t);
  auto links_on = [w, staging, &t](const std::string& node) -> gpu::nccl_membership::link_factory {
    const auto hosted = hosted_members(t, node);
    return [w, staging, hosted](const gpu::nccl_id& id, const gpu::comm_layout& l,
                                int rank) -> std::unique_ptr<gpu::p2p_link> {
      std::shared_ptr<test::fake_nccl_world> world;
      {
        std::lock_guard<std::mutex> lock(w->mutex);
        auto& slot = w->by_id[id];
        if (!slot)
          slot = test::fake_nccl_world::make();
        world = slot;
        w->joined.push_back(l);
      }
      const int device = device_of(hosted, l.members.at(static_cast<std::size_t>(rank)));
      return test::fake_nccl_world::join(world, l, rank, staging, device);
    };
  };
  gpu::device_info devices; // what the fake worlds stand for: a GPU per hosted member
  devices.compiled_with_cuda = devices.compiled_with_nccl = true;
  devices.device_count = 8;
  devices.detail = "fake";

  system_config head_cfg;
  caf::actor_system head_sys{head_cfg};
  const std::string secret = "two-ranks";
  std::mutex log_mutex;
  std::vector<std::string> lines;
  auto log = [&](const std::string& l) {
    std::lock_guard<std::mutex> lock(log_mutex);
    lines.push_back(l);
  };
  head_hooks hooks;
  hooks.log = log;
  hooks.nccl_links = links_on("a");
  hooks.devices = devices;
  auto head = std::make_unique<head_node>(head_sys, t, *t.find_node("a"), member_secrets(t, "a", secret), hooks);
  REQUIRE(head->ranks().size() == 2);
  auto head_spec = *t.find_node("a");
  head_spec.port = head->port();

  system_config member_cfg;
  caf::actor_system member_sys{member_cfg};
  std::atomic<bool> stop_member{false};
  member_node_options mo;
  mo.stop_requested = [&] { return stop_member.load(); };
  mo.log = log;
  mo.nccl_links = links_on("b");
  mo.devices = devices;
  std::thread member([&] { run_member_node(member_sys, t, *t.find_node("b"), head_spec, secret, mo); });
  struct stop_both { // a failed REQUIRE must not leave the member serving
    std::atomic<bool>& stop;
    std::thread& member;
    std::unique_ptr<head_node>& head;
    ~stop_both() {
      stop = true;
      member.join();
      head->stop(std::chrono::seconds(10));
      head.reset();
    }
  } guard{stop_member, member, head};
  // One deadline for the whole case, well inside ctest's 120 s, so that a
  // failure shows its message rather than ctest's timeout.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                    give_up - std::chrono::steady_clock::now()));
  };
  REQUIRE(head->await_members(2, left(), [] { return false; }) == 2);

  caf::scoped_actor self{head_sys};
  auto status = [&] {
    coordinator_status out;
    self->request(head->coordinator(), std::chrono::seconds(5), status_atom::value)
      .receive([&](coordinator_status& s) { out = std::move(s); }, [](caf::error&) {});
    return out;
  };
  auto last_version = [&] {
    const auto s = status();
    return std::make_pair(s.version, s.routable.size());
  };
  std::string failure;
  auto sync = [&] {
    self->request(head->coordinator(), std::min(left(), std::chrono::milliseconds(10000)), sync_atom::value)
      .receive([](const sync_report&) {}, [&](caf::error& err) { failure = head_sys.render(err); });
  };
  // Both ranks publish their first version as they start; one round or a
  // few (a rendezvous first, each newcomer's cold sync) bring both engines to it.
  while (last_version() != std::make_pair(std::uint64_t{1}, std::size_t{2})
         && std::chrono::steady_clock::now() < give_up) {
    sync();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE_MESSAGE(last_version() == std::make_pair(std::uint64_t{1}, std::size_t{2}), failure);
  // The counts below are the senders' of this epoch: no rebuild may come between.
  const auto epoch = status().nccl_epoch;
  REQUIRE(epoch > 0);

  // Each rank steps once; the round that brings both engines to version 2
  // holds both, so each rank broadcasts its groups in its own communicator.
  std::vector<std::uint64_t> broadcast_before, sent_before;
  for (const auto& r : head->ranks()) {
    const auto sender = r.trainer.nccl->producer();
    REQUIRE(sender);
    broadcast_before.push_back(sender->broadcast());
    sent_before.push_back(sender->sent());
    test::step_trainer(head_sys, r.trainer.actor);
  }
  // A version starts a round, or the next sync does.
  while (last_version().first != 2 && std::chrono::steady_clock::now() < give_up)
    sync();
  std::optional<sync_report> round; // the one that brought both engines to 2
  const auto after = status();
  for (const auto& r : after.history)
    if (r.version == 2 && r.engines_synced > 0)
      round = r;
  REQUIRE_MESSAGE(round.has_value(), failure);
  REQUIRE(after.nccl_epoch == epoch);
  CHECK(round->engines_synced == 2);
  CHECK(round->evicted.empty());
  for (std::size_t i = 0; i < head->ranks().size(); ++i) { // each rank served its own part, in its own way
    CAPTURE(i);
    const auto sender = head->ranks()[i].trainer.nccl->producer();
    CHECK(sender->broadcast() == broadcast_before[i] + (collective ? 1 : 0));
    if (collective)
      CHECK(sender->sent() == sent_before[i]);
    else
      CHECK(sender->sent() > sent_before[i]);
  }

  std::vector<weight_digest> digests;
  self->request(head->coordinator(), std::chrono::seconds(10), digest_atom::value)
    .receive([&](std::vector<weight_digest>& x) { digests = std::move(x); }, [](caf::error&) {});
  REQUIRE(digests.size() == 2);
  const auto& ranks = head->ranks();
  for (const auto& v : verify_weights(t, {ranks[0].trainer.source.get(), ranks[1].trainer.source.get()}, digests)) {
    CAPTURE(v.engine);
    CAPTURE(v.error);
    CHECK(v.ok());
  }
  // The collective: three communicators of one epoch, the main one (both
  // ranks, three workers) and one per rank, rooted at it, with the same
  // three workers; point to point, the main one alone.
  std::lock_guard<std::mutex> lock(w->mutex);
  CHECK(w->by_id.size() >= (collective ? 3u : 1u)); // a rebuild before the rounds makes more
  std::set<std::vector<std::string>> rooted;
  for (const auto& l : w->joined)
    if (l.epoch == epoch
        && std::count_if(l.members.begin(), l.members.end(), [](const gpu::comm_member& m) { return m.producer; }) == 1) {
      std::vector<std::string> names;
      for (const auto& m : l.members)
        names.push_back(m.describe());
      rooted.insert(names);
    }
  CHECK(rooted.size() == (collective ? 2u : 0u));
  for (const auto& names : rooted) {
    CAPTURE(names.front());
    CHECK(names.size() == 4); // the rank, then e-0's worker and e-1's two
    CHECK((names.front() == gpu::comm_member::trainer_rank(0).describe()
           || names.front() == gpu::comm_member::trainer_rank(1).describe()));
  }
}

} // namespace

TEST_CASE("nccl plane: two trainer ranks on a head serve a member node's engines, over the nodes' own wiring") {
  if (!nccl_compiled_in()) {
    MESSAGE("skipped: rlsync was built without NCCL, which refuses transfer.backend nccl");
    return;
  }
  SUBCASE("the collective: each rank broadcasts its part in a communicator of its own") {
    two_ranks_across_nodes("{backend: nccl, mode: broadcast, collective: true}", true);
  }
  SUBCASE("sharded, point to point: each rank sends each worker its share over the one communicator") {
    two_ranks_across_nodes("{backend: nccl, mode: sharded}", false);
  }
}
