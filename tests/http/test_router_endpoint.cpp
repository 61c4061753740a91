// The fleet's HTTP endpoint (router.http_port) in front of a whole
// in-process deployment: completions through the router with their weight
// versions, streaming, /health, /v1/models, /metrics, the bearer token, a
// restarted router, and a client that hangs up ending its engine request.
#include "actors/assembly/local_deployment.hpp"
#include "actors/system_config.hpp"
#include "runtime/http/client.hpp"
#include "tests/support/scratch_dir.hpp"

#include <caf/scoped_actor.hpp>
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

using namespace rlsync;
using nlohmann::json;

namespace {

std::string topology_text(const std::string& extra_cluster = "") {
  return "name: fleet\n"
         "model: {synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, intermediate_size: 128}}\n"
         "nodes: [{name: a}]\n"
         "cluster: {" + extra_cluster + "}\n"
         "trainer: {node: a, step_time_ms: 3600000}\n"
         "engines: [{name: e, node: a, replicas: 2}]\n"
         "router: {node: a, http_port: 0}\n";
}

/// Stops a deployment's actors (the endpoint first) when it goes, however
/// the test ends: the actor system's destructor would wait for them forever.
struct deployment_stopper {
  caf::actor_system& sys;
  local_deployment& d;
  ~deployment_stopper() {
    if (d.http)
      d.http->stop();
    stop_and_await(sys, d.actors());
  }
};

/// A deployment with its endpoint, synced once; stops everything on exit.
struct fleet {
  system_config cfg;
  caf::actor_system sys{cfg};
  topology t;
  local_deployment d;
  deployment_stopper stopper{sys, d}; // destroyed first, also when the constructor throws
  std::uint64_t version = 0;

  explicit fleet(const std::string& text) {
    t = parse_topology(text, "t.yaml", "/tmp");
    d = deploy_local(sys, t, {});
    caf::scoped_actor self{sys};
    std::string failure;
    // The trainer publishes its first version as it starts; a round before it finds nothing to sync.
    for (int attempt = 0; attempt < 100 && version == 0; ++attempt) {
      self->request(d.coordinator, std::chrono::seconds(30), sync_atom::value)
        .receive([&](const sync_report& r) { version = r.version; }, [&](caf::error& e) { failure = sys.render(e); });
      if (version == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    REQUIRE_MESSAGE(version > 0, failure);
  }

  http::client client() const { return http::client("127.0.0.1", d.http->port(), std::chrono::seconds(20)); }
};

http::client_request completion(const json& body) {
  return {"POST", "/v1/completions", body.dump(), "application/json", {}};
}

} // namespace

TEST_CASE("completions through the router carry the version that produced them") {
  fleet f(topology_text());
  REQUIRE(f.d.http);
  CHECK(f.d.http->url() == "http://127.0.0.1:" + std::to_string(f.d.http->port()));
  auto c = f.client();
  auto r = c.send(completion({{"model", "fleet"}, {"prompt", {1, 2, 3}}, {"max_tokens", 5}, {"n", 2},
                              {"temperature", 0}, {"return_token_ids", true}}));
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto body = json::parse(r.body);
  REQUIRE(body["choices"].size() == 2);
  for (const auto& choice : body["choices"]) {
    CHECK(choice["token_ids"].size() == 5);
    REQUIRE(choice["weight_versions"].size() == 1);
    CHECK(choice["weight_versions"][0]["version"] == std::to_string(f.version));
    CHECK(choice["weight_versions"][0]["start"] == 0);
    CHECK(choice["weight_versions"][0]["end"] == 5);
  }
  // Greedy: both choices agree, whichever engine each went to (both hold the same version).
  CHECK(body["choices"][0]["token_ids"] == body["choices"][1]["token_ids"]);

  // The same request streamed: the same tokens, then [DONE].
  auto head = c.open_stream(completion({{"model", "fleet"}, {"prompt", {1, 2, 3}}, {"max_tokens", 5},
                                        {"temperature", 0}, {"stream", true}, {"return_token_ids", true}}));
  REQUIRE(head.status == 200);
  json streamed = json::array();
  bool done = false;
  while (auto ev = c.next_event()) {
    if (*ev == "[DONE]") {
      done = true;
      continue;
    }
    auto chunk = json::parse(*ev);
    for (const auto& ch : chunk["choices"])
      for (const auto& tok : ch.value("token_ids", json::array()))
        streamed.push_back(tok);
  }
  CHECK(done);
  CHECK(streamed == body["choices"][0]["token_ids"]);

  // Another model name: 404, as vLLM answers.
  CHECK(c.send(completion({{"model", "other"}, {"prompt", {1}}, {"max_tokens", 1}})).status == 404);
}

TEST_CASE("health, models and the node's metrics") {
  fleet f(topology_text());
  auto c = f.client();
  CHECK(c.send({"GET", "/health", "", "", {}}).status == 200);
  auto models = c.send({"GET", "/v1/models", "", "", {}});
  REQUIRE(models.status == 200);
  auto m = json::parse(models.body);
  CHECK(m["data"][0]["id"] == "fleet");
  CHECK(m["data"][0]["max_model_len"] == f.t.model.config.max_position_embeddings);
  REQUIRE(c.send(completion({{"model", "fleet"}, {"prompt", {4, 5}}, {"max_tokens", 2}})).status == 200);
  auto metrics = c.send({"GET", "/metrics", "", "", {}});
  REQUIRE(metrics.status == 200);
  CHECK(metrics.body.find("rlsync_router_completed_total 1") != std::string::npos);
  CHECK(metrics.body.find("rlsync_sync_rounds_total") != std::string::npos);
  CHECK(metrics.body.find("vllm:generation_tokens_total{engine=\"e-0\"}") != std::string::npos);

  // A router that does not answer: /health says so.
  caf::anon_send_exit(f.d.router, caf::exit_reason::kill);
  http::client_response h;
  for (int i = 0; i < 100; ++i) { // the kill lands asynchronously
    h = c.send({"GET", "/health", "", "", {}});
    if (h.status != 200)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(h.status == 503);
}

TEST_CASE("generation needs the cluster's bearer token, health does not") {
  test::scratch_dir dir;
  {
    std::ofstream(dir / "http.key") << "s3cret-token\n";
  }
  std::filesystem::permissions(dir / "http.key", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  fleet f(topology_text("http_api_key_file: " + (dir / "http.key")));
  auto c = f.client();
  auto body = json{{"model", "fleet"}, {"prompt", {1}}, {"max_tokens", 1}};
  CHECK(c.send(completion(body)).status == 401);
  CHECK(c.send({"GET", "/metrics", "", "", {}}).status == 401);
  CHECK(c.send({"GET", "/health", "", "", {}}).status == 200);
  c.set_default_header("Authorization", "Bearer s3cret-token");
  CHECK(c.send(completion(body)).status == 200);
  CHECK(c.send({"GET", "/metrics", "", "", {}}).status == 200);
}

TEST_CASE("a restarted router takes the endpoint's requests") {
  fleet f(topology_text());
  auto old = f.d.router;
  auto fresh = f.d.restart_router(f.sys);
  REQUIRE(fresh.address() != old.address());
  auto c = f.client();
  // The coordinator routes every member to the new router; until then requests wait in its queue.
  // ignore_eos: whichever version serves it (rounds go on), it runs to max_tokens.
  auto r = c.send(completion({{"model", "fleet"}, {"prompt", {7, 8}}, {"max_tokens", 3}, {"ignore_eos", true}}));
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(json::parse(r.body)["choices"][0]["finish_reason"] == "length");
  CHECK(c.send({"GET", "/health", "", "", {}}).status == 200);
}

TEST_CASE("a client that hangs up ends its request on the engine") {
  fleet f(topology_text());
  caf::scoped_actor self{f.sys};
  // Paused engines queue what reaches them: the request waits there, visibly.
  for (auto& e : f.d.engines)
    self->request(e, std::chrono::seconds(10), pause_atom::value, pause_request{pause_mode::keep, false})
      .receive([](const pause_report&) {}, [&](caf::error& err) { FAIL(f.sys.render(err)); });
  auto outstanding = [&] {
    std::uint32_t n = 0;
    for (auto& e : f.d.engines)
      self->request(e, std::chrono::seconds(10), status_atom::value)
        .receive([&](const engine_status& s) { n += s.running + s.waiting + s.frozen; },
                 [&](caf::error& err) { FAIL(f.sys.render(err)); });
    return n;
  };
  auto wait_for = [&](std::uint32_t expected) {
    for (int i = 0; i < 500 && outstanding() != expected; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return outstanding();
  };
  {
    auto c = f.client();
    auto head = c.open_stream(completion({{"model", "fleet"}, {"prompt", {1, 2}}, {"max_tokens", 50},
                                          {"stream", true}}));
    REQUIRE(head.status == 200);
    REQUIRE(wait_for(1) == 1); // it reached an engine, which holds it while paused
  } // the client closes its connection
  // The stream's keep-alive finds the connection closed, the request's actor
  // ends, the router's relay follows, and the engine drops the request.
  CHECK(wait_for(0) == 0);
  for (auto& e : f.d.engines)
    self->request(e, std::chrono::seconds(10), resume_atom::value)
      .receive([](const phase_ack&) {}, [&](caf::error& err) { FAIL(f.sys.render(err)); });
}
