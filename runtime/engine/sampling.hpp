#pragma once
// Choosing the next token from a row of logits, per request.
#include "runtime/control/protocol.hpp"

#include <cstdint>
#include <vector>

namespace rlsync::engine {

/// The next token. temperature <= 0: greedy (the lowest id among equal
/// maxima). Otherwise a draw from softmax(logits / temperature) restricted to
/// the top-p nucleus (the most probable tokens whose mass first reaches
/// top_p; at least one). The draw uses a random number that depends only on
/// (p.seed, token_index), so a request samples the same tokens however it is
/// batched, whichever engine serves it, and after a reroute.
std::int32_t sample(const float* logits, std::int64_t vocab, const sampling_params& p,
                    std::uint64_t token_index);

/// Log-probabilities under log_softmax(logits) (the raw logits: no
/// temperature, no nucleus), as vLLM reports them.
struct token_logprobs {
  float logprob = 0.0f;                 ///< of the sampled token
  std::vector<std::int32_t> top_tokens; ///< the k most probable, ties by lower id
  std::vector<float> top_logprobs;
};

/// The log-probability of `token` and the `top_k` most probable tokens with
/// theirs (top_k is capped at vocab).
token_logprobs logprobs_of(const float* logits, std::int64_t vocab, std::int32_t token, std::uint32_t top_k);

/// The uniform number in [0, 1) that sample() draws for (seed, token_index).
double sample_uniform(std::uint64_t seed, std::uint64_t token_index);

} // namespace rlsync::engine
