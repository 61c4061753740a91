#pragma once
#include <string>

namespace rlsync {

/// The version string of this build, e.g. "0.1.0".
std::string version_string();

} // namespace rlsync
