// The cuda_ipc producer over host memory: slots per consumer, sessions that
// begin at chunk 0 and ack as they go, refusals, and slot reuse.
#include "gpu/ipc_producer.hpp"

#include "tests/gpu/fake_ipc_memory.hpp"

#include <doctest/doctest.h>

#include <numeric>
#include <string>
#include <vector>

using namespace rlsync;

namespace {

std::vector<std::uint8_t> pattern(std::size_t n, std::uint8_t seed) {
  std::vector<std::uint8_t> v(n);
  std::iota(v.begin(), v.end(), seed);
  return v;
}

std::vector<std::uint8_t> read_back(test::fake_ipc_memory& mem, const gpu::ipc_placement& p) {
  auto m = mem.map(p.handle, p.buffer_bytes);
  std::vector<std::uint8_t> out(p.bytes);
  m->read(p.offset, out.data(), out.size());
  return out;
}

} // namespace

TEST_CASE("ipc producer: each consumer reads its own chunks from its own slot of one exported buffer") {
  auto mem = std::make_shared<test::fake_ipc_memory>();
  gpu::ipc_producer producer(mem, 64, 2);
  auto a0 = pattern(40, 1), b0 = pattern(64, 100), a1 = pattern(8, 200);
  auto pa0 = producer.place("rollout-0/0", 0, 0, a0.data(), a0.size());
  auto pb0 = producer.place("rollout-0/1", 0, 0, b0.data(), b0.size());
  CHECK(pa0.handle == pb0.handle);
  CHECK(pa0.buffer_bytes == 128);
  CHECK(pa0.offset != pb0.offset);
  CHECK(pa0.session != pb0.session);
  CHECK(read_back(*mem, pa0) == a0);
  CHECK(read_back(*mem, pb0) == b0);
  auto pa1 = producer.place("rollout-0/0", pa0.session, 1, a1.data(), a1.size());
  CHECK(pa1.session == pa0.session);
  CHECK(pa1.chunk == 1);
  CHECK(pa1.offset == pa0.offset); // one slot per consumer, reused chunk after chunk
  CHECK(read_back(*mem, pa1) == a1);
  CHECK(read_back(*mem, pb0) == b0); // the other consumer's slot is untouched
  auto s = producer.stats();
  CHECK(mem->allocations == 1);
  CHECK(s.sessions == 2);
  CHECK(s.chunks == 3);
  CHECK(s.bytes == 112);
  CHECK(s.buffer_bytes == 128);
}

TEST_CASE("ipc producer: a chunk from device memory lays its pieces back to back, sized as any chunk") {
  auto mem = std::make_shared<test::fake_ipc_memory>();
  gpu::ipc_producer producer(mem, 64, 1);
  CHECK(producer.packer().get() == mem->packs.get()); // where the trainer keeps its copies of versions
  auto a = pattern(24, 1), b = pattern(16, 50), c = pattern(30, 90);
  auto p = producer.place_from_device("rollout-0/0", 0, 0, {{a.data(), a.size()}, {b.data(), b.size()}});
  auto both = a;
  both.insert(both.end(), b.begin(), b.end());
  CHECK(p.bytes == 40);
  CHECK(read_back(*mem, p) == both);
  CHECK_THROWS_WITH_AS(producer.place_from_device("rollout-0/0", p.session, 1, {{a.data(), a.size()}, {c.data(), c.size()}, {b.data(), b.size()}}),
                       "a chunk of more than 64 bytes does not fit an IPC slot of 64", std::runtime_error);
  auto next = producer.place_from_device("rollout-0/0", p.session, 1, {{c.data(), c.size()}});
  CHECK(read_back(*mem, next) == c);
}

TEST_CASE("ipc producer: requests out of order are refused and change nothing") {
  auto mem = std::make_shared<test::fake_ipc_memory>();
  gpu::ipc_producer producer(mem, 16, 1);
  auto b = pattern(16, 7);
  struct refusal {
    const char* name;
    std::uint64_t session_delta; // added to the open session; ~0: a made-up session
    std::uint32_t chunk;
    std::size_t bytes;
    const char* says;
  };
  auto p = producer.place("e/0", 0, 0, b.data(), b.size());
  const std::vector<refusal> cases = {
    {"chunk 0 naming a session", 1, 0, 16, "chunk 0 begins a session"},
    {"a chunk skipped", 0, 2, 16, "the next is 1"},
    {"another session", 5, 1, 16, "its session is"},
    {"larger than a slot", 0, 1, 17, "does not fit"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    auto session = c.chunk == 0 ? c.session_delta : p.session + c.session_delta;
    try {
      producer.place("e/0", session, c.chunk, b.data(), c.bytes);
      FAIL("accepted");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()).find(c.says) != std::string::npos);
    }
  }
  // None of them moved the session: chunk 1 of it is still next.
  auto p1 = producer.place("e/0", p.session, 1, b.data(), b.size());
  CHECK(p1.chunk == 1);
  CHECK_THROWS_WITH_AS(producer.place("nobody/0", 3, 1, b.data(), 1), doctest::Contains("has no session open"),
                       std::runtime_error);
}

TEST_CASE("ipc producer: a new chunk 0 ends the old session, a release frees the slot for another consumer") {
  auto mem = std::make_shared<test::fake_ipc_memory>();
  gpu::ipc_producer producer(mem, 8, 2);
  auto b = pattern(8, 3);
  auto first = producer.place("a/0", 0, 0, b.data(), b.size());
  auto again = producer.place("a/0", 0, 0, b.data(), b.size()); // a retry after a failed pull
  CHECK(again.session > first.session);
  CHECK(producer.stats().aborted == 1);
  CHECK_THROWS_AS(producer.place("a/0", first.session, 1, b.data(), b.size()), std::runtime_error);

  producer.place("b/0", 0, 0, b.data(), b.size());
  // Two slots, both in open sessions: a third consumer waits for one.
  CHECK_THROWS_WITH_AS(producer.place("c/0", 0, 0, b.data(), b.size()), doctest::Contains("open session"),
                       std::runtime_error);
  producer.release("a/0", first.session); // a stale release: ignored
  CHECK_THROWS_AS(producer.place("c/0", 0, 0, b.data(), b.size()), std::runtime_error);
  producer.release("a/0", again.session);
  auto c = producer.place("c/0", 0, 0, b.data(), b.size());
  CHECK(c.offset == again.offset); // a's slot
  CHECK(read_back(*mem, c) == b);
  // a is gone from the books: it has to begin again.
  CHECK_THROWS_AS(producer.place("a/0", again.session, 1, b.data(), b.size()), std::runtime_error);
}

TEST_CASE("ipc producer: sessions grow across producers, sizes are checked") {
  auto mem = std::make_shared<test::fake_ipc_memory>();
  auto b = pattern(4, 0);
  gpu::ipc_producer one(mem, 4, 1);
  auto s1 = one.place("a/0", 0, 0, b.data(), b.size()).session;
  gpu::ipc_producer restarted(mem, 4, 1);
  CHECK(restarted.place("a/0", 0, 0, b.data(), b.size()).session > s1);

  CHECK_THROWS_AS(gpu::ipc_producer(mem, 0, 1), std::invalid_argument);
  CHECK_THROWS_AS(gpu::ipc_producer(mem, 1, 0), std::invalid_argument);
  CHECK_THROWS_AS(gpu::ipc_producer(mem, SIZE_MAX / 2, 3), std::invalid_argument);
  CHECK_THROWS_AS(gpu::ipc_producer(nullptr, 1, 1), std::invalid_argument);
  // The buffer is made at construction: a device without the memory fails the node's start.
  const int before = mem->allocations;
  gpu::ipc_producer eager(mem, 1 << 20, 4);
  CHECK(eager.stats().buffer_bytes == 4u << 20);
  CHECK(mem->allocations == before + 1);
  mem->fail_allocations = true;
  CHECK_THROWS_AS(gpu::ipc_producer(mem, 1 << 20, 4), gpu::gpu_error);
}

TEST_CASE("ipc producer: a write the device fails ends the session, the consumer begins again") {
  auto mem = std::make_shared<test::fake_ipc_memory>();
  gpu::ipc_producer producer(mem, 8, 1);
  auto b = pattern(8, 9);
  auto first = producer.place("a/0", 0, 0, b.data(), b.size());
  mem->fail_writes = true;
  CHECK_THROWS_AS(producer.place("a/0", first.session, 1, b.data(), b.size()), gpu::gpu_error);
  CHECK(producer.stats().aborted == 1);
  mem->fail_writes = false;
  // Nothing of that session is awaited: the slot is free for another consumer, and a/0 begins anew.
  auto other = producer.place("b/0", 0, 0, b.data(), b.size());
  CHECK(read_back(*mem, other) == b);
  producer.release("b/0", other.session);
  CHECK(producer.place("a/0", 0, 0, b.data(), b.size()).session > first.session);
}
