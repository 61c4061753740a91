#include "runtime/engine/tokenizer.hpp"

#include "runtime/config/model_config.hpp"

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

std::string to_valid_utf8(std::string_view bytes) {
  static const char replacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(bytes.size());
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  for (std::size_t i = 0; i < n;) {
    unsigned char c = b[i];
    std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k)
      ok = (b[i + k] & 0xC0) == 0x80;
    if (ok && len > 1) {
      // Reject overlong encodings, surrogates and code points past U+10FFFF.
      std::uint32_t cp = c & (0x7F >> len);
      for (std::size_t k = 1; k < len; ++k)
        cp = (cp << 6) | (b[i + k] & 0x3F);
      static const std::uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= min_cp[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (ok) {
      out.append(bytes.substr(i, len));
      i += len;
    } else {
      out += replacement;
      ++i;
    }
  }
  return out;
}

} // namespace rlsync::engine
