// `rlsync serve`'s routes through the real server on an ephemeral port, in
// front of a real engine on a synthetic checkpoint: the route table, the
// envelopes on malformed bodies, booleans spelt every way, ordering
// mistakes, the disk backend's checks, and a disk update that changes the
// weight checker's digests.
#include "actors/assembly/serve_node.hpp"
#include "actors/system_config.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/http/client.hpp"
#include "tests/support/engine_fixtures.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/scratch_dir.hpp"

#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <filesystem>
#include <functional>
#include <future>
#include <fstream>
#include <thread>
#include <utility>

using namespace rlsync;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

struct serve_fixture {
  test::scratch_dir dir;
  system_config cfg;
  caf::actor_system sys{cfg};
  std::unique_ptr<serve_node> node;
  std::uint16_t port = 0;
  std::unique_ptr<http::client> client;

  explicit serve_fixture(bool strict = false, std::optional<std::string> token = std::nullopt,
                         std::function<void(serve_node_options&)> tune = {}) {
    make_synthetic_checkpoint(dir / "v1", test::tiny_config(), dtype::f32, 7);
    perturb_checkpoint(dir / "v1", dir / "v2", 0.05, 11);
    serve_node_options o;
    o.checkpoint_dir = dir / "v1";
    o.tp = 2;
    o.strict_vllm = strict;
    o.http.bearer_token = token;
    if (tune)
      tune(o);
    node = std::make_unique<serve_node>(sys, o);
    port = node->start();
    client = std::make_unique<http::client>("127.0.0.1", port, 20s);
  }
  ~serve_fixture() { node->stop(); }

  http::client_response call(const std::string& method, const std::string& target, const std::string& body = "") {
    return client->send({method, target, body, "application/json", {}});
  }
  json call_json(const std::string& method, const std::string& target, const std::string& body = "",
                 unsigned expected = 200) {
    auto r = call(method, target, body);
    INFO(method << " " << target << " " << body << " -> " << r.status << " " << r.body);
    CHECK(r.status == expected);
    CHECK(r.headers.count("content-length") == 1);
    return r.body.empty() ? json::object() : json::parse(r.body);
  }
};

/// The envelope's fields, checked.
void check_envelope(const json& j, unsigned code, const std::string& param = "") {
  INFO(j.dump());
  REQUIRE(j.contains("error"));
  REQUIRE(j["error"].is_object());
  CHECK(j["error"]["code"] == code);
  CHECK(j["error"]["message"].is_string());
  CHECK(j["error"]["type"].is_string());
  if (!param.empty())
    CHECK(j["error"]["param"] == param);
}

std::string path_body(const std::string& dir) { return json{{"update_info", {{"path", dir}}}}.dump(); }

} // namespace

TEST_CASE("routes: every route answers on its method, 405 on another, 404 elsewhere") {
  serve_fixture f;
  for (auto& [method, path] : serve::engine_route_table()) {
    CAPTURE(path);
    auto r = f.call(method, path, method == "POST" ? "{}" : "");
    CHECK(r.status != 404);
    CHECK(r.status != 405);
    CHECK(r.headers.count("content-length") == 1);
    CHECK(f.call(method == "GET" ? "POST" : "GET", path).status == 405);
    // Leave the engine unpaused and out of any session for the next route.
    f.call("POST", "/resume");
  }
  auto nf = f.call("GET", "/nope");
  CHECK(nf.status == 404);
  CHECK(json::parse(nf.body) == json{{"detail", "Not Found"}});
}

TEST_CASE("routes: malformed bodies get 400 in vLLM's envelope naming the body or field") {
  serve_fixture f;
  const char* routes[] = {"/update_weights", "/init_weight_transfer_engine", "/finish_weight_update",
                          "/update_weight_version", "/weight_checker", "/collective_rpc", "/start_weight_update"};
  for (auto route : routes)
    for (auto body : {"[]", "1", "null", "\"x\"", "{"}) {
      CAPTURE(route);
      CAPTURE(body);
      check_envelope(f.call_json("POST", route, body, 400), 400, "body");
    }
  check_envelope(f.call_json("POST", "/update_weights", R"({"update_info": 1})", 400), 400, "body.update_info");
  check_envelope(f.call_json("POST", "/update_weights", "{}", 400), 400, "body.update_info");
  check_envelope(f.call_json("POST", "/init_weight_transfer_engine", R"({"init_info": 1})", 400), 400,
                 "body.init_info");
  check_envelope(f.call_json("POST", "/init_weight_transfer_engine", R"({"init_info": {"master_port": 1}})", 400),
                 400, "body.init_info.master_port");
  check_envelope(f.call_json("POST", "/finish_weight_update", R"({"weight_version": 7})", 400), 400,
                 "body.weight_version");
  check_envelope(f.call_json("POST", "/update_weight_version", "{}", 400), 400, "body.new_version");
  check_envelope(f.call_json("POST", "/update_weight_version",
                             "{\"new_version\": \"" + std::string(max_name_bytes + 1, 'v') + "\"}", 400),
                 400, "body.new_version");
  // The flat envelope on the routes that use it.
  for (auto body : {"[]", "1", "null"}) {
    auto j = f.call_json("POST", "/abort_requests", body, 400);
    CHECK(j["error"].is_string());
  }
  CHECK(f.call_json("POST", "/abort_requests", R"({"request_ids": 5})", 400)["error"].is_string());
  CHECK(f.call_json("POST", "/abort_requests", "{}") == json{{"status", "aborted"}, {"aborted", 0}});
  CHECK(f.call_json("POST", "/abort_requests", R"({"request_ids": ["cmpl-x"]})")["aborted"] == 0);
  // prime-rl's own shape is answered clearly.
  auto prime = f.call_json("POST", "/update_weights", R"({"weight_dir": "/tmp/x"})", 400);
  check_envelope(prime, 400, "body.weight_dir");
  CHECK(prime["error"]["message"].get<std::string>().find("prime-rl") != std::string::npos);
}

TEST_CASE("routes: query booleans spelt every way clients spell them") {
  serve_fixture f;
  for (auto spelling : {"true", "True", "TRUE", "1", "yes", "on", "false", "False", "FALSE", "0", "no", "off", "Off"}) {
    CAPTURE(spelling);
    CHECK(f.call_json("POST", std::string("/pause?mode=keep&clear_cache=") + spelling) == json{{"status", "paused"}});
    CHECK(f.call_json("GET", "/is_paused") == json{{"is_paused", true}});
    CHECK(f.call_json("POST", "/resume") == json{{"status", "resumed"}});
    CHECK(f.call_json("GET", "/is_paused") == json{{"is_paused", false}});
    CHECK(f.call_json("POST", std::string("/reset_prefix_cache?reset_running_requests=") + spelling +
                                  "&reset_external=" + spelling) == json{{"success", true}});
    CHECK(f.call_json("GET", std::string("/get_world_size?include_dp=") + spelling) == json{{"world_size", 2}});
  }
  CHECK(f.call_json("POST", "/pause?clear_cache=maybe", "", 400)["error"].is_string());
  CHECK(f.call_json("POST", "/pause?mode=sideways", "", 400)["error"].is_string());
  check_envelope(f.call_json("POST", "/reset_prefix_cache?reset_external=2", "", 400), 400, "query.reset_external");
  // Every mode, and the deprecated parameter.
  for (auto q : {"mode=abort", "mode=wait", "mode=keep", "wait_for_inflight_requests=true", ""}) {
    CAPTURE(q);
    CHECK(f.call_json("POST", std::string("/pause?") + q) == json{{"status", "paused"}});
    CHECK(f.call_json("POST", "/resume") == json{{"status", "resumed"}});
  }
}

TEST_CASE("routes: ordering mistakes answer 409, failures 500, and a disk update changes the digests") {
  serve_fixture f;
  CHECK(f.call_json("GET", "/weight_info") == json{{"weight_version", "default"}});
  check_envelope(f.call_json("POST", "/update_weights", path_body(f.dir / "v2"), 409), 409);
  check_envelope(f.call_json("POST", "/finish_weight_update", "", 409), 409);
  auto before = f.call_json("POST", "/weight_checker", R"({"action": "checksum"})")["checksums"];
  REQUIRE(before.size() > 0);
  CHECK(before.contains("dp0:pp0:pcp0:tp0:model.embed_tokens.weight"));
  CHECK(before.contains("dp0:pp0:pcp0:tp1:model.embed_tokens.weight"));
  CHECK(before["dp0:pp0:pcp0:tp0:model.embed_tokens.weight"].get<std::string>().size() == 64);

  CHECK(f.call_json("POST", "/init_weight_transfer_engine", R"({"init_info": {}})") ==
        json{{"message", "Weight transfer initialized"}});
  CHECK(f.call_json("POST", "/pause?mode=keep&clear_cache=false", "{}") == json{{"status", "paused"}});
  CHECK(f.call_json("POST", "/start_weight_update", R"({"is_checkpoint_format": true})") ==
        json{{"message", "Weight update started"}});
  check_envelope(f.call_json("POST", "/start_weight_update", "", 409), 409);
  // The disk path's checks.
  check_envelope(f.call_json("POST", "/update_weights", R"({"update_info": {"path": "relative/dir"}})", 400), 400,
                 "body.update_info.path");
  check_envelope(f.call_json("POST", "/update_weights", R"({"update_info": {"path": ""}})", 400), 400,
                 "body.update_info.path");
  check_envelope(f.call_json("POST", "/update_weights", R"({"update_info": {"path": "/x", "names": []}})", 400), 400,
                 "body.update_info.names");
  check_envelope(f.call_json("POST", "/update_weights",
                             json{{"update_info", json::array({{{"path", "/a"}}, {{"path", "/b"}}})}}.dump(), 400),
                 400, "body.update_info");
  check_envelope(f.call_json("POST", "/update_weights", path_body(f.dir / "missing"), 500), 500);
  std::filesystem::create_directory(f.dir / "empty");
  check_envelope(f.call_json("POST", "/update_weights", path_body(f.dir / "empty"), 500), 500);
  // The real one, as a list of one.
  CHECK(f.call_json("POST", "/update_weights", json{{"update_info", json::array({{{"path", f.dir / "v2"}}})}}.dump()) ==
        json{{"message", "Weights updated"}});
  check_envelope(f.call_json("POST", "/update_weights", path_body(f.dir / "v2"), 409), 409); // one per session
  CHECK(f.call_json("POST", "/finish_weight_update", R"({"weight_version": "step-1"})") ==
        json{{"message", "Weight update finished"}});
  CHECK(f.call_json("POST", "/resume", "{}") == json{{"status", "resumed"}});
  CHECK(f.call_json("GET", "/weight_info") == json{{"weight_version", "step-1"}});

  auto after = f.call_json("POST", "/weight_checker", R"({"action": "checksum"})")["checksums"];
  CHECK(after.size() == before.size());
  CHECK(after != before);
  auto cmp = f.call_json("POST", "/weight_checker", json{{"action", "compare"}, {"baseline", before}}.dump());
  CHECK(cmp["match"] == false);
  CHECK(cmp["mismatches"].size() > 0);
  CHECK(f.call_json("POST", "/weight_checker", json{{"action", "compare"}, {"baseline", after}}.dump())["match"] ==
        true);
  CHECK(f.call_json("POST", "/weight_checker", R"({"action": "compare"})")["match"] == true); // the stored baseline
  CHECK(f.call_json("POST", "/weight_checker", R"({"action": "reset"})").contains("status"));
  check_envelope(f.call_json("POST", "/weight_checker", R"({"action": "compare"})", 400), 400, "body.baseline");
  check_envelope(f.call_json("POST", "/weight_checker", R"({"action": "nope"})", 400), 400, "body.action");

  // A finish without a loaded checkpoint fails and drops the session; the label stays.
  CHECK(f.call_json("POST", "/start_weight_update")["message"] == "Weight update started");
  check_envelope(f.call_json("POST", "/finish_weight_update", R"({"weight_version": "step-2"})", 500), 500);
  CHECK(f.call_json("GET", "/weight_info") == json{{"weight_version", "step-1"}});
  CHECK(f.call_json("GET", "/is_paused") == json{{"is_paused", false}}); // its implicit pause was resumed
  check_envelope(f.call_json("POST", "/finish_weight_update", "", 409), 409);
  // No pause needed (vLLM needs none): start pauses and finish resumes.
  CHECK(f.call_json("POST", "/start_weight_update")["message"] == "Weight update started");
  CHECK(f.call_json("POST", "/update_weights", path_body(f.dir / "v1"))["message"] == "Weights updated");
  CHECK(f.call_json("POST", "/finish_weight_update")["message"] == "Weight update finished");
  CHECK(f.call_json("GET", "/is_paused") == json{{"is_paused", false}});
  CHECK(f.call_json("GET", "/weight_info") == json{{"weight_version", "step-1"}}); // no label: kept
  CHECK(f.call_json("POST", "/weight_checker", json{{"action", "compare"}, {"baseline", before}}.dump())["match"] ==
        true); // back on v1's weights
  CHECK(f.call_json("POST", "/update_weight_version", R"({"new_version": "v-one"})") ==
        json{{"success", true}, {"new_version", "v-one"}});
  CHECK(f.call_json("GET", "/weight_info") == json{{"weight_version", "v-one"}});
}

TEST_CASE("routes: --strict-vllm answers ordering mistakes with 500") {
  serve_fixture f(true);
  check_envelope(f.call_json("POST", "/finish_weight_update", "", 500), 500);
  CHECK(f.call_json("POST", "/start_weight_update")["message"] == "Weight update started");
  auto again = f.call_json("POST", "/start_weight_update", "", 500);
  check_envelope(again, 500);
  CHECK(again["error"]["message"] ==
        "start_weight_update called while a weight update is already active. Call finish_weight_update first.");
}

TEST_CASE("routes: collective_rpc runs SkyRL's weight sync and names other methods") {
  serve_fixture f;
  auto rpc = [&](const std::string& method, json kwargs, unsigned expected) {
    return f.call_json("POST", "/collective_rpc",
                       json{{"method", method}, {"args", json::array()}, {"kwargs", kwargs}, {"timeout", 30}}.dump(),
                       expected);
  };
  CHECK(rpc("skyrl_sleep_for_weight_sync", json::object(), 200) == json{{"results", {nullptr, nullptr}}});
  CHECK(f.call_json("GET", "/is_sleeping") == json{{"is_sleeping", true}});
  CHECK(rpc("skyrl_wake_for_weight_sync", json::object(), 200)["results"].size() == 2);
  CHECK(f.call_json("GET", "/is_sleeping") == json{{"is_sleeping", false}});
  CHECK(rpc("skyrl_start_weight_update", json::object(), 200)["results"].size() == 2);
  auto nccl = rpc("update_weights_nccl", json::object(), 400);
  check_envelope(nccl, 400, "body.method");
  CHECK(nccl["error"]["message"].get<std::string>().find("update_weights_nccl") != std::string::npos);
  CHECK(f.call_json("POST", "/update_weights", path_body(f.dir / "v2"))["message"] == "Weights updated");
  check_envelope(rpc("skyrl_finish_weight_update", {{"weight_version", 5}}, 400), 400, "body.kwargs.weight_version");
  CHECK(rpc("skyrl_finish_weight_update", {{"weight_version", "sky-1"}}, 200)["results"].size() == 2);
  CHECK(f.call_json("GET", "/weight_info") == json{{"weight_version", "sky-1"}});
  auto other = rpc("reload_everything", json::object(), 400);
  CHECK(other["error"]["message"].get<std::string>().find("reload_everything") != std::string::npos);
  check_envelope(f.call_json("POST", "/collective_rpc", "{}", 400), 400, "body.method");
}

TEST_CASE("routes: sleep level 2 frees the weights, wake_up loads the published ones again") {
  serve_fixture f;
  const std::string greedy = R"({"prompt": [5, 6, 7], "max_tokens": 6, "temperature": 0})";
  auto tokens_of = [&] { return f.call_json("POST", "/v1/completions", greedy)["choices"][0]["token_ids"]; };
  const auto before = tokens_of();
  auto checksums = [&] { return f.call_json("POST", "/weight_checker", R"({"action": "checksum"})")["checksums"]; };
  REQUIRE(!checksums().empty());
  CHECK(f.call_json("POST", "/sleep?level=2").empty());
  CHECK(checksums().empty()); // nothing held: the memory is freed
  CHECK(f.call_json("POST", "/resume", "", 500).contains("error")); // no weights to serve
  CHECK(f.call_json("POST", "/wake_up").empty());
  CHECK(f.call_json("GET", "/is_sleeping") == json{{"is_sleeping", false}});
  CHECK(tokens_of() == before);
  CHECK(f.call_json("GET", "/weight_info")["weight_version"] == "default"); // the same version again

  // An update while asleep brings its own weights: the wake resumes on them.
  CHECK(f.call_json("POST", "/sleep?level=2").empty());
  CHECK(f.call_json("POST", "/start_weight_update").size() == 1);
  CHECK(f.call_json("POST", "/update_weights", path_body(f.dir / "v2")).size() == 1);
  CHECK(f.call_json("POST", "/finish_weight_update", R"({"weight_version": "v2"})").size() == 1);
  CHECK(f.call_json("POST", "/wake_up").empty());
  const auto after_update = tokens_of();
  CHECK(after_update != before);

  // Asleep again with the published directory gone: the wake fails, saying so, and it sleeps on.
  CHECK(f.call_json("POST", "/sleep?level=2").empty());
  std::filesystem::remove_all(f.dir / "v2");
  auto failed = f.call_json("POST", "/wake_up", "", 500);
  check_envelope(failed, 500);
  CHECK(failed["error"]["message"].get<std::string>().find("v2") != std::string::npos);
  CHECK(f.call_json("GET", "/is_sleeping") == json{{"is_sleeping", true}});
}

TEST_CASE("routes: a wait-pause past its deadline leaves the engine running and loses no request") {
  serve_fixture f(false, std::nullopt, [](serve_node_options& o) { o.pause_deadline = 1ms; });
  // 32 choices of 200 tokens each: far more than a millisecond's work.
  const std::string body =
      R"({"prompt": [5, 6, 7], "n": 32, "max_tokens": 200, "ignore_eos": true, "temperature": 0, "stream": true})";
  std::promise<void> running;
  std::vector<std::string> finished;
  bool done = false;
  std::string failure;
  std::atomic<bool> ended{false};
  std::thread generate([&] {
    bool first = true;
    try {
      http::client c("127.0.0.1", f.port, 60s);
      auto head = c.open_stream({"POST", "/v1/completions", body, "application/json", {}});
      while (auto ev = c.next_event()) {
        if (std::exchange(first, false))
          running.set_value();
        if (*ev == "[DONE]") {
          done = true;
          continue;
        }
        const auto chunk = json::parse(*ev);
        for (const auto& choice : chunk["choices"])
          if (choice["finish_reason"].is_string())
            finished.push_back(choice["finish_reason"]);
      }
    } catch (const std::exception& e) {
      failure = e.what();
    }
    ended = true;
    if (first)
      running.set_value();
  });
  running.get_future().wait();
  const bool generating = !ended.load(); // the pause below must find requests running
  if (!generating)
    generate.join();
  REQUIRE(generating);
  auto paused = f.call_json("POST", "/pause?mode=wait", "", 500);
  generate.join();
  REQUIRE(paused["error"].is_string());
  CHECK(paused["error"].get<std::string>().find("pause failed") != std::string::npos);
  CHECK(paused["error"].get<std::string>().find("the engine runs on as before the call") != std::string::npos);
  CHECK(f.call_json("GET", "/is_paused") == json{{"is_paused", false}});
  CHECK(failure.empty());
  CHECK(done);
  CHECK(finished == std::vector<std::string>(32, "length")); // every choice ran to its end
}

TEST_CASE("routes: a control call that waited past its deadline behind another is not run") {
  // The engine holds its phase acknowledgements for 3 s (a straggler): a
  // pause holds the control actor that long, and calls queued behind it
  // pass their 400 ms deadline.
  auto faults = std::make_shared<engine_fault_gate>();
  serve_fixture f(false, std::nullopt, [&](serve_node_options& o) {
    o.control_deadline = 400ms;
    o.faults = faults;
  });
  faults->acks_held_until_ns = (std::chrono::steady_clock::now() + 3s).time_since_epoch().count();
  auto pause = std::async(std::launch::async, [&] {
    http::client c("127.0.0.1", f.port, 20s);
    return c.send({"POST", "/pause?mode=keep", "", "application/json", {}}).status;
  });
  std::this_thread::sleep_for(300ms); // the pause reaches the control actor first
  // Its client is answered 500 at the deadline; when the pause ends, the
  // sleep must not happen after all.
  CHECK(f.call("POST", "/sleep?level=1&mode=keep").status == 500);
  CHECK(pause.get() == 500); // the pause's own client gave up too
  unsigned status = 0;
  json sleeping;
  for (int i = 0; i < 100 && status != 200; ++i) { // until the control actor is free: 40 s at most
    auto r = f.call("GET", "/is_sleeping");
    status = r.status;
    if (status == 200)
      sleeping = json::parse(r.body);
  }
  CHECK(sleeping == json{{"is_sleeping", false}});
  CHECK(f.call_json("GET", "/is_paused") == json{{"is_paused", true}}); // the pause did run, late
}

TEST_CASE("routes: a weight-update session no call touches is dropped, the pause its start made resumed") {
  serve_fixture f(false, std::nullopt, [](serve_node_options& o) { o.session_idle_deadline = 3s; });
  CHECK(f.call_json("POST", "/start_weight_update").size() == 1);
  CHECK(f.call_json("GET", "/is_paused") == json{{"is_paused", true}});
  json paused;
  for (int i = 0; i < 500; ++i) { // 10 s at most
    paused = f.call_json("GET", "/is_paused");
    if (paused == json{{"is_paused", false}})
      break;
    std::this_thread::sleep_for(20ms);
  }
  CHECK(paused == json{{"is_paused", false}});
  check_envelope(f.call_json("POST", "/update_weights", path_body(f.dir / "v2"), 409), 409); // no session now
  // A session whose calls keep coming stays open past the idle deadline.
  CHECK(f.call_json("POST", "/start_weight_update").size() == 1);
  std::this_thread::sleep_for(1200ms);
  CHECK(f.call_json("POST", "/update_weights", path_body(f.dir / "v2"))["message"] == "Weights updated");
  std::this_thread::sleep_for(1200ms);
  CHECK(f.call_json("POST", "/finish_weight_update", R"({"weight_version": "v2"})")["message"]
        == "Weight update finished");
  CHECK(f.call_json("GET", "/weight_info") == json{{"weight_version", "v2"}});
  CHECK(f.call_json("GET", "/is_paused") == json{{"is_paused", false}});
}

TEST_CASE("routes: sleep levels, models, world size, health and the token") {
  serve_fixture f(false, std::string("tok"));
  f.client->set_default_header("Authorization", "Bearer tok");
  CHECK(f.call("GET", "/health").status == 200);
  CHECK(f.call("GET", "/health").body.empty());
  auto models = f.call_json("GET", "/v1/models");
  CHECK(models["object"] == "list");
  CHECK(models["data"][0]["max_model_len"] == 256);
  CHECK(models["data"][0]["id"] == f.dir / "v1");
  // Level 2 frees the weights that requests frozen by mode=keep would need.
  check_envelope(f.call_json("POST", "/sleep?level=2&mode=keep", "", 400), 400, "query.mode");
  CHECK(f.call_json("GET", "/is_sleeping") == json{{"is_sleeping", false}});
  CHECK(f.call_json("GET", "/is_paused") == json{{"is_paused", false}});
  // A resume ends a level-1 sleep.
  CHECK(f.call_json("POST", "/sleep?level=1&mode=keep").empty());
  CHECK(f.call_json("GET", "/is_sleeping") == json{{"is_sleeping", true}});
  CHECK(f.call_json("POST", "/resume") == json{{"status", "resumed"}});
  CHECK(f.call_json("GET", "/is_sleeping") == json{{"is_sleeping", false}});
  CHECK(f.call_json("POST", "/sleep?level=2&mode=abort").empty());
  CHECK(f.call_json("GET", "/is_sleeping") == json{{"is_sleeping", true}});
  check_envelope(f.call_json("POST", "/sleep?level=3", "", 400), 400, "query.level");
  CHECK(f.call_json("POST", "/wake_up?tags=weights").empty());
  CHECK(f.call_json("GET", "/is_sleeping") == json{{"is_sleeping", false}});
  // Without the token: POST refused, GET served.
  http::client bare("127.0.0.1", f.port, 5s);
  CHECK(bare.send({"POST", "/pause", "", "application/json", {}}).status == 401);
  CHECK(bare.send({"GET", "/is_paused", "", "application/json", {}}).status == 200);
  // A dead engine: /health 503, the rest 500.
  caf::anon_send_exit(f.node->engine(), caf::exit_reason::kill);
  unsigned status = 0;
  for (int i = 0; i < 100 && status != 503; ++i) {
    std::this_thread::sleep_for(20ms);
    status = f.call("GET", "/health").status;
  }
  CHECK(status == 503);
  CHECK(f.call("GET", "/weight_info").status == 500);
}

TEST_CASE("routes: version labels, by their set label or (for a coordinator's versions) by number") {
  struct row {
    bool by_number;
    std::vector<std::pair<std::uint64_t, std::string>> set;
    std::uint64_t version;
    std::string expected;
  };
  const std::vector<row> rows = {
    {false, {}, 0, "default"},
    {false, {}, 7, "default"},
    {false, {{3, "step-3"}}, 5, "step-3"},
    {false, {{3, "step-3"}}, 2, "default"},
    {true, {}, 0, "default"},
    {true, {}, 7, "7"},
    {true, {{7, "step-7"}}, 7, "step-7"},
    {true, {{7, "step-7"}}, 8, "8"},
    {true, {}, 18446744073709551615ull, "18446744073709551615"},
  };
  for (const auto& r : rows) {
    serve::version_labels labels;
    labels.label_by_number(r.by_number);
    for (const auto& [v, l] : r.set)
      labels.set(v, l);
    INFO("by_number " << r.by_number << " version " << r.version);
    CHECK(labels.label_of(r.version) == r.expected);
  }
  // One label per update for as long as the server runs: the newest are kept.
  serve::version_labels many;
  for (std::uint64_t v = 1; v <= serve::version_labels::max_labels + 10; ++v)
    many.set(v, "step-" + std::to_string(v));
  CHECK(many.versions_of("step-10").empty());
  CHECK(many.versions_of("step-11") == std::vector<std::uint64_t>{11});
  CHECK(many.label_of(serve::version_labels::max_labels + 10) == "step-" + std::to_string(serve::version_labels::max_labels + 10));
}

TEST_CASE("routes: in front of a coordinator's engine, the routes that would fight it answer 409") {
  serve_fixture owner; // an engine at version 1, as a member node's would be after its first round
  serve_node_options o;
  o.tp = 2;
  serve_node coordinated(owner.sys, o, owner.node->engine(), test::tiny_config(), "served-model");
  auto port = coordinated.start();
  http::client client("127.0.0.1", port, 20s);
  auto call = [&](const std::string& method, const std::string& target, const std::string& body = "") {
    return client.send({method, target, body, "application/json", {}});
  };
  struct refused_row {
    const char* path;
    const char* body;
    bool flat; // /pause and /resume answer vLLM's flat {"error": "..."}
  };
  const std::vector<refused_row> refused = {
    {"/init_weight_transfer_engine", "{\"init_info\": {}}", false},
    {"/start_weight_update", "{\"is_checkpoint_format\": true}", false},
    {"/update_weights", "{\"update_info\": {\"path\": \"/tmp\"}}", false},
    {"/finish_weight_update", "{\"weight_version\": \"step-9\"}", false},
    {"/update_weight_version", "{\"new_version\": \"x\"}", false},
    {"/collective_rpc", "{\"method\": \"skyrl_start_weight_update\"}", false},
    {"/reset_prefix_cache", "{}", false},
    {"/sleep?level=2", "", false},
    {"/wake_up", "", false},
    {"/pause?mode=keep", "", true},
    {"/resume", "", true},
  };
  for (const auto& r : refused) {
    auto answer = call("POST", r.path, r.body);
    INFO(r.path << " -> " << answer.status << " " << answer.body);
    CHECK(answer.status == 409);
    auto j = json::parse(answer.body);
    if (r.flat) {
      REQUIRE(j["error"].is_string());
      CHECK(j["error"].get<std::string>().find("coordinator owns the engine's weights") != std::string::npos);
    } else {
      check_envelope(j, 409);
      CHECK(j["error"]["message"].get<std::string>().find("coordinator owns the engine's weights") !=
            std::string::npos);
    }
  }
  // Nothing of that reached the engine: still version 1, unpaused, no session.
  auto info = call("GET", "/weight_info");
  CHECK(info.status == 200);
  CHECK(json::parse(info.body)["weight_version"] == "1"); // the coordinator's number, not "default"
  CHECK(json::parse(call("GET", "/is_paused").body)["is_paused"] == false);
  CHECK(call("GET", "/health").status == 200);
  auto models = json::parse(call("GET", "/v1/models").body);
  CHECK(models["data"][0]["id"] == "served-model");
  auto sums = call("POST", "/weight_checker", "{\"action\": \"checksum\"}");
  CHECK(sums.status == 200);
  CHECK(json::parse(sums.body)["checksums"] == json::parse(owner.call("POST", "/weight_checker", "{}").body)["checksums"]);
  auto completion = call("POST", "/v1/completions", "{\"prompt\": [5, 6, 7], \"max_tokens\": 3, \"temperature\": 0}");
  REQUIRE(completion.status == 200);
  auto choice = json::parse(completion.body)["choices"][0];
  CHECK(choice["weight_versions"][0]["version"] == "1");
  // Stopping the server leaves the engine to its owner (the member node).
  coordinated.stop();
  CHECK(owner.call("GET", "/health").status == 200);
  CHECK(json::parse(owner.call("GET", "/weight_info").body)["weight_version"] == "default");
}

TEST_CASE("routes: a coordinated node's completions and those the router sends its engine never share an id") {
  // The router forwards the head endpoint's requests with the ids that
  // endpoint numbers from 2^56, as the owner's own route here does; an
  // engine takes a request id it already runs for a newer attempt and ends
  // the older one. Both wait in the paused engine, then both finish.
  serve_fixture owner;
  serve_node_options o;
  o.tp = 2;
  serve_node coordinated(owner.sys, o, owner.node->engine(), test::tiny_config(), "served-model");
  auto port = coordinated.start();
  REQUIRE(owner.call("POST", "/pause?mode=keep").status == 200);
  const std::string body = R"({"prompt": "a", "max_tokens": 3, "temperature": 0})";
  auto head_side = std::async(std::launch::async, [&] {
    http::client c("127.0.0.1", owner.port, 20s); // the fixture's client stays the main thread's
    return c.send({"POST", "/v1/completions", body, "application/json", {}});
  });
  auto node_side = std::async(std::launch::async, [&] {
    http::client c("127.0.0.1", port, 20s);
    return c.send({"POST", "/v1/completions", body, "application/json", {}});
  });
  caf::scoped_actor self{owner.sys};
  const bool both_waiting = test::eventually([&] {
    std::uint32_t waiting = 0;
    self->request(owner.node->engine(), 2s, status_atom::value)
      .receive([&](const engine_status& st) { waiting = st.waiting + st.running; }, [](caf::error&) {});
    return waiting == 2;
  }, 10s);
  CHECK(both_waiting);
  REQUIRE(owner.call("POST", "/resume").status == 200);
  for (auto* side : {&head_side, &node_side}) {
    auto answer = side->get();
    INFO(answer.body);
    REQUIRE(answer.status == 200);
    CHECK(json::parse(answer.body)["choices"][0]["finish_reason"] == "length");
  }
}
