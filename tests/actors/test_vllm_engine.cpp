// The rollout-engine actor in front of an external vLLM server, tested
// against `rlsync serve --strict-vllm` instances in this process (loopback,
// ephemeral ports): what vLLM answers, with none of rlsync's extras. A full
// sync round over HTTP from a local producer, generation relayed token by
// token, continuations, ordering mistakes, deadlines on a server that never
// answers, a server stopped mid-stream, health loss and restarts, digests
// cross-checked with the server's weight checker, and refused senders.
// Also the pure helpers of runtime/vllm/remote_engine.
#include "actors/assembly/serve_node.hpp"
#include "actors/system_config.hpp"
#include "actors/vllm_engine.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/engine/engine_core.hpp"
#include "runtime/engine/loader.hpp"
#include "runtime/http/client.hpp"
#include "runtime/http/server.hpp"
#include "runtime/transfer/local/local_transfer.hpp"
#include "runtime/vllm/remote_engine.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/engine_fixtures.hpp"
#include "tests/support/scratch_dir.hpp"
#include "tests/support/transfer_fixtures.hpp"
#include "runtime/plan/groups.hpp"

#include <caf/all.hpp>
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

using namespace rlsync;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

/// Tokens a sink received, from any thread.
struct token_log {
  std::mutex mu;
  std::vector<token_event> tokens;
  std::vector<token_event> copy() {
    std::lock_guard<std::mutex> lock(mu);
    return tokens;
  }
};

token_sink_actor::behavior_type locked_sink(token_sink_actor::pointer, std::shared_ptr<token_log> log) {
  return {[=](token_atom, const token_event& ev) {
    std::lock_guard<std::mutex> lock(log->mu);
    log->tokens.push_back(ev);
  }};
}

using test::eventually;

/// Writes `snapshot` as a checkpoint directory (the reference a built-in engine loads).
void write_checkpoint(const transfer::weight_snapshot& s, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::vector<tensor_bytes> out;
  for (const auto& t : s.tensors())
    out.push_back({static_cast<const tensor_spec&>(t), t.data});
  write_safetensors(dir + "/model.safetensors", out);
  write_config_json(dir + "/config.json", s.config());
}

/// A listening socket that accepts connections (the kernel's backlog) and never answers.
struct silent_server {
  int fd = -1;
  std::uint16_t port = 0;
  silent_server() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 64) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~silent_server() { ::close(fd); }
};

/// The error a request got; nullopt when it was answered.
template <class T, class Handle, class... Ts>
std::optional<caf::error> error_of(caf::scoped_actor& self, const Handle& h, Ts... xs) {
  std::optional<caf::error> err;
  self->request(h, std::chrono::seconds(30), xs...).receive([](T&) {}, [&](caf::error& e) { err = e; });
  return err;
}

/// A stand-in for a real vLLM server: every control route answers 200 as
/// vLLM does, /weight_checker knows vLLM's own shard names (not rlsync's),
/// and /v1/completions streams a fixed script in vLLM's shape, reporting
/// weight versions on the last chunk.
struct fake_vllm {
  std::mutex mu;
  std::string label = "default";
  std::vector<std::string> calls;   ///< "POST /pause?mode=keep&clear_cache=false", ...
  std::string loaded;               ///< the last update_weights path
  json last_completion;             ///< the last completions body
  std::atomic<int> completion_status{200}; ///< what /v1/completions answers; not 200: an error body
  /// Not 0: the stream answers 200, then an error event with this code,
  /// after `error_after_tokens` tokens.
  std::atomic<int> stream_error_code{0};
  std::atomic<bool> error_after_tokens{false};
  http::server srv;
  std::uint16_t port = 0;

  explicit fake_vllm(std::optional<std::string> token = std::nullopt)
      : srv([&] {
          http::server_options o;
          o.bearer_token = token;
          return o;
        }()) {
    auto ok = [this](std::string answer) {
      return [this, answer](const http::request& rq, std::shared_ptr<http::responder> r) {
        {
          std::lock_guard<std::mutex> lock(mu);
          calls.push_back(rq.method + " " + rq.target);
          if (rq.path == "/update_weights")
            loaded = json::parse(rq.body)["update_info"]["path"];
          if (rq.path == "/finish_weight_update" && !rq.body.empty()) {
            auto j = json::parse(rq.body);
            if (j.contains("weight_version"))
              label = j["weight_version"];
          }
        }
        r->reply({200, "application/json", answer, {}});
      };
    };
    srv.route("GET", "/health", [](const http::request&, std::shared_ptr<http::responder> r) {
      r->reply({200, "application/json", "", {}});
    }, false);
    srv.route("GET", "/weight_info", [this](const http::request&, std::shared_ptr<http::responder> r) {
      std::lock_guard<std::mutex> lock(mu);
      r->reply({200, "application/json", json{{"weight_version", label}}.dump(), {}});
    }, false);
    for (auto path : {"/init_weight_transfer_engine", "/pause", "/resume", "/reset_prefix_cache", "/start_weight_update", "/update_weights",
                      "/finish_weight_update", "/abort_requests"})
      srv.route("POST", path, ok("{}"));
    srv.route("POST", "/weight_checker",
              ok(json{{"match", false}, {"mismatches", {"dp0:pp0:pcp0:tp0:model.layers.0.self_attn.qkv_proj.weight_scale"}}}
                   .dump()));
    srv.route("POST", "/v1/completions", [this](const http::request& rq, std::shared_ptr<http::responder> r) {
      {
        std::lock_guard<std::mutex> lock(mu);
        last_completion = json::parse(rq.body);
      }
      if (const int status = completion_status; status != 200) {
        r->reply({status, "application/json", json{{"error", {{"message", "refused by the test"}}}}.dump(), {}});
        return;
      }
      r->start_stream("text/event-stream");
      auto chunk = [](json tokens, json finish, json extra = json::object()) {
        json c = {{"index", 0}, {"text", "x"}, {"logprobs", nullptr}, {"finish_reason", finish}, {"token_ids", tokens}};
        c.update(extra);
        return "data: " + json{{"id", "cmpl-fake"}, {"object", "text_completion"}, {"choices", {c}}}.dump() + "\n\n";
      };
      if (const int code = stream_error_code; code != 0) {
        if (error_after_tokens)
          r->write(chunk({40, 41}, nullptr));
        r->write("data: " + json{{"error", {{"message", "failed in the stream"}, {"code", code}}}}.dump() + "\n\n");
        r->finish();
        return;
      }
      r->write(chunk({40, 41}, nullptr));
      r->write(chunk({42}, "length",
                     {{"weight_versions", {{{"version", "v2"}, {"start", 0}, {"end", 2}},
                                           {{"version", "v3"}, {"start", 2}, {"end", 3}}}}}));
      r->write("data: [DONE]\n\n");
      r->finish();
    });
    port = srv.start();
  }
};

struct vllm_fixture {
  test::scratch_dir dir;
  system_config cfg;
  caf::actor_system sys{cfg};
  model_config model = test::tiny_config();
  std::shared_ptr<transfer::synthetic_source> source;
  std::shared_ptr<transfer::local_transfer> puller;
  std::unique_ptr<serve_node> server;
  std::uint16_t port = 0;
  rollout_engine_actor engine;
  std::shared_ptr<std::mutex> log_mu = std::make_shared<std::mutex>();
  std::shared_ptr<std::vector<std::string>> logs = std::make_shared<std::vector<std::string>>();
  std::shared_ptr<std::atomic<int>> recovered = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::set<caf::actor_id>> outsiders = std::make_shared<std::set<caf::actor_id>>();

  explicit vllm_fixture(std::function<void(vllm_engine_config&)> tweak = {}) {
    make_synthetic_checkpoint(dir / "initial", model, dtype::bf16, 7);
    transfer::synthetic_options o;
    o.config = model;
    o.initial_checkpoint = dir / "initial";
    o.perturb = 0.05;
    o.trainer_seed = 11;
    o.keep_versions = 4;
    o.threads = 1;
    source = std::make_shared<transfer::synthetic_source>(o);
    source->produce_next(); // v1: the initial checkpoint
    source->produce_next(); // v2
    puller = std::make_shared<transfer::local_transfer>(source);
    start_server();
    vllm_engine_config c;
    c.model = model;
    c.name = "vllm-0";
    c.node = "n0";
    c.url = "http://127.0.0.1:" + std::to_string(port);
    c.weights_dir = dir / "weights";
    c.source_dtype = dtype::bf16;
    c.server_tp = 2;
    c.puller = puller;
    c.health_interval_ms = 50;
    c.health_timeout_ms = 2000;
    c.stream_idle_ms = 5000;
    c.log = [mu = log_mu, logs = logs](const std::string& line) {
      std::lock_guard<std::mutex> lock(*mu);
      logs->push_back(line);
    };
    c.on_recovered = [r = recovered] { ++*r; };
    c.authorize = [ids = outsiders](const caf::strong_actor_ptr& sender) { return ids->count(sender->id()) == 0; };
    if (tweak)
      tweak(c);
    engine = spawn_vllm_engine(sys, c);
    REQUIRE(eventually([&] { return heartbeat_answered(); }));
  }
  ~vllm_fixture() {
    caf::anon_send_exit(engine, caf::exit_reason::user_shutdown);
    retire(server);
  }

  /// Stops a server and waits for its engine to end before freeing it:
  /// serve_node::stop only asks its engine to quit, and the engine writes
  /// into the node's metrics registry until it has.
  void retire(std::unique_ptr<serve_node>& node) {
    if (!node)
      return;
    caf::scoped_actor self{sys};
    self->monitor(node->engine());
    node->stop();
    self->receive([](caf::down_msg&) {}, caf::after(std::chrono::seconds(20)) >> [] {});
    node.reset();
  }

  void start_server(const std::string& checkpoint = "initial") {
    serve_node_options o;
    o.checkpoint_dir = dir / checkpoint;
    o.tp = 2;
    o.strict_vllm = true;
    o.http.port = port; // 0 the first time; the same port for a restart
    retire(server);
    server = std::make_unique<serve_node>(sys, o);
    port = server->start();
  }

  std::function<void(const std::string&)> engine_log() {
    return [mu = log_mu, logs = logs](const std::string& line) {
      std::lock_guard<std::mutex> lock(*mu);
      logs->push_back(line);
    };
  }

  bool logged(const std::string& part) {
    std::lock_guard<std::mutex> lock(*log_mu);
    for (auto& l : *logs)
      if (l.find(part) != std::string::npos)
        return true;
    return false;
  }

  template <class T, class... Ts>
  caf::expected<T> ask(std::chrono::milliseconds timeout, Ts... xs) {
    caf::scoped_actor self{sys};
    caf::expected<T> out{caf::error{}};
    self->request(engine, timeout, xs...).receive([&](T& x) { out = std::move(x); },
                                                  [&](caf::error& e) { out = std::move(e); });
    return out;
  }
  template <class T, class... Ts>
  T must(Ts... xs) {
    auto r = ask<T>(30s, xs...);
    if (!r)
      FAIL(sys.render(r.error()));
    return *r;
  }

  bool heartbeat_answered() { return static_cast<bool>(ask<heartbeat>(300ms, heartbeat_atom::value, heartbeat{"t", 1})); }
  engine_status status() { return must<engine_status>(status_atom::value); }

  transfer_order order(std::uint64_t v, transfer_mode mode = transfer_mode::sharded) {
    transfer_order o;
    o.version = v;
    o.mode = mode;
    o.backend = "local";
    return o;
  }

  /// pause → flush → start → transfer → finish → resume.
  void sync(std::uint64_t v, transfer_mode mode = transfer_mode::sharded) {
    must<pause_report>(pause_atom::value, pause_request{pause_mode::keep, false});
    must<phase_ack>(flush_atom::value);
    must<phase_ack>(start_atom::value, v);
    auto report = must<transfer_report>(transfer_atom::value, order(v, mode), std::vector<trainer_actor>{});
    CHECK(report.version == v);
    auto fin = must<phase_ack>(finish_atom::value, v);
    CHECK(fin.version == v);
    CHECK_FALSE(fin.dirty);
    must<phase_ack>(resume_atom::value);
  }

  generate_request greedy(std::uint64_t id, std::uint32_t max_tokens, std::vector<std::int32_t> generated = {}) {
    generate_request r;
    r.request_id = id;
    r.prompt = {1, 5, 9, 17};
    r.generated = std::move(generated);
    r.sampling.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.sampling.stop_at_eos = false;
    return r;
  }

  std::pair<caf::expected<generate_result>, std::vector<token_event>> generate(const generate_request& r) {
    auto log = std::make_shared<token_log>();
    auto sink = sys.spawn(locked_sink, log);
    auto res = ask<generate_result>(30s, generate_atom::value, r, sink);
    std::size_t want = res ? res->tokens.size() : 0;
    eventually([&] { return log->copy().size() >= want; });
    caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
    return {std::move(res), log->copy()};
  }

  /// Greedy tokens of a built-in engine on checkpoint `dir`, from its own HTTP route.
  std::vector<std::int32_t> reference_tokens(const std::string& ckpt, std::uint32_t max_tokens) {
    return reference(ckpt, max_tokens)["token_ids"].get<std::vector<std::int32_t>>();
  }
  /// The greedy choice of a built-in engine on checkpoint `dir` (with the sampled tokens' logprobs).
  json reference(const std::string& ckpt, std::uint32_t max_tokens) {
    serve_node_options o;
    o.checkpoint_dir = ckpt;
    o.tp = 1;
    auto ref = std::make_unique<serve_node>(sys, o);
    auto p = ref->start();
    json body = {{"prompt", {1, 5, 9, 17}}, {"max_tokens", max_tokens}, {"temperature", 0},
                 {"ignore_eos", true}, {"return_token_ids", true}, {"logprobs", 0}};
    auto r = http::request_once("127.0.0.1", p, {"POST", "/v1/completions", body.dump(), "application/json", {}});
    retire(ref);
    REQUIRE(r.status == 200);
    return json::parse(r.body)["choices"][0];
  }

  /// A generate request whose answer lands in a slot, read from any thread.
  struct answer_slot {
    std::mutex mu;
    std::optional<caf::expected<generate_result>> value;
    bool done() {
      std::lock_guard<std::mutex> lock(mu);
      return value.has_value();
    }
    std::optional<generate_result> result() {
      std::lock_guard<std::mutex> lock(mu);
      if (value && *value)
        return **value;
      return std::nullopt;
    }
  };
  std::shared_ptr<answer_slot> generate_async(const generate_request& r, token_sink_actor sink) {
    auto slot = std::make_shared<answer_slot>();
    auto e = engine;
    sys.spawn([=](caf::event_based_actor* self) {
      self->request(e, std::chrono::seconds(30), generate_atom::value, r, sink)
        .then(
          [=](generate_result& x) {
            std::lock_guard<std::mutex> lock(slot->mu);
            slot->value = std::move(x);
          },
          [=](caf::error& err) {
            std::lock_guard<std::mutex> lock(slot->mu);
            slot->value = caf::expected<generate_result>(std::move(err));
          });
    });
    return slot;
  }

  http::client_response server_call(const std::string& method, const std::string& target, const std::string& body = "") {
    return http::request_once("127.0.0.1", port, {method, target, body, "application/json", {}});
  }
};

} // namespace

// -- the pure helpers ---------------------------------------------------------------

TEST_CASE("helpers: server URLs, version labels, pause targets") {
  auto a = vllm::parse_server_url("http://127.0.0.1:8000");
  CHECK(a.host == "127.0.0.1");
  CHECK(a.port == 8000);
  CHECK(vllm::parse_server_url("http://srv/").port == 80);
  CHECK(vllm::parse_server_url("http://[::1]:9").host == "::1");
  // An IPv6 address without a port: port 80, its colons no port's.
  for (auto v6 : {"http://[::1]", "http://[fe80::1]/"}) {
    CAPTURE(v6);
    CHECK(vllm::parse_server_url(v6).port == 80);
  }
  for (auto bad : {"https://x:1", "x:1", "http://:1", "http://x:0", "http://x:65536", "http://x:1/v1", "http://u@x:1",
                   "http://x:", "http://x:12a", "http://[::1]:", "http://[::1]x"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(vllm::parse_server_url(bad), std::invalid_argument);
  }
  CHECK(vllm::version_label(7) == "v7");
  CHECK(vllm::parse_version_label("v7") == 7u);
  CHECK(vllm::parse_version_label("v0") == 0u);
  for (auto other : {"default", "v", "v07", "v7x", "step-7", "V7", "v99999999999999999999"})
    CHECK_FALSE(vllm::parse_version_label(other).has_value());
  CHECK(vllm::pause_target(pause_mode::keep, false) == "/pause?mode=keep&clear_cache=false");
  CHECK(vllm::pause_target(pause_mode::abort, true) == "/pause?mode=abort&clear_cache=true");
}

TEST_CASE("helpers: a continuation's completion body is the token-id prompt with the rest to generate") {
  generate_request r;
  r.request_id = 3;
  r.prompt = {1, 2};
  r.generated = {7, 8, 9};
  r.sampling.max_tokens = 10;
  r.sampling.temperature = 0.5f;
  r.sampling.seed = 42;
  r.sampling.stop_token_ids = {4};
  auto j = json::parse(vllm::completion_body(r, "m"));
  CHECK(j["prompt"] == json{1, 2, 7, 8, 9});
  CHECK(j["max_tokens"] == 7);
  CHECK(j["stream"] == true);
  CHECK(j["return_token_ids"] == true);
  CHECK(j["seed"] == 42);
  CHECK(j["model"] == "m");
  CHECK(j["stop_token_ids"] == json{4});
  CHECK(j["ignore_eos"] == false);
  CHECK_FALSE(j.contains("logprobs"));
  r.sampling.logprobs = true;
  r.sampling.top_logprobs = 2;
  CHECK(json::parse(vllm::completion_body(r, ""))["logprobs"] == 2);
  CHECK_FALSE(json::parse(vllm::completion_body(r, "")).contains("model"));
  r.generated.assign(10, 1);
  CHECK_THROWS_AS(vllm::completion_body(r, ""), std::invalid_argument);
}

TEST_CASE("helpers: stream chunks parsed, malformed ones refused naming the field") {
  auto c = vllm::parse_completion_chunk(
    R"({"id":"cmpl-1","choices":[{"index":0,"text":"ab","token_ids":[5,6],"finish_reason":null,
        "logprobs":{"tokens":["a","b"],"token_logprobs":[-0.5,-1.5],
                    "top_logprobs":[{"token_id:5":-0.5,"token_id:9":-0.7},{"token_id:6":-1.5}]}}]})");
  CHECK(c.id == "cmpl-1");
  CHECK(c.token_ids == std::vector<std::int32_t>{5, 6});
  CHECK(c.logprobs == std::vector<float>{-0.5f, -1.5f});
  REQUIRE(c.top.size() == 2);
  CHECK(c.top[0].front().first == 5);
  CHECK_FALSE(c.finish.has_value());
  CHECK_FALSE(c.weight_versions.has_value());
  auto last = vllm::parse_completion_chunk(
    R"({"choices":[{"index":0,"token_ids":[],"finish_reason":"length",
        "weight_versions":[{"version":"v1","start":0,"end":2},{"version":"v2","start":2,"end":5}]}]})");
  REQUIRE(last.finish.has_value());
  CHECK(*last.finish == finish_reason::length);
  REQUIRE(last.weight_versions.has_value());
  CHECK(last.weight_versions->size() == 2);
  CHECK(vllm::parse_completion_chunk(R"({"choices":[],"usage":{}})").usage_only);
  CHECK(*vllm::parse_completion_chunk(R"({"choices":[{"index":0,"finish_reason":"abort"}]})").finish
        == finish_reason::aborted);
  const char* bad[] = {
    "[]", "not json", R"({"no":"choices"})", R"({"choices":[{"index":1}]})",
    R"({"choices":[{"index":0,"token_ids":[-1]}]})", R"({"choices":[{"index":0,"token_ids":"x"}]})",
    R"({"choices":[{"index":0,"finish_reason":"sideways"}]})",
    R"({"choices":[{"index":0,"weight_versions":[{"version":"v1","start":1,"end":2}]}]})",
    R"({"choices":[{"index":0,"token_ids":[1],"logprobs":{"token_logprobs":[-1,-2]}}]})",
    R"({"error":{"message":"engine died","code":500}})",
  };
  for (auto b : bad) {
    CAPTURE(b);
    CHECK_THROWS_AS(vllm::parse_completion_chunk(b), std::invalid_argument);
  }
  try {
    vllm::parse_completion_chunk(R"({"error":{"message":"engine died"}})");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("engine died") != std::string::npos);
  }
}

TEST_CASE("helpers: a stream chunk is read strictly: depth, ranges, text without tokens, the error's status") {
  std::string deep = R"({"error":)";
  for (int i = 0; i < 100000; ++i)
    deep += '[';
  CHECK_THROWS_WITH_AS(vllm::parse_completion_chunk(deep), doctest::Contains("completion chunk: data: "),
                       std::invalid_argument); // refused as it opens: nothing that deep is built or printed
  CHECK_THROWS_WITH_AS(vllm::parse_completion_chunk(R"({"choices":[],"choices":[]})"),
                       doctest::Contains("completion chunk: data: "), std::invalid_argument);
  CHECK_THROWS_WITH_AS(
    vllm::parse_completion_chunk(R"({"choices":[{"index":0,"token_ids":[1],"logprobs":{"token_logprobs":[1e300]}}]})"),
    "completion chunk: choices[0].logprobs.token_logprobs: out of a float's range", std::invalid_argument);
  CHECK_THROWS_WITH_AS(vllm::parse_completion_chunk(R"({"choices":[{"index":0,"text":"abc","finish_reason":"length"}]})"),
                       "completion chunk: choices[0].token_ids: missing beside text: does the server honour "
                       "return_token_ids?",
                       std::invalid_argument);
  CHECK(vllm::parse_completion_chunk(R"({"choices":[{"index":0,"text":"","finish_reason":"length"}]})").finish);
  struct row {
    const char* chunk;
    int status;
    const char* message;
  };
  const row rows[] = {
    {R"({"error":{"message":"too long","type":"BadRequestError","code":400}})", 400,
     "the server reported an error in the stream (400): too long"},
    {R"({"error":{"message":"engine died","code":500}})", 500, "the server reported an error in the stream (500): engine died"},
    {R"({"error":{"message":"odd","code":7}})", 0, "the server reported an error in the stream: odd"},
    {R"({"error":{"message":"text code","code":"400"}})", 0, "the server reported an error in the stream: text code"},
    {R"({"error":[[1]]})", 0, "the server reported an error in the stream: an array"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.chunk);
    try {
      vllm::parse_completion_chunk(r.chunk);
      FAIL("an error event was taken as a chunk");
    } catch (const vllm::stream_error_event& e) {
      CHECK(e.status == r.status);
      CHECK(std::string(e.what()) == r.message);
    }
  }
}

TEST_CASE("helpers: the server's weight versions are believed only within what it held during the stream") {
  using spans = std::vector<vllm::label_span>;
  struct row {
    const char* what;
    spans labels;
    std::uint64_t opened_at, held;
    std::size_t tokens;
    std::vector<std::uint64_t> versions; ///< empty: not believed
  };
  const std::vector<row> rows = {
    {"one version", {{"v2", 0, 3}}, 2, 2, 3, {2}},
    {"across a sync", {{"v2", 0, 2}, {"v3", 2, 3}}, 2, 3, 3, {2, 3}},
    {"the initial weights", {{"default", 0, 3}}, 0, 0, 3, {0}},
    {"a version not held yet", {{"v2", 0, 2}, {"v3", 2, 3}}, 2, 2, 3, {}},
    {"a version older than the stream", {{"v1", 0, 3}}, 2, 2, 3, {}},
    {"the initial weights after a sync", {{"default", 0, 3}}, 2, 2, 3, {}},
    {"going back", {{"v3", 0, 2}, {"v2", 2, 3}}, 2, 3, 3, {}},
    {"a label not the adapter's", {{"step-2", 0, 3}}, 2, 2, 3, {}},
    {"short of the tokens", {{"v2", 0, 2}}, 2, 2, 3, {}},
    {"none for no tokens", {}, 2, 2, 0, {}},
  };
  for (const auto& r : rows) {
    CAPTURE(r.what);
    auto got = vllm::server_versions(r.labels, r.opened_at, r.held, r.tokens);
    if (r.versions.empty() && r.tokens != 0) {
      CHECK_FALSE(got);
      continue;
    }
    REQUIRE(got);
    REQUIRE(got->size() == r.versions.size());
    for (std::size_t i = 0; i < r.versions.size(); ++i) {
      CHECK((*got)[i].version == r.versions[i]);
      CHECK((*got)[i].begin == r.labels[i].start);
      CHECK((*got)[i].end == r.labels[i].end);
    }
  }
}

TEST_CASE("helpers: a version directory written group by group opens as a checkpoint, and old ones are removed") {
  test::scratch_dir dir;
  auto model = test::tiny_config();
  auto source = test::small_source(model);
  auto snapshot = source->produce_next();
  auto groups = plan::group_count(model);
  {
    vllm::version_dir_writer partial(dir / "w", 3, model, groups);
    partial.write_group(0, snapshot->group(0));
    CHECK_THROWS_AS(partial.write_group(0, snapshot->group(0)), std::invalid_argument);
    CHECK_THROWS_AS(partial.write_group(groups, {}), std::invalid_argument);
    CHECK_THROWS_AS(partial.commit(vllm::checkpoint_tensors(model, dtype::bf16)), std::invalid_argument);
  } // not committed: nothing left
  CHECK_FALSE(std::filesystem::exists(dir / "w/v3"));
  CHECK(std::filesystem::is_empty(dir / "w"));
  for (std::uint64_t v : {3, 4}) {
    vllm::version_dir_writer w(dir / "w", v, model, groups);
    for (std::uint32_t g = 0; g < groups; ++g)
      w.write_group(g, snapshot->group(g));
    auto out = w.commit(vllm::checkpoint_tensors(model, dtype::bf16));
    CHECK(out == std::filesystem::absolute(dir / "w/v" + std::to_string(v)).lexically_normal().string());
  }
  auto ckpt = checkpoint::open(dir / "w/v4");
  CHECK(ckpt.sharded());
  CHECK(check_llama_parameters(ckpt).empty());
  for (const auto& t : snapshot->tensors()) {
    auto* got = ckpt.find(t.name);
    REQUIRE(got);
    CHECK(test::bytes_of(*got) == test::bytes_of(t));
  }
  std::filesystem::create_directories(dir / "w/keep-me");
  CHECK(vllm::remove_other_versions(dir / "w", 4).empty());
  CHECK_FALSE(std::filesystem::exists(dir / "w/v3"));
  CHECK(std::filesystem::exists(dir / "w/v4"));
  CHECK(std::filesystem::exists(dir / "w/keep-me"));
}

TEST_CASE("helpers: the whole-tensor plan names every tensor once, whole") {
  auto model = test::tiny_config();
  auto p = vllm::whole_tensor_plan(model, dtype::bf16);
  auto specs = vllm::checkpoint_tensors(model, dtype::bf16);
  REQUIRE(p.entries.size() == specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CHECK(p.entries[i].source == specs[i].name);
    CHECK(p.entries[i].numel() == specs[i].numel());
    CHECK(p.entries[i].bytes() == specs[i].bytes());
  }
}

// -- the actor against rlsync serve --strict-vllm --------------------------------------

TEST_CASE("a full sync round over HTTP, then greedy output equals a built-in engine on that version") {
  vllm_fixture f;
  auto s = f.status();
  CHECK(s.version == 0); // the server's initial weights: not a version the adapter published
  CHECK_FALSE(s.dirty);
  f.sync(2);
  s = f.status();
  CHECK(s.version == 2);
  CHECK_FALSE(s.dirty);
  CHECK(s.state == scheduler_state::unpaused);
  CHECK(std::filesystem::exists(f.dir / "weights/v2"));
  // The server took the label the adapter finished with.
  CHECK(json::parse(f.server_call("GET", "/weight_info").body)["weight_version"] == "v2");

  write_checkpoint(*f.source->find(2), f.dir / "ref-v2");
  auto want = f.reference_tokens(f.dir / "ref-v2", 12);
  CHECK(f.reference_tokens(f.dir / "initial", 12) != want); // else the comparison would prove nothing
  auto [res, events] = f.generate(f.greedy(1, 12));
  REQUIRE(res);
  CHECK(res->tokens == want);
  CHECK(res->reason == finish_reason::length);

  // The digest: what the server's loader makes of version 2, confirmed by its weight checker.
  auto d = f.must<weight_digest>(digest_atom::value);
  CHECK(d.version == 2);
  CHECK_FALSE(d.dirty);
  auto reference = engine::weight_set::make(f.model, 2, dtype::bf16);
  engine::load_weights(f.source->find(2)->tensors(), *reference);
  auto sums = engine::weight_checksums(*reference);
  REQUIRE(d.names.size() == sums.size());
  for (std::size_t i = 0; i < d.names.size(); ++i) {
    CAPTURE(d.names[i]);
    CHECK(sums.at(d.names[i]) == d.checksums[i]);
  }

  // The next round, broadcast this time, removes the older directory.
  f.source->produce_next();
  f.sync(3, transfer_mode::broadcast);
  CHECK(f.status().version == 3);
  CHECK(std::filesystem::exists(f.dir / "weights/v3"));
  CHECK(eventually([&] { return !std::filesystem::exists(f.dir / "weights/v2"); })); // removed off the actor's thread
}

TEST_CASE("tokens relayed one by one with versions, and a continuation continues the indexes") {
  vllm_fixture f;
  f.sync(2);
  auto [full, events] = f.generate(f.greedy(7, 10));
  REQUIRE(full);
  REQUIRE(full->tokens.size() == 10);
  REQUIRE(events.size() == 10);
  for (std::uint32_t i = 0; i < events.size(); ++i) {
    CHECK(events[i].request_id == 7);
    CHECK(events[i].index == i);
    CHECK(events[i].token == full->tokens[i]);
    CHECK(events[i].version == 2);
  }
  REQUIRE(full->spans.size() == 1);
  CHECK(full->spans[0].version == 2);
  CHECK(full->spans[0].begin == 0);
  CHECK(full->spans[0].end == 10);
  CHECK(full->engine == "vllm-0");

  // Rerouted after 4 tokens: the rest continues from index 4, the same greedy tokens.
  std::vector<std::int32_t> prefix(full->tokens.begin(), full->tokens.begin() + 4);
  auto [rest, rest_events] = f.generate(f.greedy(8, 10, prefix));
  REQUIRE(rest);
  CHECK(rest->tokens == std::vector<std::int32_t>(full->tokens.begin() + 4, full->tokens.end()));
  REQUIRE(rest_events.size() == 6);
  CHECK(rest_events.front().index == 4);
  CHECK(rest_events.back().index == 9);

  // Log-probabilities relayed per token, as a built-in engine on version 2 reports them.
  write_checkpoint(*f.source->find(2), f.dir / "ref-v2");
  auto want = f.reference(f.dir / "ref-v2", 10)["logprobs"]["token_logprobs"].get<std::vector<float>>();
  auto with_logprobs = f.greedy(10, 10);
  with_logprobs.sampling.logprobs = true;
  auto [lp, lp_events] = f.generate(with_logprobs);
  REQUIRE(lp);
  CHECK(lp->tokens == full->tokens);
  REQUIRE(lp->logprobs.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CHECK(lp->logprobs[i] == doctest::Approx(want[i]).epsilon(1e-5));
    CHECK(lp_events[i].logprob == lp->logprobs[i]);
  }

  // Nothing left to generate: answered at once.
  auto done = f.ask<generate_result>(10s, generate_atom::value, f.greedy(9, 4, prefix),
                                     caf::actor_cast<token_sink_actor>(f.sys.spawn(locked_sink, std::make_shared<token_log>())));
  REQUIRE(done);
  CHECK(done->tokens.empty());
}

TEST_CASE("ordering mistakes the server answers 500 become error replies and leave it dirty") {
  vllm_fixture f;
  auto fin = f.ask<phase_ack>(10s, finish_atom::value, std::uint64_t{3});
  REQUIRE_FALSE(fin);
  CHECK(f.sys.render(fin.error()).find("500") != std::string::npos);
  CHECK(f.status().dirty);
  f.must<phase_ack>(start_atom::value, std::uint64_t{2});
  auto again = f.ask<phase_ack>(10s, start_atom::value, std::uint64_t{2});
  REQUIRE_FALSE(again);
  CHECK(f.status().dirty);
  // A transfer outside its session is refused before anything moves.
  auto outside = f.ask<transfer_report>(10s, transfer_atom::value, f.order(5), std::vector<trainer_actor>{});
  REQUIRE_FALSE(outside);
  // A complete round makes it clean again.
  f.must<phase_ack>(resume_atom::value); // closes the open session (an aborted round)
  f.sync(2);
  CHECK_FALSE(f.status().dirty);
  CHECK(f.status().version == 2);
}

TEST_CASE("pause(abort) replies after the aborted request ended, and abort ends one request") {
  vllm_fixture f;
  f.sync(2);
  f.must<pause_report>(pause_atom::value, pause_request{pause_mode::keep, false});
  auto sink = caf::actor_cast<token_sink_actor>(f.sys.spawn(locked_sink, std::make_shared<token_log>()));
  auto first = f.generate_async(f.greedy(11, 50), sink);
  auto second = f.generate_async(f.greedy(12, 50), sink);
  REQUIRE(eventually([&] { return f.status().frozen == 2; }));
  // One aborted by its id: answered at once, aborted.
  CHECK(f.must<bool>(abort_atom::value, std::uint64_t{11}));
  CHECK_FALSE(f.must<bool>(abort_atom::value, std::uint64_t{99}));
  REQUIRE(eventually([&] { return first->done(); }));
  REQUIRE(first->result());
  CHECK(first->result()->reason == finish_reason::aborted);
  // The other ends with the pause, whose reply comes after it.
  auto report = f.must<pause_report>(pause_atom::value, pause_request{pause_mode::abort, false});
  CHECK(report.aborted == 1);
  CHECK(report.state == scheduler_state::paused_new);
  CHECK(f.status().running + f.status().frozen == 0);
  REQUIRE(eventually([&] { return second->done(); }));
  REQUIRE(second->result());
  CHECK(second->result()->reason == finish_reason::aborted);
  f.must<phase_ack>(resume_atom::value);
  auto [after, events] = f.generate(f.greedy(13, 5));
  REQUIRE(after);
  CHECK(after->tokens.size() == 5);
}

TEST_CASE("a server that never answers fails the phase within its deadline") {
  silent_server silent;
  vllm_fixture f;
  vllm_engine_config c;
  c.model = f.model;
  c.name = "silent";
  c.url = "http://127.0.0.1:" + std::to_string(silent.port);
  c.weights_dir = f.dir / "silent";
  c.flush_deadline_ms = 300;
  c.health_interval_ms = 50;
  c.health_timeout_ms = 200;
  c.log = [](const std::string&) {};
  auto e = spawn_vllm_engine(f.sys, c);
  caf::scoped_actor self{f.sys};
  std::optional<caf::error> err;
  self->request(e, 20s, flush_atom::value)
    .receive([&](phase_ack&) { FAIL("a silent server acknowledged a flush"); }, [&](caf::error& x) { err = x; });
  REQUIRE(err);
  CHECK(*err != caf::sec::request_timeout); // the adapter's own deadline, not the caller's
  CHECK(f.sys.render(*err).find("reset_prefix_cache") != std::string::npos);
  // Never healthy: heartbeats go unanswered.
  bool answered = false;
  self->request(e, 300ms, heartbeat_atom::value, heartbeat{"t", 2})
    .receive([&](heartbeat&) { answered = true; }, [&](caf::error&) {});
  CHECK_FALSE(answered);
  caf::anon_send_exit(e, caf::exit_reason::user_shutdown);
}

TEST_CASE("a server stopped mid-stream fails the request") {
  vllm_fixture f;
  f.sync(2);
  // Paused (keep): the stream is open and silent when the server goes.
  f.must<pause_report>(pause_atom::value, pause_request{pause_mode::keep, false});
  auto log = std::make_shared<token_log>();
  auto sink = f.sys.spawn(locked_sink, log);
  std::thread stopper([&] {
    eventually([&] { return f.status().frozen == 1; });
    std::this_thread::sleep_for(200ms); // let the request reach the server
    f.server->stop();
  });
  auto res = f.ask<generate_result>(30s, generate_atom::value, f.greedy(3, 50), sink);
  stopper.join();
  REQUIRE_FALSE(res);
  CHECK(res.error() != caf::sec::request_timeout);
  caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
}

TEST_CASE("health loss leaves heartbeats unanswered, and the restarted server is version 0") {
  vllm_fixture f;
  f.sync(2);
  CHECK(f.status().version == 2);
  f.server->stop();
  CHECK(eventually([&] { return !f.heartbeat_answered(); }));
  CHECK(f.logged("unhealthy"));
  // Requests are refused while the server is gone (the router tries elsewhere).
  auto refused = f.ask<generate_result>(10s, generate_atom::value, f.greedy(4, 4),
                                        caf::actor_cast<token_sink_actor>(f.sys.spawn(locked_sink, std::make_shared<token_log>())));
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), errc::engine_dirty));
  f.start_server(); // same port, initial weights
  CHECK(eventually([&] { return f.heartbeat_answered(); }));
  auto s = f.status();
  CHECK(s.version == 0);
  CHECK_FALSE(s.dirty);
  CHECK(*f.recovered >= 1);
  // A sync brings it current again.
  f.sync(2);
  CHECK(f.status().version == 2);
}

TEST_CASE("a label the adapter did not finish means a restart: version 0") {
  vllm_fixture f;
  f.sync(2);
  // As if the server restarted between two polls and someone labelled it.
  REQUIRE(f.server_call("POST", "/update_weight_version", R"({"new_version": "default"})").status == 200);
  CHECK(eventually([&] { return f.status().version == 0; }));
  CHECK(f.logged("it restarted"));
  CHECK(*f.recovered >= 1);
}

TEST_CASE("the digest verifies only what the server's weight checker confirms") {
  vllm_fixture f;
  CHECK(f.must<weight_digest>(digest_atom::value).names.empty()); // version 0: nothing published
  f.sync(2);
  CHECK_FALSE(f.must<weight_digest>(digest_atom::value).names.empty());
  // Someone loads other weights behind the adapter's back, keeping its label.
  REQUIRE(f.server_call("POST", "/start_weight_update", "{}").status == 200);
  json path = {{"update_info", {{"path", f.dir / "initial"}}}};
  REQUIRE(f.server_call("POST", "/update_weights", path.dump()).status == 200);
  REQUIRE(f.server_call("POST", "/finish_weight_update", R"({"weight_version": "v2"})").status == 200);
  auto d = f.must<weight_digest>(digest_atom::value);
  CHECK(d.dirty);
  CHECK(d.names.empty());
  CHECK(f.status().dirty);
  CHECK(f.logged("differ from version 2"));
}

TEST_CASE("a sender the policy does not admit is refused") {
  vllm_fixture f;
  caf::scoped_actor outsider{f.sys};
  f.outsiders->insert(outsider->id());
  std::optional<caf::error> err;
  outsider->request(f.engine, 10s, status_atom::value)
    .receive([&](engine_status&) { FAIL("an outsider got the status"); }, [&](caf::error& e) { err = e; });
  REQUIRE(err);
  CHECK(is(*err, errc::unauthenticated));
  outsider->request(f.engine, 10s, start_atom::value, std::uint64_t{2})
    .receive([&](phase_ack&) { FAIL("an outsider started a session"); }, [&](caf::error& e) { err = e; });
  CHECK(is(*err, errc::unauthenticated));
  CHECK(f.status().refused == 2);
  // Nothing reached the server: a session can still start.
  f.must<phase_ack>(start_atom::value, std::uint64_t{2});
}

TEST_CASE("against a vLLM-shaped server: bearer token, its stream's versions, unknown checker keys") {
  vllm_fixture f; // for its system, model and producer
  fake_vllm fake("s3cret");
  auto make = [&](std::string token) {
    vllm_engine_config c;
    c.model = f.model;
    c.name = token.empty() ? "fake-untrusted" : "fake"; // one name per engine: a stopping one unregisters its name
    c.url = "http://127.0.0.1:" + std::to_string(fake.port);
    c.bearer_token = token;
    c.weights_dir = f.dir / "fake-weights";
    c.puller = f.puller;
    c.health_interval_ms = 50;
    c.log = f.engine_log();
    return spawn_vllm_engine(f.sys, c);
  };
  caf::scoped_actor self{f.sys};
  // Without the token the server refuses the mutating routes.
  auto untrusted = make("");
  auto refused = error_of<phase_ack>(self, untrusted, start_atom::value, std::uint64_t{2});
  REQUIRE(refused);
  CHECK(f.sys.render(*refused).find("401") != std::string::npos);
  caf::anon_send_exit(untrusted, caf::exit_reason::user_shutdown);

  auto e = make("s3cret");
  REQUIRE(eventually([&] {
    bool answered = false;
    self->request(e, 300ms, heartbeat_atom::value, heartbeat{"t", 1})
      .receive([&](heartbeat&) { answered = true; }, [](caf::error&) {});
    return answered;
  }));
  CHECK_FALSE(error_of<pause_report>(self, e, pause_atom::value, pause_request{pause_mode::keep, false}));
  CHECK_FALSE(error_of<phase_ack>(self, e, start_atom::value, std::uint64_t{2}));
  CHECK_FALSE(error_of<transfer_report>(self, e, transfer_atom::value, f.order(2), std::vector<trainer_actor>{}));
  CHECK_FALSE(error_of<phase_ack>(self, e, finish_atom::value, std::uint64_t{2}));
  CHECK_FALSE(error_of<phase_ack>(self, e, resume_atom::value));
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    CHECK(fake.loaded == std::filesystem::absolute(f.dir / "fake-weights/v2").lexically_normal().string());
    CHECK(fake.label == "v2");
    std::vector<std::string> want = {"POST /pause?mode=keep&clear_cache=false", "POST /start_weight_update",
                                     "POST /update_weights", "POST /finish_weight_update", "POST /resume"};
    std::vector<std::string> round;
    for (auto& c : fake.calls)
      if (c != "POST /init_weight_transfer_engine") // once per (re)started server, beside the round
        round.push_back(c);
    CHECK(round == want);
  }
  CHECK(eventually([&] {
    std::lock_guard<std::mutex> lock(fake.mu);
    return std::count(fake.calls.begin(), fake.calls.end(), "POST /init_weight_transfer_engine") >= 1;
  }));
  CHECK(checkpoint::open(f.dir / "fake-weights/v2").tensors().size() == vllm::checkpoint_tensors(f.model, dtype::bf16).size());

  // The stream's weight_versions (last chunk) say the last token came from
  // v3, which the server never held: the adapter keeps its own account.
  auto log = std::make_shared<token_log>();
  std::optional<generate_result> res;
  self->request(e, 30s, generate_atom::value, f.greedy(5, 3), f.sys.spawn(locked_sink, log))
    .receive([&](generate_result& r) { res = r; }, [&](caf::error& err) { FAIL(f.sys.render(err)); });
  REQUIRE(res);
  CHECK(res->tokens == std::vector<std::int32_t>{40, 41, 42});
  REQUIRE(res->spans.size() == 1);
  CHECK(res->spans[0].version == 2);
  CHECK(res->spans[0].begin == 0);
  CHECK(res->spans[0].end == 3);
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    CHECK(fake.last_completion["prompt"] == json{1, 5, 9, 17});
    CHECK(fake.last_completion["stream"] == true);
  }

  // More tokens than asked for (the script sends 3): the request fails, nothing grows.
  std::optional<caf::error> lie;
  self->request(e, 30s, generate_atom::value, f.greedy(6, 2), f.sys.spawn(locked_sink, std::make_shared<token_log>()))
    .receive([&](generate_result&) { FAIL("a lying server's answer was taken"); }, [&](caf::error& err) { lie = err; });
  REQUIRE(lie);
  CHECK(f.sys.render(*lie).find("more than the 2 tokens") != std::string::npos);

  // A request the server refuses as its own fault (400: longer than the
  // server's --max-model-len, say) fails as malformed, which the router sends
  // to no other engine and which leaves this one routable; 429 (busy) asks
  // to retry elsewhere; anything else is the server's fault.
  for (const auto& [status, want] : std::vector<std::pair<int, errc>>{
         {400, errc::malformed}, {413, errc::malformed}, {429, errc::queue_full}, {500, errc::engine_dirty}, {404, errc::engine_dirty}}) {
    CAPTURE(status);
    fake.completion_status = status;
    std::optional<caf::error> refusal;
    self->request(e, 30s, generate_atom::value, f.greedy(11, 3), f.sys.spawn(locked_sink, std::make_shared<token_log>()))
      .receive([&](generate_result&) { FAIL("a refused request succeeded"); }, [&](caf::error& err) { refusal = err; });
    REQUIRE(refusal);
    CHECK(is(*refusal, want));
    CHECK(f.sys.render(*refusal).find("HTTP " + std::to_string(status)) != std::string::npos);
  }
  fake.completion_status = 200;

  // The same refusal as an error event after answering 200 (vLLM does that)
  // counts as one before any token; after some, the server failed while
  // generating (vLLM reports a dead engine mid-stream as 400 too).
  for (bool after_tokens : {false, true}) {
    CAPTURE(after_tokens);
    fake.stream_error_code = 400;
    fake.error_after_tokens = after_tokens;
    std::optional<caf::error> failed;
    self->request(e, 30s, generate_atom::value, f.greedy(11, 3), f.sys.spawn(locked_sink, std::make_shared<token_log>()))
      .receive([&](generate_result&) { FAIL("a failed stream succeeded"); }, [&](caf::error& err) { failed = err; });
    REQUIRE(failed);
    CHECK(is(*failed, after_tokens ? errc::engine_dirty : errc::malformed));
    CHECK(f.sys.render(*failed).find("in the stream (400): failed in the stream") != std::string::npos);
  }
  fake.stream_error_code = 0;

  // Log-probabilities asked for and not sent with the tokens: a lie, not
  // log-probabilities shifted onto the wrong tokens.
  auto with_logprobs = f.greedy(12, 3);
  with_logprobs.sampling.logprobs = true;
  std::optional<caf::error> unaligned;
  self->request(e, 30s, generate_atom::value, with_logprobs, f.sys.spawn(locked_sink, std::make_shared<token_log>()))
    .receive([&](generate_result&) { FAIL("tokens without log-probabilities were taken"); },
             [&](caf::error& err) { unaligned = err; });
  REQUIRE(unaligned);
  CHECK_MESSAGE(f.sys.render(*unaligned).find("2 tokens with 0 log-probabilities") != std::string::npos,
                f.sys.render(*unaligned));

  // A checker that names shards the adapter does not know: unverified, said so.
  std::optional<weight_digest> d;
  self->request(e, 30s, digest_atom::value).receive([&](weight_digest& x) { d = x; }, [&](caf::error& err) {
    FAIL(f.sys.render(err));
  });
  REQUIRE(d);
  CHECK(d->version == 2);
  CHECK(d->names.empty());
  CHECK_FALSE(d->dirty);
  CHECK(f.logged("does not know"));
  caf::anon_send_exit(e, caf::exit_reason::user_shutdown);
}

TEST_CASE("an order naming two trainer ranks (M:N) writes the same version") {
  std::map<std::uint32_t, std::shared_ptr<transfer::weight_puller>> ranks;
  std::vector<std::shared_ptr<transfer::synthetic_source>> halves;
  vllm_fixture f([&](vllm_engine_config& c) {
    c.producer_puller = [&ranks](const producer_holding& h, const trainer_actor&) { return ranks.at(h.rank); };
  });
  // The fixture's trainer, split by layer: each rank holds one layer's group and what goes with it.
  for (std::int64_t layer : {0, 1}) {
    transfer::synthetic_options o;
    o.config = f.model;
    o.initial_checkpoint = f.dir / "initial";
    o.perturb = 0.05;
    o.trainer_seed = 11;
    o.keep_versions = 4;
    o.threads = 1;
    o.held_layers = std::vector<std::int64_t>{layer};
    auto s = std::make_shared<transfer::synthetic_source>(o);
    s->produce_next();
    s->produce_next();
    ranks[static_cast<std::uint32_t>(layer)] = std::make_shared<transfer::local_transfer>(s);
    halves.push_back(s);
  }
  transfer_order order = f.order(2);
  for (std::uint32_t r = 0; r < 2; ++r) {
    producer_holding h{r, 1, {}};
    for (const auto& spec : halves[r]->parameters())
      h.held.push_back(spec.name);
    std::sort(h.held.begin(), h.held.end());
    order.producers.push_back(h);
  }
  f.must<pause_report>(pause_atom::value, pause_request{pause_mode::keep, false});
  f.must<phase_ack>(start_atom::value, std::uint64_t{2});
  f.must<transfer_report>(transfer_atom::value, order, std::vector<trainer_actor>(2));
  f.must<phase_ack>(finish_atom::value, std::uint64_t{2});
  f.must<phase_ack>(resume_atom::value);
  auto d = f.must<weight_digest>(digest_atom::value);
  auto reference = engine::weight_set::make(f.model, 2, dtype::bf16);
  engine::load_weights(f.source->find(2)->tensors(), *reference);
  auto sums = engine::weight_checksums(*reference);
  REQUIRE(d.names.size() == sums.size());
  for (std::size_t i = 0; i < d.names.size(); ++i)
    CHECK(sums.at(d.names[i]) == d.checksums[i]);
}
