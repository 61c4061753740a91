#pragma once
// For tests whose actors run on CAF's real scheduler (threads): a config
// with rlsync's types, a guard that stops an actor on every way out of a
// test (the system's destructor waits for every actor, so a failed REQUIRE
// must not leave one running), and the small topology such tests start from.
#include "actors/system_config.hpp"
#include "runtime/config/topology.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

namespace rlsync::test {

struct rlsync_config : caf::actor_system_config {
  rlsync_config() { register_rlsync_types(*this); }
};

struct stop_on_exit {
  caf::actor actor;
  ~stop_on_exit() { caf::anon_send_exit(actor, caf::exit_reason::user_shutdown); }
};

/// small_model(layers) in bf16, seed 3, one trainer rank on node "a"
/// holding every layer.
inline topology small_topology(std::int64_t layers) {
  topology t;
  t.model.config = small_model(layers);
  t.model.weights_dtype = dtype::bf16;
  t.model.seed = 3;
  std::vector<std::int64_t> all;
  for (std::int64_t l = 0; l < layers; ++l)
    all.push_back(l);
  t.trainer.ranks = {trainer_rank{"a", all}};
  return t;
}

} // namespace rlsync::test
