#include "actors/system_config.hpp"

#include <caf/io/middleman.hpp>

namespace rlsync {

void register_rlsync_types(caf::actor_system_config&) {}

system_config::system_config() {
  load<caf::io::middleman>();
  register_rlsync_types(*this);
}

} // namespace rlsync
