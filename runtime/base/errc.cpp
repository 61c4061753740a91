#include "runtime/base/errc.hpp"

namespace rlsync {

std::string to_string(errc x) {
  switch (x) {
    case errc::queue_full: return "queue_full";
    case errc::engine_dirty: return "engine_dirty";
    case errc::pause_in_flight: return "pause_in_flight";
    case errc::not_paused: return "not_paused";
    case errc::no_session: return "no_session";
    case errc::version_mismatch: return "version_mismatch";
    case errc::checksum_mismatch: return "checksum_mismatch";
    case errc::malformed: return "malformed";
    case errc::unauthenticated: return "unauthenticated";
    case errc::evicted: return "evicted";
    case errc::not_routable: return "not_routable";
    case errc::round_aborted: return "round_aborted";
    case errc::unknown_name: return "unknown_name";
    case errc::version_gone: return "version_gone";
    case errc::update_incomplete: return "update_incomplete";
  }
  return "errc(" + std::to_string(static_cast<int>(x)) + ")";
}

} // namespace rlsync
