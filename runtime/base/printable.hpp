#pragma once
// Text that came from outside (file names, node names, tensor names, HTTP
// bodies, a peer's strings) is echoed through printable(): a control
// character or an invalid byte in it must not move the cursor, clear the
// terminal or forge a log line.
#include <string>
#include <string_view>

namespace rlsync {

/// `s` with every byte below 0x20, 0x7f and every byte >= 0x80 written as
/// \xHH (backslash as \\), cut at `max_chars` input bytes with "..." after.
std::string printable(std::string_view s, std::size_t max_chars = 256);

} // namespace rlsync
