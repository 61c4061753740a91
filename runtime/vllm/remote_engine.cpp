#include "runtime/vllm/remote_engine.hpp"

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/base/json.hpp"
#include "runtime/plan/groups.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

namespace rlsync::vllm {

namespace fs = std::filesystem;
using nlohmann::json;

server_address parse_server_url(const std::string& url) {
  auto bad = [&](const std::string& why) {
    return std::invalid_argument("engine url '" + url + "': " + why + " (expected http://host:port)");
  };
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0)
    throw bad(url.rfind("https://", 0) == 0 ? "https is not supported" : "not an http:// URL");
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/')
    rest.pop_back();
  if (rest.find('/') != std::string::npos || rest.find('@') != std::string::npos)
    throw bad("a path or credentials in the URL");
  server_address a;
  std::string port;
  bool port_given = false; // a ':' after the host, however empty the port after it
  if (!rest.empty() && rest.front() == '[') { // [::1]:8000
    auto close = rest.find(']');
    if (close == std::string::npos)
      throw bad("unclosed '['");
    a.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':')
        throw bad("junk after the address");
      port = rest.substr(close + 2);
      port_given = true;
    }
  } else {
    auto colon = rest.find(':');
    a.host = rest.substr(0, colon);
    if (colon != std::string::npos) {
      port = rest.substr(colon + 1);
      port_given = true;
    }
  }
  if (a.host.empty())
    throw bad("no host");
  if (port_given) {
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
      throw bad("bad port '" + port + "'");
    auto p = std::stoul(port);
    if (p == 0 || p > 65535)
      throw bad("port " + port + " out of range");
    a.port = static_cast<std::uint16_t>(p);
  }
  return a;
}

std::string version_label(std::uint64_t version) { return "v" + std::to_string(version); }

std::optional<std::uint64_t> parse_version_label(const std::string& label) {
  if (label.size() < 2 || label.size() > 21 || label[0] != 'v')
    return std::nullopt;
  auto digits = label.substr(1);
  if (digits.find_first_not_of("0123456789") != std::string::npos || (digits.size() > 1 && digits[0] == '0'))
    return std::nullopt;
  try {
    return std::stoull(digits);
  } catch (const std::exception&) {
    return std::nullopt; // out of range
  }
}

std::string pause_target(pause_mode mode, bool clear_cache) {
  return "/pause?mode=" + to_string(mode) + "&clear_cache=" + (clear_cache ? "true" : "false");
}

std::string completion_body(const generate_request& req, const std::string& model) {
  if (req.generated.size() >= req.sampling.max_tokens)
    throw std::invalid_argument("request " + std::to_string(req.request_id) + ": nothing left to generate ("
                                + std::to_string(req.generated.size()) + " of max_tokens "
                                + std::to_string(req.sampling.max_tokens) + " already generated)");
  json prompt = json::array();
  for (auto t : req.prompt)
    prompt.push_back(t);
  for (auto t : req.generated)
    prompt.push_back(t);
  json body = {
    {"prompt", std::move(prompt)},
    {"max_tokens", req.sampling.max_tokens - static_cast<std::uint32_t>(req.generated.size())},
    {"temperature", req.sampling.temperature},
    {"top_p", req.sampling.top_p},
    {"seed", req.sampling.seed},
    {"n", 1},
    {"stream", true},
    {"return_token_ids", true},
    {"ignore_eos", !req.sampling.stop_at_eos},
  };
  if (!model.empty())
    body["model"] = model;
  if (!req.sampling.stop_token_ids.empty())
    body["stop_token_ids"] = req.sampling.stop_token_ids;
  if (req.sampling.logprobs) {
    body["logprobs"] = req.sampling.top_logprobs;
    body["return_tokens_as_token_ids"] = true; // vLLM: top tokens as "token_id:N"
  }
  return body.dump();
}

namespace {

std::invalid_argument chunk_error(const std::string& field, const std::string& what) {
  return std::invalid_argument("completion chunk: " + field + ": " + what);
}

std::int32_t token_id(const json& v, const std::string& field) {
  if (!v.is_number_integer())
    throw chunk_error(field, "not an integer token id");
  auto x = v.get<std::int64_t>();
  if (x < 0 || x > std::numeric_limits<std::int32_t>::max())
    throw chunk_error(field, "token id " + std::to_string(x) + " out of range");
  return static_cast<std::int32_t>(x);
}

float number(const json& v, const std::string& field) {
  if (!v.is_number())
    throw chunk_error(field, "not a number");
  const double x = v.get<double>();
  if (std::isnan(x) || std::abs(x) > std::numeric_limits<float>::max())
    throw chunk_error(field, "out of a float's range");
  return static_cast<float>(x);
}

/// "token_id:N" -> N (vLLM's return_tokens_as_token_ids); nullopt otherwise.
std::optional<std::int32_t> named_token(const std::string& key) {
  const std::string prefix = "token_id:";
  if (key.rfind(prefix, 0) != 0 || key.size() == prefix.size() || key.size() > prefix.size() + 10)
    return std::nullopt;
  auto digits = key.substr(prefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  auto x = std::stoll(digits);
  if (x > std::numeric_limits<std::int32_t>::max())
    return std::nullopt;
  return static_cast<std::int32_t>(x);
}

} // namespace

std::optional<std::vector<version_span>> server_versions(const std::vector<label_span>& spans,
                                                         std::uint64_t opened_at, std::uint64_t held,
                                                         std::size_t tokens) {
  std::vector<version_span> out;
  for (const auto& s : spans) {
    auto v = s.label == "default" ? std::optional<std::uint64_t>(0) : parse_version_label(s.label);
    if (!v || *v < opened_at || *v > held || (!out.empty() && *v < out.back().version))
      return std::nullopt;
    out.push_back({*v, s.start, s.end});
  }
  if (out.empty() ? tokens != 0 : out.back().end != tokens)
    return std::nullopt;
  return out;
}

completion_chunk parse_completion_chunk(const std::string& data) {
  if (data.size() > max_chunk_bytes)
    throw chunk_error("data", std::to_string(data.size()) + " bytes, more than " + std::to_string(max_chunk_bytes));
  json j;
  try {
    // A chunk nests 6 deep (choices, logprobs, top_logprobs); an error object a little more.
    j = read_json_strict(data, json_read_limits{16, std::size_t{1} << 20});
  } catch (const json_read_error& e) {
    throw chunk_error("data", e.what());
  }
  if (!j.is_object())
    throw chunk_error("data", "not a JSON object");
  if (auto e = j.find("error"); e != j.end()) {
    const bool has_message = e->is_object() && e->contains("message") && (*e)["message"].is_string();
    const std::string message = has_message ? (*e)["message"].get<std::string>() : json_describe(*e);
    int status = 0;
    if (e->is_object())
      if (auto code = e->find("code"); code != e->end() && code->is_number_integer()
                                       && code->get<std::int64_t>() >= 400 && code->get<std::int64_t>() <= 599)
        status = static_cast<int>(code->get<std::int64_t>());
    throw stream_error_event("the server reported an error in the stream" + (status ? " (" + std::to_string(status) + ")" : std::string())
                               + ": " + message.substr(0, 512),
                             status);
  }
  completion_chunk out;
  if (auto id = j.find("id"); id != j.end() && id->is_string())
    out.id = id->get<std::string>();
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array())
    throw chunk_error("choices", "missing or not a list");
  if (choices->empty()) {
    out.usage_only = true;
    return out;
  }
  if (choices->size() != 1)
    throw chunk_error("choices", std::to_string(choices->size()) + " choices in one chunk (asked for n = 1)");
  const json& c = (*choices)[0];
  if (!c.is_object())
    throw chunk_error("choices[0]", "not an object");
  if (auto i = c.find("index"); i != c.end() && !(i->is_number_integer() && i->get<std::int64_t>() == 0))
    throw chunk_error("choices[0].index", "not 0 (asked for n = 1)");
  if (auto t = c.find("token_ids"); t != c.end() && !t->is_null()) {
    if (!t->is_array())
      throw chunk_error("choices[0].token_ids", "not a list");
    for (std::size_t k = 0; k < t->size(); ++k)
      out.token_ids.push_back(token_id((*t)[k], "choices[0].token_ids[" + std::to_string(k) + "]"));
  } else if (auto text = c.find("text"); text != c.end() && text->is_string() && !text->get_ref<const std::string&>().empty()) {
    // Text the adapter cannot turn into tokens: a server that ignores return_token_ids.
    throw chunk_error("choices[0].token_ids", "missing beside text: does the server honour return_token_ids?");
  }
  if (auto lp = c.find("logprobs"); lp != c.end() && !lp->is_null()) {
    if (!lp->is_object())
      throw chunk_error("choices[0].logprobs", "not an object");
    if (auto tl = lp->find("token_logprobs"); tl != lp->end() && tl->is_array()) {
      if (tl->size() != out.token_ids.size())
        throw chunk_error("choices[0].logprobs.token_logprobs", std::to_string(tl->size()) + " values for "
                                                                  + std::to_string(out.token_ids.size()) + " tokens");
      for (std::size_t k = 0; k < tl->size(); ++k)
        out.logprobs.push_back((*tl)[k].is_null() ? 0.0f
                                                  : number((*tl)[k], "choices[0].logprobs.token_logprobs"));
    }
    if (auto top = lp->find("top_logprobs"); top != lp->end() && top->is_array()
                                             && top->size() == out.token_ids.size()) {
      bool named = true;
      std::vector<std::vector<std::pair<std::int32_t, float>>> all;
      for (const auto& step : *top) {
        std::vector<std::pair<std::int32_t, float>> row;
        if (step.is_object())
          for (auto& [k, v] : step.items()) {
            auto t = named_token(k);
            if (!t) {
              named = false;
              break;
            }
            row.emplace_back(*t, number(v, "choices[0].logprobs.top_logprobs"));
          }
        // Most probable first, ties by the lower id (a JSON object has no order).
        std::sort(row.begin(), row.end(), [](const auto& a, const auto& b) {
          return a.second != b.second ? a.second > b.second : a.first < b.first;
        });
        all.push_back(std::move(row));
      }
      if (named)
        out.top = std::move(all);
    }
  }
  if (auto f = c.find("finish_reason"); f != c.end() && !f->is_null()) {
    if (!f->is_string())
      throw chunk_error("choices[0].finish_reason", "not a string");
    auto r = f->get<std::string>();
    if (r == "length")
      out.finish = finish_reason::length;
    else if (r == "stop")
      out.finish = finish_reason::eos; // EOS or a stop token: the request ended by itself
    else if (r == "abort")
      out.finish = finish_reason::aborted;
    else
      throw chunk_error("choices[0].finish_reason", "'" + r.substr(0, 64) + "' is none of stop, length, abort");
  }
  if (auto w = c.find("weight_versions"); w != c.end() && !w->is_null()) {
    if (!w->is_array())
      throw chunk_error("choices[0].weight_versions", "not a list");
    std::vector<label_span> spans;
    std::uint32_t at = 0;
    for (std::size_t k = 0; k < w->size(); ++k) {
      const json& s = (*w)[k];
      auto field = "choices[0].weight_versions[" + std::to_string(k) + "]";
      if (!s.is_object() || !s.contains("version") || !s["version"].is_string() || !s.contains("start")
          || !s["start"].is_number_unsigned() || !s.contains("end") || !s["end"].is_number_unsigned())
        throw chunk_error(field, "not {\"version\": string, \"start\": n, \"end\": n}");
      auto start = s["start"].get<std::uint64_t>(), end = s["end"].get<std::uint64_t>();
      if (start != at || end <= start || end > std::numeric_limits<std::uint32_t>::max())
        throw chunk_error(field, "[" + std::to_string(start) + ", " + std::to_string(end)
                                     + ") does not continue the spans before it (at " + std::to_string(at) + ")");
      spans.push_back({s["version"].get<std::string>().substr(0, max_name_bytes), static_cast<std::uint32_t>(start),
                       static_cast<std::uint32_t>(end)});
      at = static_cast<std::uint32_t>(end);
    }
    out.weight_versions = std::move(spans);
  }
  return out;
}

std::vector<tensor_spec> checkpoint_tensors(const model_config& c, dtype source) {
  return llama_parameter_specs(c, source);
}

plan::worker_plan whole_tensor_plan(const model_config& c, dtype source) {
  plan::worker_plan p;
  p.tp = 1;
  p.worker = 0;
  for (const auto& s : checkpoint_tensors(c, source)) {
    plan::plan_entry e;
    e.source = s.name;
    e.source_type = s.type;
    e.source_shape = s.shape;
    e.view = plan::strided::dense(s.shape);
    e.param = s.name;
    e.dst_offset = 0;
    p.entries.push_back(std::move(e));
  }
  return p;
}

namespace {

std::string shard_name(std::uint32_t group, std::uint32_t groups) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05u-of-%05u.safetensors", group + 1, groups);
  return buf;
}

} // namespace

version_dir_writer::version_dir_writer(std::string weights_dir, std::uint64_t version, model_config model,
                                       std::uint32_t groups)
    : weights_dir_(fs::absolute(weights_dir).lexically_normal().string()), version_(version),
      model_(std::move(model)), groups_(groups), written_groups_(groups, false) {
  if (groups == 0)
    throw std::invalid_argument("version directory: a model of no groups");
  final_ = (fs::path(weights_dir_) / version_label(version)).string();
  partial_ = (fs::path(weights_dir_) / ("." + version_label(version) + ".partial")).string();
  std::error_code ec;
  fs::create_directories(weights_dir_, ec);
  if (ec)
    throw std::runtime_error("cannot create weights directory " + weights_dir_ + ": " + ec.message());
  for (const auto& d : {partial_, final_}) {
    fs::remove_all(d, ec);
    if (ec)
      throw std::runtime_error("cannot remove the old " + d + ": " + ec.message());
  }
  fs::create_directory(partial_, ec);
  if (ec)
    throw std::runtime_error("cannot create " + partial_ + ": " + ec.message());
}

version_dir_writer::~version_dir_writer() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(partial_, ec); // best effort: a later writer of this version removes it too
  }
}

void version_dir_writer::write_group(std::uint32_t group, const std::vector<tensor_view>& tensors) {
  if (group >= groups_)
    throw std::invalid_argument("version " + std::to_string(version_) + ": group " + std::to_string(group)
                                + " of a model of " + std::to_string(groups_));
  if (written_groups_[group])
    throw std::invalid_argument("version " + std::to_string(version_) + ": group " + std::to_string(group)
                                + " arrived twice");
  std::vector<tensor_bytes> out;
  for (const auto& t : tensors) {
    if (t.size != t.bytes())
      throw std::invalid_argument("tensor " + t.name + ": " + std::to_string(t.size) + " bytes for its shape's "
                                  + std::to_string(t.bytes()));
    if (!names_.insert(t.name).second)
      throw std::invalid_argument("tensor " + t.name + " arrived twice");
    out.push_back({static_cast<const tensor_spec&>(t), t.data});
  }
  written_groups_[group] = true;
  if (out.empty())
    return;
  auto file = shard_name(group, groups_);
  try {
    write_safetensors((fs::path(partial_) / file).string(), out);
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot write " + (fs::path(partial_) / file).string() + ": " + e.what());
  }
  for (const auto& t : tensors) {
    weight_map_.emplace_back(t.name, file);
    bytes_ += t.size;
  }
}

std::string version_dir_writer::commit(const std::vector<tensor_spec>& expected) {
  for (const auto& s : expected)
    if (!names_.count(s.name))
      throw std::invalid_argument("version " + std::to_string(version_) + ": tensor " + s.name
                                  + " never arrived");
  json map = json::object();
  for (auto& [name, file] : weight_map_)
    map[name] = file;
  json index = {{"metadata", {{"total_size", bytes_}}}, {"weight_map", std::move(map)}};
  {
    std::ofstream f(fs::path(partial_) / index_file_name);
    f << index.dump(1);
    f.flush();
    if (!f)
      throw std::runtime_error("cannot write " + (fs::path(partial_) / index_file_name).string());
  }
  try {
    write_config_json((fs::path(partial_) / config_file_name).string(), model_);
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot write the config of " + partial_ + ": " + e.what());
  }
  std::error_code ec;
  fs::rename(partial_, final_, ec);
  if (ec)
    throw std::runtime_error("cannot rename " + partial_ + " to " + final_ + ": " + ec.message());
  committed_ = true;
  return final_;
}

std::vector<std::string> remove_other_versions(const std::string& weights_dir, std::uint64_t keep) {
  std::vector<std::string> problems;
  std::error_code ec;
  fs::directory_iterator it(weights_dir, ec), end;
  if (ec)
    return {"cannot list " + weights_dir + ": " + ec.message()};
  std::vector<fs::path> doomed;
  for (; it != end; it.increment(ec)) {
    if (ec)
      break;
    auto name = it->path().filename().string();
    // Only what this adapter writes: v<N> and .v<N>.partial.
    std::string label = name;
    const std::string partial = ".partial";
    if (name.size() > 1 + partial.size() && name[0] == '.'
        && name.compare(name.size() - partial.size(), partial.size(), partial) == 0)
      label = name.substr(1, name.size() - 1 - partial.size());
    auto v = parse_version_label(label);
    if (v && (*v != keep || label != name))
      doomed.push_back(it->path());
  }
  for (const auto& p : doomed) {
    fs::remove_all(p, ec);
    if (ec)
      problems.push_back("cannot remove " + p.string() + ": " + ec.message());
  }
  return problems;
}

} // namespace rlsync::vllm
