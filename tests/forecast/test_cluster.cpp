// Reading a cluster description: what it resolves to, and every mistake
// refused with file:line:col.
#include "tests/forecast/forecast_fixtures.hpp"

#include <doctest/doctest.h>

using namespace rlsync;
using namespace rlsync::forecast;

TEST_CASE("cluster: a description resolves the trainer's dp and the engines' GPUs") {
  test::cluster_files files;
  const auto c = files.load(test::small_cluster("  - {name: e, replicas: 3, tp: 2, dp: 2, expert_parallel: true}\n",
                                                "transfer: {mode: broadcast, groups_in_flight: 4, pp_groups: parallel}\n"
                                                "sync: {wave_size: 2}\n"
                                                "published: {sharded_s: 1.5, source: somewhere}\n"));
  CHECK(c.name == "small");
  CHECK(c.trainer.dp == 1);
  CHECK(c.trainer.ranks() == 4);
  CHECK(c.engine_count() == 3);
  CHECK(c.engine_gpus() == 12);
  CHECK(c.engine_nodes() == 6);
  CHECK(c.fabric.nic_bytes_per_s == 10e9);
  CHECK(c.mode == plan_mode::broadcast);
  CHECK(c.groups_in_flight == 4);
  CHECK(c.pp_groups == pp_order::parallel);
  CHECK(c.wave_size == 2);
  REQUIRE(c.published.sharded);
  CHECK(*c.published.sharded == 1.5);
  CHECK(c.model.num_experts == 8);
}

TEST_CASE("cluster: every mistake is refused with file, line, column and field") {
  struct row {
    const char* what;
    std::string yaml;
    const char* message;
  };
  const std::string e = "  - {name: e, tp: 2}\n";
  const std::vector<row> table = {
    {"unknown key", test::small_cluster(e, "trnasfer: {}\n"), ":7:1: trnasfer: unknown key"},
    {"etp above 1", test::small_cluster(e).replace(test::small_cluster(e).find("ep: 2}"), 6, "ep: 2, etp: 2}"),
     "trainer.etp: only 1 is supported"},
    {"tp x pp not dividing the GPUs", test::small_cluster(e).replace(test::small_cluster(e).find("pp: 2"), 5, "pp: 3"),
     "trainer.tp: tp x pp (6) must divide"},
    {"ep not dividing a stage", test::small_cluster(e).replace(test::small_cluster(e).find("ep: 2"), 5, "ep: 4"),
     "trainer.ep: must divide"},
    {"engine tp not dividing the heads", test::small_cluster("  - {name: e, tp: 3}\n"), "engines[0].tp: must divide"},
    {"more workers than experts", test::small_cluster("  - {name: e, tp: 2, dp: 8, expert_parallel: true}\n"),
     "engines[0].dp: tp x dp (16) workers exceed the 8 experts"},
    {"waves larger than the fleet", test::small_cluster(e, "sync: {wave_size: 2}\n"),
     "sync.wave_size: more than the 1 engines"},
    {"a bandwidth of zero", test::small_cluster(e).replace(test::small_cluster(e).find("nic_gbytes_per_s: 10"), 20,
                                                           "nic_gbytes_per_s: 0"),
     "fabric.nic_gbytes_per_s: must be in (0,"},
    {"no engines", test::small_cluster("  []\n").replace(test::small_cluster("  []\n").find("engines:\n  []"), 13,
                                                         "engines: []"),
     "engines: at least one engine"},
    {"a mode that does not exist", test::small_cluster(e, "transfer: {mode: multicast}\n"),
     "transfer.mode: must be one of sharded, broadcast"},
    {"a missing config.json", test::small_cluster(e).replace(test::small_cluster(e).find("config.json"), 11, "nope.json"),
     "model.config:"},
    {"a negative published time", test::small_cluster(e, "published: {sharded_s: -1}\n"), "published.sharded_s: must be"},
    {"a calibration naming no figure", test::small_cluster(e, "published: {sharded_is_calibration: true}\n"),
     "published.sharded_is_calibration: names no figure"},
    {"too many engines", test::small_cluster("  - {name: e, tp: 1, replicas: 3000}\n  - {name: f, tp: 1, replicas: 3000}\n"),
     "engines: 6000 engine replicas, more than 4096"},
  };
  for (const auto& r : table) {
    const std::string what = r.what;
    CAPTURE(what);
    test::cluster_files files;
    const auto path = files.write(r.yaml);
    try {
      load_cluster(path);
      FAIL("accepted");
    } catch (const cluster_error& err) {
      const std::string all = err.what();
      CAPTURE(all);
      CHECK(all.find(r.message) != std::string::npos);
      CHECK(all.rfind(path + ":", 0) == 0);
    }
  }
}

TEST_CASE("cluster: a cluster whose planning would take hours is refused") {
  // 4096 experts over 4096 workers: each worker's plan is recorded and assigned
  // over the model's 12,000 tensors.
  test::cluster_files files(test::tiny_moe_config_with(4096));
  CHECK_THROWS_WITH_AS(files.load(test::small_cluster("  - {name: e, tp: 1, dp: 4096, expert_parallel: true}\n")),
                       doctest::Contains("engines: planning would record and assign"), cluster_error);
}

TEST_CASE("cluster: a file that is not there, or not YAML, is one clear error") {
  test::cluster_files files;
  CHECK_THROWS_WITH_AS(load_cluster(files.dir / "missing.yaml"), doctest::Contains("missing.yaml"), cluster_error);
  CHECK_THROWS_WITH_AS(files.load("name: [unclosed\n"), doctest::Contains("syntax error"), cluster_error);
  CHECK_THROWS_WITH_AS(files.load(""), doctest::Contains("the file is empty"), cluster_error);
}
