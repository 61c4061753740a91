// POST /v1/completions through the real HTTP server and a real (tiny)
// rollout-engine actor on a threaded actor system: greedy output equals
// the engine core's own, streaming agrees with non-streaming, n and seeds,
// logprobs, stop strings, queueing while paused, aborts, disconnects.
#include "actors/http/completions_route.hpp"
#include "actors/rollout_engine.hpp"
#include "actors/system_config.hpp"
#include "runtime/base/checksum.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "runtime/http/client.hpp"
#include "tests/support/engine_fixtures.hpp"

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <thread>

using namespace rlsync;
using nlohmann::json;

namespace {

struct served_engine {
  // First, so destroyed last: the route's on_start/on_end hooks write
  // these from the actor system's threads, which may still run one after
  // the test's last request returned, until `sys` is gone.
  std::mutex hooks_mu;
  std::map<std::string, std::vector<std::uint64_t>> started; ///< completions begun, by id
  std::set<std::string> ended;
  caf::actor_system_config cfg;
  caf::actor_system sys;
  model_config config = test::tiny_config();
  test::source_weights v1 = test::make_source(config, dtype::bf16, 1);
  rollout_engine_actor engine;
  http::server srv{http::server_options{}};
  std::unique_ptr<completions_route> route;
  std::uint16_t port = 0;

  explicit served_engine(bool strict = false) : sys(init(cfg)) {
    rollout_engine_config ec;
    ec.model = config;
    ec.options.name = "serve";
    ec.options.tp = 2;
    engine = caf::actor_cast<rollout_engine_actor>(spawn_rollout_engine(sys, ec));
    load(v1, 1);
    completions_route_config rc;
    rc.served_model = "tiny";
    rc.model = {config.vocab_size, config.max_position_embeddings};
    rc.strict = strict;
    rc.label = [](std::uint64_t v) { return "v" + std::to_string(v); };
    rc.liveness_interval = std::chrono::milliseconds(20);
    rc.stream_keepalive = std::chrono::milliseconds(20);
    rc.on_start = [this](const std::string& id, const std::vector<std::uint64_t>& ids) {
      std::lock_guard<std::mutex> lock(hooks_mu);
      started[id] = ids;
    };
    rc.on_end = [this](const std::string& id, const std::vector<std::uint64_t>&) {
      std::lock_guard<std::mutex> lock(hooks_mu);
      ended.insert(id);
    };
    route = std::make_unique<completions_route>(sys, rc, target_of(engine));
    route->mount(srv);
    port = srv.start();
  }
  ~served_engine() { srv.stop(); }

  static caf::actor_system_config& init(caf::actor_system_config& c) {
    c.set("logger.file-verbosity", caf::atom("quiet"));
    register_rlsync_types(c);
    return c;
  }

  template <class T, class... Ts>
  T ask(Ts... xs) {
    caf::scoped_actor self{sys};
    std::optional<T> out;
    self->request(engine, std::chrono::seconds(10), xs...)
      .receive([&](T& x) { out = std::move(x); }, [&](caf::error& e) { FAIL(sys.render(e)); });
    REQUIRE(out);
    return *out;
  }

  /// Serves `w` as `version` through a whole weight-update session.
  void load(const test::source_weights& w, std::uint64_t version) {
    ask<pause_report>(pause_atom_v, pause_request{pause_mode::abort, true});
    ask<phase_ack>(start_atom_v, version);
    for (auto& t : w.views()) {
      weight_bucket b;
      b.version = version;
      b.entries.push_back({t.name, static_cast<std::uint8_t>(t.type), t.shape, 0, t.size, 0});
      const auto* p = reinterpret_cast<const std::uint8_t*>(t.data);
      b.data.assign(p, p + t.size);
      b.checksum = checksum64(b.data.data(), b.data.size());
      ask<std::uint64_t>(caf::update_atom_v, b);
    }
    ask<phase_ack>(finish_atom_v, version);
    ask<phase_ack>(resume_atom_v);
  }

  http::client_response post(const json& body) {
    http::client c("127.0.0.1", port, std::chrono::seconds(20));
    return c.send({"POST", "/v1/completions", body.dump()});
  }

  json complete(const json& body) {
    auto r = post(body);
    INFO(r.body);
    REQUIRE(r.status == 200);
    REQUIRE(r.headers.count("content-length"));
    return json::parse(r.body);
  }

  /// The stream's events as JSON, and whether it ended with [DONE].
  std::pair<std::vector<json>, bool> stream(json body) {
    body["stream"] = true;
    http::client c("127.0.0.1", port, std::chrono::seconds(20));
    auto head = c.open_stream({"POST", "/v1/completions", body.dump()});
    REQUIRE(head.status == 200);
    CHECK(head.headers["content-type"].find("text/event-stream") == 0);
    std::vector<json> events;
    bool done = false;
    while (auto ev = c.next_event()) {
      REQUIRE(!done); // nothing after [DONE]
      if (*ev == "[DONE]")
        done = true;
      else
        events.push_back(json::parse(*ev));
    }
    return {events, done};
  }
};

/// What the engine core produces for `prompt`, the way `rlsync generate` runs it.
std::vector<std::int32_t> direct_greedy(const test::source_weights& w, const std::vector<std::int32_t>& prompt,
                                        std::uint32_t max_tokens) {
  engine::engine_options o;
  o.tp = 1;
  engine::engine_core core(w.config, o);
  core.load(w.load(1), 1);
  generate_request r;
  r.request_id = 1;
  r.prompt = prompt;
  r.sampling.max_tokens = max_tokens;
  std::vector<std::int32_t> out;
  REQUIRE(!core.add(r, {[&](const token_event& e) { out.push_back(e.token); }, {}}));
  for (int i = 0; i < 10000 && core.has_work(); ++i)
    core.step();
  return out;
}

/// A streamed choice put back together.
struct joined {
  std::string text;
  std::vector<std::int32_t> tokens;
  json finish_reason, weight_versions;
  std::size_t chunks = 0;
};

std::map<int, joined> join(const std::vector<json>& events) {
  std::map<int, joined> out;
  for (auto& e : events) {
    if (e["choices"].empty())
      continue;
    REQUIRE(e["choices"].size() == 1);
    auto& c = e["choices"][0];
    auto& j = out[c["index"].get<int>()];
    REQUIRE(j.finish_reason.is_null()); // nothing after a choice's last chunk
    j.text += c["text"].get<std::string>();
    for (auto& t : c["token_ids"])
      j.tokens.push_back(t.get<std::int32_t>());
    j.finish_reason = c["finish_reason"];
    if (c.contains("weight_versions"))
      j.weight_versions = c["weight_versions"];
    ++j.chunks;
  }
  return out;
}

} // namespace

TEST_CASE("completions route: greedy output equals the engine core's, streamed or not") {
  served_engine s;
  for (auto prompt : {json("Hello"), json(std::vector<int>{256, 72, 105})}) {
    CAPTURE(prompt.dump());
    json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0},
                 {"return_token_ids", true}};
    auto r = s.complete(body);
    auto ids = prompt.is_string() ? engine::encode(prompt.get<std::string>()) : prompt.get<std::vector<std::int32_t>>();
    auto want = direct_greedy(s.v1, ids, 24);
    REQUIRE(r["choices"].size() == 1);
    auto& c = r["choices"][0];
    CHECK(c["token_ids"].get<std::vector<std::int32_t>>() == want);
    CHECK(c["prompt_token_ids"].get<std::vector<std::int32_t>>() == ids);
    CHECK(c["text"] == engine::to_valid_utf8(engine::decode(want)));
    CHECK(c["finish_reason"] == (want.size() == 24 ? "length" : "stop"));
    CHECK(c["logprobs"].is_null());
    CHECK(c["weight_versions"] == json::parse(R"([{"version": "v1", "start": 0, "end": )"
                                              + std::to_string(want.size()) + "}]"));
    CHECK(r["object"] == "text_completion");
    CHECK(r["model"] == "tiny");
    CHECK(r["id"].get<std::string>().rfind("cmpl-", 0) == 0);
    CHECK(r["usage"]["prompt_tokens"] == ids.size());
    CHECK(r["usage"]["completion_tokens"] == want.size());

    body["stream_options"] = {{"include_usage", true}};
    auto [events, done] = s.stream(body);
    CHECK(done);
    REQUIRE(!events.empty());
    CHECK(events.back()["choices"] == json::array()); // the usage chunk comes last
    CHECK(events.back()["usage"] == r["usage"]);
    auto streamed = join(events);
    REQUIRE(streamed.size() == 1);
    CHECK(streamed[0].tokens == want);
    CHECK(streamed[0].text == c["text"]);
    CHECK(streamed[0].finish_reason == c["finish_reason"]);
    CHECK(streamed[0].weight_versions == c["weight_versions"]);
    CHECK(streamed[0].chunks >= want.size()); // token by token
  }
}

TEST_CASE("completions route: n choices with a seed differ from each other and replay identically") {
  served_engine s;
  json body = {{"prompt", "Once"}, {"max_tokens", 16}, {"n", 3}, {"seed", 7}, {"temperature", 1.0},
               {"logprobs", 2}, {"ignore_eos", true}};
  auto a = s.complete(body);
  auto b = s.complete(body);
  REQUIRE(a["choices"].size() == 3);
  std::set<std::vector<std::int32_t>> distinct;
  for (int i = 0; i < 3; ++i) {
    auto& c = a["choices"][i];
    CHECK(c["index"] == i);
    CHECK(c["token_ids"] == b["choices"][i]["token_ids"]); // replay
    distinct.insert(c["token_ids"].get<std::vector<std::int32_t>>());
    auto& lp = c["logprobs"];
    REQUIRE(lp["token_logprobs"].size() == 16);
    for (auto& x : lp["token_logprobs"]) {
      CHECK(std::isfinite(x.get<double>()));
      CHECK(x.get<double>() <= 0.0);
    }
    for (auto& top : lp["top_logprobs"]) {
      CHECK(top.size() >= 2);
      CHECK(top.size() <= 3);
    }
  }
  CHECK(distinct.size() == 3);
  // Each completion was announced with its engine request ids, one per choice, and ended.
  bool all_ended = false;
  for (int i = 0; i < 500 && !all_ended; ++i) {
    {
      std::lock_guard<std::mutex> lock(s.hooks_mu);
      all_ended = s.ended.size() == 2;
    }
    if (!all_ended)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(all_ended);
  {
    std::lock_guard<std::mutex> lock(s.hooks_mu);
    REQUIRE(s.started.count(a["id"].get<std::string>()));
    CHECK(s.started[a["id"].get<std::string>()].size() == 3);
    CHECK(s.ended.count(b["id"].get<std::string>()));
  }
  // Streamed with the same seed: the same tokens.
  auto streamed = join(s.stream(body).first);
  for (int i = 0; i < 3; ++i)
    CHECK(streamed[i].tokens == a["choices"][i]["token_ids"].get<std::vector<std::int32_t>>());
}

TEST_CASE("completions route: a stop string cuts the text and finishes with stop") {
  served_engine s;
  auto free_run = s.complete({{"prompt", "Hello"}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}});
  auto tokens = free_run["choices"][0]["token_ids"].get<std::vector<std::int32_t>>();
  // A printable ASCII token past the first: a stop string the output certainly contains.
  auto at = std::find_if(tokens.begin() + 1, tokens.end(), [](std::int32_t t) { return t >= 32 && t < 127; });
  REQUIRE(at != tokens.end());
  std::string stop(1, static_cast<char>(*at));
  auto raw = engine::decode(tokens);
  auto cut = engine::to_valid_utf8(raw.substr(0, raw.find(stop)));
  json body = {{"prompt", "Hello"}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}, {"stop", {stop}}};
  auto r = s.complete(body);
  CHECK(r["choices"][0]["text"] == cut);
  CHECK(r["choices"][0]["finish_reason"] == "stop");
  CHECK(r["choices"][0]["stop_reason"] == stop);
  auto streamed = join(s.stream(body).first);
  CHECK(streamed[0].text == cut);
  CHECK(streamed[0].finish_reason == "stop");
}

TEST_CASE("completions route: bad requests answer vLLM's envelope") {
  served_engine s;
  struct row {
    std::string body;
    unsigned status;
    std::string param;
  };
  const std::vector<row> rows = {
    {"[]", 400, "body"},
    {"null", 400, "body"},
    {R"({"prompt": "a", "n": "x"})", 400, "body.n"},
    {R"({"prompt": [256, 5000]})", 400, "body.prompt[1]"},
    {R"({"prompt": "a", "model": "other"})", 404, "model"},
  };
  for (auto& r : rows) {
    CAPTURE(r.body);
    http::client c("127.0.0.1", s.port, std::chrono::seconds(10));
    auto got = c.send({"POST", "/v1/completions", r.body});
    CHECK(got.status == r.status);
    auto j = json::parse(got.body);
    CHECK(j["error"]["code"] == r.status);
    CHECK(j["error"]["param"] == r.param);
  }
}

TEST_CASE("completions route: requests wait while paused, start on resume, a pause(abort) ends them with abort") {
  served_engine s;
  s.ask<pause_report>(pause_atom_v, pause_request{pause_mode::keep, false});
  json body = {{"prompt", "Hi"}, {"max_tokens", 8}, {"temperature", 0}};
  std::optional<json> answer;
  std::thread waiting([&] { answer = s.complete(body); });
  // Queued, not rejected: the engine reports it waiting.
  bool queued = false;
  for (int i = 0; i < 500 && !queued; ++i) {
    queued = s.ask<engine_status>(status_atom_v).waiting == 1;
    if (!queued)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(queued);
  CHECK(!answer);
  s.ask<phase_ack>(resume_atom_v);
  waiting.join();
  REQUIRE(answer);
  CHECK((*answer)["choices"][0]["finish_reason"] != "abort");

  s.ask<pause_report>(pause_atom_v, pause_request{pause_mode::keep, false});
  std::optional<json> aborted;
  std::thread doomed([&] { aborted = s.complete(body); });
  for (int i = 0; i < 500 && s.ask<engine_status>(status_atom_v).waiting == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  s.ask<pause_report>(pause_atom_v, pause_request{pause_mode::abort, false});
  doomed.join();
  REQUIRE(aborted);
  CHECK((*aborted)["choices"][0]["finish_reason"] == "abort");
  CHECK((*aborted)["choices"][0]["text"] == "");
  s.ask<phase_ack>(resume_atom_v);
}

TEST_CASE("completions route: a client that disconnects mid-stream aborts its request") {
  served_engine s;
  s.ask<pause_report>(pause_atom_v, pause_request{pause_mode::keep, false});
  {
    http::client c("127.0.0.1", s.port, std::chrono::seconds(10));
    auto head = c.open_stream({"POST", "/v1/completions", R"({"prompt": "Hi", "max_tokens": 8, "stream": true})"});
    REQUIRE(head.status == 200);
    bool queued = false;
    for (int i = 0; i < 500 && !queued; ++i) {
      queued = s.ask<engine_status>(status_atom_v).waiting == 1;
      if (!queued)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE(queued);
  } // the client closes its connection
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = s.ask<engine_status>(status_atom_v).waiting == 0;
    if (!gone)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(gone);
  s.ask<phase_ack>(resume_atom_v);
}

TEST_CASE("completions route: strict mode answers as vLLM does, without weight_versions") {
  served_engine s(true);
  auto r = s.complete({{"prompt", "Hi"}, {"max_tokens", 4}, {"temperature", 0}});
  CHECK(!r["choices"][0].contains("weight_versions"));
  CHECK(!r["choices"][0].contains("token_ids"));
  auto with_ids = s.complete({{"prompt", "Hi"}, {"max_tokens", 4}, {"temperature", 0}, {"return_token_ids", true}});
  CHECK(with_ids["choices"][0]["token_ids"].size() == 4);
  CHECK(!with_ids["choices"][0].contains("weight_versions"));
}
