#pragma once
// printf into a string, for the fixed-width lines and tables reports print.
#include <string>

namespace rlsync {

/// The text `fmt` makes of the arguments, cut at 511 characters.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

} // namespace rlsync
