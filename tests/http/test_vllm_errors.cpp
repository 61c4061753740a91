#include "runtime/http/vllm_errors.hpp"

#include <doctest/doctest.h>

using namespace rlsync::http;

TEST_CASE("http: query booleans are read as clients spell them") {
  struct row {
    const char* text;
    std::optional<bool> expected;
  };
  const row rows[] = {
      {"true", true},   {"True", true},   {"TRUE", true},  {"1", true},    {"yes", true},  {"Yes", true},
      {"on", true},     {"ON", true},     {"false", false}, {"False", false}, {"FALSE", false}, {"0", false},
      {"no", false},    {"NO", false},    {"off", false},  {"Off", false},  {"", std::nullopt}, {"2", std::nullopt},
      {"t", std::nullopt}, {"truee", std::nullopt}, {" true", std::nullopt}, {"nope", std::nullopt},
  };
  for (auto& r : rows) {
    CAPTURE(r.text);
    CHECK(parse_bool(r.text) == r.expected);
  }
}

TEST_CASE("http: query_bool falls back when absent and names the parameter when bad") {
  request rq;
  CHECK(query_bool(rq, "clear_cache", true));
  CHECK_FALSE(query_bool(rq, "clear_cache", false));
  rq.query["clear_cache"] = "False";
  CHECK_FALSE(query_bool(rq, "clear_cache", true));
  rq.query["clear_cache"] = "maybe";
  try {
    query_bool(rq, "clear_cache", true);
    FAIL("no error");
  } catch (const bad_request& e) {
    CHECK(e.param == "query.clear_cache");
    CHECK(std::string(e.what()).find("maybe") != std::string::npos);
  }
}

TEST_CASE("http: the vLLM error envelope and the flat error") {
  auto r = error_envelope(400, "bad thing", "body.update_info");
  CHECK(r.status == 400);
  auto j = nlohmann::json::parse(r.body);
  CHECK(j["error"]["message"] == "bad thing");
  CHECK(j["error"]["type"] == "Bad Request");
  CHECK(j["error"]["param"] == "body.update_info");
  CHECK(j["error"]["code"] == 400);
  auto none = nlohmann::json::parse(error_envelope(500, "x").body);
  CHECK(none["error"]["param"].is_null());
  CHECK(none["error"]["type"] == "Internal Server Error");
  CHECK(nlohmann::json::parse(error_envelope(409, "x").body)["error"]["type"] == "Conflict");
  auto flat = flat_error(400, "nope");
  CHECK(nlohmann::json::parse(flat.body) == nlohmann::json{{"error", "nope"}});
  // Invalid UTF-8 in a message is replaced, never thrown.
  CHECK_NOTHROW(error_envelope(400, std::string("\xff\xfe bad")));
}

TEST_CASE("http: bodies that are not JSON objects are refused naming body") {
  struct row {
    const char* body;
    bool ok;
  };
  const row rows[] = {{"", true},      {"  \n", true}, {"{}", true},    {"{\"a\": 1}", true}, {"[]", false},
                      {"1", false},    {"null", false}, {"\"s\"", false}, {"true", false},     {"{", false},
                      {"{} x", false}, {"{\"a\":1,\"a\":2}", false}};
  for (auto& r : rows) {
    CAPTURE(r.body);
    if (r.ok) {
      CHECK(parse_object_body(r.body).is_object());
    } else {
      try {
        parse_object_body(r.body);
        FAIL("accepted");
      } catch (const bad_request& e) {
        CHECK(e.param == "body");
      }
    }
  }
  CHECK_THROWS_AS(parse_object_body("", false), bad_request);
}

TEST_CASE("http: field accessors name body.FIELD on a wrong type") {
  auto body = parse_object_body(R"({"update_info": 1, "weight_version": 7, "flag": "yes", "s": "x", "n": null})");
  try {
    optional_object(body, "update_info");
    FAIL("accepted");
  } catch (const bad_request& e) {
    CHECK(e.param == "body.update_info");
  }
  CHECK_THROWS_AS(optional_string(body, "weight_version"), bad_request);
  CHECK_THROWS_AS(optional_bool(body, "flag"), bad_request);
  CHECK(optional_string(body, "s") == "x");
  CHECK_FALSE(optional_string(body, "n"));
  CHECK_FALSE(optional_string(body, "missing"));
  CHECK(optional_object(body, "missing") == nullptr);
}
