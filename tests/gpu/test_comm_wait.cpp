// The wait loop every NCCL wait goes through: done, failed, a dead member,
// the deadline; abort exactly once whenever it gives up; never a nap past
// the deadline.
#include "gpu/comm_wait.hpp"
#include "tests/gpu/fake_communicator.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <optional>

using namespace rlsync;
using namespace std::chrono_literals;
using gpu::comm_poll;
using kind = gpu::wait_outcome::kind;

TEST_CASE("wait_for: done after a few polls, without an abort") {
  test::fake_communicator c;
  c.script = {comm_poll::in_progress, comm_poll::in_progress, comm_poll::done};
  test::fake_clock clock;
  auto out = gpu::wait_for(c, clock.t + 1s, "init of epoch 1", clock.hooks());
  CHECK(out.ok());
  CHECK(out.why.empty());
  CHECK(c.polls == 3);
  CHECK(c.aborts == 0);
  CHECK(clock.naps.size() == 2);
}

TEST_CASE("wait_for: an asynchronous error aborts once and says what NCCL said") {
  test::fake_communicator c;
  c.script = {comm_poll::in_progress, comm_poll::failed};
  test::fake_clock clock;
  auto out = gpu::wait_for(c, clock.t + 1s, "broadcast of group 7", clock.hooks());
  CHECK(out.result == kind::failed);
  CHECK(out.why == "broadcast of group 7: unhandled system error: peer closed the connection");
  CHECK(c.aborts == 1);
}

TEST_CASE("wait_for: a member that dies mid-wait aborts the communicator at once") {
  test::fake_communicator c; // in progress forever: the dead peer never answers
  test::fake_clock clock;
  auto hooks = clock.hooks();
  int asked = 0;
  hooks.dead_member = [&]() -> std::optional<std::string> {
    return ++asked < 4 ? std::nullopt : std::optional<std::string>("engine rollout-1 worker 0");
  };
  auto out = gpu::wait_for(c, clock.t + 10s, "broadcast of group 2", hooks);
  CHECK(out.result == kind::peer_dead);
  CHECK(out.why == "broadcast of group 2: engine rollout-1 worker 0 died; aborted the communicator");
  CHECK(c.aborts == 1);
  CHECK(c.polls == 4);
}

TEST_CASE("wait_for: a peer that never answers is aborted at the deadline, and no nap overshoots it") {
  test::fake_communicator c;
  test::fake_clock clock;
  auto hooks = clock.hooks();
  hooks.poll_every = 300us;
  const auto deadline = clock.t + 1ms; // 300 + 300 + 300 + 100 us
  auto out = gpu::wait_for(c, deadline, "init of epoch 4", hooks);
  CHECK(out.result == kind::deadline);
  CHECK(out.why == "init of epoch 4: not done by the phase deadline; aborted the communicator");
  CHECK(c.aborts == 1);
  CHECK(clock.t == deadline);
  REQUIRE(clock.naps.size() == 4);
  CHECK(clock.naps.back() == 100us);
}

TEST_CASE("wait_for: a deadline already past still polls once, so finished work counts") {
  test::fake_communicator done;
  done.script = {comm_poll::done};
  test::fake_clock clock;
  CHECK(gpu::wait_for(done, clock.t - 1s, "finish", clock.hooks()).ok());
  test::fake_communicator stuck;
  auto out = gpu::wait_for(stuck, clock.t - 1s, "finish", clock.hooks());
  CHECK(out.result == kind::deadline);
  CHECK(stuck.polls == 1);
  CHECK(stuck.aborts == 1);
  CHECK(clock.naps.empty());
}

TEST_CASE("wait_for on the real clock returns by its deadline") {
  test::fake_communicator c;
  const auto start = gpu::clock::now();
  auto out = gpu::wait_for(c, start + 20ms, "init");
  CHECK(out.result == kind::deadline);
  CHECK(gpu::clock::now() >= start + 20ms);
  CHECK(c.aborts == 1);
}
