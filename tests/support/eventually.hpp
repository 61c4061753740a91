#pragma once
// Waits, bounded, for something another thread does: for tests of what
// completes asynchronously (a sender counting a send at its next poll, a
// buffer freed when the last holder lets go).
#include <chrono>
#include <thread>

namespace rlsync::test {

/// Polls `ready` every millisecond until it holds or `within` passed;
/// whether it held.
template <class F>
bool eventually(F&& ready, std::chrono::milliseconds within = std::chrono::seconds(20)) {
  for (const auto until = std::chrono::steady_clock::now() + within;;) {
    if (ready())
      return true;
    if (std::chrono::steady_clock::now() >= until)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

} // namespace rlsync::test
