#pragma once
#include <caf/actor_system_config.hpp>

namespace rlsync {

/// The actor-system configuration every rlsync process uses: it loads the
/// middleman and registers every message type and the error category, so
/// that two processes built from the same source agree on the wire format.
class system_config : public caf::actor_system_config {
public:
  system_config();
};

/// Registers rlsync's types and error category on any config (tests use it
/// on a config set to the deterministic scheduler).
void register_rlsync_types(caf::actor_system_config& cfg);

} // namespace rlsync
