// Buckets for the CAF inline path: at most bucket_bytes each, checksummed,
// whole tensors kept whole when they fit, larger ones cut into pieces, and
// put back together byte for byte.
#include "runtime/base/checksum.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/transfer/bucket.hpp"
#include "runtime/transfer/packing.hpp"
#include "runtime/transfer/puller.hpp"

#include "tests/support/transfer_fixtures.hpp"

#include <doctest/doctest.h>

using namespace rlsync;
using namespace rlsync::transfer;
using rlsync::test::bytes_of;

TEST_CASE("bucketize: every bucket within the limit, checksummed, reassembled byte for byte") {
  const model_config c = test::small_model(2);
  auto src = test::small_source(c);
  auto s = src->produce_next();
  const auto& tensors = s->group(1); // the last group: a layer, the norm and lm_head
  std::uint64_t largest = 0;
  for (const auto& t : tensors)
    largest = std::max<std::uint64_t>(largest, t.size);
  for (std::uint64_t limit : {std::uint64_t(2), std::uint64_t(100), std::uint64_t(4096), largest - 2, largest, std::uint64_t(1) << 20}) {
    INFO("bucket_bytes " << limit);
    auto buckets = bucketize(7, 1, tensors, limit);
    REQUIRE(!buckets.empty());
    std::vector<tensor_spec> specs(tensors.begin(), tensors.end());
    bucket_assembler a(specs);
    std::uint64_t total = 0;
    for (const auto& b : buckets) {
      CHECK(b.version == 7);
      CHECK(b.group == 1);
      CHECK(b.data.size() <= limit);
      CHECK(!b.entries.empty());
      CHECK(check(b).empty());
      CHECK(verify_bucket(b));
      CHECK(b.checksum == checksum64(b.data.data(), b.data.size()));
      for (const auto& e : b.entries) {
        const tensor_view& t = s->at(e.name);
        if (e.bytes == t.size)
          CHECK(e.shape == t.shape); // whole tensors keep their shape
      }
      total += b.data.size();
      CHECK_FALSE(a.complete());
      a.add(b);
    }
    CHECK(total == s->group_bytes(1));
    CHECK(a.complete());
    CHECK(a.bytes_received() == total);
    auto out = a.tensors();
    REQUIRE(out.size() == tensors.size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      CHECK(out[i].name == tensors[i].name);
      CHECK(out[i].shape == tensors[i].shape);
      CHECK(bytes_of(out[i]) == bytes_of(tensors[i]));
    }
    if (limit >= largest) // every tensor fits a bucket: nothing is cut
      for (const auto& b : buckets)
        for (const auto& e : b.entries)
          CHECK(e.tensor_offset == 0);
  }
  CHECK_THROWS_AS(bucketize(1, 1, tensors, 1), std::invalid_argument); // below one bf16 element
}

TEST_CASE("bucketize_packed carries one worker's packed group") {
  const model_config c = test::small_model(2);
  auto src = test::small_source(c);
  auto s = src->produce_next();
  auto plan = std::make_shared<const plan::worker_plan>(engine::make_plan(c, 2, 1, dtype::bf16));
  plan::grouped_plan gp(c, plan);
  std::vector<std::uint8_t> packed(static_cast<std::size_t>(gp.bytes(0)));
  pack_group(gp, 0, *s, packed.data());
  auto buckets = bucketize_packed(3, 0, dtype::bf16, packed.data(), packed.size(), 1000);
  bucket_assembler a({tensor_spec{packed_entry_name, dtype::bf16,
                                  {static_cast<std::int64_t>(packed.size() / 2)}}});
  for (const auto& b : buckets) {
    CHECK(b.data.size() <= 1000);
    a.add(b);
  }
  REQUIRE(a.complete());
  CHECK(bytes_of(a.tensors().front()) == packed);
  CHECK_THROWS_AS(bucketize_packed(3, 0, dtype::bf16, packed.data(), 3, 1000), std::invalid_argument);
}

TEST_CASE("bucket_assembler refuses corrupt, unknown and repeated pieces") {
  const model_config c = test::small_model(2);
  auto src = test::small_source(c);
  auto s = src->produce_next();
  const auto& tensors = s->group(0);
  std::vector<tensor_spec> specs(tensors.begin(), tensors.end());
  auto buckets = bucketize(1, 0, tensors, 4096);
  REQUIRE(buckets.size() > 2);

  bucket_assembler a(specs);
  auto bad = buckets[1];
  bad.data[bad.data.size() / 2] ^= 1;
  try {
    a.add(bad);
    FAIL("a corrupt bucket was accepted");
  } catch (const transfer_error& e) {
    CHECK(e.failure == transfer_failure::checksum_mismatch);
  }
  CHECK(a.bytes_received() == 0); // nothing of it was kept

  a.add(buckets[0]);
  CHECK_THROWS_WITH_AS(a.add(buckets[0]), doctest::Contains("received twice"), std::invalid_argument);

  bucket_assembler other({specs.front()});
  CHECK_THROWS_WITH_AS(other.add(buckets.back()), doctest::Contains("unexpected tensor"), std::invalid_argument);
  CHECK_THROWS_AS(other.tensors(), std::logic_error);

  // One bucket that carries the same piece twice does not fill the tensor.
  bucket_assembler one({tensor_spec{"t", dtype::f32, {4}}});
  weight_bucket twice;
  twice.version = 1;
  twice.data.assign(16, 7);
  for (std::uint64_t at : {0, 8})
    twice.entries.push_back(bucket_entry{"t", static_cast<std::uint8_t>(dtype::f32), {2}, at, 8, 0});
  twice.checksum = checksum64(twice.data.data(), twice.data.size());
  CHECK_THROWS_WITH_AS(one.add(twice), doctest::Contains("bytes [0, +8) received twice"), std::invalid_argument);
  CHECK(one.bytes_received() == 0);
  CHECK_FALSE(one.complete());
}
