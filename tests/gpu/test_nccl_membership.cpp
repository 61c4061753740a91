// A process's members of the NCCL communicator: a rendezvous is joined
// whole or not at all, replaces the older epoch's links (aborted, so that
// nobody waits on them) and leaves out members it does not name.
#include "gpu/nccl_membership.hpp"

#include "tests/gpu/fake_nccl_world.hpp"

#include <doctest/doctest.h>

#include <stdexcept>

using namespace rlsync;
using gpu::comm_member;

namespace {

gpu::nccl_rendezvous rendezvous(std::uint64_t epoch, std::vector<comm_member> members) {
  gpu::nccl_rendezvous r;
  r.epoch = epoch;
  r.id.fill(0);
  r.id[0] = static_cast<std::uint8_t>(epoch);
  r.members = gpu::make_layout(epoch, std::move(members)).members;
  return r;
}

struct counting_factory {
  std::shared_ptr<test::fake_nccl_world> world = test::fake_nccl_world::make();
  int made = 0;
  int fail_at = -1; ///< the made-th link throws

  gpu::nccl_membership::link_factory factory() {
    return [this](const gpu::nccl_id&, const gpu::comm_layout& layout, int rank) -> std::unique_ptr<gpu::p2p_link> {
      if (made++ == fail_at)
        throw gpu::gpu_error("cudaSetDevice: invalid device ordinal");
      return test::fake_nccl_world::join(world, layout, rank, 64);
    };
  }
};

const comm_member trainer0 = comm_member::trainer_rank(0);
const comm_member w0 = comm_member::worker("rollout-0", 0);
const comm_member w1 = comm_member::worker("rollout-0", 1);
const comm_member late = comm_member::worker("rollout-9", 0);

} // namespace

TEST_CASE("nccl membership: hosted members get links at their ranks, a member left out gets none") {
  counting_factory f;
  gpu::nccl_membership engines(f.factory());
  CHECK(engines.join(rendezvous(1, {trainer0, w0, w1}), {w0, w1, late}).empty());
  CHECK(engines.epoch() == 1);
  REQUIRE(engines.link(w0).get() != nullptr);
  CHECK(engines.link(w0)->rank() == 1);
  CHECK(engines.link(w1)->rank() == 2);
  CHECK(engines.link(w1)->layout().epoch == 1);
  CHECK(engines.link(late).get() == nullptr); // joins at the next boundary
  CHECK(engines.link(trainer0).get() == nullptr); // hosted elsewhere
}

TEST_CASE("nccl membership: a newer epoch replaces the links and aborts the old ones") {
  counting_factory f;
  gpu::nccl_membership engines(f.factory());
  REQUIRE(engines.join(rendezvous(1, {trainer0, w0, w1}), {w0, w1}).empty());
  auto held = engines.link(w1); // a puller mid-pull keeps its link
  // w1 died: the coordinator rebuilt without it.
  CHECK(engines.join(rendezvous(2, {trainer0, w0}), {w0, w1}).empty());
  CHECK(engines.epoch() == 2);
  CHECK(engines.link(w0)->layout().epoch == 2);
  CHECK(engines.link(w1).get() == nullptr);
  CHECK(f.world->aborted(1, 1) == 1);
  CHECK(f.world->aborted(1, 2) == 1);
  std::string why;
  CHECK(held->poll(why) == gpu::comm_poll::failed); // never a hang for whoever still holds it
  CHECK(f.world->aborted(2, 1) == 0);
}

TEST_CASE("nccl membership: a stale, empty or disordered rendezvous changes nothing") {
  counting_factory f;
  gpu::nccl_membership engines(f.factory());
  REQUIRE(engines.join(rendezvous(3, {trainer0, w0}), {w0}).empty());
  auto before = engines.link(w0);
  CHECK(engines.join(rendezvous(3, {trainer0, w0}), {w0}).find("stale rendezvous") != std::string::npos);
  CHECK(engines.join(rendezvous(2, {trainer0, w0}), {w0}).find("stale rendezvous") != std::string::npos);
  auto empty_id = rendezvous(4, {trainer0, w0});
  empty_id.id.fill(0);
  CHECK(engines.join(empty_id, {w0}).find("empty NCCL id") != std::string::npos);
  auto disordered = rendezvous(4, {trainer0, w0});
  std::swap(disordered.members[0], disordered.members[1]);
  CHECK(engines.join(disordered, {w0}).find("bad rendezvous") != std::string::npos);
  CHECK(engines.epoch() == 3);
  CHECK(engines.link(w0).get() == before.get());
  CHECK(f.made == 1);
}

TEST_CASE("nccl membership: a link that cannot start fails the whole join, the old epoch stays") {
  counting_factory f;
  gpu::nccl_membership engines(f.factory());
  REQUIRE(engines.join(rendezvous(1, {trainer0, w0, w1}), {w0, w1}).empty());
  f.fail_at = 3; // epoch 2's second link
  const auto why = engines.join(rendezvous(2, {trainer0, w0, w1}), {w0, w1});
  CHECK(why.find("joining epoch 2: cudaSetDevice: invalid device ordinal") != std::string::npos);
  CHECK(engines.epoch() == 1);
  CHECK(engines.link(w0)->layout().epoch == 1);
  CHECK(f.world->aborted(2, 1) == 1); // epoch 2's first link, started and then given up
  CHECK(f.world->aborted(1, 1) == 0);
}

TEST_CASE("nccl membership: leaving aborts every link and keeps the epoch") {
  counting_factory f;
  gpu::nccl_membership engines(f.factory());
  REQUIRE(engines.join(rendezvous(5, {trainer0, w0}), {w0, trainer0}).empty());
  engines.leave();
  CHECK(engines.link(w0).get() == nullptr);
  CHECK(engines.link(trainer0).get() == nullptr);
  CHECK(f.world->aborted(5, 0) == 1);
  CHECK(f.world->aborted(5, 1) == 1);
  CHECK(engines.epoch() == 5);
  CHECK(engines.join(rendezvous(5, {trainer0, w0}), {w0}).find("stale") != std::string::npos);
}

TEST_CASE("nccl membership: the actors of one process each join the epoch for their own members") {
  counting_factory f;
  gpu::nccl_membership process(f.factory());
  const comm_member rank1 = comm_member::trainer_rank(1);
  const auto r = rendezvous(1, {trainer0, rank1, w0});
  CHECK(process.join(r, {trainer0}).empty()); // trainer rank 0's actor
  CHECK(process.join(r, {rank1}).empty());    // rank 1's, in the same process
  CHECK(process.link(trainer0)->rank() == 0);
  CHECK(process.link(rank1)->rank() == 1);
  CHECK(f.world->aborted(1, 0) == 0); // the second join added, it did not replace
  CHECK(process.join(r, {rank1}).find("epoch 1 already joined by trainer rank 1") != std::string::npos);
  auto other = rendezvous(1, {trainer0, rank1, w0});
  other.id[5] = 9;
  CHECK(process.join(other, {w0}).find("differs from the first") != std::string::npos);
  CHECK(process.link(w0).get() == nullptr);
  CHECK(f.made == 2);
}

TEST_CASE("nccl membership: root ids start each producer's own communicator, the workers in each, a rank in its own") {
  struct made {
    std::uint8_t id;
    gpu::comm_layout layout;
    int rank;
  };
  std::vector<made> log;
  std::vector<std::shared_ptr<test::fake_nccl_world>> worlds; // one per id: each communicator its own
  gpu::nccl_membership::link_factory factory = [&](const gpu::nccl_id& id, const gpu::comm_layout& layout,
                                                   int rank) -> std::unique_ptr<gpu::p2p_link> {
    log.push_back({id[0], layout, rank});
    worlds.push_back(test::fake_nccl_world::make());
    return test::fake_nccl_world::join(worlds.back(), layout, rank, 64);
  };
  const comm_member rank1 = comm_member::trainer_rank(1);
  auto r = rendezvous(1, {trainer0, rank1, w0, w1});
  r.root_ids.resize(2);
  r.root_ids[0].fill(0);
  r.root_ids[0][0] = 50; // trainer rank 0's communicator
  r.root_ids[1].fill(0);
  r.root_ids[1][0] = 51; // rank 1's

  gpu::nccl_membership engines(factory);
  REQUIRE(engines.join(r, {w0, w1}).empty());
  CHECK(log.size() == 6); // two main links, and each worker in both producers' communicators
  for (int producer : {0, 1}) {
    CAPTURE(producer);
    auto a = engines.root_link(w0, producer), b = engines.root_link(w1, producer);
    REQUIRE(a.get() != nullptr);
    REQUIRE(b.get() != nullptr);
    CHECK(a->rank() == 1);
    CHECK(b->rank() == 2);
    CHECK(a->layout().members
          == std::vector<comm_member>{comm_member::trainer_rank(producer), w0, w1});
    CHECK(a->layout().epoch == 1);
  }
  for (const auto& m : log)
    if (m.layout.members.size() == 3) // a producer's own: made from that producer's id
      CHECK(m.id == (m.layout.members.front() == trainer0 ? 50 : 51));
  CHECK(engines.root_link(w0, 2).get() == nullptr);
  CHECK(engines.link(w0)->rank() == 2); // the main communicator as before

  gpu::nccl_membership trainer(factory);
  log.clear();
  REQUIRE(trainer.join(r, {rank1}).empty());
  CHECK(log.size() == 2); // its main link, and the root of its own communicator only
  REQUIRE(trainer.root_link(rank1, 1).get() != nullptr);
  CHECK(trainer.root_link(rank1, 1)->rank() == 0);
  CHECK(trainer.root_link(rank1, 0).get() == nullptr);

  // A newer epoch, or leaving, aborts them with the rest.
  auto held = engines.root_link(w1, 1);
  REQUIRE(engines.join(rendezvous(2, {trainer0, w0}), {w0, w1}).empty());
  CHECK(engines.root_link(w1, 1).get() == nullptr);
  CHECK(engines.root_link(w0, 0).get() == nullptr); // epoch 2 has no root ids
  std::string why;
  CHECK(held->poll(why) == gpu::comm_poll::failed);
  auto own = trainer.root_link(rank1, 1);
  trainer.leave();
  CHECK(trainer.root_link(rank1, 1).get() == nullptr);
  CHECK(own->poll(why) == gpu::comm_poll::failed);
  // The same epoch with other root ids is a different rendezvous.
  gpu::nccl_membership again(factory);
  REQUIRE(again.join(r, {w0}).empty());
  auto other = r;
  other.root_ids[1][1] = 3;
  CHECK(again.join(other, {w1}).find("differs from the first") != std::string::npos);
}

TEST_CASE("nccl membership: a member the coordinator saw die aborts the waits of its epoch, not a later one's") {
  counting_factory f;
  auto engines = std::make_shared<gpu::nccl_membership>(f.factory());
  const auto hooks = gpu::dead_member_hooks(engines);
  REQUIRE(hooks.dead_member);
  CHECK_FALSE(hooks.dead_member().has_value());
  CHECK_FALSE(engines->mark_dead(1, "engine rollout-1")); // nothing joined yet: stale news
  REQUIRE(engines->join(rendezvous(1, {trainer0, w0, w1}), {w0, w1}).empty());
  CHECK_FALSE(engines->mark_dead(2, "engine rollout-1")); // not the epoch held
  CHECK_FALSE(hooks.dead_member().has_value());

  // A receive the trainer never matches would wait out its deadline (an
  // hour here); once the coordinator says a member died it aborts at its
  // next poll, and the link with it.
  auto link = engines->link(w0);
  REQUIRE(link.get() != nullptr);
  link->recv(16, 0);
  CHECK(engines->mark_dead(1, "engine rollout-1"));
  CHECK(engines->mark_dead(1, "trainer rank 0")); // the first named is kept
  REQUIRE(hooks.dead_member().has_value());
  CHECK(hooks.dead_member()->find("engine rollout-1 died") != std::string::npos);
  const auto started = gpu::clock::now();
  const auto out = gpu::wait_for(*link, started + std::chrono::hours(1), "receive of group 0", hooks);
  CHECK(out.result == gpu::wait_outcome::kind::peer_dead);
  CHECK(out.why.find("engine rollout-1") != std::string::npos);
  CHECK(gpu::clock::now() - started < std::chrono::minutes(1));
  CHECK(f.world->aborted(1, 1) == 1);

  // The next epoch is built without the dead: its waits are not aborted.
  REQUIRE(engines->join(rendezvous(2, {trainer0, w0}), {w0, w1}).empty());
  CHECK_FALSE(hooks.dead_member().has_value());
  CHECK_FALSE(engines->mark_dead(1, "engine rollout-1")); // late news of the old epoch
  CHECK_FALSE(hooks.dead_member().has_value());
  // Hooks outliving their membership ask nobody.
  engines.reset();
  CHECK_FALSE(hooks.dead_member().has_value());
}
