// The cuda_ipc backend's books: a producer's slots and acks across one
// session, abort and dead consumers; a consumer's mapping, chunk order and
// bounds against a producer that lies.
#include "gpu/ipc_session.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace rlsync::gpu;

TEST_CASE("ipc producer: two slots, a slot reused only once both consumers acked, then finish") {
  ipc_producer_session p(2);
  CHECK(p.free_slot() == std::nullopt); // nothing open
  CHECK(p.publish() == "no session is open");
  REQUIRE(p.begin(1, {"r0/0", "r1/0"}) == "");
  CHECK(p.begin(2, {"r0/0"}) == "session 1 is still open");

  CHECK(p.free_slot() == 0u);
  CHECK(p.publish() == ""); // chunk 0 in slot 0
  CHECK(p.free_slot() == 1u);
  CHECK(p.publish() == ""); // chunk 1 in slot 1
  CHECK(p.free_slot() == std::nullopt);
  CHECK(p.publish() == "the next slot still holds a chunk not yet acked");

  CHECK(p.ack(1, "r0/0", 0) == "");
  CHECK(p.free_slot() == std::nullopt); // r1/0 still reads slot 0
  CHECK(p.ack(1, "r0/0", 0) == "r0/0 acked chunk 0, which it does not hold");
  CHECK(p.ack(1, "r2/0", 0) == "r2/0 is not a consumer of session 1");
  CHECK(p.ack(1, "r1/0", 2) == "r1/0 acked chunk 2, which it does not hold");
  CHECK(p.finish() == "2 chunk(s) not acked, the first 0");
  CHECK(p.ack(1, "r1/0", 0) == "");
  CHECK(p.free_slot() == 0u); // chunk 2 reuses slot 0
  CHECK(p.next_chunk() == 2u);
  CHECK(p.ack(1, "r1/0", 1) == "");
  CHECK(p.ack(1, "r0/0", 1) == "");
  CHECK(p.outstanding() == 0u);
  CHECK(p.finish() == "");
  CHECK(!p.open());
  CHECK(p.begin(1, {"r0/0"}) == "session 1 is not newer than 1");
  CHECK(p.begin(2, {}) == "a session without consumers");
  CHECK(p.begin(2, {"r0/0"}) == "");
  CHECK(p.publish() == "");
  // A late ack of session 1 must not free session 2's slot.
  CHECK(p.ack(1, "r0/0", 0) == "r0/0 acked chunk 0 of session 1; session 2 is open");
  CHECK(p.ack(2, "r0/0", 0) == "");
}

TEST_CASE("ipc producer: acks out of order free a slot only once the chunk it held is acked") {
  ipc_producer_session p(2);
  REQUIRE(p.begin(1, {"a"}) == "");
  CHECK(p.publish() == ""); // chunk 0, slot 0
  CHECK(p.publish() == ""); // chunk 1, slot 1
  CHECK(p.ack(1, "a", 1) == "");
  CHECK(p.outstanding() == 1u);
  CHECK(p.free_slot() == std::nullopt); // chunk 2 would go to slot 0, which chunk 0 still holds
  CHECK(p.publish() == "the next slot still holds a chunk not yet acked");
  CHECK(p.ack(1, "a", 0) == "");
  CHECK(p.free_slot() == 0u);
  CHECK(p.publish() == ""); // chunk 2, slot 0
  CHECK(p.free_slot() == 1u); // chunk 3 into slot 1: chunk 1 was acked
}

TEST_CASE("ipc producer: a dead consumer's acks are not awaited, and abort releases everyone alive") {
  ipc_producer_session p(1);
  REQUIRE(p.begin(7, {"a", "b", "c"}) == "");
  CHECK(p.publish() == "");
  CHECK(p.ack(7, "a", 0) == "");
  CHECK(p.free_slot() == std::nullopt);
  p.consumer_gone("b");
  CHECK(p.free_slot() == std::nullopt); // c still reads
  p.consumer_gone("c");
  CHECK(p.free_slot() == 0u); // nobody alive holds chunk 0
  CHECK(p.ack(7, "b", 0) == "b is not a consumer of session 7");
  CHECK(p.publish() == "");
  CHECK(p.abort() == std::vector<std::string>{"a"});
  CHECK(!p.open());
  CHECK(p.outstanding() == 0u);
  CHECK(p.abort().empty()); // abort is idempotent
  REQUIRE(p.begin(8, {"a"}) == "");
  p.consumer_gone("a");
  CHECK(p.publish() == "every consumer is gone");
}

TEST_CASE("ipc consumer: map once per session, chunks in order and in bounds, replays refused") {
  ipc_consumer_session c;
  CHECK(c.chunk(1, 0, 0, 16, 64) == "chunk of session 1, which is not mapped");
  auto first = c.open(1);
  CHECK(first.error == "");
  CHECK(!first.unmap);
  CHECK(c.chunk(1, 0, 0, 64, 64) == "");
  CHECK(c.chunk(1, 0, 0, 64, 64) == "chunk 0 where 1 was next");
  CHECK(c.chunk(1, 1, 32, 33, 64) == "chunk 1 at [32, +33) lies outside the 64-byte buffer");
  CHECK(c.chunk(1, 1, ~std::uint64_t{0}, 2, 64).find("lies outside") != std::string::npos); // wraps
  CHECK(c.chunk(1, 1, 32, 32, 64) == "");
  CHECK(c.chunk(2, 2, 0, 8, 64) == "chunk of session 2, which is not mapped");

  // The producer died before closing session 1: session 2's handle comes,
  // and the old mapping must go first.
  auto second = c.open(2);
  CHECK(second.error == "");
  CHECK(second.unmap == 1u);
  CHECK(c.chunk(2, 0, 0, 8, 64) == ""); // chunk numbers restart per session
  CHECK(c.open(2).error == "session 2 is not newer than 2 (a replay)");
  CHECK(c.open(1).error == "session 1 is not newer than 2 (a replay)");
  CHECK(c.mapped() == 2u);
  CHECK(!c.close(1));
  CHECK(c.close(2));
  CHECK(!c.close(2));
  CHECK(!c.mapped());
}
