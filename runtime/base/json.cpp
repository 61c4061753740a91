#include "runtime/base/json.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <utility>

namespace rlsync {

using nlohmann::json;

std::string json_quote(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string json_syntax_message(const std::exception& parse_error) {
  // nlohmann writes "[json.exception.parse_error.101] parse error at line 1,
  // column 5: syntax error while parsing ...".
  std::string what = parse_error.what();
  const std::string tag = "parse error";
  auto at = what.find(tag);
  if (at == std::string::npos)
    return "invalid JSON: " + what;
  return "invalid JSON" + what.substr(at + tag.size());
}

std::string json_nul_byte_message(std::string_view text) {
  auto at = text.find('\0');
  if (at == std::string_view::npos)
    return "";
  auto line_start = text.rfind('\n', at);
  std::size_t line = 1 + static_cast<std::size_t>(std::count(text.begin(), text.begin() + at, '\n'));
  std::size_t column = at - (line_start == std::string_view::npos ? 0 : line_start + 1) + 1;
  return "invalid JSON at line " + std::to_string(line) + ", column " + std::to_string(column)
         + ": a NUL byte (JSON text cannot hold one)";
}

std::string json_describe(const json& value) {
  switch (value.type()) {
  case json::value_t::object: return "an object";
  case json::value_t::array: return "an array";
  case json::value_t::string: {
    const auto& s = value.get_ref<const std::string&>();
    return s.empty() ? "an empty string" : "the string '" + s + "'";
  }
  default: return "'" + value.dump(-1, ' ', false, json::error_handler_t::replace) + "'";
  }
}

namespace {

// Builds the value as nlohmann's own DOM parser does, plus the checks it
// lacks: duplicate keys, depth and value count.
class strict_dom_builder : public nlohmann::json_sax<json> {
public:
  strict_dom_builder(const json_read_limits& limits, const json_duplicate_message& duplicate_message)
      : limits_(limits), duplicate_message_(duplicate_message) {}

  bool null() override { return place(json(nullptr)) != nullptr; }
  bool boolean(bool v) override { return place(json(v)) != nullptr; }
  bool number_integer(number_integer_t v) override { return place(json(v)) != nullptr; }
  bool number_unsigned(number_unsigned_t v) override { return place(json(v)) != nullptr; }
  bool number_float(number_float_t v, const string_t&) override { return place(json(v)) != nullptr; }
  bool string(string_t& v) override { return place(json(std::move(v))) != nullptr; }
  bool binary(binary_t&) override { return refuse("binary value"); } // only binary formats have them

  bool start_object(std::size_t) override { return open(json::object()); }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }

  bool key(string_t& k) override {
    if (open_.back()->contains(k)) {
      std::string message = duplicate_message_ ? duplicate_message_(path_, k) : "";
      if (message.empty()) {
        for (auto& step : path_)
          message += step + ": ";
        message += "duplicate key '" + k + "'";
      }
      return refuse(message);
    }
    key_ = std::move(k);
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return refuse(json_syntax_message(e));
  }

  json result;
  std::string error; // why parsing stopped

private:
  bool refuse(std::string why) {
    error = std::move(why);
    return false;
  }

  // Puts `value` where the parser is (the top, under the pending key, or at
  // the end of the open array) and returns where it now lives.
  json* place(json&& value) {
    if (++values_ > limits_.max_values) {
      refuse("more than " + std::to_string(limits_.max_values) + " JSON values");
      return nullptr;
    }
    if (open_.empty()) {
      result = std::move(value);
      return &result;
    }
    json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back(); // stays put: the array grows only while this element is closed
    }
    return &(parent[std::move(key_)] = std::move(value)); // a std::map node: never moves
  }

  bool open(json&& container) {
    if (static_cast<int>(open_.size()) >= limits_.max_depth)
      return refuse("JSON nested deeper than " + std::to_string(limits_.max_depth) + " levels");
    std::string step;
    if (!open_.empty())
      step = open_.back()->is_array() ? std::to_string(open_.back()->size()) : key_;
    json* placed = place(std::move(container));
    if (!placed)
      return false;
    if (!open_.empty())
      path_.push_back(std::move(step));
    open_.push_back(placed);
    return true;
  }

  bool close() {
    open_.pop_back();
    if (!path_.empty())
      path_.pop_back();
    return true;
  }

  const json_read_limits& limits_;
  const json_duplicate_message& duplicate_message_;
  std::vector<json*> open_;        // the containers being filled, outermost first
  std::vector<std::string> path_;  // how to reach open_.back() from the top
  std::string key_;                // the key whose value comes next
  std::size_t values_ = 0;
};

} // namespace

json read_json_strict(std::string_view text, const json_read_limits& limits,
                      const json_duplicate_message& duplicate_message) {
  if (auto nul = json_nul_byte_message(text); !nul.empty())
    throw json_read_error(nul);
  strict_dom_builder builder(limits, duplicate_message);
  if (!json::sax_parse(text.begin(), text.end(), &builder))
    throw json_read_error(builder.error.empty() ? "invalid JSON" : builder.error);
  return std::move(builder.result);
}

} // namespace rlsync
