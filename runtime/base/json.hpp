#pragma once
// JSON with nlohmann-json: a strict reader for files rlsync did not write,
// and string quoting for output still assembled by hand.
//
// Only the forward declarations are included here: this header is reached
// from runtime/safetensors.hpp, which half the project includes.
#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace rlsync {

/// `s` as a JSON string literal, quotes included, as nlohmann-json writes it
/// (", \ and control characters escaped; UTF-8 passes through). Bytes that
/// are not valid UTF-8 become U+FFFD, so the result is always valid JSON.
std::string json_quote(std::string_view s);

/// A JSON text that read_json_strict refuses; what() says why and where
/// (line and column, or the enclosing keys), but not which file.
struct json_read_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct json_read_limits {
  int max_depth = 8;                  // nested objects and arrays; the top-level value is depth 1
  std::size_t max_values = 1'000'000; // every value, containers included
};

/// The message for a second `key` in the object reached through `path`
/// (the keys, and array indexes as decimal text, from the top; empty for
/// the top-level object). Return "" for the default message.
using json_duplicate_message =
    std::function<std::string(const std::vector<std::string>& path, const std::string& key)>;

/// Parses `text` as exactly one JSON value (RFC 8259: no comments, nothing
/// but whitespace after it, no NUL byte, strings valid UTF-8) with
/// nlohmann's SAX parser.
/// Unlike nlohmann::json::parse, which silently keeps the last of two equal
/// keys, an object with a key twice is refused. Nesting deeper than
/// limits.max_depth is refused when it opens, before anything that deep is
/// built (the parser itself does not recurse), and so are more than
/// limits.max_values values. Throws json_read_error.
nlohmann::json read_json_strict(std::string_view text, const json_read_limits& limits = {},
                                const json_duplicate_message& duplicate_message = {});

/// "" when `text` holds no NUL byte, else "invalid JSON at line L, column C:
/// ..." for the first one. JSON text never holds one raw, but nlohmann's
/// parser takes it for the end of the input (so "{}\0junk" would pass as
/// "{}"): check this before parsing.
std::string json_nul_byte_message(std::string_view text);

/// A parse error from nlohmann's parser as "invalid JSON at line L,
/// column C: <what is wrong>", without the library's exception tag.
std::string json_syntax_message(const std::exception& parse_error);

/// How a value looks in a message: "an object", "an array", "an empty
/// string", "the string 'text'", anything else as its JSON text in quotes
/// ('5', '2.5', 'true', 'null').
std::string json_describe(const nlohmann::json& value);

} // namespace rlsync
