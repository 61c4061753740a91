// The one assembly of a head: its rule for the dtype every engine records
// its plans in (the head announces it to the other nodes in the join grant).
#include "actors/assembly/local_deployment.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include <doctest/doctest.h>

#include <optional>
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
  CHECK(process_incarnation() == process_incarnation()); // one per process
  CHECK(process_incarnation() > 0);
}
