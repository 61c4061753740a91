#include "runtime/engine/tokenizer.hpp"

#include "runtime/model_config.hpp"

namespace rlsync::engine {

std::vector<std::int32_t> encode(std::string_view text) {
  std::vector<std::int32_t> out;
  out.reserve(text.size() + 1);
  out.push_back(static_cast<std::int32_t>(token_bos));
  for (char c : text)
    out.push_back(static_cast<std::int32_t>(static_cast<unsigned char>(c)));
  return out;
}

std::string decode(const std::vector<std::int32_t>& tokens) {
  std::string out;
  out.reserve(tokens.size());
  for (auto t : tokens)
    if (t >= 0 && t < 256)
      out.push_back(static_cast<char>(static_cast<unsigned char>(t)));
  return out;
}

} // namespace rlsync::engine
