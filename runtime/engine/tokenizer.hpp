#pragma once
// The byte-level tokenizer: byte b is token b, plus BOS and EOS
// (runtime/model_config.hpp). Any text round-trips, no vocabulary file.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rlsync::engine {

/// BOS followed by one token per byte of `text`.
std::vector<std::int32_t> encode(std::string_view text);

/// The bytes of the byte tokens in `tokens`; BOS, EOS and any other id
/// outside [0, 256) are skipped.
std::string decode(const std::vector<std::int32_t>& tokens);

} // namespace rlsync::engine
