// The strict JSON reader (duplicate keys, depth, value count, syntax with
// line and column) and string quoting.
#include "runtime/base/json.hpp"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

using namespace rlsync;
using nlohmann::json;

namespace {

std::string read_error(const std::string& text, const json_read_limits& limits = {},
                       const json_duplicate_message& duplicate_message = {}) {
  try {
    read_json_strict(text, limits, duplicate_message);
  } catch (const json_read_error& e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST_CASE("read_json_strict: accepts JSON and keeps its types") {
  auto v = read_json_strict(" {\"a\": [1, -2, 2.5, \"5\", true, null], \"b\": {\"c\": {}}, \"\": \"\"}\n\t ");
  REQUIRE(v.is_object());
  auto& a = v.at("a");
  CHECK(a.at(0).is_number_unsigned());
  CHECK(a.at(1).is_number_integer());
  CHECK(a.at(1) == -2);
  CHECK(a.at(2).is_number_float());
  CHECK(a.at(3).is_string());
  CHECK(a.at(4) == true);
  CHECK(a.at(5).is_null());
  CHECK(v.at("b").at("c").empty());
  CHECK(v.at("") == "");
  CHECK(read_json_strict("5") == 5);
  CHECK(read_json_strict("\"\\u00e9\"") == "\xc3\xa9");
}

TEST_CASE("read_json_strict: refuses duplicate keys, deep nesting, too many values and bad syntax") {
  struct row {
    const char* what;
    std::string text;
    json_read_limits limits;
    const char* expect; // what() must start with this
  };
  const row rows[] = {
    {"duplicate at the top", R"({"a": 1, "b": 2, "a": 1})", {}, "duplicate key 'a'"},
    {"duplicate in a nested object", R"({"a": {"x": 1, "x": 2}})", {}, "a: duplicate key 'x'"},
    {"duplicate in an array element", R"({"a": [{}, {"x": 1, "x": 1}]})", {}, "a: 1: duplicate key 'x'"},
    {"equal keys in sibling objects are fine", R"({"a": {"x": 1}, "b": {"x": 1}})", {}, ""},
    {"depth at the limit", "[[[1]]]", {3, 100}, ""},
    {"depth past the limit", "[[[[1]]]]", {3, 100}, "JSON nested deeper than 3 levels"},
    {"objects count as levels", R"({"a": {"b": {"c": {}}}})", {3, 100}, "JSON nested deeper than 3 levels"},
    {"deep nesting refused as it opens", std::string(1'000'000, '['), {}, "JSON nested deeper than 8 levels"},
    {"values at the limit", "[1, 2, 3]", {8, 4}, ""},
    {"values past the limit", "[1, 2, 3, 4]", {8, 4}, "more than 4 JSON values"},
    {"empty text", "", {}, "invalid JSON at line 1, column 1: syntax error"},
    {"truncated", R"({"a": )", {}, "invalid JSON at line 1, column 7: syntax error"},
    {"trailing comma", "[1,]", {}, "invalid JSON at line 1, column 4: syntax error"},
    {"second value", "{} {}", {}, "invalid JSON at line 1, column 4: syntax error"},
    {"comment", "{} // no", {}, "invalid JSON at line 1, column 4: syntax error"},
    {"line and column", "{\n  \"a\": tru}", {}, "invalid JSON at line 2, column 11: syntax error"},
    {"string not UTF-8", "[\"\xff\"]", {}, "invalid JSON at line 1, column 3: syntax error"},
    {"NUL after the value", std::string("{}\0{}", 5), {}, "invalid JSON at line 1, column 3: a NUL byte"},
    {"NUL in a string", std::string("{\n\"a\0\": 1}", 10), {}, "invalid JSON at line 2, column 3: a NUL byte"},
    {"single quotes", "['a']", {}, "invalid JSON at line 1, column 2: syntax error"},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    std::string error = read_error(r.text, r.limits);
    if (*r.expect == '\0')
      CHECK(error.empty());
    else
      CHECK_MESSAGE(error.rfind(r.expect, 0) == 0, error);
  }
}

TEST_CASE("read_json_strict: the duplicate message comes from the caller, with the path") {
  std::vector<std::string> seen_path;
  auto name_it = [&](const std::vector<std::string>& path, const std::string& key) -> std::string {
    seen_path = path;
    return key == "x" ? "x twice" : "";
  };
  CHECK(read_error(R"({"a": [{"b": {"x": 1, "x": 2}}]})", {}, name_it) == "x twice");
  CHECK(seen_path == std::vector<std::string>{"a", "0", "b"});
  CHECK(read_error(R"({"y": 1, "y": 2})", {}, name_it) == "duplicate key 'y'"); // "" falls back
  CHECK(seen_path.empty());
}

TEST_CASE("json_quote: nlohmann's escaping, invalid UTF-8 replaced") {
  struct row {
    std::string in;
    std::string out;
  };
  const row rows[] = {
    {"", "\"\""},
    {"plain", "\"plain\""},
    {"say \"hi\" \\ /", "\"say \\\"hi\\\" \\\\ /\""},
    {"a\nb\tc\rd\be\ff", "\"a\\nb\\tc\\rd\\be\\ff\""},
    {std::string("nul\0x\x1f", 6), "\"nul\\u0000x\\u001f\""},
    {"caf\xc3\xa9 \xe2\x80\xa6", "\"caf\xc3\xa9 \xe2\x80\xa6\""},
    {"bad \xff byte", "\"bad \xef\xbf\xbd byte\""},
  };
  for (auto& r : rows) {
    CAPTURE(r.in);
    CHECK(json_quote(r.in) == r.out);
    CHECK(read_json_strict(json_quote(r.in)).is_string()); // always valid JSON
  }
}

TEST_CASE("json_describe: how values look in messages") {
  CHECK(json_describe(json::object()) == "an object");
  CHECK(json_describe(json::array()) == "an array");
  CHECK(json_describe(json("")) == "an empty string");
  CHECK(json_describe(json("5")) == "the string '5'");
  CHECK(json_describe(json(5)) == "'5'");
  CHECK(json_describe(json(-2.5)) == "'-2.5'");
  CHECK(json_describe(json(true)) == "'true'");
  CHECK(json_describe(json(nullptr)) == "'null'");
}
