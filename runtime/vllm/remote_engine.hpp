#pragma once
// The client side of vLLM's HTTP API, as rlsync's adapter for an external
// server (actors/vllm_engine.hpp) speaks it: the server's address, request
// bodies, the completion stream's chunks, weight-version labels, and the
// disk weight-transfer backend's checkpoint directories. Pure: no sockets,
// no actors; the adapter does the I/O.
//
//   generate_request ─► completion_body ─► POST /v1/completions (stream)
//   SSE data ─► parse_completion_chunk ─► tokens, finish, weight_versions
//   pulled groups ─► version_dir_writer ─► weights_dir/v<N>/ ─► update_weights {"path"}
#include "runtime/base/tensor.hpp"
#include "runtime/config/model_config.hpp"
#include "runtime/control/protocol.hpp"
#include "runtime/plan/plan.hpp"

#include <cstdint>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace rlsync::vllm {

/// A server's address, from "http://host:port" (https is refused: the
/// adapter speaks plain HTTP to a server on its own node or network).
struct server_address {
  std::string host;
  std::uint16_t port = 80;
};

/// Throws std::invalid_argument naming the URL when it is not http://host[:port][/].
server_address parse_server_url(const std::string& url);

/// "v<version>": the label the adapter finishes every update with.
std::string version_label(std::uint64_t version);
/// The version of a label the adapter wrote ("v7" -> 7); nullopt for any
/// other label ("default", "step-7", "v", "v07x").
std::optional<std::uint64_t> parse_version_label(const std::string& label);

/// "/pause?mode=keep&clear_cache=false".
std::string pause_target(pause_mode mode, bool clear_cache);

/// The streaming /v1/completions body for `req`: the token-id prompt (the
/// prompt and what was already generated, for a continuation), max_tokens
/// less what was generated, the sampling parameters, token ids returned,
/// log-probabilities when asked. `model`: the served model's name, empty to
/// leave it out. Throws std::invalid_argument when nothing is left to
/// generate (the caller answers such a request itself).
std::string completion_body(const generate_request& req, const std::string& model);

/// One weight-version span a server reported, as labels.
struct label_span {
  std::string label;
  std::uint32_t start = 0;
  std::uint32_t end = 0;
};

/// The server's account of which version made which token (a choice's
/// weight_versions) as versions, where it can be believed: every label is
/// "default" (0) or one of the adapter's, each version held between the
/// stream's opening (`opened_at`) and now (`held`), never going back, and
/// the spans cover exactly `tokens`. Otherwise nullopt: the adapter keeps
/// its own account.
std::optional<std::vector<version_span>> server_versions(const std::vector<label_span>& spans,
                                                         std::uint64_t opened_at, std::uint64_t held,
                                                         std::size_t tokens);

/// What one stream chunk carries for choice 0 (the adapter asks for n = 1).
struct completion_chunk {
  std::string id;                      ///< the completion's id ("cmpl-..."); empty when absent
  std::vector<std::int32_t> token_ids; ///< tokens of this chunk, in order
  /// Per token of token_ids when the server reported log-probabilities.
  std::vector<float> logprobs;
  /// Per token: the most probable tokens and theirs, when the server names
  /// them as "token_id:N" (vLLM's return_tokens_as_token_ids); else empty.
  std::vector<std::vector<std::pair<std::int32_t, float>>> top;
  std::optional<finish_reason> finish;  ///< set on the choice's last chunk
  /// Set when the server reported the choice's weight versions (vLLM sends
  /// them on the last chunk; a server that does not know them, never).
  std::optional<std::vector<label_span>> weight_versions;
  bool usage_only = false; ///< the usage chunk ("choices": []): nothing to relay
};

/// Largest stream chunk the adapter parses (bytes of one event's data).
inline constexpr std::size_t max_chunk_bytes = std::size_t{4} << 20;

/// An error event in a stream ({"error": {"message": ..., "code": N}}):
/// vLLM reports some refusals so after answering 200. `status` is its code
/// when that is an HTTP status (400-599), else 0.
struct stream_error_event : std::invalid_argument {
  stream_error_event(const std::string& what, int status) : std::invalid_argument(what), status(status) {}
  int status = 0;
};

/// Parses one SSE event's data (not "[DONE]"), strictly (nesting and value
/// count bounded, a key twice refused). Throws stream_error_event for an
/// error event, std::invalid_argument naming the field for a chunk that is
/// not a completion chunk, a choice other than 0, text without token_ids,
/// or a finish reason other than stop, length and abort.
completion_chunk parse_completion_chunk(const std::string& data);

/// A plan that receives every tensor of the model whole and unchanged, as
/// one worker of tp 1 (the adapter writes checkpoint-format tensors, the
/// server shards them itself).
plan::worker_plan whole_tensor_plan(const model_config& c, dtype source);

/// The tensors `whole_tensor_plan` names, checkpoint order (lm_head absent when tied).
std::vector<tensor_spec> checkpoint_tensors(const model_config& c, dtype source);

/// Writes one version as a Hugging Face checkpoint directory that vLLM's
/// disk backend loads: group g as model-<g+1>-of-<groups>.safetensors as it
/// arrives, then model.safetensors.index.json and config.json, all under a
/// hidden partial name renamed to <weights_dir>/v<version> at the end, so
/// that the server never sees half a version. Not thread-safe; one writer
/// per version.
class version_dir_writer {
public:
  /// Removes a leftover partial or complete directory of the same version
  /// first. Throws std::runtime_error naming the directory on I/O failure.
  version_dir_writer(std::string weights_dir, std::uint64_t version, model_config model, std::uint32_t groups);
  ~version_dir_writer(); ///< removes the partial directory unless committed

  /// Writes group `group`'s tensors (their bytes are copied to disk before
  /// this returns). Throws std::invalid_argument for a group out of range or
  /// written twice, a tensor of another model or written before, and
  /// std::runtime_error on I/O failure.
  void write_group(std::uint32_t group, const std::vector<tensor_view>& tensors);
  /// Checks that every expected tensor was written (names the first missing
  /// one), writes the index and config, renames into place and returns the
  /// absolute directory.
  std::string commit(const std::vector<tensor_spec>& expected);

  std::uint64_t bytes_written() const { return bytes_; }

private:
  std::string weights_dir_, partial_, final_;
  std::uint64_t version_;
  model_config model_;
  std::uint32_t groups_;
  std::vector<bool> written_groups_;
  std::set<std::string> names_;
  std::vector<std::pair<std::string, std::string>> weight_map_; ///< tensor -> file
  std::uint64_t bytes_ = 0;
  bool committed_ = false;
};

/// Removes every <weights_dir>/v<N> (and partial) directory except v<keep>;
/// returns what it could not remove, one message each (never throws).
std::vector<std::string> remove_other_versions(const std::string& weights_dir, std::uint64_t keep);

} // namespace rlsync::vllm
