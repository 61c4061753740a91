#include "runtime/base/version.hpp"

#include "wire_fingerprint.inc" // generated: RLSYNC_WIRE_FINGERPRINT

namespace rlsync {

std::string version_string() { return "0.1.0"; }

std::string wire_fingerprint() { return RLSYNC_WIRE_FINGERPRINT; }

} // namespace rlsync
