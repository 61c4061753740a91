#pragma once
// A token sink for tests that writes down every token it receives, in order.
// One thread runs every actor on the deterministic scheduler: no locks.
#include "actors/interfaces.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

namespace rlsync::test {

/// What the sink received; shared with the test.
struct sink_record {
  std::vector<token_event> tokens; ///< every token, in arrival order
  /// "token <request id>.<index>" per token; a test may add its own events
  /// (a client's "result <id>") to see what came first.
  std::vector<std::string> events;
  /// Who sent the tokens (a router's relays), each once, in order.
  std::vector<caf::actor_addr> senders;
};

inline token_sink_actor::behavior_type recording_sink(token_sink_actor::pointer self,
                                                      std::shared_ptr<sink_record> record) {
  return {
    [=](token_atom, const token_event& ev) {
      if (auto from = caf::actor_cast<caf::actor_addr>(self->current_sender());
          std::find(record->senders.begin(), record->senders.end(), from) == record->senders.end())
        record->senders.push_back(from);
      record->tokens.push_back(ev);
      record->events.push_back("token " + std::to_string(ev.request_id) + "." + std::to_string(ev.index));
    },
  };
}

} // namespace rlsync::test
