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

/// `bytes` with every invalid UTF-8 sequence replaced by U+FFFD, as
/// Hugging Face tokenizers decode with errors="replace": safe to print and
/// to put in JSON. Random weights produce arbitrary bytes.
std::string to_valid_utf8(std::string_view bytes);

} // namespace rlsync::engine
