// /v1/completions without I/O: request parsing and its bounds, the engine
// requests it becomes, and the answers (body, SSE chunks, stop strings,
// logprobs, weight-version spans, strict mode).
#include "runtime/config/model_config.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "runtime/vllm/completions.hpp"

#include <doctest/doctest.h>

#include <set>

using namespace rlsync;
using namespace rlsync::vllm;
using nlohmann::json;

namespace {

completion_request parse_ok(const std::string& body) {
  auto r = parse_completion_request(body);
  if (auto* e = std::get_if<api_error>(&r))
    FAIL_CHECK(e->message);
  REQUIRE(std::holds_alternative<completion_request>(r));
  return std::get<completion_request>(r);
}

std::vector<std::int32_t> bytes(const std::string& s) {
  auto t = engine::encode(s);
  t.erase(t.begin()); // no BOS
  return t;
}

/// Feeds `tokens` into a choice one by one (version from `versions`, or 1),
/// collecting the streamed deltas; stops early when a stop string matches.
struct fed_choice {
  completion_choice choice;
  std::vector<json> deltas;
  bool stopped_early = false;
  std::size_t fed = 0;

  fed_choice(const completion_request& req, const std::vector<std::int32_t>& tokens, finish_reason end,
             const response_options& o, std::vector<std::uint64_t> versions = {})
      : choice(0, req, engine::encode("p")) {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      token_event ev;
      ev.index = static_cast<std::uint32_t>(i);
      ev.token = tokens[i];
      ev.version = i < versions.size() ? versions[i] : 1;
      ev.logprob = -0.5f;
      ev.top_tokens = {tokens[i], 7};
      ev.top_logprobs = {-0.5f, -1.5f};
      ++fed;
      bool stop = choice.add(ev);
      if (auto d = choice.take_delta(o))
        deltas.push_back(json::parse(d->dump()));
      if (stop) {
        stopped_early = true;
        break;
      }
    }
    choice.finish(end);
    if (auto d = choice.take_delta(o))
      deltas.push_back(json::parse(d->dump()));
    CHECK(!choice.take_delta(o)); // nothing after the last chunk
  }

  std::string streamed_text() const {
    std::string s;
    for (auto& d : deltas)
      s += d["text"].get<std::string>();
    return s;
  }
};

} // namespace

TEST_CASE("completions: malformed bodies are 400 naming the field") {
  struct row {
    std::string body, param, says;
  };
  const std::vector<row> rows = {
    {"[]", "body", "must be a JSON object"},
    {"1", "body", "must be a JSON object"},
    {"null", "body", "must be a JSON object"},
    {"{", "body", "invalid JSON"},
    {R"({"prompt": "a", "prompt": "b"})", "body", "prompt"},
    {R"({})", "body.prompt", "is required"},
    {R"({"prompt": null})", "body.prompt", "is required"},
    {R"({"prompt": 5})", "body.prompt", "string or a list"},
    {R"({"prompt": []})", "body.prompt", "is empty"},
    {R"({"prompt": [[]]})", "body.prompt[0]", "is empty"},
    {R"({"prompt": [1, "a"]})", "body.prompt[1]", "token id"},
    {R"({"prompt": [1, -3]})", "body.prompt[1]", "must be in 0.."},
    {R"({"prompt": [1, 2.5]})", "body.prompt[1]", "token id"},
    {R"({"prompt": ["a", 3]})", "body.prompt[1]", "string or a list"},
    {R"({"prompt": "a", "model": 3})", "body.model", "must be a string"},
    {R"({"prompt": "a", "max_tokens": 0})", "body.max_tokens", "must be in 1.."},
    {R"({"prompt": "a", "max_tokens": 1.5})", "body.max_tokens", "must be an integer"},
    {R"({"prompt": "a", "max_tokens": "16"})", "body.max_tokens", "must be an integer"},
    {R"({"prompt": "a", "max_tokens": 2000000})", "body.max_tokens", "must be in 1..1048576"},
    {R"({"prompt": "a", "temperature": -1})", "body.temperature", "must be in [0, 100]"},
    {R"({"prompt": "a", "temperature": "hot"})", "body.temperature", "must be a number"},
    {R"({"prompt": "a", "top_p": 0})", "body.top_p", "(0, 1]"},
    {R"({"prompt": "a", "top_p": 1.5})", "body.top_p", "(0, 1]"},
    {R"({"prompt": "a", "top_p": 1e-50})", "body.top_p", "not below a float's smallest normal value"},
    {R"({"prompt": "a", "n": 0})", "body.n", "must be in 1..64"},
    {R"({"prompt": "a", "n": 65})", "body.n", "must be in 1..64"},
    {R"({"prompt": "a", "logprobs": 21})", "body.logprobs", "must be in 0..20"},
    {R"({"prompt": "a", "logprobs": -1})", "body.logprobs", "must be in 0..20"},
    {R"({"prompt": "a", "stream": "maybe"})", "body.stream", "must be a boolean"},
    {R"({"prompt": "a", "stream": 2})", "body.stream", "must be a boolean"},
    {R"({"prompt": "a", "stream_options": 1})", "body.stream_options", "must be an object"},
    {R"({"prompt": "a", "stream_options": {"include_usage": []}})", "body.stream_options.include_usage",
     "must be a boolean"},
    {R"({"prompt": "a", "seed": "x"})", "body.seed", "must be an integer"},
    {R"({"prompt": "a", "stop": 1})", "body.stop", "string or a list"},
    {R"({"prompt": "a", "stop": [""]})", "body.stop[0]", "empty string"},
    {R"({"prompt": "a", "stop": ["x", 2]})", "body.stop[1]", "must be a string"},
    {R"({"prompt": "a", "stop": ")" + std::string(257, 'x') + R"("})", "body.stop", "exceed the limit of 256"},
    {R"({"prompt": "a", "stop_token_ids": 3})", "body.stop_token_ids", "list of token ids"},
    {R"({"prompt": "a", "stop_token_ids": [3, "x"]})", "body.stop_token_ids[1]", "token id"},
    {R"({"prompt": "a", "ignore_eos": {}})", "body.ignore_eos", "must be a boolean"},
    {R"({"prompt": "a", "echo": true})", "body.echo", "not supported"},
    {R"({"prompt": "a", "n": 2, "best_of": 3})", "body.best_of", "not supported"},
    {R"({"prompt": ["a","b","c","d","e"], "n": 64})", "body.n", "exceed the limit of 256 choices"},
    // Sampling controls the engine does not implement: refused unless neutral.
    {R"({"prompt": "a", "top_k": 5})", "body.top_k", "is not supported unless -1 or 0 (every token), got '5'"},
    {R"({"prompt": "a", "min_p": 0.1})", "body.min_p", "is not supported unless 0, got '0.1'"},
    {R"({"prompt": "a", "presence_penalty": 0.5})", "body.presence_penalty", "is not supported unless 0"},
    {R"({"prompt": "a", "frequency_penalty": -1})", "body.frequency_penalty", "is not supported unless 0"},
    {R"({"prompt": "a", "repetition_penalty": 1.2})", "body.repetition_penalty", "is not supported unless 1"},
    {R"({"prompt": "a", "min_tokens": 3})", "body.min_tokens", "is not supported unless 0"},
    {R"({"prompt": "a", "top_k": "many"})", "body.top_k", "must be a number"},
    {R"({"prompt": "a", "logit_bias": {"1": 5}})", "body.logit_bias", "is not supported unless empty"},
    {R"({"prompt": "a", "prompt_logprobs": 1})", "body.prompt_logprobs", "is not supported"},
    {R"({"prompt": "a", "include_stop_str_in_output": true})", "body.include_stop_str_in_output", "is not supported"},
    {R"({"prompt": "a", "use_beam_search": true})", "body.use_beam_search", "is not supported"},
    {R"({"prompt": "a", "suffix": "z"})", "body.suffix", "is not supported"},
    {R"({"prompt": "a", "return_tokens_as_token_ids": 3})", "body.return_tokens_as_token_ids", "must be a boolean"},
    // Constrained decoding and token filters change outputs: refused, never ignored.
    {R"({"prompt": "a", "guided_json": {"type": "object"}})", "body.guided_json", "is not supported"},
    {R"({"prompt": "a", "guided_regex": "[a-z]+"})", "body.guided_regex", "is not supported"},
    {R"({"prompt": "a", "guided_choice": ["yes", "no"]})", "body.guided_choice", "is not supported"},
    {R"({"prompt": "a", "guided_grammar": "root ::= x"})", "body.guided_grammar", "is not supported"},
    {R"({"prompt": "a", "structured_outputs": {"regex": "x"}})", "body.structured_outputs", "is not supported"},
    {R"({"prompt": "a", "allowed_token_ids": [1, 2]})", "body.allowed_token_ids", "is not supported"},
    {R"({"prompt": "a", "bad_words": ["x"]})", "body.bad_words", "is not supported"},
    {R"({"prompt": "a", "response_format": {"type": "json_object"}})", "body.response_format",
     "is not supported unless {\"type\": \"text\"}"},
    {R"({"prompt": "a", "response_format": {"type": 3}})", "body.response_format", "is not supported"},
    {R"({"prompt": "a", "skip_special_tokens": false})", "body.skip_special_tokens", "is not supported unless true"},
    {R"({"prompt": "a", "priority": 2})", "body.priority", "is not supported unless 0"},
    {R"({"prompt": "a", "add_special_tokens": []})", "body.add_special_tokens", "must be a boolean"},
    {R"({"prompt": "", "add_special_tokens": false})", "body.prompt", "is empty"},
    {R"({"prompt": ["a", ""], "add_special_tokens": false})", "body.prompt[1]", "is empty"},
    {R"({"prompt": "a", "truncate_prompt_tokens": 0})", "body.truncate_prompt_tokens", "must be in 1.."},
    {R"({"prompt": "a", "truncate_prompt_tokens": -1})", "body.truncate_prompt_tokens", "must be in 1.."},
  };
  for (const auto& r : rows) {
    CAPTURE(r.body.substr(0, 120));
    auto got = parse_completion_request(r.body);
    REQUIRE(std::holds_alternative<api_error>(got));
    const auto& e = std::get<api_error>(got);
    CHECK(e.status == 400);
    CHECK(e.param == r.param);
    CHECK_MESSAGE(e.message.find(r.says) != std::string::npos, e.message);
    auto env = json::parse(error_body(e).dump());
    CHECK(env["error"]["code"] == 400);
    CHECK(env["error"]["type"] == "Bad Request");
    CHECK(env["error"]["param"] == r.param);
    CHECK(env["error"]["message"] == e.message);
  }
}

TEST_CASE("completions: bounds on prompt lists and prompt tokens") {
  completion_limits small;
  small.max_prompts = 2;
  small.max_prompt_tokens = 5;
  auto many = parse_completion_request(R"({"prompt": ["a", "b", "c"]})", small);
  REQUIRE(std::holds_alternative<api_error>(many));
  CHECK(std::get<api_error>(many).message.find("3 prompts exceed the limit of 2") != std::string::npos);
  auto long_prompt = parse_completion_request(R"({"prompt": "abcdef"})", small); // BOS + 6 bytes
  REQUIRE(std::holds_alternative<api_error>(long_prompt));
  CHECK(std::get<api_error>(long_prompt).message.find("7 tokens exceed the limit of 5") != std::string::npos);
}

TEST_CASE("completions: fields parse as RL clients send them, unknown fields are ignored") {
  auto d = parse_ok(R"({"prompt": "hi"})");
  CHECK(d.prompts == std::vector<std::vector<std::int32_t>>{engine::encode("hi")});
  CHECK(d.max_tokens == 16u);
  CHECK(d.temperature == 1.0f);
  CHECK(d.top_p == 1.0f);
  CHECK(d.n == 1);
  CHECK(!d.logprobs);
  CHECK(!d.stream);
  CHECK(!d.seed);
  CHECK(d.model.empty());

  auto f = parse_ok(R"({"model": "m", "prompt": [[256, 104], [256, 105]], "max_tokens": 8.0, "temperature": 0,
    "top_p": 0.9, "n": 3, "logprobs": 0, "stream": "True", "stream_options": {"include_usage": 1},
    "return_token_ids": "yes", "seed": -1, "stop": "\n", "stop_token_ids": [10, 33], "ignore_eos": true,
    "frequency_penalty": 0, "user": "x", "extra": {"deep": [1]}})");
  CHECK(f.model == "m");
  CHECK(f.prompts.size() == 2);
  CHECK(f.prompts[1] == std::vector<std::int32_t>{256, 105});
  CHECK(f.max_tokens == 8u);
  CHECK(f.temperature == 0.0f);
  CHECK(f.top_p == doctest::Approx(0.9f));
  CHECK(f.n == 3);
  CHECK(f.logprobs == 0u);
  CHECK(f.stream);
  CHECK(f.include_usage);
  CHECK(f.return_token_ids);
  CHECK(f.seed == ~std::uint64_t{0});
  CHECK(f.stop == std::vector<std::string>{"\n"});
  CHECK(f.stop_token_ids == std::vector<std::int32_t>{10, 33});
  CHECK(f.ignore_eos);

  // The neutral values of sampling controls the engine does not implement pass.
  auto neutral = parse_ok(R"({"prompt": "a", "top_k": -1, "min_p": 0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
    "min_tokens": 0, "length_penalty": 1, "logit_bias": {}, "prompt_logprobs": null, "include_stop_str_in_output": false,
    "use_beam_search": false, "suffix": "", "skip_special_tokens": true, "return_tokens_as_token_ids": true})");
  CHECK(neutral.tokens_as_ids);
  CHECK_FALSE(f.tokens_as_ids);
  CHECK(parse_ok(R"({"prompt": "a", "top_k": 0})").prompts.size() == 1);
  CHECK(parse_ok(R"({"prompt": "a", "response_format": {"type": "text"}, "priority": 0, "guided_json": null,
    "bad_words": [], "allowed_token_ids": [], "logits_processors": []})")
          .prompts.size() == 1);

  // add_special_tokens false: a string prompt without BOS; token ids as given.
  auto no_bos = parse_ok(R"({"prompt": ["hi", [256, 7]], "add_special_tokens": false})");
  CHECK(no_bos.prompts == std::vector<std::vector<std::int32_t>>{{'h', 'i'}, {256, 7}});
  // truncate_prompt_tokens keeps each prompt's last k tokens.
  auto cut = parse_ok(R"({"prompt": ["abc", [1, 2]], "truncate_prompt_tokens": 2})");
  CHECK(cut.prompts == std::vector<std::vector<std::int32_t>>{{'b', 'c'}, {1, 2}});

  auto tokens = parse_ok(R"({"prompt": [256, 1, 2], "max_tokens": null, "stop": ["a", "bc"], "stream": false})");
  CHECK(tokens.prompts == std::vector<std::vector<std::int32_t>>{{256, 1, 2}});
  CHECK(!tokens.max_tokens);
  CHECK(tokens.stop == std::vector<std::string>{"a", "bc"});
  auto strings = parse_ok(R"({"prompt": ["a", ""]})");
  CHECK(strings.prompts == std::vector<std::vector<std::int32_t>>{engine::encode("a"), engine::encode("")});

  // Booleans spelt every way clients spell them.
  for (const char* yes : {"true", "1", "\"true\"", "\"True\"", "\"1\"", "\"yes\"", "\"on\"", "\"ON\""})
    CHECK(parse_ok(std::string(R"({"prompt": "a", "stream": )") + yes + "}").stream);
  for (const char* no : {"false", "0", "null", "\"false\"", "\"False\"", "\"0\"", "\"no\"", "\"off\""})
    CHECK(!parse_ok(std::string(R"({"prompt": "a", "stream": )") + no + "}").stream);
}

TEST_CASE("completions: engine requests, one per prompt x n, with derived seeds") {
  model_limits model{258, 64};
  auto req = parse_ok(R"({"prompt": ["ab", "c"], "n": 2, "seed": 42, "temperature": 0.7, "top_p": 0.5,
    "max_tokens": 5, "logprobs": 2, "stop_token_ids": [10], "ignore_eos": true})");
  auto made = make_generate_requests(req, model, 100, 999);
  REQUIRE(std::holds_alternative<std::vector<generate_request>>(made));
  auto& rs = std::get<std::vector<generate_request>>(made);
  REQUIRE(rs.size() == 4);
  std::set<std::uint64_t> seeds;
  for (std::uint32_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(rs[i].request_id == 100 + i);
    CHECK(rs[i].prompt == engine::encode(i < 2 ? "ab" : "c"));
    CHECK(rs[i].sampling.seed == choice_seed(42, i));
    CHECK(rs[i].sampling.temperature == doctest::Approx(0.7f));
    CHECK(rs[i].sampling.top_p == doctest::Approx(0.5f));
    CHECK(rs[i].sampling.max_tokens == 5);
    CHECK(rs[i].sampling.logprobs);
    CHECK(rs[i].sampling.top_logprobs == 2);
    CHECK(rs[i].sampling.stop_token_ids == std::vector<std::int32_t>{10});
    CHECK(!rs[i].sampling.stop_at_eos);
    CHECK(check(rs[i]).empty());
    seeds.insert(rs[i].sampling.seed);
  }
  CHECK(rs[0].sampling.seed == 42); // choice 0 samples as `rlsync generate --seed 42`
  CHECK(seeds.size() == 4);         // the choices differ
  // Replays identically; without a seed, the caller's entropy decides.
  auto again = std::get<std::vector<generate_request>>(make_generate_requests(req, model, 100, 12345));
  CHECK(again[3].sampling.seed == rs[3].sampling.seed);
  auto unseeded = parse_ok(R"({"prompt": "a", "n": 2})");
  auto u = std::get<std::vector<generate_request>>(make_generate_requests(unseeded, model, 1, 7));
  CHECK(u[0].sampling.seed == 7);
  CHECK(u[1].sampling.seed == choice_seed(7, 1));
  CHECK(u[0].sampling.stop_at_eos);
  CHECK(!u[0].sampling.logprobs);
  // max_tokens null: up to the context length.
  auto open = parse_ok(R"({"prompt": "abc", "max_tokens": null})");
  CHECK(std::get<std::vector<generate_request>>(make_generate_requests(open, model, 1, 0))[0].sampling.max_tokens
        == 64 - 4);
}

TEST_CASE("completions: prompts the model cannot take are 400") {
  model_limits model{258, 16};
  struct row {
    std::string body, param, says;
  };
  const std::vector<row> rows = {
    {R"({"prompt": [256, 300]})", "body.prompt[1]", "outside the vocabulary of 258"},
    {R"({"prompt": ["a", [1, 999]], "max_tokens": 2})", "body.prompt[1][1]", "outside the vocabulary"},
    {R"({"prompt": "0123456789abcdef"})", "body.prompt", "maximum context length is 16 tokens"},
    {R"({"prompt": "0123456789", "max_tokens": 6})", "body.max_tokens", "you requested 17 tokens (11 in the"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.body);
    auto made = make_generate_requests(parse_ok(r.body), model, 1, 0);
    REQUIRE(std::holds_alternative<api_error>(made));
    CHECK(std::get<api_error>(made).param == r.param);
    CHECK_MESSAGE(std::get<api_error>(made).message.find(r.says) != std::string::npos,
                  std::get<api_error>(made).message);
  }
  CHECK(std::holds_alternative<std::vector<generate_request>>(
    make_generate_requests(parse_ok(R"({"prompt": "0123456789", "max_tokens": 5})"), model, 1, 0)));
}

TEST_CASE("completions: a non-streamed answer is bounded, a streamed one is not") {
  model_limits model{258, 1000};
  completion_limits small;
  small.max_answer_entries = 100;
  auto check = [&](const std::string& body) {
    auto req = parse_ok(body);
    auto made = make_generate_requests(req, model, 1, 0);
    REQUIRE(std::holds_alternative<std::vector<generate_request>>(made));
    return check_answer_size(req, std::get<std::vector<generate_request>>(made), small);
  };
  // Each choice: its tokens, and its prompt's ids echoed (BOS and "a").
  CHECK_FALSE(check(R"({"prompt": "a", "n": 4, "max_tokens": 23})"));            // 4 × (23 + 2) = 100
  auto over = check(R"({"prompt": "a", "n": 4, "max_tokens": 24})");              // 104
  REQUIRE(over);
  CHECK(over->param == "body.max_tokens");
  CHECK_MESSAGE(over->message.find("holds up to 104 entries, above the limit of 100") != std::string::npos,
                over->message);
  // Log-probabilities count: the sampled token's and each of the top k.
  CHECK_FALSE(check(R"({"prompt": "a", "max_tokens": 24, "logprobs": 2})"));      // 24 × 4 + 2
  CHECK(check(R"({"prompt": "a", "max_tokens": 25, "logprobs": 2})"));            // 25 × 4 + 2
  // max_tokens null: up to the context length, 998 tokens after BOS and "a".
  CHECK(check(R"({"prompt": "a", "max_tokens": null})"));
  CHECK_FALSE(check(R"({"prompt": "a", "max_tokens": null, "stream": true, "n": 64, "logprobs": 20})"));
}

TEST_CASE("completions: stop strings cut the text and finish with stop, streamed deltas join to the text") {
  struct row {
    std::string output; // what the engine produces, byte by byte
    std::vector<std::string> stop;
    std::string text, reason;
    json stop_reason;
    bool early; // the choice ended on a stop string before the engine did
  };
  const std::vector<row> rows = {
    {"hello world", {}, "hello world", "length", nullptr, false},
    {"hello world", {"wor"}, "hello ", "stop", "wor", true},
    {"hello world", {"xyz", "lo w"}, "hel", "stop", "lo w", true},
    {"hello world", {"o", "l"}, "he", "stop", "l", true},                // the earliest match wins
    {"aaab", {"aab"}, "a", "stop", "aab", true},                         // overlapping prefix
    {"hello", {"lox"}, "hello", "length", nullptr, false},               // a held-back prefix is released at the end
    {"caf\xC3\xA9 ok", {"ok"}, "caf\xC3\xA9 ", "stop", "ok", true},      // UTF-8 stays whole
    {"bad \xC3 x", {}, "bad \xEF\xBF\xBD x", "length", nullptr, false},  // invalid bytes become U+FFFD
  };
  for (const auto& r : rows) {
    CAPTURE(r.output);
    completion_request req;
    req.stop = r.stop;
    response_options o;
    fed_choice f(req, bytes(r.output), finish_reason::length, o);
    CHECK(f.choice.text() == r.text);
    CHECK(f.streamed_text() == r.text);
    CHECK(f.stopped_early == r.early);
    auto full = json::parse(f.choice.to_json(o).dump());
    CHECK(full["text"] == r.text);
    CHECK(full["finish_reason"] == r.reason);
    CHECK(full["stop_reason"] == r.stop_reason);
    // Tokens up to and including the one that completed the stop string.
    CHECK(full["token_ids"].size() == f.fed);
    REQUIRE(!f.deltas.empty());
    CHECK(f.deltas.back()["finish_reason"] == r.reason);
    for (std::size_t i = 0; i + 1 < f.deltas.size(); ++i) {
      CHECK(f.deltas[i]["finish_reason"].is_null());
      CHECK(!f.deltas[i].contains("weight_versions")); // only the last chunk carries the spans
    }
  }
}

TEST_CASE("completions: a stop token ends with stop and its text left out, EOS has no text") {
  completion_request req;
  req.stop_token_ids = {'!'};
  response_options o;
  fed_choice f(req, bytes("hi!"), finish_reason::eos, o);
  CHECK(f.choice.text() == "hi");
  auto j = json::parse(f.choice.to_json(o).dump());
  CHECK(j["finish_reason"] == "stop");
  CHECK(j["stop_reason"] == '!');
  CHECK(j["token_ids"] == json(bytes("hi!")));

  completion_request plain;
  auto eos = bytes("ok");
  eos.push_back(static_cast<std::int32_t>(token_eos));
  fed_choice e(plain, eos, finish_reason::eos, o);
  CHECK(e.choice.text() == "ok");
  auto je = json::parse(e.choice.to_json(o).dump());
  CHECK(je["finish_reason"] == "stop");
  CHECK(je["stop_reason"].is_null());
  fed_choice a(plain, bytes("part"), finish_reason::aborted, o);
  CHECK(json::parse(a.choice.to_json(o).dump())["finish_reason"] == "abort");
}

TEST_CASE("completions: logprobs carry tokens, token_logprobs, top_logprobs and text_offset") {
  completion_request req;
  req.logprobs = 1;
  response_options o;
  fed_choice f(req, {'a', 0xC3, 0xA9}, finish_reason::length, o);
  auto j = json::parse(f.choice.to_json(o).dump());
  auto& lp = j["logprobs"];
  CHECK(lp["tokens"] == json({"a", "bytes:\\xc3", "bytes:\\xa9"}));
  CHECK(lp["token_logprobs"] == json({-0.5, -0.5, -0.5}));
  CHECK(lp["text_offset"] == json({0, 1, 2}));
  REQUIRE(lp["top_logprobs"].size() == 3);
  // The top-1 (capped at logprobs = 1 even if the engine sent more) plus the sampled token.
  CHECK(lp["top_logprobs"][0] == json({{"a", -0.5}}));
  // Streamed: the deltas' logprobs add up to the same lists.
  json tokens = json::array();
  for (auto& d : f.deltas)
    for (auto& t : d["logprobs"]["tokens"])
      tokens.push_back(t);
  CHECK(tokens == lp["tokens"]);

  // vLLM's return_tokens_as_token_ids: every token named by its id.
  response_options ids = o;
  ids.tokens_as_ids = true;
  auto named = json::parse(f.choice.to_json(ids).dump())["logprobs"];
  CHECK(named["tokens"] == json({"token_id:97", "token_id:195", "token_id:169"}));
  CHECK(named["top_logprobs"][0] == json({{"token_id:97", -0.5}}));

  completion_request none;
  fed_choice g(none, {'a'}, finish_reason::length, o);
  CHECK(json::parse(g.choice.to_json(o).dump())["logprobs"].is_null());
  CHECK(token_string(token_bos) == "<bos>");
  CHECK(token_string(token_eos) == "<eos>");
  CHECK(token_string('\n') == "\n");
}

TEST_CASE("completions: weight_versions spans, half-open and contiguous, strict mode leaves them out") {
  completion_request req;
  response_options o;
  o.label = [](std::uint64_t v) { return v == 0 ? std::string("default") : "step-" + std::to_string(v); };
  fed_choice f(req, bytes("abcde"), finish_reason::length, o, {0, 0, 7, 7, 8});
  auto spans = json::parse(f.choice.to_json(o).dump())["weight_versions"];
  CHECK(spans == json::parse(R"([{"version": "default", "start": 0, "end": 2},
                                 {"version": "step-7", "start": 2, "end": 4},
                                 {"version": "step-8", "start": 4, "end": 5}])"));
  CHECK(f.deltas.back()["weight_versions"] == spans);
  fed_choice empty(req, {}, finish_reason::aborted, o);
  CHECK(json::parse(empty.choice.to_json(o).dump())["weight_versions"] == json::array());

  response_options strict = o;
  strict.strict = true;
  fed_choice s(req, bytes("ab"), finish_reason::length, strict);
  auto js = json::parse(s.choice.to_json(strict).dump());
  CHECK(!js.contains("weight_versions"));
  CHECK(!js.contains("token_ids"));
  for (auto& d : s.deltas) {
    CHECK(!d.contains("weight_versions"));
    CHECK(!d.contains("token_ids"));
  }
  strict.return_token_ids = true;
  fed_choice t(req, bytes("ab"), finish_reason::length, strict);
  auto jt = json::parse(t.choice.to_json(strict).dump());
  CHECK(jt["token_ids"] == json(bytes("ab")));
  CHECK(jt["prompt_token_ids"] == json(engine::encode("p")));
  CHECK(t.deltas.front()["prompt_token_ids"] == json(engine::encode("p"))); // first chunk only
  CHECK(!t.deltas.back().contains("prompt_token_ids"));
}

TEST_CASE("completions: the response body and the SSE stream") {
  completion_request req;
  response_options o;
  o.id = completion_id(1, 2);
  o.created = 1700000000;
  o.model = "tiny";
  o.include_usage = true;
  CHECK(o.id == "cmpl-00000000000000010000000000000002");
  std::vector<completion_choice> choices;
  choices.emplace_back(0, req, engine::encode("ab"));
  choices.emplace_back(1, req, engine::encode("ab"));
  token_event ev;
  ev.token = 'x';
  choices[0].add(ev);
  choices[0].finish(finish_reason::length);
  choices[1].finish(finish_reason::eos);
  auto body = json::parse(completion_response(o, choices, 3).dump());
  CHECK(body["id"] == o.id);
  CHECK(body["object"] == "text_completion");
  CHECK(body["created"] == 1700000000);
  CHECK(body["model"] == "tiny");
  CHECK(body["choices"].size() == 2);
  CHECK(body["choices"][1]["index"] == 1);
  CHECK(body["usage"] == json::parse(R"({"prompt_tokens": 3, "total_tokens": 4, "completion_tokens": 1})"));

  auto chunk = stream_chunk(o, *choices[0].take_delta(o));
  REQUIRE(chunk.rfind("data: ", 0) == 0);
  REQUIRE(chunk.size() > 8);
  CHECK(chunk.substr(chunk.size() - 2) == "\n\n");
  auto cj = json::parse(chunk.substr(6));
  CHECK(cj["object"] == "text_completion");
  CHECK(cj["choices"].size() == 1);
  CHECK(cj["choices"][0]["text"] == "x");
  CHECK(cj["usage"].is_null());
  auto usage = json::parse(usage_chunk(o, choices, 3).substr(6));
  CHECK(usage["choices"] == json::array());
  CHECK(usage["usage"]["completion_tokens"] == 1);
  CHECK(stream_done == "data: [DONE]\n\n");
  o.include_usage = false;
  CHECK(!json::parse(stream_chunk(o, json::object()).substr(6)).contains("usage"));
}
