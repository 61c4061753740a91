#pragma once
// Step (6) of the weight lifecycle, process: an optional per-engine format
// the engine computes from what it received, after loading, so that the
// transfer boundary stays at "sharded, unprocessed" whatever the engine
// serves from (the trainer and the plans never see it).
//
//   received   serve the weights as they arrived (bf16, f16 or f32)
//   int8       every linear layer's matrix (qkv, o, gate/up, down, and each
//              expert's) quantized per output channel, symmetric:
//              scale[j] = max_k |w[j][k]| / 127, q = round(w / scale) (ties
//              to even), each worker from its own shard. Embeddings, the
//              lm_head, the router and the norms stay as received.
#include "runtime/engine/weights.hpp"

#include <optional>
#include <string>

namespace rlsync::engine {

enum class weight_format { received, int8 };

const char* to_string(weight_format f);
/// "received" or "int8"; nullopt for anything else.
std::optional<weight_format> weight_format_of(const std::string& s);

/// Whether `name` is one of the matrices the int8 format quantizes.
bool quantized_parameter(const std::string& name);

/// The int8 form of one matrix [rows, ...] from its bytes: fills p.q and
/// p.scales (the GPU kernel of the same step is checked against this).
void quantize_int8(parameter& p);

/// Computes `f`'s form of every worker's parameters in place (int8: fills
/// q and scales of each quantized matrix from its bytes, a row holding NaN
/// or infinity getting a NaN scale; received: frees them), spread over the
/// machine's threads, and sets set.processed. Run on a set no step reads:
/// a staging set before it is served (rollout engines do it on their
/// pulling thread once a pull is complete, so that finish does not wait for
/// it), or one leaving service.
void process_weights(weight_set& set, weight_format f);

} // namespace rlsync::engine
