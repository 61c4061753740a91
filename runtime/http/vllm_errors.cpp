#include "runtime/http/vllm_errors.hpp"

#include "runtime/base/json.hpp"

#include <algorithm>
#include <cctype>

namespace rlsync::http {

std::string status_phrase(unsigned status) {
  switch (status) {
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 409: return "Conflict";
  case 413: return "Payload Too Large";
  case 422: return "Unprocessable Entity";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 503: return "Service Unavailable";
  default: return status >= 500 ? "Internal Server Error" : "Bad Request";
  }
}

response error_envelope(unsigned status, const std::string& message, const std::string& param) {
  nlohmann::json error = {{"message", message},
                          {"type", status_phrase(status)},
                          {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
                          {"code", status}};
  return json_response(nlohmann::json{{"error", std::move(error)}}, status);
}

response flat_error(unsigned status, const std::string& message) {
  return json_response(nlohmann::json{{"error", message}}, status);
}

response json_response(const nlohmann::json& body, unsigned status) {
  response r;
  r.status = status;
  // Invalid UTF-8 (e.g. echoed from a request) becomes U+FFFD, never an exception.
  r.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

std::optional<bool> parse_bool(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "true" || t == "1" || t == "yes" || t == "on")
    return true;
  if (t == "false" || t == "0" || t == "no" || t == "off")
    return false;
  return std::nullopt;
}

bool query_bool(const request& rq, const std::string& name, bool fallback) {
  auto it = rq.query.find(name);
  if (it == rq.query.end())
    return fallback;
  auto value = parse_bool(it->second);
  if (!value)
    throw bad_request("query parameter '" + name + "' must be a boolean (true/false, 1/0, yes/no, on/off), got '" +
                          it->second + "'",
                      "query." + name);
  return *value;
}

nlohmann::json parse_object_body(const std::string& body, bool empty_is_object) {
  if (std::all_of(body.begin(), body.end(), [](unsigned char c) { return std::isspace(c); })) {
    if (empty_is_object)
      return nlohmann::json::object();
    throw bad_request("the request body is empty; a JSON object is required", "body");
  }
  nlohmann::json value;
  try {
    value = read_json_strict(body, json_read_limits{16, 100'000});
  } catch (const std::exception& e) {
    throw bad_request(std::string("the request body is not valid JSON: ") + e.what(), "body");
  }
  if (!value.is_object())
    throw bad_request(std::string("the request body must be a JSON object, got ") + value.type_name(), "body");
  return value;
}

namespace {
const nlohmann::json* field(const nlohmann::json& obj, const std::string& name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null())
    return nullptr;
  return &*it;
}
} // namespace

std::optional<std::string> optional_string(const nlohmann::json& obj, const std::string& name, const std::string& where) {
  auto f = field(obj, name);
  if (!f)
    return std::nullopt;
  if (!f->is_string())
    throw bad_request("'" + name + "' must be a string, got " + f->type_name(), where + "." + name);
  return f->get<std::string>();
}

std::optional<bool> optional_bool(const nlohmann::json& obj, const std::string& name, const std::string& where) {
  auto f = field(obj, name);
  if (!f)
    return std::nullopt;
  if (!f->is_boolean())
    throw bad_request("'" + name + "' must be a boolean, got " + f->type_name(), where + "." + name);
  return f->get<bool>();
}

const nlohmann::json* optional_object(const nlohmann::json& obj, const std::string& name, const std::string& where) {
  auto f = field(obj, name);
  if (f && !f->is_object())
    throw bad_request("'" + name + "' must be an object, got " + f->type_name(), where + "." + name);
  return f;
}

} // namespace rlsync::http
