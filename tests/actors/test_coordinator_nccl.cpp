// transfer.backend nccl: the coordinator builds the communicator at a round
// boundary (actors/coordinator_nccl.cpp) on the deterministic scheduler,
// against a scripted trainer (rank 0 of every communicator) and scripted
// engines that join, refuse or fall silent.
#include "tests/support/coordinator_fixture.hpp"
#include "tests/support/threaded_system.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

using namespace rlsync;
using namespace rlsync::test;
using namespace std::chrono_literals;

namespace {

struct nccl_fixture : coordinator_fixture {
  std::shared_ptr<trainer_script> rec = std::make_shared<trainer_script>();
  scripted_trainer_actor trainer;
  int ids_made = 0;

  nccl_fixture() {
    rec->nccl_joins_ok = true;
    rec->nccl_id = [this]() -> caf::result<std::vector<std::uint8_t>> {
      ++ids_made;
      return std::vector<std::uint8_t>(128, static_cast<std::uint8_t>(ids_made));
    };
  }

  coordinator_config nccl_config() {
    auto c = config();
    c.transfer.backend = transfer_backend::nccl;
    c.shares_process = [](const caf::actor_addr&, const caf::actor_addr&) { return false; }; // every engine elsewhere
    return c;
  }

  void start_nccl(coordinator_config c) {
    trainer = spawn(scripted_trainer, rec);
    c.trainer = trainer;
    start(c);
  }

  void publish_through_trainer(std::uint64_t v) {
    REQUIRE(!rec->listeners.empty());
    publish_from(trainer, version_info{v, 4, 4096});
    run();
  }

  /// Spawns engine `name` that treats the rendezvous as `on_join` says, and
  /// registers it (incarnation `incarnation`); what follows runs.
  engine_handle& join_engine(const std::string& name, act on_join, std::uint64_t incarnation = 0) {
    auto& e = spawn_engine(name);
    e.script->on_nccl_join = on_join;
    join(engine_info{name, "node", 1, 0, false, incarnation}, e);
    return e;
  }

  /// "t0 a/0 b/0": the members of a rendezvous, in rank order.
  static std::string members_of(const nccl_rendezvous_msg& m) {
    std::string out;
    for (const auto& x : m.members)
      out += (out.empty() ? "" : " ") + (x.producer ? "t" + std::to_string(x.rank) : x.engine + "/" + std::to_string(x.rank));
    return out;
  }

  std::vector<std::uint64_t> epochs_joined(const std::string& engine) {
    std::vector<std::uint64_t> out;
    for (const auto& m : engines.at(engine).script->nccl_joins)
      out.push_back(m.epoch);
    return out;
  }
};

} // namespace

TEST_CASE_FIXTURE(nccl_fixture, "coordinator nccl: the first round waits for the rendezvous: rank 0 makes the id, every member joins") {
  start_nccl(nccl_config());
  add_engine("a");
  REQUIRE(rec->nccl_joins.size() == 1);
  const auto& first = rec->nccl_joins.front();
  CHECK(first.epoch == 1);
  CHECK(first.id == std::vector<std::uint8_t>(128, 1));
  CHECK(members_of(first) == "t0 a/0");
  CHECK(engines["a"].script->nccl_joins.size() == 1);
  CHECK(engines["a"].script->nccl_joins.front().id == first.id); // one rendezvous for all
  CHECK(routable("a"));                                          // the round ran after the joins
  CHECK(logged("communicator epoch 1 joined by 2 members"));
  // A newcomer changes the members: the boundary before its round rebuilds.
  add_engine("b");
  REQUIRE(rec->nccl_joins.size() == 2);
  CHECK(members_of(rec->nccl_joins.back()) == "t0 a/0 b/0");
  CHECK(epochs_joined("a") == std::vector<std::uint64_t>{1, 2});
  CHECK(epochs_joined("b") == std::vector<std::uint64_t>{2});
  CHECK(routable("b"));
  auto s = status(); // what `rlsync status` shows
  CHECK(s.nccl_epoch == 2);
  CHECK(s.nccl_members == 3);
  CHECK(s.nccl_rebuilds == 2);
  CHECK(s.nccl_healthy);
  // Nobody changed: the next version syncs over the same communicator.
  publish_through_trainer(3);
  CHECK(status().version == 3);
  CHECK(rec->nccl_joins.size() == 2);
  CHECK(ids_made == 2);
}

TEST_CASE_FIXTURE(nccl_fixture, "coordinator nccl: an engine that refuses the rendezvous is left out at once and asked again after the round") {
  start_nccl(nccl_config());
  add_engine("a");
  auto& b = join_engine("b", act::fail);
  // Epoch 2 named b, which refused; epoch 3 leaves it out and the round runs.
  CHECK(epochs_joined("a") == std::vector<std::uint64_t>{1, 2, 3});
  CHECK(epochs_joined("b") == std::vector<std::uint64_t>{2});
  CHECK(members_of(rec->nccl_joins.back()) == "t0 a/0");
  CHECK(logged("rebuilt without engines that did not join: b: "));
  CHECK(logged("b told to refuse the rendezvous"));
  CHECK(routable("b")); // a scripted transfer needs no link; a real one fails and is evicted
  // The round ended: at the next boundary b is a member again.
  b.script->on_nccl_join = act::answer;
  publish_through_trainer(3);
  CHECK(epochs_joined("b") == std::vector<std::uint64_t>{2, 4});
  CHECK(members_of(rec->nccl_joins.back()) == "t0 a/0 b/0");
}

TEST_CASE_FIXTURE(nccl_fixture, "coordinator nccl: a silent engine fails the rendezvous at the start deadline, never hangs it") {
  start_nccl(nccl_config());
  add_engine("a");
  const auto rounds = status().rounds;
  join_engine("b", act::drop);
  CHECK(status().rounds == rounds); // b's round waits on the rendezvous
  advance(1s);                      // the start deadline
  CHECK(epochs_joined("a") == std::vector<std::uint64_t>{1, 2, 3});
  CHECK(status().rounds == rounds + 1);
  CHECK(logged("rebuilt without engines that did not join: b: "));
}

TEST_CASE_FIXTURE(nccl_fixture, "coordinator nccl: a trainer that makes no id holds the rounds and is asked again after nccl_retry") {
  auto made = rec->nccl_id;
  rec->nccl_id = nullptr; // refuses
  start_nccl(nccl_config());
  const auto rounds = status().rounds; // the trainer's first version, synced with nobody: no member to join
  auto& a = join_engine("a", act::answer);
  CHECK(status().rounds == rounds);
  CHECK(a.script->nccl_joins.empty());
  CHECK(logged("trainer rank 0 made no unique id for epoch 1"));
  CHECK(logged("the next in 1000 ms"));
  rec->nccl_id = made;
  advance(500ms);
  CHECK(a.script->nccl_joins.empty()); // not before the retry is due
  advance(500ms);
  CHECK(epochs_joined("a") == std::vector<std::uint64_t>{2}); // a newer epoch than the failed one
  CHECK(status().rounds == rounds + 1);
  CHECK(routable("a"));
}

TEST_CASE_FIXTURE(nccl_fixture, "coordinator nccl: a trainer rank that refuses to join fails the rendezvous, and the retry names a newer epoch") {
  rec->nccl_joins_ok = false;
  start_nccl(nccl_config());
  const auto rounds = status().rounds;
  add_engine("a");
  CHECK(status().rounds == rounds);
  CHECK(logged("trainer rank 0 did not join"));
  rec->nccl_joins_ok = true;
  advance(1s);
  CHECK(epochs_joined("a") == std::vector<std::uint64_t>{1, 2});
  CHECK(status().rounds == rounds + 1);
}

TEST_CASE_FIXTURE(nccl_fixture, "coordinator nccl: an engine evicted in its transfer marks the communicator: the next boundary rebuilds it") {
  start_nccl(nccl_config());
  add_engine("a");
  add_engine("b");
  REQUIRE(epochs_joined("a") == std::vector<std::uint64_t>{1, 2});
  engines["b"].on(sync_phase::transfer, act::fail);
  publish_through_trainer(3);
  CHECK(!routable("b"));
  CHECK(logged("b was evicted in transfer"));
  engines["b"].on(sync_phase::transfer, act::answer);
  publish_through_trainer(4);
  CHECK(epochs_joined("a") == std::vector<std::uint64_t>{1, 2, 3}); // same members, a new communicator
  CHECK(routable("b"));
}

TEST_CASE_FIXTURE(nccl_fixture, "coordinator nccl: engines in the producer's own process join nothing: no communicator, rounds run") {
  auto c = nccl_config();
  c.shares_process = [](const caf::actor_addr&, const caf::actor_addr&) { return true; };
  start_nccl(c);
  add_engine("a");
  CHECK(routable("a"));
  CHECK(rec->nccl_joins.empty());
  CHECK(ids_made == 0);
}

TEST_CASE_FIXTURE(nccl_fixture, "coordinator nccl: other backends never rendezvous") {
  auto c = nccl_config();
  c.transfer.backend = transfer_backend::ucx;
  start_nccl(c);
  add_engine("a");
  CHECK(routable("a"));
  CHECK(rec->nccl_joins.empty());
  CHECK(engines["a"].script->nccl_joins.empty());
}

TEST_CASE_FIXTURE(nccl_fixture, "coordinator nccl: an engine that leaves while the id is made fails the rendezvous, nothing else") {
  start_nccl(nccl_config());
  add_engine("a");
  rec->hold_nccl_ids = true;
  auto& b = join_engine("b", act::answer);
  REQUIRE(rec->held_ids.size() == 1); // epoch 2, for a and b
  kill(b);                            // dropped while the trainer makes the id
  rec->hold_nccl_ids = false;
  tell(trainer, release_ids_atom::value);
  run();
  CHECK(logged("b: it left before the rendezvous"));
  CHECK(epochs_joined("a") == std::vector<std::uint64_t>{1, 2});
  // No round is due (a is current): the next one builds the communicator without b.
  publish_through_trainer(3);
  CHECK(epochs_joined("a") == std::vector<std::uint64_t>{1, 2, 3});
  CHECK(members_of(rec->nccl_joins.back()) == "t0 a/0");
  CHECK(status().version == 3);
}

TEST_CASE_FIXTURE(nccl_fixture, "coordinator nccl: a member that restarts mid-rendezvous gets the communicator built again") {
  start_nccl(nccl_config());
  add_engine("a");
  auto& b = join_engine("b", act::hold);
  REQUIRE(epochs_joined("a") == std::vector<std::uint64_t>{1, 2}); // a answered epoch 2, b holds it
  join_engine("a", act::answer, 1); // a's process restarted
  b.script->on_nccl_join = act::answer;
  release("b");
  CHECK(logged("a member restarted or failed meanwhile: built again"));
  CHECK(epochs_joined("a") == std::vector<std::uint64_t>{3}); // the new incarnation joins the next epoch
  CHECK(epochs_joined("b") == std::vector<std::uint64_t>{2, 3});
  CHECK(routable("b"));
}

TEST_CASE_FIXTURE(nccl_fixture, "coordinator nccl: epochs start above the base, so a restarted coordinator's are newer") {
  auto c = nccl_config();
  c.nccl_epoch_base = 5000;
  start_nccl(c);
  add_engine("a");
  CHECK(epochs_joined("a") == std::vector<std::uint64_t>{5001});
  // Deployments take the wall clock's milliseconds.
  const auto before = static_cast<std::uint64_t>(
    std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  CHECK(coordinator_config_from(test::small_topology(2)).nccl_epoch_base >= before);
}

TEST_CASE_FIXTURE(nccl_fixture, "coordinator nccl: a trainer that keeps failing is asked ever less often, up to 30 s apart") {
  rec->nccl_id = nullptr;
  start_nccl(nccl_config());
  join_engine("a", act::answer);
  for (const char* wait : {"1000 ms", "2000 ms", "4000 ms", "8000 ms", "16000 ms", "30000 ms", "30000 ms"}) {
    CAPTURE(wait);
    CHECK(logged(std::string("the next in ") + wait));
    advance(30s);
  }
  CHECK(logged("(7 failed in a row)"));
}

TEST_CASE_FIXTURE(nccl_fixture, "coordinator nccl: a member that dies is named to every other member at once, once "
                                "per epoch, and the next boundary rebuilds without it") {
  start_nccl(nccl_config());
  for (const char* name : {"a", "b", "c", "d"})
    add_engine(name);
  REQUIRE(status().nccl_epoch == 4);
  REQUIRE(status().nccl_healthy);
  // Engine b's process dies: the trainer, a, c and d hear it in epoch 4,
  // so their waits on b abort now instead of at their deadlines.
  kill(engines["b"]);
  const std::vector<std::pair<std::uint64_t, std::string>> b_died{{4, "engine b"}};
  CHECK(rec->nccl_dead == b_died);
  for (const char* name : {"a", "c", "d"}) {
    CAPTURE(name);
    CHECK(engines[name].script->nccl_dead == b_died);
  }
  CHECK(engines["b"].script->nccl_dead.empty());
  CHECK(logged("engine b is down: told 4 member actor(s) of communicator epoch 4"));
  CHECK_FALSE(status().nccl_healthy);
  // d dies too (its node went with b's): every process holds a death of
  // epoch 4 already, so nobody is told again.
  kill(engines["d"]);
  CHECK(rec->nccl_dead == b_died);
  CHECK(engines["a"].script->nccl_dead == b_died);
  CHECK(logged("engine d is down in communicator epoch 4, whose members were told of a death already"));
  publish_through_trainer(status().version + 1);
  CHECK(members_of(rec->nccl_joins.back()) == "t0 a/0 c/0");
  CHECK(status().nccl_epoch == 5);
  CHECK(status().nccl_healthy);
  // An engine that was never a member (refused the rendezvous) is no news.
  auto& e = join_engine("e", act::fail);
  REQUIRE(engines["a"].script->nccl_dead.size() == 1);
  kill(e);
  CHECK(engines["a"].script->nccl_dead.size() == 1);
  // The trainer (rank 0) dies: the engines of the epoch hear it.
  const auto epoch = status().nccl_epoch;
  caf::anon_send_exit(trainer, caf::exit_reason::kill);
  run();
  const std::pair<std::uint64_t, std::string> rank_died{epoch, "trainer rank 0"};
  CHECK(engines["a"].script->nccl_dead.back() == rank_died);
  CHECK(engines["c"].script->nccl_dead.back() == rank_died);
}
