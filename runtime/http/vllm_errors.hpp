#pragma once
// vLLM's answers for bad requests and failures, and the parsing rules its
// clients rely on:
//   - the error envelope {"error": {"message", "type", "param", "code"}}
//     (400 for bad parameters or bodies, 409 ordering, 500 failures; type is
//     the status's reason phrase, e.g. "Bad Request"), and the flat
//     {"error": "..."} that /pause, /resume, /is_paused and /abort_requests use;
//   - query booleans as clients spell them: true/false/1/0/yes/no/on/off in
//     any case (Python sends "False");
//   - a JSON body that must be an object, with errors naming body.FIELD.
#include "runtime/http/server.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace rlsync::http {

/// The reason phrase vLLM puts in the envelope's "type" ("Bad Request",
/// "Conflict", "Internal Server Error", ...).
std::string status_phrase(unsigned status);

/// {"error": {"message": message, "type": phrase, "param": param or null, "code": status}}
response error_envelope(unsigned status, const std::string& message, const std::string& param = "");
/// {"error": message}
response flat_error(unsigned status, const std::string& message);
/// A 200 (or `status`) answer with `body` serialized.
response json_response(const nlohmann::json& body, unsigned status = 200);

/// A request that is malformed; param names where ("body.update_info",
/// "query.mode", "body"), empty when nothing in particular.
struct bad_request : std::runtime_error {
  bad_request(const std::string& message, std::string param_name)
      : std::runtime_error(message), param(std::move(param_name)) {}
  std::string param;
};

/// true/false/1/0/yes/no/on/off, any case; nullopt otherwise.
std::optional<bool> parse_bool(std::string_view text);
/// The query parameter `name` as a boolean, `fallback` when absent; throws
/// bad_request naming "query.NAME" when it is spelt otherwise.
bool query_bool(const request& rq, const std::string& name, bool fallback);

/// The body as a JSON object. An empty (or all-whitespace) body is `{}` when
/// empty_is_object, else an error. Anything but an object (`[]`, `1`, `null`,
/// a string) or invalid JSON throws bad_request naming "body".
nlohmann::json parse_object_body(const std::string& body, bool empty_is_object = true);

/// Field accessors that throw bad_request naming "WHERE.NAME" when the field
/// has the wrong type; nullopt when absent (or null, as pydantic treats it).
/// `where` is the object's own path: "body", or e.g. "body.kwargs".
std::optional<std::string> optional_string(const nlohmann::json& obj, const std::string& name,
                                           const std::string& where = "body");
std::optional<bool> optional_bool(const nlohmann::json& obj, const std::string& name,
                                  const std::string& where = "body");
const nlohmann::json* optional_object(const nlohmann::json& obj, const std::string& name,
                                      const std::string& where = "body");

} // namespace rlsync::http
