#pragma once
// A communicator that plays a script, and a clock the wait loop reads, so
// that deadline and abort handling are tested without NCCL or a device.
#include "gpu/comm_wait.hpp"

#include <string>
#include <vector>

namespace rlsync::test {

struct fake_communicator : gpu::communicator {
  /// What each poll reports, in order; the last entry repeats.
  std::vector<gpu::comm_poll> script{gpu::comm_poll::in_progress};
  std::string failure = "unhandled system error: peer closed the connection";
  int polls = 0;
  int aborts = 0;

  gpu::comm_poll poll(std::string& why) override {
    const auto at = static_cast<std::size_t>(polls++);
    const auto p = script[at < script.size() ? at : script.size() - 1];
    if (p == gpu::comm_poll::failed)
      why = failure;
    return p;
  }
  void abort() override { ++aborts; }
};

/// A steady clock that moves only when the loop sleeps.
struct fake_clock {
  gpu::clock::time_point t{};
  std::vector<gpu::clock::duration> naps;

  gpu::wait_hooks hooks() {
    gpu::wait_hooks h;
    h.now = [this] { return t; };
    h.sleep = [this](gpu::clock::duration d) {
      naps.push_back(d);
      t += d;
    };
    return h;
  }
};

} // namespace rlsync::test
