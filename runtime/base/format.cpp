#include "runtime/base/format.hpp"

#include <cstdarg>
#include <cstdio>

namespace rlsync {

std::string format(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

} // namespace rlsync
