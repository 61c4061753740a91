#include "runtime/base/printable.hpp"

namespace rlsync {

std::string printable(std::string_view s, std::size_t max_chars) {
  static const char digits[] = "0123456789abcdef";
  bool cut = s.size() > max_chars;
  if (cut)
    s = s.substr(0, max_chars);
  std::string out;
  out.reserve(s.size() + 3);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c >= 0x7f) {
      // UTF-8 is escaped too: a name is an identifier, and escaping every
      // high byte is the one rule that cannot let a bidi control through.
      out += "\\x";
      out += digits[c >> 4];
      out += digits[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (cut)
    out += "...";
  return out;
}

} // namespace rlsync
