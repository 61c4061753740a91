#include "runtime/vllm/completions.hpp"

#include "runtime/base/json.hpp"
#include "runtime/config/model_config.hpp"
#include "runtime/engine/tokenizer.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>

namespace rlsync::vllm {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

const char* reason_phrase(int status) {
  switch (status) {
  case 400: return "Bad Request";
  case 404: return "Not Found";
  case 409: return "Conflict";
  case 413: return "Payload Too Large";
  case 503: return "Service Unavailable";
  default: return status >= 500 ? "Internal Server Error" : "Error";
  }
}

api_error bad(const std::string& field, const std::string& what) {
  return api_error{400, "body." + field + ": " + what, "body." + field};
}

/// How a value looks in a message, cut short: a client can send megabytes.
std::string describe(const json& v) {
  auto s = json_describe(v);
  if (s.size() > 80)
    s = s.substr(0, 77) + "...";
  return s;
}

/// A field that failed: thrown inside the parser, answered as a 400.
struct field_error {
  api_error error;
};

[[noreturn]] void fail(const std::string& field, const std::string& what) { throw field_error{bad(field, what)}; }

/// A boolean as pydantic reads one in lax mode: true/false, 0/1, or the
/// strings clients send (any case): true/false/1/0/yes/no/on/off/t/f/y/n.
bool get_bool(const json& v, const std::string& field) {
  if (v.is_boolean())
    return v.get<bool>();
  if (v.is_number_integer() || v.is_number_unsigned()) {
    auto i = v.get<std::int64_t>();
    if (i == 0 || i == 1)
      return i == 1;
  }
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    for (const char* t : {"true", "1", "yes", "on", "t", "y"})
      if (s == t)
        return true;
    for (const char* f : {"false", "0", "no", "off", "f", "n"})
      if (s == f)
        return false;
  }
  fail(field, "must be a boolean, got " + describe(v));
}

/// An integer in [lo, hi]: a JSON integer, or a float with no fraction.
std::int64_t get_int(const json& v, const std::string& field, std::int64_t lo, std::int64_t hi) {
  std::int64_t x = 0;
  if (v.is_number_unsigned()) {
    auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(hi))
      fail(field, "must be in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " + std::to_string(u));
    x = static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<std::int64_t>();
  } else if (v.is_number_float()) {
    double d = v.get<double>();
    if (!(std::trunc(d) == d) || d < -9.2e18 || d > 9.2e18)
      fail(field, "must be an integer, got " + describe(v));
    x = static_cast<std::int64_t>(d);
  } else {
    fail(field, "must be an integer, got " + describe(v));
  }
  if (x < lo || x > hi)
    fail(field, "must be in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " + std::to_string(x));
  return x;
}

double get_number(const json& v, const std::string& field) {
  if (!v.is_number())
    fail(field, "must be a number, got " + describe(v));
  return v.get<double>();
}

std::int32_t get_token(const json& v, const std::string& field) {
  if (!(v.is_number_integer() || v.is_number_unsigned()))
    fail(field, "must be a token id (an integer), got " + describe(v));
  return static_cast<std::int32_t>(get_int(v, field, 0, std::numeric_limits<std::int32_t>::max()));
}

/// One prompt: a string (encoded, BOS first unless `add_special_tokens` is
/// false) or a list of token ids (taken as they are, as vLLM does).
std::vector<std::int32_t> get_prompt(const json& v, const std::string& field, bool add_special_tokens) {
  if (v.is_string()) {
    auto tokens = engine::encode(v.get_ref<const std::string&>());
    if (!add_special_tokens)
      tokens.erase(tokens.begin());
    if (tokens.empty())
      fail(field, "is empty (an empty string with add_special_tokens false)");
    return tokens;
  }
  if (!v.is_array())
    fail(field, "must be a string or a list of token ids, got " + describe(v));
  if (v.empty())
    fail(field, "is empty");
  std::vector<std::int32_t> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    out.push_back(get_token(v[i], field + "[" + std::to_string(i) + "]"));
  return out;
}

void parse_prompts(const json& v, bool add_special_tokens, completion_request& out,
                   const completion_limits& limits) {
  if (v.is_null())
    fail("prompt", "is required");
  // A list is one prompt of token ids when its first element is a number,
  // else a list of prompts (strings or token-id lists).
  bool many = v.is_array() && !v.empty() && (v[0].is_string() || v[0].is_array());
  if (!many) {
    out.prompts.push_back(get_prompt(v, "prompt", add_special_tokens));
  } else {
    if (v.size() > limits.max_prompts)
      fail("prompt", std::to_string(v.size()) + " prompts exceed the limit of " + std::to_string(limits.max_prompts));
    for (std::size_t i = 0; i < v.size(); ++i)
      out.prompts.push_back(get_prompt(v[i], "prompt[" + std::to_string(i) + "]", add_special_tokens));
  }
  std::size_t total = 0;
  for (auto& p : out.prompts)
    total += p.size();
  if (total > limits.max_prompt_tokens)
    fail("prompt", std::to_string(total) + " tokens exceed the limit of " + std::to_string(limits.max_prompt_tokens));
}

void parse_stop(const json& v, completion_request& out, const completion_limits& limits) {
  auto one = [&](const json& s, const std::string& field) {
    if (!s.is_string())
      fail(field, "must be a string, got " + describe(s));
    const auto& text = s.get_ref<const std::string&>();
    if (text.empty())
      fail(field, "is an empty string");
    if (text.size() > limits.max_stop_bytes)
      fail(field, std::to_string(text.size()) + " bytes exceed the limit of " + std::to_string(limits.max_stop_bytes));
    out.stop.push_back(text);
  };
  if (v.is_string()) {
    one(v, "stop");
    return;
  }
  if (!v.is_array())
    fail("stop", "must be a string or a list of strings, got " + describe(v));
  if (v.size() > limits.max_stop_strings)
    fail("stop", std::to_string(v.size()) + " strings exceed the limit of " + std::to_string(limits.max_stop_strings));
  for (std::size_t i = 0; i < v.size(); ++i)
    one(v[i], "stop[" + std::to_string(i) + "]");
}

completion_request parse_object(const json& body, const completion_limits& limits) {
  completion_request out;
  auto field = [&](const char* name) -> const json* {
    auto it = body.find(name);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  if (auto v = field("model")) {
    if (!v->is_string())
      fail("model", "must be a string, got " + describe(*v));
    out.model = v->get<std::string>();
  }
  bool add_special_tokens = true;
  if (auto v = field("add_special_tokens"))
    add_special_tokens = get_bool(*v, "add_special_tokens");
  auto prompt = body.find("prompt");
  parse_prompts(prompt == body.end() ? json(nullptr) : *prompt, add_special_tokens, out, limits);
  // vLLM keeps a prompt's last k tokens; -1 (the context length) is not taken.
  if (auto v = field("truncate_prompt_tokens")) {
    const auto keep = static_cast<std::size_t>(get_int(*v, "truncate_prompt_tokens", 1, static_cast<std::int64_t>(limits.max_prompt_tokens)));
    for (auto& p : out.prompts)
      if (p.size() > keep)
        p.erase(p.begin(), p.end() - static_cast<std::ptrdiff_t>(keep));
  }
  if (body.contains("max_tokens") && body["max_tokens"].is_null())
    out.max_tokens.reset();
  else if (auto v = field("max_tokens"))
    out.max_tokens = static_cast<std::uint32_t>(get_int(*v, "max_tokens", 1, limits.max_tokens));
  if (auto v = field("temperature")) {
    double t = get_number(*v, "temperature");
    if (!(t >= 0 && t <= topology_limits::max_temperature))
      fail("temperature", "must be in [0, 100], got " + describe(*v));
    out.temperature = static_cast<float>(t);
  }
  if (auto v = field("top_p")) {
    double p = get_number(*v, "top_p");
    if (!(p >= topology_limits::min_top_p && p <= 1)) // carried as a float: not below its smallest normal value
      fail("top_p", std::string("must be in (0, 1]") + (p > 0 && p < topology_limits::min_top_p ? " and not below a float's smallest normal value (about 1.18e-38)" : "") + ", got "
                        + describe(*v));
    out.top_p = static_cast<float>(p);
  }
  if (auto v = field("n"))
    out.n = static_cast<std::uint32_t>(get_int(*v, "n", 1, limits.max_n));
  if (auto v = field("best_of")) // vLLM's best_of must not exceed n; rlsync returns exactly n
    if (get_int(*v, "best_of", 1, limits.max_n) != out.n)
      fail("best_of", "is not supported unless equal to n");
  if (auto v = field("echo"))
    if (get_bool(*v, "echo"))
      fail("echo", "is not supported");
  if (auto v = field("logprobs"))
    out.logprobs = static_cast<std::uint32_t>(get_int(*v, "logprobs", 0, limits.max_logprobs));
  if (auto v = field("stream"))
    out.stream = get_bool(*v, "stream");
  if (auto v = field("stream_options")) {
    if (!v->is_object())
      fail("stream_options", "must be an object, got " + describe(*v));
    auto it = v->find("include_usage");
    if (it != v->end() && !it->is_null())
      out.include_usage = get_bool(*it, "stream_options.include_usage");
  }
  if (auto v = field("return_token_ids"))
    out.return_token_ids = get_bool(*v, "return_token_ids");
  if (auto v = field("return_tokens_as_token_ids"))
    out.tokens_as_ids = get_bool(*v, "return_tokens_as_token_ids");
  // Sampling controls the engine does not implement: the value that changes
  // nothing passes (clients send it), any other is refused, never ignored.
  auto neutral_number = [&](const char* name, std::initializer_list<double> neutral, const char* which) {
    if (auto v = field(name))
      if (const double x = get_number(*v, name); std::find(neutral.begin(), neutral.end(), x) == neutral.end())
        fail(name, std::string("is not supported unless ") + which + ", got " + describe(*v));
  };
  neutral_number("top_k", {-1, 0}, "-1 or 0 (every token)");
  neutral_number("min_p", {0}, "0");
  neutral_number("presence_penalty", {0}, "0");
  neutral_number("frequency_penalty", {0}, "0");
  neutral_number("repetition_penalty", {1}, "1");
  neutral_number("min_tokens", {0}, "0");
  neutral_number("length_penalty", {1}, "1");
  if (auto v = field("logit_bias"); v && !(v->is_object() && v->empty()))
    fail("logit_bias", "is not supported unless empty, got " + describe(*v));
  if (auto v = field("prompt_logprobs"))
    fail("prompt_logprobs", "is not supported, got " + describe(*v));
  for (const char* flag : {"include_stop_str_in_output", "use_beam_search"})
    if (auto v = field(flag); v && get_bool(*v, flag))
      fail(flag, "is not supported");
  if (auto v = field("suffix"); v && !(v->is_string() && v->get_ref<const std::string&>().empty()))
    fail("suffix", "is not supported, got " + describe(*v));
  // Constrained decoding and token filters: any value would change outputs.
  // Clients that fill in vLLM's defaults send the token filters as empty lists.
  for (const char* constraint : {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                                 "structured_outputs", "allowed_token_ids", "bad_words", "logits_processors",
                                 "prompt_embeds"})
    if (auto v = field(constraint); v && !(v->is_array() && v->empty()))
      fail(constraint, "is not supported, got " + describe(*v));
  if (auto v = field("response_format"); v && !(v->is_object() && v->size() == 1 && v->contains("type") && v->at("type") == "text"))
    fail("response_format", "is not supported unless {\"type\": \"text\"}, got " + describe(*v));
  // The byte tokenizer has no text for BOS and EOS: special tokens are always skipped.
  if (auto v = field("skip_special_tokens"); v && !get_bool(*v, "skip_special_tokens"))
    fail("skip_special_tokens", "is not supported unless true (special tokens have no text here)");
  neutral_number("priority", {0}, "0 (no priority scheduling)");
  if (auto v = field("seed"))
    out.seed = static_cast<std::uint64_t>(
      get_int(*v, "seed", std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()));
  if (auto v = field("stop"))
    parse_stop(*v, out, limits);
  if (auto v = field("stop_token_ids")) {
    if (!v->is_array())
      fail("stop_token_ids", "must be a list of token ids, got " + describe(*v));
    if (v->size() > max_stop_token_ids)
      fail("stop_token_ids",
           std::to_string(v->size()) + " ids exceed the limit of " + std::to_string(max_stop_token_ids));
    for (std::size_t i = 0; i < v->size(); ++i)
      out.stop_token_ids.push_back(get_token((*v)[i], "stop_token_ids[" + std::to_string(i) + "]"));
  }
  if (auto v = field("ignore_eos"))
    out.ignore_eos = get_bool(*v, "ignore_eos");
  if (out.prompts.size() * out.n > limits.max_choices)
    fail("n", std::to_string(out.prompts.size()) + " prompts × n " + std::to_string(out.n) + " exceed the limit of "
                + std::to_string(limits.max_choices) + " choices");
  return out;
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Bytes at the end of `s` that begin a UTF-8 sequence not yet complete:
/// held back from a stream until the rest arrives (or the choice ends).
std::size_t incomplete_utf8_tail(std::string_view s) {
  const std::size_t n = s.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80)
      continue; // a continuation byte: look further back for the lead
    std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    return len > back ? back : 0;
  }
  return 0;
}

std::string label_of(const response_options& o, std::uint64_t version) {
  return o.label ? o.label(version) : std::to_string(version);
}

ordered_json usage_json(const std::vector<completion_choice>& choices, std::size_t prompt_tokens) {
  std::size_t completion = 0;
  for (auto& c : choices)
    completion += c.token_ids().size();
  return {{"prompt_tokens", prompt_tokens},
          {"total_tokens", prompt_tokens + completion},
          {"completion_tokens", completion}};
}

ordered_json envelope(const response_options& o) {
  return {{"id", o.id}, {"object", "text_completion"}, {"created", o.created}, {"model", o.model}};
}

} // namespace

ordered_json error_body(const api_error& e) {
  ordered_json err = {{"message", e.message},
                      {"type", reason_phrase(e.status)},
                      {"param", e.param.empty() ? ordered_json(nullptr) : ordered_json(e.param)},
                      {"code", e.status}};
  return {{"error", std::move(err)}};
}

std::variant<completion_request, api_error> parse_completion_request(std::string_view body,
                                                                     const completion_limits& limits) {
  json doc;
  try {
    json_read_limits read;
    read.max_values = limits.max_prompt_tokens + 4096; // every token id is a value
    doc = read_json_strict(body, read);
  } catch (const std::exception& e) {
    return api_error{400, std::string("body: ") + e.what(), "body"};
  }
  if (!doc.is_object())
    return api_error{400, "body: must be a JSON object, got " + describe(doc), "body"};
  try {
    return parse_object(doc, limits);
  } catch (const field_error& e) {
    return e.error;
  }
}

std::uint64_t choice_seed(std::uint64_t seed, std::uint32_t index) {
  return index == 0 ? seed : splitmix64(seed ^ splitmix64(index));
}

std::variant<std::vector<generate_request>, api_error> make_generate_requests(const completion_request& req,
                                                                              const model_limits& model,
                                                                              std::uint64_t first_request_id,
                                                                              std::uint64_t unseeded_base) {
  std::vector<generate_request> out;
  for (std::size_t p = 0; p < req.prompts.size(); ++p) {
    const auto& prompt = req.prompts[p];
    std::string field = req.prompts.size() == 1 ? "prompt" : "prompt[" + std::to_string(p) + "]";
    if (prompt.empty())
      return bad(field, "is empty");
    for (std::size_t i = 0; i < prompt.size(); ++i)
      if (prompt[i] < 0 || prompt[i] >= model.vocab_size)
        return bad(field + "[" + std::to_string(i) + "]", "token id " + std::to_string(prompt[i])
                                                             + " is outside the vocabulary of "
                                                             + std::to_string(model.vocab_size));
    auto prompt_len = static_cast<std::int64_t>(prompt.size());
    if (prompt_len >= model.max_model_len)
      return bad(field, "This model's maximum context length is " + std::to_string(model.max_model_len)
                          + " tokens. However, your request has " + std::to_string(prompt_len)
                          + " input tokens. Please reduce the length of the input messages.");
    std::int64_t room = model.max_model_len - prompt_len;
    if (req.max_tokens && static_cast<std::int64_t>(*req.max_tokens) > room)
      return bad("max_tokens", "This model's maximum context length is " + std::to_string(model.max_model_len)
                                 + " tokens. However, you requested " + std::to_string(prompt_len + *req.max_tokens)
                                 + " tokens (" + std::to_string(prompt_len) + " in the messages, "
                                 + std::to_string(*req.max_tokens)
                                 + " in the completion). Please reduce the length of the messages or completion.");
    for (std::uint32_t k = 0; k < req.n; ++k) {
      auto index = static_cast<std::uint32_t>(p * req.n + k);
      generate_request g;
      g.request_id = first_request_id + index;
      g.prompt = prompt;
      auto& s = g.sampling;
      s.temperature = req.temperature;
      s.top_p = req.top_p;
      s.max_tokens = req.max_tokens ? *req.max_tokens : static_cast<std::uint32_t>(std::min<std::int64_t>(room, 1 << 20));
      s.seed = choice_seed(req.seed ? *req.seed : unseeded_base, index);
      s.stop_at_eos = !req.ignore_eos;
      s.logprobs = req.logprobs.has_value();
      s.top_logprobs = req.logprobs.value_or(0);
      s.stop_token_ids = req.stop_token_ids;
      out.push_back(std::move(g));
    }
  }
  return out;
}

std::optional<api_error> check_answer_size(const completion_request& req, const std::vector<generate_request>& made,
                                           const completion_limits& limits) {
  if (req.stream)
    return std::nullopt;
  // Each term is below 2^20 × 22 and there are at most max_choices of them: no overflow.
  const std::uint64_t per_token = 1 + (req.logprobs ? 1 + *req.logprobs : 0);
  std::uint64_t entries = 0;
  for (const auto& g : made) // each choice echoes its prompt's token ids too
    entries += std::uint64_t{g.sampling.max_tokens} * per_token + g.prompt.size();
  if (entries <= limits.max_answer_entries)
    return std::nullopt;
  return bad("max_tokens", "a non-streamed answer of " + std::to_string(made.size()) + " choice(s) at their max_tokens"
                             + (req.logprobs ? " with " + std::to_string(*req.logprobs) + " log-probabilities each" : "")
                             + " holds up to " + std::to_string(entries) + " entries, above the limit of "
                             + std::to_string(limits.max_answer_entries)
                             + ": lower max_tokens, n or logprobs, or set stream");
}

std::string completion_id(std::uint64_t a, std::uint64_t b) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b));
  return std::string("cmpl-") + buf;
}

std::string token_string(std::int32_t token) {
  if (token >= 0 && token < 0x80)
    return std::string(1, static_cast<char>(token));
  if (token >= 0x80 && token < 256) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "bytes:\\x%02x", static_cast<unsigned>(token));
    return buf;
  }
  if (token == token_bos)
    return "<bos>";
  if (token == token_eos)
    return "<eos>";
  return "<token " + std::to_string(token) + ">";
}

// -- one choice -------------------------------------------------------------------------

completion_choice::completion_choice(std::uint32_t index, const completion_request& req,
                                     std::vector<std::int32_t> prompt)
    : index_(index), prompt_(std::move(prompt)), stop_(req.stop), stop_token_ids_(req.stop_token_ids),
      logprobs_(req.logprobs) {}

bool completion_choice::add(const token_event& ev) {
  if (finished_)
    return false;
  auto local = static_cast<std::uint32_t>(tokens_.size());
  tokens_.push_back(ev.token);
  if (spans_.empty() || spans_.back().version != ev.version)
    spans_.push_back({ev.version, local, local + 1});
  else
    spans_.back().end = local + 1;
  if (logprobs_) {
    token_logprobs_.push_back(ev.logprob);
    std::vector<std::pair<std::int32_t, float>> top;
    for (std::size_t i = 0; i < ev.top_tokens.size() && i < ev.top_logprobs.size() && i < *logprobs_; ++i)
      top.emplace_back(ev.top_tokens[i], ev.top_logprobs[i]);
    top_.push_back(std::move(top));
  }
  text_offset_.push_back(raw_.size());
  bool stop_token = std::find(stop_token_ids_.begin(), stop_token_ids_.end(), ev.token) != stop_token_ids_.end();
  if (stop_token) {
    // vLLM leaves a stop token's text out of the output; the engine ends the request.
    stop_reason_ = ev.token;
    return false;
  }
  if (ev.token < 0 || ev.token >= 256)
    return false; // no text: BOS, EOS
  const std::size_t before = raw_.size();
  raw_.push_back(static_cast<char>(static_cast<unsigned char>(ev.token)));
  // The earliest stop string that now appears: only a match ending in the new byte is new.
  std::size_t cut = std::string::npos;
  const std::string* matched = nullptr;
  for (const auto& s : stop_) {
    std::size_t from = before + 1 >= s.size() ? before + 1 - s.size() : 0;
    auto at = raw_.find(s, from);
    if (at != std::string::npos && at < cut) {
      cut = at;
      matched = &s;
    }
  }
  if (matched) {
    raw_.resize(cut);
    stop_reason_ = *matched;
    reason_ = "stop";
    finished_ = true;
  }
  settle();
  return matched != nullptr;
}

void completion_choice::finish(finish_reason reason) {
  if (finished_)
    return;
  finished_ = true;
  switch (reason) {
  case finish_reason::length: reason_ = "length"; break;
  case finish_reason::eos:
    reason_ = "stop";
    // EOS itself reports no stop_reason (vLLM: None); a stop token id already set it.
    break;
  default: reason_ = "abort"; break;
  }
  settle();
}

void completion_choice::settle() {
  if (finished_) {
    visible_ = raw_.size();
    return;
  }
  // Hold back the longest tail that could still grow into a stop string...
  std::size_t hold = 0;
  for (const auto& s : stop_)
    for (std::size_t len = std::min(s.size() - 1, raw_.size()); len > hold; --len)
      if (raw_.compare(raw_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  // ...and an unfinished UTF-8 character.
  hold = std::max(hold, incomplete_utf8_tail(raw_));
  visible_ = std::max(visible_, raw_.size() - hold);
}

std::string completion_choice::text() const { return engine::to_valid_utf8(raw_); }

ordered_json completion_choice::finish_reason_json() const {
  return finished_ ? ordered_json(reason_) : ordered_json(nullptr);
}

ordered_json completion_choice::logprobs_json(std::size_t from, std::size_t to, const response_options& o) const {
  if (!logprobs_)
    return nullptr;
  const auto token_string = [&o](std::int32_t t) {
    return o.tokens_as_ids ? "token_id:" + std::to_string(t) : vllm::token_string(t);
  };
  ordered_json tokens = ordered_json::array(), lps = ordered_json::array(), tops = ordered_json::array(),
               offsets = ordered_json::array();
  for (std::size_t i = from; i < to; ++i) {
    tokens.push_back(token_string(tokens_[i]));
    lps.push_back(token_logprobs_[i]);
    // The k most probable and the sampled token, as vLLM lists them.
    ordered_json top = ordered_json::object();
    for (auto& [t, lp] : top_[i])
      top[token_string(t)] = lp;
    top[token_string(tokens_[i])] = token_logprobs_[i];
    tops.push_back(std::move(top));
    offsets.push_back(std::min(text_offset_[i], raw_.size()));
  }
  return {{"text_offset", std::move(offsets)},
          {"token_logprobs", std::move(lps)},
          {"tokens", std::move(tokens)},
          {"top_logprobs", std::move(tops)}};
}

ordered_json completion_choice::spans_json(const response_options& o) const {
  ordered_json out = ordered_json::array();
  for (auto& s : spans_)
    out.push_back({{"version", label_of(o, s.version)}, {"start", s.start}, {"end", s.end}});
  return out;
}

ordered_json completion_choice::to_json(const response_options& o) const {
  ordered_json c = {{"index", index_},
                    {"text", text()},
                    {"logprobs", logprobs_json(0, tokens_.size(), o)},
                    {"finish_reason", finish_reason_json()},
                    {"stop_reason", stop_reason_}};
  if (o.return_token_ids || !o.strict) {
    c["token_ids"] = tokens_;
    c["prompt_token_ids"] = prompt_;
  }
  if (!o.strict)
    c["weight_versions"] = spans_json(o);
  return c;
}

std::optional<ordered_json> completion_choice::take_delta(const response_options& o) {
  if (sent_last_)
    return std::nullopt;
  bool last = finished_;
  if (!last && sent_tokens_ == tokens_.size() && sent_bytes_ == visible_)
    return std::nullopt;
  // Split only where a UTF-8 character ends, so that the deltas joined are the whole text.
  std::string delta = engine::to_valid_utf8(std::string_view(raw_).substr(sent_bytes_, visible_ - sent_bytes_));
  ordered_json c = {{"index", index_},
                    {"text", std::move(delta)},
                    {"logprobs", logprobs_json(sent_tokens_, tokens_.size(), o)},
                    {"finish_reason", last ? ordered_json(reason_) : ordered_json(nullptr)},
                    {"stop_reason", last ? stop_reason_ : ordered_json(nullptr)}};
  if (o.return_token_ids || !o.strict) {
    c["token_ids"] = std::vector<std::int32_t>(tokens_.begin() + static_cast<std::ptrdiff_t>(sent_tokens_),
                                               tokens_.end());
    if (!sent_first_)
      c["prompt_token_ids"] = prompt_;
  }
  if (last && !o.strict)
    c["weight_versions"] = spans_json(o);
  sent_first_ = true;
  sent_bytes_ = visible_;
  sent_tokens_ = tokens_.size();
  sent_last_ = last;
  return c;
}

// -- whole answers ------------------------------------------------------------------------

ordered_json completion_response(const response_options& o, const std::vector<completion_choice>& choices,
                                 std::size_t prompt_tokens) {
  auto out = envelope(o);
  ordered_json list = ordered_json::array();
  for (auto& c : choices)
    list.push_back(c.to_json(o));
  out["choices"] = std::move(list);
  out["usage"] = usage_json(choices, prompt_tokens);
  return out;
}

namespace {
std::string sse(const ordered_json& j) {
  // Text is valid UTF-8 already; replace guards token strings all the same.
  return "data: " + j.dump(-1, ' ', false, ordered_json::error_handler_t::replace) + "\n\n";
}
} // namespace

std::string stream_chunk(const response_options& o, ordered_json choice) {
  auto out = envelope(o);
  out["choices"] = ordered_json::array({std::move(choice)});
  if (o.include_usage)
    out["usage"] = nullptr; // OpenAI: null on every chunk but the usage chunk
  return sse(out);
}

std::string usage_chunk(const response_options& o, const std::vector<completion_choice>& choices,
                        std::size_t prompt_tokens) {
  auto out = envelope(o);
  out["choices"] = ordered_json::array();
  out["usage"] = usage_json(choices, prompt_tokens);
  return sse(out);
}

const std::string stream_done = "data: [DONE]\n\n";

nlohmann::json models_list(const std::string& model_name, std::int64_t max_model_len) {
  nlohmann::json model = {{"id", model_name},
                          {"object", "model"},
                          {"created", static_cast<std::int64_t>(std::time(nullptr))},
                          {"owned_by", "vllm"},
                          {"root", model_name},
                          {"parent", nullptr},
                          {"max_model_len", max_model_len},
                          {"permission", nlohmann::json::array()}};
  return {{"object", "list"}, {"data", nlohmann::json::array({model})}};
}

} // namespace rlsync::vllm
