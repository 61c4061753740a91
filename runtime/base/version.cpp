#include "runtime/base/version.hpp"

namespace rlsync {

std::string version_string() { return "0.1.0"; }

} // namespace rlsync
