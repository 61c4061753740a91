// rlsync status: the fleet view from the coordinator's and router's statuses, its text and JSON.
#include "actors/jobs/status.hpp"
#include "actors/gatekeeper.hpp"
#include "actors/system_config.hpp"
#include "actors/tls.hpp"
#include "tests/support/impostor_gate.hpp"

#include <caf/send.hpp>
#include <doctest/doctest.h>

using namespace rlsync;
using namespace rlsync::jobs;

namespace {

engine_info member(const std::string& name, std::uint64_t version, bool dirty = false) {
  engine_info m;
  m.name = name;
  m.node = "n-" + name;
  m.version = version;
  m.dirty = dirty;
  m.incarnation = 1;
  return m;
}

} // namespace

TEST_CASE("status: each engine's state, row by row") {
  struct row {
    const char* what;
    engine_info m;
    bool routable, unreachable;
    const char* eviction;
    const char* state;
  };
  const std::vector<row> rows = {
    {"routable: serving", member("a", 3), true, false, "", "serving"},
    {"new, never synced", member("a", 0, true), false, false, "", "syncing"},
    {"evicted, clean", member("a", 2), false, false, "transfer: no answer within 100 ms", "evicted"},
    {"evicted mid-update: dirty", member("a", 2, true), false, false, "finish: boom", "dirty"},
    {"evicted once, serving again", member("a", 3), true, false, "pause: x", "serving"},
    {"silent: unreachable wins", member("a", 3), true, true, "", "unreachable"},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    coordinator_status c;
    c.members.push_back(r.m);
    if (r.routable)
      c.routable.push_back(r.m.name);
    if (r.unreachable)
      c.unreachable.push_back(r.m.name);
    if (*r.eviction)
      c.last_evictions[r.m.name] = r.eviction;
    auto v = fleet_view_of(c, std::nullopt);
    REQUIRE(v.engines.size() == 1);
    CHECK(v.engines[0].state == r.state);
    CHECK(v.engines[0].last_eviction == r.eviction);
    CHECK_FALSE(v.engines[0].outstanding);
  }
}

TEST_CASE("status: the fleet in text and JSON") {
  coordinator_status c;
  c.version = 4;
  c.rounds = 5;
  c.live = 2;
  c.members = {member("e1", 4), member("e0", 4), member("e2", 3, true)};
  c.routable = {"e0", "e1"};
  c.retired = {"e9"};
  c.last_evictions = {{"e2", "transfer: no answer within 60000 ms"}, {"e9", "pause: down"}};
  sync_report last;
  last.version = 4;
  last.engines_synced = 2;
  last.evicted = {"e2"};
  last.stall_ns = 3'000'000;
  last.transfer_ns = 2'000'000;
  last.bytes = 2'000'000;
  last.control_ns = 1'000'000;
  last.slowest_pull_ns = 1'500'000;
  last.slowest_queued_ns = 250'000;
  c.history = {sync_report{}, last};
  router_status r;
  r.routable = 2;
  r.queued = 1;
  r.outstanding = 3;
  r.outstanding_by_engine = {{"e0", 2}, {"e1", 1}};
  auto v = fleet_view_of(c, r);
  REQUIRE(v.engines.size() == 4); // sorted, the retired one by name only
  CHECK(v.engines[0].name == "e0");
  CHECK(v.engines[0].outstanding == std::optional<std::uint32_t>{2});
  CHECK(v.engines[2].name == "e2");
  CHECK(v.engines[2].state == "dirty");
  CHECK(v.engines[2].outstanding == std::optional<std::uint32_t>{0}); // the router has none out on it
  CHECK(v.engines[3].name == "e9");
  CHECK(v.engines[3].state == "retired");
  REQUIRE(v.last_round);
  CHECK(v.last_round->version == 4);

  auto text = fleet_text(v);
  CAPTURE(text);
  CHECK(text.find("version 4, 5 rounds, 2 of 4 engines live\n") == 0);
  CHECK(text.find("ENGINE  NODE  STATE    VERSION   OUTSTANDING  LAST EVICTION\n") != std::string::npos);
  CHECK(text.find("e0      n-e0  serving  4         2            -\n") != std::string::npos);
  CHECK(text.find("e2      n-e2  dirty    3         0            transfer: no answer within 60000 ms\n")
        != std::string::npos);
  CHECK(text.find("e9      -     retired  0         ?            pause: down\n") != std::string::npos); // no member: no router figure
  CHECK(text.find("last round: version 4, 2 engines synced, 1 evicted; stall 3.0 ms, transfer 2.0 ms, 2000000 bytes")
        != std::string::npos);
  CHECK(text.find("router: 2 routable, 1 queued, 3 outstanding") != std::string::npos);

  auto j = fleet_json(v);
  CHECK(j["version"] == 4);
  REQUIRE(j["engines"].size() == 4);
  CHECK(j["engines"][2]["state"] == "dirty");
  CHECK(j["engines"][2]["last_eviction"] == "transfer: no answer within 60000 ms");
  CHECK(j["engines"][0]["last_eviction"].is_null());
  CHECK(j["last_round"]["bytes"] == 2000000);
  CHECK(j["last_round"]["slowest_pull_ms"] == 1.5);
  CHECK(j["last_round"]["slowest_wait_ms"] == 0.0); // not measured
  CHECK(j["last_round"]["slowest_queued_ms"] == 0.25);
  CHECK(j["router"]["queued"] == 1);
  // Round-trips through text: what `--json` prints parses.
  CHECK(nlohmann::json::parse(j.dump(2))["engines"][3]["name"] == "e9");
  CHECK(text.find("nccl:") == std::string::npos); // no communicator: no line
  CHECK(j["nccl"].is_null());
}

TEST_CASE("status: the nccl communicator, when there is one") {
  coordinator_status c;
  c.nccl_epoch = 1733300000002;
  c.nccl_members = 5;
  c.nccl_rebuilds = 2;
  c.nccl_healthy = true;
  auto v = fleet_view_of(c, std::nullopt);
  CHECK(fleet_text(v).find("nccl: communicator epoch 1733300000002, 5 members, serving; 2 built\n")
        != std::string::npos);
  CHECK(fleet_json(v)["nccl"]["members"] == 5);
  c.nccl_healthy = false;
  CHECK(fleet_text(fleet_view_of(c, std::nullopt)).find("5 members, rebuilt at the next round") != std::string::npos);
}

TEST_CASE("status: no router, no round yet") {
  coordinator_status c;
  c.members = {member("a", 0, true)};
  auto v = fleet_view_of(c, std::nullopt);
  auto text = fleet_text(v);
  CHECK(text.find("last round: none yet\n") != std::string::npos);
  CHECK(text.find("router: did not answer\n") != std::string::npos);
  CHECK(text.find("a       n-a   syncing  0         ?") != std::string::npos);
  auto j = fleet_json(v);
  CHECK(j["router"].is_null());
  CHECK(j["last_round"].is_null());
  CHECK(j["engines"][0]["outstanding"].is_null());
}

TEST_CASE("status: a peer posing as the head, which cannot prove the node's secret, is refused") {
  system_config head_cfg;
  caf::actor_system head{head_cfg};
  auto fake = head.spawn(test::impostor_gate);
  auto port = publish_node(head, fake, 0, "127.0.0.1");
  REQUIRE(port);
  system_config cfg;
  caf::actor_system sys{cfg};
  std::string why;
  const status_target target{"127.0.0.1", *port, "w1", "w1's secret", std::chrono::milliseconds(5000)};
  CHECK_FALSE(fetch_fleet(sys, target, why));
  CHECK_MESSAGE(why.find("admitted node 'w1' without proving it holds that node's secret") != std::string::npos, why);
  caf::anon_send_exit(fake, caf::exit_reason::user_shutdown);
}
