#include "gpu/comm_wait.hpp"

#include <algorithm>
#include <thread>

namespace rlsync::gpu {

const char* to_string(wait_outcome::kind k) {
  switch (k) {
  case wait_outcome::kind::done: return "done";
  case wait_outcome::kind::failed: return "failed";
  case wait_outcome::kind::peer_dead: return "peer dead";
  case wait_outcome::kind::deadline: return "deadline";
  }
  return "?";
}

wait_outcome wait_for(communicator& c, clock::time_point deadline, const std::string& what,
                      const wait_hooks& hooks) {
  auto now = [&] { return hooks.now ? hooks.now() : clock::now(); };
  auto give_up = [&](wait_outcome::kind k, std::string why) {
    c.abort();
    return wait_outcome{k, what + ": " + why};
  };
  for (;;) {
    std::string why;
    switch (c.poll(why)) {
    case comm_poll::done: return {};
    case comm_poll::failed: return give_up(wait_outcome::kind::failed, why);
    case comm_poll::in_progress: break;
    }
    if (hooks.dead_member)
      if (auto dead = hooks.dead_member())
        return give_up(wait_outcome::kind::peer_dead, *dead + " died; aborted the communicator");
    const auto t = now();
    if (t >= deadline)
      return give_up(wait_outcome::kind::deadline, "not done by the phase deadline; aborted the communicator");
    const auto nap = std::min<clock::duration>(hooks.poll_every, deadline - t);
    if (hooks.sleep)
      hooks.sleep(nap);
    else
      std::this_thread::sleep_for(nap);
  }
}

} // namespace rlsync::gpu
