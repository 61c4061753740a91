#pragma once
// OpenAI's /v1/completions as vLLM serves it, over the built-in engine: the
// request body parsed and bounded, turned into engine generate_requests (one
// per prompt × n), and the answers built as one JSON body or as Server-Sent
// Events. No I/O: the HTTP route feeds token events in and writes out what
// comes back.
//
//   body ─► parse_completion_request ─► make_generate_requests ─► engine
//                                                                   │ token events
//   response / SSE chunks ◄─ completion_choice (text, stop strings, logprobs, spans)
//
// The tokenizer is the engine's byte tokenizer: a string prompt is BOS plus
// its bytes, a token's text is its byte (BOS, EOS and other ids have none).
#include "runtime/control/protocol.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace rlsync::vllm {

/// An answer that is not a completion: an HTTP status and vLLM's error
/// envelope {"error": {"message", "type", "param", "code"}}.
struct api_error {
  int status = 400;
  std::string message;
  std::string param; ///< the offending field as "body.FIELD"; empty: none
};

/// The envelope's JSON, `type` being the status's reason phrase.
nlohmann::ordered_json error_body(const api_error& e);

/// Bounds on what one request may make the server hold or do.
struct completion_limits {
  std::size_t max_prompts = 64;       ///< entries of a prompt list
  std::uint32_t max_n = 64;           ///< choices per prompt
  std::size_t max_choices = 256;      ///< prompts × n
  std::size_t max_prompt_tokens = max_request_tokens; ///< tokens (or bytes) of all prompts together
  std::uint32_t max_tokens = 1u << 20;
  std::size_t max_stop_strings = 16;
  std::size_t max_stop_bytes = 256;   ///< of one stop string
  std::uint32_t max_logprobs = max_top_logprobs;
  /// A non-streamed answer is held whole until its last token: tokens of
  /// every choice at their max_tokens, each counting 1 + its log-probability
  /// entries, plus each choice's prompt token ids (about 130 MB of JSON at
  /// the bound). A stream is not bounded by it.
  std::uint64_t max_answer_entries = 1u << 22;
};

/// A parsed completions request. Fields RL clients send; unknown fields are
/// ignored, as OpenAI-compatible servers do.
struct completion_request {
  std::string model; ///< empty: not given
  /// Each prompt as token ids: a string prompt is already encoded.
  std::vector<std::vector<std::int32_t>> prompts;
  std::optional<std::uint32_t> max_tokens = 16; ///< nullopt (JSON null): up to the context length
  float temperature = 1.0f;                     ///< 0: greedy
  float top_p = 1.0f;
  std::uint32_t n = 1;
  /// Log-probabilities: nullopt none; k the sampled token's and the k most probable.
  std::optional<std::uint32_t> logprobs;
  bool stream = false;
  bool include_usage = false; ///< stream_options.include_usage
  bool return_token_ids = false;
  /// vLLM's return_tokens_as_token_ids: log-probability tokens named "token_id:N".
  bool tokens_as_ids = false;
  std::optional<std::uint64_t> seed; ///< a negative JSON seed wraps (two's complement)
  std::vector<std::string> stop;
  std::vector<std::int32_t> stop_token_ids;
  bool ignore_eos = false;
};

/// Parses a request body. Errors are 400 and name the field ("body.n").
std::variant<completion_request, api_error> parse_completion_request(std::string_view body,
                                                                     const completion_limits& limits = {});

/// What the served model accepts.
struct model_limits {
  std::int64_t vocab_size = 0;
  std::int64_t max_model_len = 0; ///< max_position_embeddings
};

/// The seed of choice `index`: `seed` itself for choice 0 (so n = 1 samples
/// as `rlsync generate --seed` does), a mix of both for the others, so that
/// choices differ yet a request replays identically.
std::uint64_t choice_seed(std::uint64_t seed, std::uint32_t index);

/// The engine requests of `req`, choice index = prompt × n + k, request id
/// = first_request_id + choice index. Without a seed, choice i samples with
/// choice_seed(unseeded_base, i) (the caller passes fresh entropy). Checks
/// the prompts against the model: token ids in the vocabulary, prompt plus
/// max_tokens within the context length (400 otherwise).
std::variant<std::vector<generate_request>, api_error> make_generate_requests(const completion_request& req,
                                                                              const model_limits& model,
                                                                              std::uint64_t first_request_id,
                                                                              std::uint64_t unseeded_base);

/// A 400 when `req` is not streamed and the answer its `made` requests may
/// produce exceeds limits.max_answer_entries; nullopt otherwise.
std::optional<api_error> check_answer_size(const completion_request& req, const std::vector<generate_request>& made,
                                           const completion_limits& limits);

/// The label a weight version is reported under ("default", "step-7", ...).
using version_labeler = std::function<std::string(std::uint64_t version)>;

/// How the answers are written.
struct response_options {
  std::string id;          ///< "cmpl-..."
  std::int64_t created = 0; ///< Unix seconds
  std::string model;
  /// Answer exactly as vLLM does: no weight_versions, token ids only with
  /// return_token_ids.
  bool strict = false;
  bool return_token_ids = false;
  bool tokens_as_ids = false; ///< completion_request::tokens_as_ids
  bool include_usage = false;
  version_labeler label; ///< empty: the version number as decimal text
};

/// A fresh completion id, "cmpl-" and 32 hex digits of `a` and `b`.
std::string completion_id(std::uint64_t a, std::uint64_t b);

/// One choice as its tokens arrive: the text (stop strings cut it, a stop
/// token's text is left out), logprobs, weight-version spans, and what a
/// stream has not sent yet. Streaming and non-streaming answers are built
/// from the same state, so they agree.
class completion_choice {
public:
  completion_choice(std::uint32_t index, const completion_request& req, std::vector<std::int32_t> prompt);

  /// Adds the next token. True when a stop string matched: the choice is
  /// finished ("stop") and the caller aborts its engine request. Tokens
  /// after the end are ignored.
  bool add(const token_event& ev);
  /// Ends the choice with the engine's reason (ignored when a stop string
  /// ended it already).
  void finish(finish_reason reason);
  bool finished() const { return finished_; }

  std::uint32_t index() const { return index_; }
  const std::vector<std::int32_t>& token_ids() const { return tokens_; }
  const std::vector<std::int32_t>& prompt_token_ids() const { return prompt_; }
  /// The final text (valid UTF-8); the text so far while running.
  std::string text() const;
  /// "stop", "length", "abort"; null while running.
  nlohmann::ordered_json finish_reason_json() const;

  /// The choice of a non-streamed response.
  nlohmann::ordered_json to_json(const response_options& o) const;
  /// The streamed part not sent yet: the text that can no longer change, the
  /// tokens and logprobs since the last call; finish_reason and (unless
  /// strict) weight_versions on the last. nullopt when nothing is left to send.
  std::optional<nlohmann::ordered_json> take_delta(const response_options& o);

private:
  struct span {
    std::uint64_t version;
    std::uint32_t start, end;
  };
  nlohmann::ordered_json logprobs_json(std::size_t from, std::size_t to, const response_options& o) const;
  nlohmann::ordered_json spans_json(const response_options& o) const;
  void settle(); ///< moves visible_ past what can no longer change

  std::uint32_t index_;
  std::vector<std::int32_t> prompt_;
  std::vector<std::string> stop_;
  std::vector<std::int32_t> stop_token_ids_;
  std::optional<std::uint32_t> logprobs_;
  std::vector<std::int32_t> tokens_;
  std::vector<float> token_logprobs_;
  std::vector<std::vector<std::pair<std::int32_t, float>>> top_; ///< per token
  std::vector<std::size_t> text_offset_; ///< per token: byte offset of its text in raw_
  std::vector<span> spans_;
  std::string raw_;          ///< bytes of the text so far (cut at a stop string)
  std::size_t visible_ = 0;  ///< bytes of raw_ that can no longer change
  std::size_t sent_bytes_ = 0;
  std::size_t sent_tokens_ = 0;
  bool sent_first_ = false;
  bool finished_ = false;
  bool sent_last_ = false;
  std::string reason_;        ///< "stop", "length", "abort"
  nlohmann::ordered_json stop_reason_; ///< the stop string or stop token id that ended it, else null
};

/// The whole non-streamed response body.
nlohmann::ordered_json completion_response(const response_options& o, const std::vector<completion_choice>& choices,
                                           std::size_t prompt_tokens);
/// `data: {chunk}\n\n` carrying one choice delta (from take_delta).
std::string stream_chunk(const response_options& o, nlohmann::ordered_json choice);
/// The usage chunk, `"choices": []`, sent last when include_usage.
std::string usage_chunk(const response_options& o, const std::vector<completion_choice>& choices,
                        std::size_t prompt_tokens);
/// `data: [DONE]\n\n`.
extern const std::string stream_done;

/// GET /v1/models' body: an OpenAI list of the one served model (TRL reads
/// data[0].max_model_len).
nlohmann::json models_list(const std::string& model_name, std::int64_t max_model_len);

/// The token's text as logprobs report it: its byte when printable ASCII,
/// "bytes:\xNN" for other bytes (vLLM's form for partial UTF-8), "<bos>",
/// "<eos>", "<token N>" for ids without text.
std::string token_string(std::int32_t token);

} // namespace rlsync::vllm
