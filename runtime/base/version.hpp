#pragma once
#include <string>

namespace rlsync {

/// The version string of this build, e.g. "0.1.0".
std::string version_string();

/// 16 hex digits hashing the sources that define what crosses between nodes
/// (RLSYNC_WIRE_SOURCES in the top CMakeLists.txt: typed messages, error
/// codes, the plan, the data planes' encodings). Nodes of builds whose
/// fingerprints differ would misread each other's messages, so a node sends
/// it with its hello and the head refuses one that differs, naming both.
std::string wire_fingerprint();

} // namespace rlsync
