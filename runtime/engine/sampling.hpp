#pragma once
// Choosing the next token from a row of logits, per request.
#include "runtime/control/protocol.hpp"

#include <cstdint>

namespace rlsync::engine {

/// The next token. temperature <= 0: greedy (the lowest id among equal
/// maxima). Otherwise a draw from softmax(logits / temperature) restricted to
/// the top-p nucleus (the most probable tokens whose mass first reaches
/// top_p; at least one). The draw uses a random number that depends only on
/// (p.seed, token_index), so a request samples the same tokens however it is
/// batched, whichever engine serves it, and after a reroute.
std::int32_t sample(const float* logits, std::int64_t vocab, const sampling_params& p,
                    std::uint64_t token_index);

/// The uniform number in [0, 1) that sample() draws for (seed, token_index).
double sample_uniform(std::uint64_t seed, std::uint64_t token_index);

} // namespace rlsync::engine
