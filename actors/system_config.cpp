#include "actors/system_config.hpp"

#include "actors/interfaces.hpp"

#include <caf/io/middleman.hpp>

namespace rlsync {

void register_rlsync_types(caf::actor_system_config& cfg) {
  cfg.add_message_types<caf::id_block::rlsync>();
  cfg.add_message_types<caf::id_block::rlsync_handles>();
  cfg.add_error_category(error_category, [](std::uint8_t code, caf::atom_value,
                                            const caf::message& ctx) -> std::string {
    std::string out = "rlsync::" + to_string(static_cast<errc>(code));
    if (!ctx.empty()) {
      if (ctx.match_elements<std::string>())
        out += ": " + ctx.get_as<std::string>(0);
      else
        out += " " + to_string(ctx);
    }
    return out;
  });
}

system_config::system_config() {
  load<caf::io::middleman>();
  register_rlsync_types(*this);
  // Work sharing wakes an idle worker at once (a condition variable); CAF
  // 0.17's default work stealing lets idle workers sleep 10 ms between
  // polls, which put up to 10 ms on every remote round trip. rlsync's hot
  // actors (engines) are detached anyway; the rest are few.
  set("scheduler.policy", caf::atom("sharing"));
}

} // namespace rlsync
