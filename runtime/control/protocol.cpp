#include "runtime/control/protocol.hpp"

#include "runtime/base/dtype.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/config/model_config.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace rlsync {

std::string to_string(scheduler_state x) {
  switch (x) {
    case scheduler_state::unpaused: return "unpaused";
    case scheduler_state::paused_new: return "paused_new";
    case scheduler_state::paused_all: return "paused_all";
  }
  return "scheduler_state(" + std::to_string(static_cast<int>(x)) + ")";
}

bool ends_as_eos(const sampling_params& s, std::int32_t token) {
  return (s.stop_at_eos && token == token_eos)
         || std::find(s.stop_token_ids.begin(), s.stop_token_ids.end(), token) != s.stop_token_ids.end();
}

std::string to_string(finish_reason x) {
  switch (x) {
    case finish_reason::length: return "length";
    case finish_reason::eos: return "eos";
    case finish_reason::aborted: return "aborted";
    case finish_reason::rejected: return "rejected";
    case finish_reason::failed: return "failed";
  }
  return "finish_reason(" + std::to_string(static_cast<int>(x)) + ")";
}


namespace {

std::string over_bound(const char* field, std::size_t size, std::size_t bound, const char* unit) {
  return std::string(field) + ": " + std::to_string(size) + " " + unit + " exceed the bound of "
         + std::to_string(bound);
}

} // namespace

std::string check_name(const std::string& name, const char* field) {
  if (name.empty())
    return std::string(field) + ": empty";
  if (name.size() > max_name_bytes)
    return over_bound(field, name.size(), max_name_bytes, "bytes");
  return {};
}

std::string check(const engine_info& x) {
  if (auto e = check_name(x.name, "engine_info.name"); !e.empty())
    return e;
  if (x.node.size() > max_name_bytes) // may be empty: an engine outside any topology node
    return over_bound("engine_info.node", x.node.size(), max_name_bytes, "bytes");
  if (x.tp == 0 || x.tp > max_engine_tp)
    return "engine_info.tp: " + std::to_string(x.tp) + " workers, not 1 to " + std::to_string(max_engine_tp);
  return {};
}

std::string check(const heartbeat& x) {
  if (x.from.size() > max_name_bytes)
    return over_bound("heartbeat.from", x.from.size(), max_name_bytes, "bytes");
  return {};
}

std::string check(const route_update& x) {
  return check_name(x.engine, "route_update.engine");
}

std::string check(const pause_request& x) {
  if (static_cast<int>(x.mode) > static_cast<int>(pause_mode::keep))
    return "pause_request.mode: out of range (" + std::to_string(static_cast<int>(x.mode)) + ")";
  return {};
}

namespace {

std::string check_tokens(const std::vector<std::int32_t>& tokens, const char* field) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0)
      return std::string(field) + "[" + std::to_string(i) + "]: negative token id "
             + std::to_string(tokens[i]);
  return {};
}

} // namespace

std::string check(const generate_request& x) {
  if (x.prompt.empty())
    return "generate_request.prompt: empty";
  if (x.prompt.size() > max_request_tokens)
    return over_bound("generate_request.prompt", x.prompt.size(), max_request_tokens, "tokens");
  if (x.generated.size() > max_request_tokens)
    return over_bound("generate_request.generated", x.generated.size(), max_request_tokens, "tokens");
  if (auto e = check_tokens(x.prompt, "generate_request.prompt"); !e.empty())
    return e;
  if (auto e = check_tokens(x.generated, "generate_request.generated"); !e.empty())
    return e;
  const auto& s = x.sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0)
    return "generate_request.sampling.temperature: must be finite and >= 0";
  if (!(s.top_p > 0 && s.top_p <= 1))
    return "generate_request.sampling.top_p: must be in (0, 1]";
  if (s.max_tokens == 0)
    return "generate_request.sampling.max_tokens: must be positive";
  if (s.top_logprobs > max_top_logprobs)
    return "generate_request.sampling.top_logprobs: " + std::to_string(s.top_logprobs)
           + " exceeds the limit of " + std::to_string(max_top_logprobs);
  if (s.top_logprobs > 0 && !s.logprobs)
    return "generate_request.sampling.top_logprobs: set without logprobs";
  if (s.stop_token_ids.size() > max_stop_token_ids)
    return over_bound("generate_request.sampling.stop_token_ids", s.stop_token_ids.size(), max_stop_token_ids,
                      "tokens");
  if (auto e = check_tokens(s.stop_token_ids, "generate_request.sampling.stop_token_ids"); !e.empty())
    return e;
  if (x.generated.size() > s.max_tokens)
    return "generate_request.generated: " + std::to_string(x.generated.size())
           + " tokens exceed max_tokens " + std::to_string(s.max_tokens);
  if (x.deadline_ms > max_request_deadline_ms)
    return "generate_request.deadline_ms: " + std::to_string(x.deadline_ms) + " exceeds the limit of "
           + std::to_string(max_request_deadline_ms) + " (an hour)";
  return {};
}

std::string check(const generate_result& x) {
  if (static_cast<int>(x.reason) > static_cast<int>(finish_reason::failed))
    return "generate_result.reason: out of range";
  std::uint32_t next = 0;
  for (auto& s : x.spans) {
    if (s.begin != next || s.end <= s.begin)
      return "generate_result.spans: not contiguous at token " + std::to_string(next);
    next = s.end;
  }
  if (next != x.tokens.size())
    return "generate_result.spans: cover " + std::to_string(next) + " tokens, result has "
           + std::to_string(x.tokens.size());
  if (!x.logprobs.empty() && x.logprobs.size() != x.tokens.size())
    return "generate_result.logprobs: " + std::to_string(x.logprobs.size()) + " for "
           + std::to_string(x.tokens.size()) + " tokens";
  if (x.top_tokens.size() != x.top_logprobs.size())
    return "generate_result.top_tokens: " + std::to_string(x.top_tokens.size()) + " tokens, "
           + std::to_string(x.top_logprobs.size()) + " log-probabilities";
  if (x.top_tokens.size() > x.tokens.size() * std::size_t{max_top_logprobs})
    return "generate_result.top_tokens: more than " + std::to_string(max_top_logprobs) + " per token";
  if (auto e = check_tokens(x.top_tokens, "generate_result.top_tokens"); !e.empty())
    return e;
  return check_tokens(x.tokens, "generate_result.tokens");
}

std::string check(const weight_bucket& x) {
  if (x.entries.size() > max_bucket_entries)
    return over_bound("weight_bucket.entries", x.entries.size(), max_bucket_entries, "entries");
  for (size_t i = 0; i < x.entries.size(); ++i) {
    const auto& e = x.entries[i];
    std::string where = "weight_bucket.entries[" + std::to_string(i) + "]";
    if (auto bad = check_name(e.name, (where + ".name").c_str()); !bad.empty())
      return bad;
    where += " '" + printable(e.name) + "'";
    if (e.shape.size() > max_shape_rank)
      return over_bound((where + ".shape").c_str(), e.shape.size(), max_shape_rank, "dimensions");
    if (e.dtype > static_cast<std::uint8_t>(dtype::f32))
      return where + ": unknown dtype " + std::to_string(e.dtype);
    std::uint64_t numel = 1;
    for (auto d : e.shape) {
      if (d < 0)
        return where + ": negative dimension";
      if (d != 0 && numel > std::numeric_limits<std::uint64_t>::max() / 8 / static_cast<std::uint64_t>(d))
        return where + ": shape overflows";
      numel *= static_cast<std::uint64_t>(d);
    }
    if (numel * dtype_size(static_cast<dtype>(e.dtype)) != e.bytes)
      return where + ": " + std::to_string(e.bytes) + " bytes do not match its shape";
    // Checked for an empty bucket too: its entries would point past nothing.
    if (e.offset > x.data.size() || e.bytes > x.data.size() - e.offset)
      return where + ": range [" + std::to_string(e.offset) + ", +" + std::to_string(e.bytes)
             + ") lies outside the bucket's " + std::to_string(x.data.size()) + " bytes";
  }
  return {};
}

std::string check(const transfer_order& x) {
  if (static_cast<int>(x.mode) > static_cast<int>(transfer_mode::broadcast))
    return "transfer_order.mode: out of range";
  if (x.backend.size() > max_name_bytes)
    return over_bound("transfer_order.backend", x.backend.size(), max_name_bytes, "bytes");
  if (x.producers.size() > max_producers)
    return over_bound("transfer_order.producers", x.producers.size(), max_producers, "producers");
  for (const auto& p : x.producers)
    if (auto why = check(p); !why.empty())
      return "transfer_order." + why;
  if (x.same_bytes_since > x.version)
    return "transfer_order.same_bytes_since: " + std::to_string(x.same_bytes_since) + " is past the version ("
           + std::to_string(x.version) + ")";
  return {};
}

namespace {

/// Held names: each a valid name, ascending without repeats, within the bound.
std::string check_held(const std::vector<std::string>& held, const std::string& field) {
  if (held.size() > max_held_tensors)
    return over_bound(field.c_str(), held.size(), max_held_tensors, "tensors");
  for (std::size_t i = 0; i < held.size(); ++i) {
    if (auto why = check_name(held[i], field.c_str()); !why.empty())
      return why;
    if (i > 0 && !(held[i - 1] < held[i]))
      return field + ": not ascending without repeats at entry " + std::to_string(i);
  }
  return {};
}

} // namespace

std::string check(const rank_info& x) {
  if (auto why = check_name(x.node, "rank_info.node"); !why.empty())
    return why;
  return check_held(x.held, "rank_info.held");
}

std::string check(const producer_holding& x) {
  return check_held(x.held, "producer_holding.held");
}

std::string check(const version_info& x) {
  if (x.version > max_version)
    return "version_info.version: " + std::to_string(x.version) + " is past the bound of " + std::to_string(max_version);
  if (x.checksums.size() > max_held_tensors)
    return over_bound("version_info.checksums", x.checksums.size(), max_held_tensors, "checksums");
  if (x.same_bytes_since > x.version)
    return "version_info.same_bytes_since: " + std::to_string(x.same_bytes_since) + " is past the version ("
           + std::to_string(x.version) + ")";
  return {};
}

} // namespace rlsync
