// Authenticated membership: the gatekeeper's challenge-response as an actor,
// the admission bookkeeping behind it (one table row per rule: names,
// binding to the asking peer, per-node secrets, bounds, rate limits,
// expiry), the member secrets the head checks, and reading a secret file.
#include "actors/gatekeeper.hpp"
#include "runtime/base/version.hpp"
#include "runtime/config/topology.hpp"
#include "tests/support/actor_fixture.hpp"
#include "tests/support/scripted_router.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <unistd.h>

using namespace rlsync;

namespace {

struct gatekeeper_fixture : test::actor_fixture {
  std::shared_ptr<admitted_nodes> admitted = std::make_shared<admitted_nodes>();
  std::vector<std::string> lines;
  router_actor registered; ///< what current_router answers (a router registered from a member node)
  gatekeeper_actor gate;

  gatekeeper_fixture() {
    gatekeeper_config cfg;
    cfg.secrets = {{"engine-node-a", "s3cret"}, {"engine-node-b", "other"}};
    cfg.admitted = admitted;
    cfg.current_router = [this] { return registered; };
    cfg.log = [this](const std::string& l) { lines.push_back(l); };
    gate = spawn(gatekeeper, cfg);
  }

  caf::expected<std::string> hello(const std::string& node, const std::string& wire = wire_fingerprint()) {
    auto r = request<std::string>(gate, hello_atom::value, node, wire);
    run();
    REQUIRE(*r);
    return **r;
  }

  caf::expected<join_grant> admit(const std::string& node, const std::string& proof,
                                  const std::string& nonce = std::string(64, 'a')) {
    auto r = request<join_grant>(gate, admit_atom::value, node, proof, nonce);
    run();
    REQUIRE(*r);
    return **r;
  }
};

} // namespace

TEST_CASE_FIXTURE(gatekeeper_fixture, "a node that proves its secret is admitted, once per challenge") {
  CHECK(!admitted->contains(sys.node()));
  auto challenge = hello("engine-node-a");
  REQUIRE(challenge);
  CHECK(challenge->size() == 64);
  auto proof = join_proof("s3cret", *challenge, "engine-node-a");
  CHECK(admit("engine-node-a", proof));
  CHECK(admitted->contains(sys.node()));
  auto replay = admit("engine-node-a", proof);
  REQUIRE(!replay);
  CHECK(is(replay.error(), errc::unauthenticated));
  CHECK(*hello("engine-node-a") != *challenge); // fresh each time
}

TEST_CASE_FIXTURE(gatekeeper_fixture, "the head proves the node's secret over the node's nonce, and a bad nonce is refused first") {
  auto challenge = hello("engine-node-a");
  REQUIRE(challenge);
  const auto proof = join_proof("s3cret", *challenge, "engine-node-a");
  // A nonce that is no nonce is refused before the challenge is used up.
  for (const std::string bad : {std::string(), std::string(31, 'a'), std::string(129, 'a'), std::string(64, 'z')}) {
    CAPTURE(bad);
    auto refused = admit("engine-node-a", proof, bad);
    REQUIRE(!refused);
    CHECK(is(refused.error(), errc::malformed));
  }
  CHECK(!admitted->contains(sys.node()));
  const auto nonce = join_nonce();
  auto grant = admit("engine-node-a", proof, nonce);
  REQUIRE(grant);
  CHECK(head_proved("s3cret", *challenge, "engine-node-a", nonce, grant->head_proof));
  // Bound to this node's secret, this challenge, this name and this nonce.
  CHECK_FALSE(head_proved("other", *challenge, "engine-node-a", nonce, grant->head_proof));
  CHECK_FALSE(head_proved("s3cret", *hello("engine-node-a"), "engine-node-a", nonce, grant->head_proof));
  CHECK_FALSE(head_proved("s3cret", *challenge, "engine-node-b", nonce, grant->head_proof));
  CHECK_FALSE(head_proved("s3cret", *challenge, "engine-node-a", join_nonce(), grant->head_proof));
  CHECK_FALSE(head_proved("s3cret", *challenge, "engine-node-a", nonce, proof)); // the node's own proof is no head proof
  CHECK_FALSE(head_proved("s3cret", *challenge, "engine-node-a", nonce, ""));
}

TEST_CASE_FIXTURE(gatekeeper_fixture, "a stray error or a message it does not take leaves the gatekeeper admitting") {
  auto untyped = caf::actor_cast<caf::actor>(gate);
  // CAF's default for an error that answers no request ends the actor.
  tell(untyped, caf::make_error(caf::sec::runtime_error, "stray"));
  run();
  auto odd = request<std::string>(untyped, status_atom::value);
  run();
  REQUIRE(odd->has_value());
  REQUIRE_FALSE(**odd);
  CHECK((*odd)->error() == caf::sec::unexpected_message);
  const auto logged = [&](const std::string& what) {
    return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(what) != std::string::npos; });
  };
  CHECK(logged("gatekeeper: ignored a stray error message from "));
  CHECK(logged("gatekeeper: refused a message it does not take from "));
  // Still admitting.
  CHECK(admit("engine-node-a", join_proof("s3cret", *hello("engine-node-a"), "engine-node-a")));
}

TEST_CASE_FIXTURE(gatekeeper_fixture, "the grant names the router registered since when the head runs none") {
  auto first = admit("engine-node-a", join_proof("s3cret", *hello("engine-node-a"), "engine-node-a"));
  REQUIRE(first);
  CHECK(!first->router); // none yet
  registered = caf::actor_cast<router_actor>(
    spawn(test::scripted_router, std::make_shared<test::router_script>()));
  auto later = admit("engine-node-a", join_proof("s3cret", *hello("engine-node-a"), "engine-node-a")); // a rejoin
  REQUIRE(later);
  CHECK(later->router == registered);
}

TEST_CASE_FIXTURE(gatekeeper_fixture, "a node admitted under one name is refused under another, even with its proof") {
  REQUIRE(admit("engine-node-a", join_proof("s3cret", *hello("engine-node-a"), "engine-node-a")));
  CHECK(admitted->name_of(sys.node()) == std::optional<std::string>("engine-node-a"));
  // A shared secret would let it prove any member's name: one node id, one name.
  auto other = admit("engine-node-b", join_proof("other", *hello("engine-node-b"), "engine-node-b"));
  REQUIRE(!other);
  CHECK(is(other.error(), errc::unauthenticated));
  CHECK(sys.render(other.error()).find("this node was admitted as engine-node-a already") != std::string::npos);
  CHECK(admitted->name_of(sys.node()) == std::optional<std::string>("engine-node-a"));
  CHECK(lines.back().find("admitted as engine-node-a already") != std::string::npos);
}

TEST_CASE_FIXTURE(gatekeeper_fixture, "refusals: wrong secret, another node's secret, unknown names, all logged") {
  auto challenge = hello("engine-node-b");
  REQUIRE(challenge);
  // engine-node-a's secret does not admit engine-node-b.
  auto wrong = admit("engine-node-b", join_proof("s3cret", *challenge, "engine-node-b"));
  REQUIRE(!wrong);
  CHECK(is(wrong.error(), errc::unauthenticated));
  // The right answer to the burnt challenge no longer works.
  CHECK(!admit("engine-node-b", join_proof("other", *challenge, "engine-node-b")));
  CHECK(!admitted->contains(sys.node()));
  auto unknown = hello("intruder\x1b[2J");
  REQUIRE(!unknown);
  CHECK(is(unknown.error(), errc::unauthenticated));
  auto empty = hello("");
  REQUIRE(!empty);
  CHECK(is(empty.error(), errc::malformed));
  REQUIRE(lines.size() >= 3);
  CHECK(lines[0].find("refused engine-node-b") != std::string::npos);
  // A peer's text reaches the log escaped.
  bool escaped = false;
  for (auto& l : lines) {
    CHECK(l.find('\x1b') == std::string::npos);
    escaped |= l.find("intruder\\x1b[2J") != std::string::npos;
  }
  CHECK(escaped);
}

TEST_CASE_FIXTURE(gatekeeper_fixture, "a node of another build is refused at hello, both fingerprints named") {
  const std::string other = "0123456789abcdef";
  REQUIRE(other != wire_fingerprint());
  auto refused = hello("engine-node-a", other);
  REQUIRE(!refused);
  CHECK(is(refused.error(), errc::malformed));
  const auto why = sys.render(refused.error());
  CHECK(why.find("engine-node-a runs an rlsync build whose wire messages differ") != std::string::npos);
  CHECK(why.find(other) != std::string::npos);
  CHECK(why.find(wire_fingerprint()) != std::string::npos);
  CHECK(why.find("run one build on every node") != std::string::npos);
  REQUIRE(!lines.empty());
  CHECK(lines.back().find("another build's wire messages") != std::string::npos);
  // No challenge was issued: the same node of this build is admitted.
  auto challenge = hello("engine-node-a");
  REQUIRE(challenge);
  CHECK(admit("engine-node-a", join_proof("s3cret", *challenge, "engine-node-a")));
}

TEST_CASE("the wire fingerprint is 16 hex digits, the same every call") {
  const auto w = wire_fingerprint();
  CHECK(w.size() == 16);
  CHECK(w.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(w == wire_fingerprint());
}

TEST_CASE_FIXTURE(gatekeeper_fixture, "a flood of refusals is logged rate-limited") {
  for (int i = 0; i < 100; ++i)
    hello("nobody");
  CHECK(lines.size() <= 10);
}

namespace {

enum class op { hello, admit, advance };
// Which proof an admit carries: over the last challenge issued to
// (challenge_peer or the sender, node), keyed with the node's secret, a
// guessed one, or another node's; or over the first challenge issued; or empty.
enum class proof_kind { right, guessed, other_nodes_secret, first_challenge, empty };

struct step {
  op what;
  std::string peer, node;
  admission_verdict expected = admission_verdict::ok;
  proof_kind proof = proof_kind::right;
  std::string challenge_peer = {};
  int advance_ms = 0;
  std::string wire = "this-build"; ///< the fingerprint a hello carries (the control's own by default)
};

step hello(const std::string& peer, const std::string& node, admission_verdict v = admission_verdict::ok,
           const std::string& wire = "this-build") {
  return {op::hello, peer, node, v, proof_kind::right, "", 0, wire};
}
step admit(const std::string& peer, const std::string& node, admission_verdict v, proof_kind p = proof_kind::right,
           const std::string& challenge_peer = {}) {
  return {op::admit, peer, node, v, p, challenge_peer};
}
step advance(int ms) { return {op::advance, "", "", admission_verdict::ok, proof_kind::right, "", ms}; }

struct admission_row {
  const char* title;
  admission_limits limits;
  std::vector<step> steps;
};

admission_limits limits(std::size_t per_peer, std::size_t total, std::size_t burst, double per_second,
                        int ttl_ms = 30000, std::size_t max_peers = 1024) {
  admission_limits l;
  l.max_pending_per_peer = per_peer;
  l.max_pending = total;
  l.burst = burst;
  l.per_second = per_second;
  l.challenge_ttl = std::chrono::milliseconds(ttl_ms);
  l.max_peers = max_peers;
  return l;
}

using V = admission_verdict;
using P = proof_kind;

} // namespace

TEST_CASE("admission control: one row per rule") {
  const admission_limits defaults = limits(4, 64, 8, 2.0);
  const std::vector<admission_row> rows = {
    {"a right proof admits once", defaults,
     {hello("p1", "a"), admit("p1", "a", V::ok), admit("p1", "a", V::no_challenge)}},
    {"only member names get a challenge", defaults,
     {hello("p1", "head", V::unknown_node), hello("p1", "zz", V::unknown_node),
      admit("p1", "zz", V::unknown_node, P::guessed)}},
    {"a node of another build gets no challenge; one of this build does", defaults,
     {hello("p1", "a", V::other_build, "another-build"), admit("p1", "a", V::no_challenge),
      hello("p1", "a", V::other_build, ""), hello("p1", "a"), admit("p1", "a", V::ok)}},
    {"malformed names and proofs", defaults,
     {hello("p1", "", V::malformed), hello("p1", std::string(300, 'a'), V::malformed),
      hello("p1", "a", V::malformed, std::string(300, 'f')), hello("p1", "a"),
      admit("p1", "a", V::malformed, P::empty), admit("p1", "a", V::ok)}},
    {"a wrong proof burns the peer's challenges for that name", defaults,
     {hello("p1", "a"), hello("p1", "a"), admit("p1", "a", V::wrong_proof, P::guessed),
      admit("p1", "a", V::no_challenge)}},
    {"one member's secret does not admit another name", defaults,
     {hello("p1", "b"), admit("p1", "b", V::wrong_proof, P::other_nodes_secret)}},
    {"another peer's wrong proofs cannot burn a legitimate challenge", defaults,
     {hello("p1", "a"), admit("p2", "a", V::no_challenge, P::guessed), admit("p2", "a", V::no_challenge, P::guessed),
      hello("p2", "a"), admit("p2", "a", V::wrong_proof, P::guessed), admit("p1", "a", V::ok)}},
    {"a challenge answers only for the peer that asked", defaults,
     {hello("p1", "a"), admit("p2", "a", V::no_challenge, P::right, "p1"), admit("p1", "a", V::ok)}},
    {"a peer holds a few challenges: its own oldest goes first", limits(2, 64, 8, 2.0),
     {hello("p1", "a"), hello("p1", "a"), hello("p1", "a"), admit("p1", "a", V::wrong_proof, P::first_challenge)}},
    {"all peers together are bounded: busy, nobody's challenge evicted", limits(2, 3, 8, 2.0),
     {hello("p1", "a"), hello("p2", "a"), hello("p3", "b"), hello("p4", "a", V::busy), admit("p1", "a", V::ok),
      hello("p4", "a"), admit("p4", "a", V::ok)}},
    {"the rate limit applies before any work, per peer", limits(4, 64, 3, 1.0),
     {admit("p2", "a", V::no_challenge, P::guessed), admit("p2", "a", V::no_challenge, P::guessed),
      admit("p2", "a", V::no_challenge, P::guessed), admit("p2", "a", V::rate_limited, P::guessed),
      hello("p2", "a", V::rate_limited), hello("p1", "a"), advance(1000), hello("p2", "a"),
      hello("p2", "a", V::rate_limited), admit("p1", "a", V::ok)}},
    {"challenges expire", limits(4, 64, 8, 2.0, 1000),
     {hello("p1", "a"), advance(999), admit("p1", "a", V::ok), hello("p1", "a"), advance(1000),
      admit("p1", "a", V::no_challenge)}},
    {"expired challenges free the global bound", limits(1, 1, 8, 2.0, 1000),
     {hello("p1", "a"), hello("p2", "a", V::busy), advance(1000), hello("p2", "a"), admit("p2", "a", V::ok)}},
    {"rate-limit buckets are bounded: the least recently seen peer is forgotten", limits(4, 64, 1, 0.0, 30000, 2),
     {hello("p1", "a"), hello("p1", "a", V::rate_limited), hello("p2", "a"), hello("p3", "a"), hello("p1", "a"),
      hello("p3", "a", V::rate_limited)}},
  };
  const std::map<std::string, std::string> secrets = {{"a", "secret-a"}, {"b", "secret-b"}};
  for (const auto& row : rows) {
    CAPTURE(row.title);
    auto now = admission_control::clock::time_point{} + std::chrono::hours(1);
    admission_control control(secrets, row.limits, [&] { return now; }, "this-build");
    std::map<std::pair<std::string, std::string>, std::string> last, first;
    int index = 0;
    for (const auto& s : row.steps) {
      CAPTURE(index++);
      if (s.what == op::advance) {
        now += std::chrono::milliseconds(s.advance_ms);
        continue;
      }
      if (s.what == op::hello) {
        std::string challenge;
        CHECK(control.hello(s.peer, s.node, s.wire, challenge) == s.expected);
        if (s.expected == V::ok) {
          CHECK(challenge.size() == 64);
          last[{s.peer, s.node}] = challenge;
          first.emplace(std::make_pair(s.peer, s.node), challenge);
        }
        continue;
      }
      auto key = std::make_pair(s.challenge_peer.empty() ? s.peer : s.challenge_peer, s.node);
      std::string own = secrets.count(s.node) ? secrets.at(s.node) : "unknown";
      std::string proof;
      switch (s.proof) {
        case P::right:
          proof = join_proof(own, last[key], s.node);
          break;
        case P::guessed:
          proof = join_proof("guess", last[key], s.node);
          break;
        case P::other_nodes_secret:
          proof = join_proof(s.node == "a" ? secrets.at("b") : secrets.at("a"), last[key], s.node);
          break;
        case P::first_challenge:
          proof = join_proof(own, first[key], s.node);
          break;
        case P::empty:
          break;
      }
      CHECK(control.admit(s.peer, s.node, proof) == s.expected);
    }
    CHECK(control.pending() <= row.limits.max_pending);
  }
}

TEST_CASE("member secrets: member nodes only, each from its own file or all shared") {
  auto dir = "/tmp/rlsync-member-secrets-" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0700);
  for (auto node : {"w1", "w2"}) {
    auto path = dir + "/" + node + ".secret";
    std::ofstream(path) << "secret-of-" << node << "\n";
    ::chmod(path.c_str(), 0600);
  }
  auto t = parse_topology("name: t\nmodel: {synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, "
                          "intermediate_size: 128}}\nnodes: [{name: h, port: 4000}, {name: w1}, {name: w2}, {name: idle}]\n"
                          "cluster: {allow_insecure_network: true, secret_file: '" + dir + "/{node}.secret'}\n"
                          "trainer: {node: h}\nengines: [{name: e, node: h}, {name: f, node: w1}, {name: g, node: w2}]\n",
                          "t.yaml", "/");
  auto per_node = member_secrets(t, "h", "");
  CHECK(per_node == std::map<std::string, std::string>{{"w1", "secret-of-w1"}, {"w2", "secret-of-w2"}});
  auto shared = member_secrets(t, "h", "one", dir + "/w1.secret"); // an override without {node}: shared
  CHECK(shared == std::map<std::string, std::string>{{"w1", "one"}, {"w2", "one"}});
  std::remove((dir + "/w2.secret").c_str());
  CHECK_THROWS_WITH_AS(member_secrets(t, "h", ""), doctest::Contains("w2.secret"), std::runtime_error);
  std::remove((dir + "/w1.secret").c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("the cluster secret comes from a private regular file or an environment variable") {
  auto path = "/tmp/rlsync-secret-" + std::to_string(::getpid());
  std::ofstream(path) << "from-file\n";
  ::chmod(path.c_str(), 0600);
  CHECK(read_cluster_secret(path, "") == "from-file");
  struct {
    mode_t mode;
    bool accepted;
  } modes[] = {{0600, true}, {0400, true}, {0640, false}, {0604, false}, {0620, false}, {0602, false}, {0644, false}};
  for (auto m : modes) {
    CAPTURE(m.mode);
    ::chmod(path.c_str(), m.mode);
    if (m.accepted)
      CHECK(read_cluster_secret(path, "") == "from-file");
    else
      CHECK_THROWS_WITH_AS(read_cluster_secret(path, ""), doctest::Contains("accessible by group or others"),
                           std::runtime_error);
  }
  ::chmod(path.c_str(), 0600);
  std::ofstream(path) << std::string(4097, 'a');
  CHECK_THROWS_WITH_AS(read_cluster_secret(path, ""), doctest::Contains("larger than the limit of 4096 bytes"),
                       std::runtime_error);
  std::ofstream(path) << "\n";
  CHECK_THROWS_WITH_AS(read_cluster_secret(path, ""), doctest::Contains("is empty"), std::runtime_error);
  std::remove(path.c_str());
  CHECK_THROWS_WITH_AS(read_cluster_secret(path, ""), doctest::Contains(path.c_str()), std::runtime_error);
  ::mkdir(path.c_str(), 0700);
  CHECK_THROWS_WITH_AS(read_cluster_secret(path, ""), doctest::Contains("not a regular file"), std::runtime_error);
  ::rmdir(path.c_str());
  ::setenv("RLSYNC_TEST_SECRET", "from-env", 1);
  CHECK(read_cluster_secret("", "RLSYNC_TEST_SECRET") == "from-env");
  ::unsetenv("RLSYNC_TEST_SECRET");
  CHECK_THROWS_WITH_AS(read_cluster_secret("", "RLSYNC_TEST_SECRET"), doctest::Contains("RLSYNC_TEST_SECRET"),
                       std::runtime_error);
  CHECK(read_cluster_secret("", "").empty()); // no secret configured
}
