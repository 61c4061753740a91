// A trainer rank's nccl sender over the host-memory NCCL world: groups reach
// the workers that post receives; a worker that never does, a dead member,
// a size mismatch or a stop abort the link and refuse every send after.
#include "gpu/nccl_sender.hpp"

#include "tests/support/eventually.hpp"
#include "tests/gpu/fake_nccl_world.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <thread>

using namespace rlsync;
using namespace std::chrono_literals;
using gpu::comm_member;

namespace {

// NCCL rank 0: trainer rank 0; ranks 1 and 2: workers 0 and 1 of engine e.
gpu::comm_layout two_workers() {
  return gpu::make_layout(1, {comm_member::trainer_rank(0), comm_member::worker("e", 0), comm_member::worker("e", 1)});
}

std::shared_ptr<const std::vector<std::uint8_t>> bytes_of(std::size_t n, std::uint8_t seed) {
  auto v = std::make_shared<std::vector<std::uint8_t>>(n);
  std::iota(v->begin(), v->end(), seed);
  return v;
}

gpu::nccl_sender::job job_to(int peer, std::shared_ptr<const std::vector<std::uint8_t>> bytes,
                             gpu::clock::duration wait = 5s) {
  return {std::move(bytes), peer, gpu::clock::now() + wait, "group 0 to rank " + std::to_string(peer)};
}

// A worker's side: receive n bytes from rank 0 within `wait`; on failure,
// what the wait said (safe on any thread: it asserts nothing).
std::vector<std::uint8_t> receive(gpu::p2p_link& l, std::size_t n, gpu::clock::duration wait = 5s) {
  l.recv(n, 0);
  auto out = gpu::wait_for(l, gpu::clock::now() + wait, "receive");
  if (!out.ok())
    return std::vector<std::uint8_t>(out.why.begin(), out.why.end());
  std::vector<std::uint8_t> got(n);
  l.read(got.data(), n);
  return got;
}

using test::eventually;

} // namespace

TEST_CASE("nccl sender: each worker receives the bytes queued for it, in the order asked") {
  auto world = test::fake_nccl_world::make();
  gpu::nccl_sender sender(test::fake_nccl_world::join(world, two_workers(), 0, 1024), 8);
  auto w0 = test::fake_nccl_world::join(world, two_workers(), 1, 1024);
  auto w1 = test::fake_nccl_world::join(world, two_workers(), 2, 1024);
  const auto a = bytes_of(100, 1), b = bytes_of(200, 7), c = bytes_of(1024, 3);
  CHECK(sender.submit(job_to(1, a)).empty());
  CHECK(sender.submit(job_to(2, b)).empty());
  CHECK(sender.submit(job_to(1, c)).empty());
  std::vector<std::uint8_t> got_b;
  std::thread other([&] { got_b = receive(*w1, 200); });
  CHECK(receive(*w0, 100) == *a);
  CHECK(receive(*w0, 1024) == *c);
  other.join();
  CHECK(got_b == *b);
  CHECK(eventually([&] { return sender.sent() == 3; }));
  CHECK(sender.failure().empty());
}

TEST_CASE("nccl sender: a job filled in the link's staging (a pack on the device) reaches its worker") {
  auto world = test::fake_nccl_world::make();
  gpu::nccl_sender sender(test::fake_nccl_world::join(world, two_workers(), 0, 64), 4);
  auto w1 = test::fake_nccl_world::join(world, two_workers(), 2, 64);
  const auto expect = bytes_of(40, 9);
  auto filled = job_to(2, nullptr);
  filled.fill = [expect](void* staging) { std::copy(expect->begin(), expect->end(), static_cast<std::uint8_t*>(staging)); };
  filled.fill_bytes = expect->size();
  CHECK(sender.submit(filled).empty());
  CHECK(receive(*w1, 40) == *expect);
  CHECK(eventually([&] { return sender.sent() == 1; }));
  // Sized as any send; a fill that throws fails the link as a failed send does.
  auto too_big = filled;
  too_big.fill_bytes = 65;
  CHECK(sender.submit(too_big).find("outside a buffer of 64 bytes") != std::string::npos);
  auto failing = filled;
  failing.fill = [](void*) { throw gpu::gpu_error("a kernel failed"); };
  CHECK(sender.submit(failing).empty());
  CHECK(eventually([&] { return !sender.failure().empty(); }));
  CHECK(sender.failure().find("a kernel failed") != std::string::npos);
}

TEST_CASE("nccl sender: refuses what no send could carry, and a full queue") {
  auto world = test::fake_nccl_world::make();
  gpu::nccl_sender sender(test::fake_nccl_world::join(world, two_workers(), 0, 64), 1);
  CHECK(sender.submit(job_to(0, bytes_of(8, 0))).find("not another member") != std::string::npos);
  CHECK(sender.submit(job_to(3, bytes_of(8, 0))).find("not another member") != std::string::npos);
  CHECK(sender.submit(job_to(-1, bytes_of(8, 0))).find("not another member") != std::string::npos);
  CHECK(sender.submit(job_to(1, bytes_of(65, 0))).find("outside a buffer of 64 bytes") != std::string::npos);
  CHECK(sender.submit(job_to(1, nullptr)) == "no bytes to send");
  // One send in flight (posted, its worker not yet receiving), one queued: the next is refused.
  CHECK(sender.submit(job_to(1, bytes_of(8, 0))).empty());
  REQUIRE(eventually([&] { return world->unmatched() == 1; }));
  CHECK(sender.submit(job_to(2, bytes_of(8, 0))).empty());
  CHECK(sender.submit(job_to(2, bytes_of(8, 0))) == "the send queue is full or closed");
  auto w0 = test::fake_nccl_world::join(world, two_workers(), 1, 64);
  auto w1 = test::fake_nccl_world::join(world, two_workers(), 2, 64);
  CHECK(receive(*w0, 8) == *bytes_of(8, 0));
  CHECK(receive(*w1, 8) == *bytes_of(8, 0));
  CHECK(eventually([&] { return sender.sent() == 2; }));
}

TEST_CASE("nccl sender: a worker that never receives ends the link at the deadline, and every send after") {
  auto world = test::fake_nccl_world::make();
  gpu::nccl_sender sender(test::fake_nccl_world::join(world, two_workers(), 0, 64), 4);
  CHECK(sender.submit(job_to(1, bytes_of(8, 0), 30ms)).empty());
  REQUIRE(eventually([&] { return !sender.failure().empty(); }));
  CHECK(sender.failure().find("group 0 to rank 1: not done by the phase deadline") != std::string::npos);
  CHECK(world->aborted(1, 0) == 1);
  CHECK(world->unmatched() == 0); // the abort took the send back
  const auto refused = sender.submit(job_to(2, bytes_of(8, 0)));
  CHECK(refused.find("the communicator of epoch 1 failed") != std::string::npos);
  CHECK(refused.find("rebuilt at the next sync boundary") != std::string::npos);
  CHECK(sender.sent() == 0);
}

TEST_CASE("nccl sender: a send whose worker stopped waiting is dropped unposted, the link serves on") {
  auto world = test::fake_nccl_world::make();
  gpu::nccl_sender sender(test::fake_nccl_world::join(world, two_workers(), 0, 64), 4);
  CHECK(sender.submit(job_to(1, bytes_of(8, 0), -1s)).empty());
  REQUIRE(eventually([&] { return sender.expired() == 1; }));
  CHECK(world->unmatched() == 0); // never posted
  CHECK(sender.failure().empty());
  CHECK(world->aborted(1, 0) == 0);
  auto w0 = test::fake_nccl_world::join(world, two_workers(), 1, 64);
  CHECK(sender.submit(job_to(1, bytes_of(8, 3))).empty());
  CHECK(receive(*w0, 8) == *bytes_of(8, 3));
}

TEST_CASE("nccl sender: a member the coordinator declares dead aborts the send in flight") {
  auto world = test::fake_nccl_world::make();
  gpu::wait_hooks hooks;
  std::atomic<bool> dead{false};
  hooks.dead_member = [&]() -> std::optional<std::string> {
    return dead ? std::optional<std::string>("engine e worker 0") : std::nullopt;
  };
  gpu::nccl_sender sender(test::fake_nccl_world::join(world, two_workers(), 0, 64), 4, hooks);
  CHECK(sender.submit(job_to(1, bytes_of(8, 0), 60s)).empty());
  REQUIRE(eventually([&] { return world->unmatched() == 1; }));
  dead = true;
  REQUIRE(eventually([&] { return !sender.failure().empty(); }));
  CHECK(sender.failure().find("engine e worker 0 died") != std::string::npos);
}

TEST_CASE("nccl sender: a receive of another size fails both sides, as NCCL's truncation does") {
  auto world = test::fake_nccl_world::make();
  gpu::nccl_sender sender(test::fake_nccl_world::join(world, two_workers(), 0, 64), 4);
  auto w0 = test::fake_nccl_world::join(world, two_workers(), 1, 64);
  CHECK(sender.submit(job_to(1, bytes_of(16, 0))).empty());
  w0->recv(8, 0);
  auto out = gpu::wait_for(*w0, gpu::clock::now() + 5s, "receive");
  CHECK(out.result == gpu::wait_outcome::kind::failed);
  CHECK(out.why.find("truncated") != std::string::npos);
  REQUIRE(eventually([&] { return !sender.failure().empty(); }));
  CHECK(sender.failure().find("truncated") != std::string::npos);
}

TEST_CASE("nccl sender: stopping with a send in flight returns at the next poll, not at the deadline") {
  auto world = test::fake_nccl_world::make();
  auto sender = std::make_unique<gpu::nccl_sender>(test::fake_nccl_world::join(world, two_workers(), 0, 64), 4);
  CHECK(sender->submit(job_to(1, bytes_of(8, 0), 600s)).empty());
  REQUIRE(eventually([&] { return world->unmatched() == 1; }));
  CHECK(world->aborted(1, 0) == 0);
  sender.reset(); // would hang for 600 s if the stop were not polled
  CHECK(world->aborted(1, 0) == 1);
  CHECK(world->unmatched() == 0);
}

TEST_CASE("nccl link: a rank outside the layout is refused before NCCL is asked") {
  CHECK_THROWS_AS(gpu::nccl_link(gpu::nccl_id{}, two_workers(), 3, 0, 64), std::invalid_argument);
  CHECK_THROWS_AS(gpu::nccl_link(gpu::nccl_id{}, two_workers(), -1, 0, 64), std::invalid_argument);
}

namespace {

// A member's side of broadcast i of `n` bytes from rank 0; on failure, what the wait said.
std::vector<std::uint8_t> join_broadcast(gpu::p2p_link& l, std::size_t n, gpu::clock::duration wait = 5s) {
  l.broadcast(nullptr, n, 0);
  auto out = gpu::wait_for(l, gpu::clock::now() + wait, "broadcast");
  if (!out.ok())
    return std::vector<std::uint8_t>(out.why.begin(), out.why.end());
  std::vector<std::uint8_t> got(n);
  l.read(got.data(), n);
  return got;
}

} // namespace

namespace {

/// A root and two workers joining its broadcasts of three buckets, with
/// what the root's callbacks did, in order.
struct three_buckets {
  std::shared_ptr<test::fake_nccl_world> world = test::fake_nccl_world::make();
  gpu::nccl_sender sender{test::fake_nccl_world::join(world, two_workers(), 0, 1024), 8};
  std::shared_ptr<gpu::p2p_link> w0 = test::fake_nccl_world::join(world, two_workers(), 1, 1024);
  std::shared_ptr<gpu::p2p_link> w1 = test::fake_nccl_world::join(world, two_workers(), 2, 1024);
  const std::vector<std::shared_ptr<const std::vector<std::uint8_t>>> buckets = {bytes_of(100, 1), bytes_of(1024, 5),
                                                                                 bytes_of(7, 9)};
  std::mutex m;
  std::vector<std::string> events;

  void happened(std::string e) {
    std::lock_guard<std::mutex> lock(m);
    events.push_back(std::move(e));
  }
  gpu::nccl_sender::collective collective() const {
    gpu::nccl_sender::collective c;
    c.buckets = buckets.size();
    c.deadline = gpu::clock::now() + 5s;
    c.what = "a version";
    return c;
  }
  /// Both workers join every bucket; worker 0 only once `ready_first`
  /// events happened (what the root did before bucket 0 could complete).
  void receive_all(std::size_t ready_first) {
    std::vector<std::vector<std::uint8_t>> got1;
    std::thread other([&] {
      for (const auto& b : buckets)
        got1.push_back(join_broadcast(*w1, b->size()));
    });
    CHECK(eventually([&] {
      std::lock_guard<std::mutex> lock(m);
      return events.size() == ready_first;
    }));
    for (const auto& b : buckets)
      CHECK(join_broadcast(*w0, b->size()) == *b);
    other.join();
    for (std::size_t i = 0; i < buckets.size(); ++i)
      CHECK(got1[i] == *buckets[i]);
    CHECK(eventually([&] { return sender.broadcast() == 3; }));
    CHECK(sender.failure().empty());
    CHECK(world->open_broadcasts() == 0);
  }
};

} // namespace

TEST_CASE_FIXTURE(three_buckets, "nccl sender: a collective reaches every member bucket by bucket, the next packed while one is out") {
  auto c = collective();
  c.pack = [&](std::size_t i, std::vector<std::uint8_t>& out) {
    out = *buckets[i];
    happened("pack " + std::to_string(i));
  };
  REQUIRE(sender.submit(std::move(c)).empty());
  receive_all(2); // the root packed bucket 1 before bucket 0 could complete without worker 0
  CHECK(events == std::vector<std::string>{"pack 0", "pack 1", "pack 2"});
}

TEST_CASE_FIXTURE(three_buckets, "nccl sender: a filled collective writes each bucket into the staging in turn, the next prepared") {
  auto c = collective();
  for (const auto& b : buckets)
    c.fill_bytes.push_back(b->size());
  c.prepare = [&](std::size_t i) { happened("prepare " + std::to_string(i)); };
  c.fill = [&](std::size_t i, void* staging) {
    happened("fill " + std::to_string(i));
    std::memcpy(staging, buckets[i]->data(), buckets[i]->size());
  };
  // Sizes that do not match the buckets, or exceed the staging, are refused before anything moves.
  auto wrong = c;
  wrong.fill_bytes.pop_back();
  CHECK(sender.submit(wrong).find("needs the size of each of its 3 buckets") != std::string::npos);
  wrong = c;
  wrong.fill_bytes[1] = 1025;
  CHECK(sender.submit(wrong).find("bucket 1 of 1025 bytes exceeds the staging's 1024") != std::string::npos);
  REQUIRE(sender.submit(std::move(c)).empty());
  receive_all(3); // bucket 1 was prepared before bucket 0 could complete without worker 0
  CHECK(events == std::vector<std::string>{"prepare 0", "fill 0", "prepare 1", "fill 1", "prepare 2", "fill 2"});
}

TEST_CASE("nccl sender: a collective with a member missing ends at the deadline, a failed pack at once") {
  auto world = test::fake_nccl_world::make();
  auto w0 = test::fake_nccl_world::join(world, two_workers(), 1, 64);
  auto w1 = test::fake_nccl_world::join(world, two_workers(), 2, 64);
  {
    gpu::nccl_sender sender(test::fake_nccl_world::join(world, two_workers(), 0, 64), 8);
    gpu::nccl_sender::collective c;
    c.buckets = 1;
    c.pack = [](std::size_t, std::vector<std::uint8_t>& out) { out.assign(16, 3); };
    c.deadline = gpu::clock::now() + 300ms;
    c.what = "a version";
    REQUIRE(sender.submit(std::move(c)).empty());
    const auto got = join_broadcast(*w0, 16, 1s); // worker 1 never joins
    CHECK(std::string(got.begin(), got.end()).find("aborted") != std::string::npos);
    CHECK(eventually([&] { return !sender.failure().empty(); }));
    CHECK(sender.failure().find("not done by the phase deadline") != std::string::npos);
    CHECK(sender.submit(gpu::nccl_sender::collective{1, c.pack, gpu::clock::now() + 1s, "again"}).find("failed")
          != std::string::npos);
  }
  // Epoch 2: bucket 1 cannot be packed while bucket 0 is out. The root's
  // link is aborted; no member gets the whole version (as on NCCL, the
  // others' waits end at their own deadlines).
  auto layout2 = two_workers();
  layout2.epoch = 2;
  auto v0 = test::fake_nccl_world::join(world, layout2, 1, 64);
  auto v1 = test::fake_nccl_world::join(world, layout2, 2, 64);
  gpu::nccl_sender sender(test::fake_nccl_world::join(world, layout2, 0, 64), 8);
  gpu::nccl_sender::collective c;
  c.buckets = 2;
  c.pack = [](std::size_t i, std::vector<std::uint8_t>& out) {
    if (i == 1)
      throw std::runtime_error("tensor 'x' is gone");
    out.assign(16, 1);
  };
  c.deadline = gpu::clock::now() + 30s;
  c.what = "version 4";
  REQUIRE(sender.submit(std::move(c)).empty());
  auto whole_version = [](gpu::p2p_link& l) {
    return join_broadcast(l, 16, 500ms) == std::vector<std::uint8_t>(16, 1)
           && join_broadcast(l, 16, 500ms) == std::vector<std::uint8_t>(16, 1);
  };
  bool second = true;
  std::thread other([&] { second = whole_version(*v1); });
  CHECK_FALSE(whole_version(*v0));
  other.join();
  CHECK_FALSE(second);
  CHECK(eventually([&] { return sender.failure().find("packing bucket 1: tensor 'x' is gone") != std::string::npos; }));
}

TEST_CASE("nccl link: a broadcast names a member as root, the root passes bytes, within the staging") {
  auto world = test::fake_nccl_world::make();
  auto root = test::fake_nccl_world::join(world, two_workers(), 0, 64);
  auto w0 = test::fake_nccl_world::join(world, two_workers(), 1, 64);
  const std::uint8_t b[65] = {};
  CHECK_THROWS_WITH_AS(w0->broadcast(nullptr, 8, 3), doctest::Contains("root 3 is no member"), gpu::gpu_error);
  CHECK_THROWS_WITH_AS(root->broadcast(nullptr, 8, 0), doctest::Contains("the root passes no bytes"), gpu::gpu_error);
  CHECK_THROWS_AS(root->broadcast(b, 65, 0), std::out_of_range);
}
