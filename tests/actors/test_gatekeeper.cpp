// Authenticated membership: the gatekeeper's challenge-response, one-time
// challenges, refusals, and reading the cluster secret.
#include "actors/gatekeeper.hpp"
#include "tests/support/actor_fixture.hpp"

#include <cstdio>
#include <fstream>
#include <unistd.h>

using namespace rlsync;

namespace {

struct gatekeeper_fixture : test::actor_fixture {
  std::shared_ptr<admitted_nodes> admitted = std::make_shared<admitted_nodes>();
  std::vector<std::string> lines;
  gatekeeper_actor gate;

  gatekeeper_fixture() {
    gatekeeper_config cfg;
    cfg.secret = "s3cret";
    cfg.admitted = admitted;
    cfg.max_pending = 4;
    cfg.log = [this](const std::string& l) { lines.push_back(l); };
    gate = spawn(gatekeeper, cfg);
  }

  std::string hello(const std::string& node) {
    auto r = request<std::string>(gate, hello_atom::value, node);
    run();
    REQUIRE(*r);
    REQUIRE(**r);
    return ***r;
  }

  caf::expected<join_grant> admit(const std::string& node, const std::string& proof) {
    auto r = request<join_grant>(gate, admit_atom::value, node, proof);
    run();
    REQUIRE(*r);
    return **r;
  }
};

} // namespace

TEST_CASE_FIXTURE(gatekeeper_fixture, "a node that proves the secret is admitted, once per challenge") {
  CHECK(!admitted->contains(sys.node()));
  auto challenge = hello("engine-node-a");
  CHECK(challenge.size() == 64);
  auto proof = join_proof("s3cret", challenge, "engine-node-a");
  CHECK(admit("engine-node-a", proof));
  CHECK(admitted->contains(sys.node()));
  auto replay = admit("engine-node-a", proof);
  REQUIRE(!replay);
  CHECK(is(replay.error(), errc::unauthenticated));
  CHECK(hello("engine-node-a") != challenge); // fresh each time
}

TEST_CASE_FIXTURE(gatekeeper_fixture, "a wrong secret is refused, logged, and burns the challenge") {
  auto challenge = hello("intruder");
  auto wrong = admit("intruder", join_proof("guess", challenge, "intruder"));
  REQUIRE(!wrong);
  CHECK(is(wrong.error(), errc::unauthenticated));
  CHECK(!admitted->contains(sys.node()));
  REQUIRE(!lines.empty());
  CHECK(lines.back().find("refused intruder") != std::string::npos);
  // The right answer to the burnt challenge no longer works.
  CHECK(!admit("intruder", join_proof("s3cret", challenge, "intruder")));
}

TEST_CASE_FIXTURE(gatekeeper_fixture, "proofs are bound to the node name and to an issued challenge") {
  auto challenge = hello("a");
  CHECK(!admit("b", join_proof("s3cret", challenge, "b"))); // b was never challenged
  CHECK(!admit("a", join_proof("s3cret", "00ff", "a")));    // a challenge never issued
  CHECK(!admit("a", "not hex at all"));
  CHECK(!admitted->contains(sys.node()));
}

TEST_CASE_FIXTURE(gatekeeper_fixture, "outstanding challenges are bounded: the oldest go first") {
  auto first = hello("n0");
  for (int i = 1; i <= 4; ++i)
    hello("n" + std::to_string(i));
  CHECK(!admit("n0", join_proof("s3cret", first, "n0"))); // dropped by the bound of 4
  auto bad = request<std::string>(gate, hello_atom::value, std::string());
  run();
  CHECK(!**bad);
}

TEST_CASE("the cluster secret comes from a file or an environment variable, never silently empty") {
  auto path = "/tmp/rlsync-secret-" + std::to_string(::getpid());
  std::ofstream(path) << "from-file\n";
  CHECK(read_cluster_secret(path, "") == "from-file");
  std::ofstream(path) << "\n";
  CHECK_THROWS_WITH_AS(read_cluster_secret(path, ""), doctest::Contains("is empty"), std::runtime_error);
  std::remove(path.c_str());
  CHECK_THROWS_WITH_AS(read_cluster_secret(path, ""), doctest::Contains(path.c_str()), std::runtime_error);
  ::setenv("RLSYNC_TEST_SECRET", "from-env", 1);
  CHECK(read_cluster_secret("", "RLSYNC_TEST_SECRET") == "from-env");
  ::unsetenv("RLSYNC_TEST_SECRET");
  CHECK_THROWS_WITH_AS(read_cluster_secret("", "RLSYNC_TEST_SECRET"), doctest::Contains("RLSYNC_TEST_SECRET"),
                       std::runtime_error);
  CHECK(read_cluster_secret("", "").empty()); // no secret configured
}
