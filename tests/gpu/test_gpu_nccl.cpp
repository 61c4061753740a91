// NCCL on one device: what a one-GPU machine can check of the nccl backend.
// NCCL refuses two ranks of one communicator on one GPU, so no transfer
// between members runs here; what does: a communicator of one, created
// non-blocking and driven by comm_wait's loop (init, a broadcast in place,
// a send to itself and its receive in one group), the link the backend
// uses over it (staging, broadcast, read back), and the two ways a wait
// must end without hanging on real NCCL: a member that never joins (the
// deadline aborts the init) and a member the coordinator saw die.
//
// Its own binary, apart from test_gpu: it loads libnccl, which a lent
// device machine has only from the nvidia-nccl wheel (tools/device-check
// finds it, or skips this check saying so). Exit 77 without a device or
// without NCCL in this build; one line per check; 1 on any failure.
#include "gpu/comm_wait.hpp"
#include "gpu/device.hpp"
#include "gpu/kernels.hpp"
#include "gpu/nccl_comm.hpp"
#include "gpu/nccl_link.hpp"

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

using namespace rlsync;
using namespace std::chrono_literals;

namespace {

int failures = 0;

void report(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
  failures += ok ? 0 : 1;
}

std::vector<std::uint8_t> pattern(std::size_t n, std::uint8_t seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::uint8_t>(i * 131 + seed);
  return v;
}

std::string outcome(const gpu::wait_outcome& o) {
  return std::string(gpu::to_string(o.result)) + (o.why.empty() ? "" : " (" + o.why + ")");
}

// A communicator of one: init, a broadcast from itself, a send to itself
// received in the same group, then abort. Every wait bounded.
void check_comm_of_one() {
  const std::size_t n = std::size_t{4} << 20;
  auto comm = gpu::nccl_comm::start(gpu::make_nccl_id(), 0, 1, 0);
  auto init = gpu::wait_for(*comm, gpu::clock::now() + 60s, "init of a communicator of one");
  report(init.ok(), "a communicator of one initialises non-blocking: " + outcome(init));
  if (!init.ok())
    return;
  const auto bytes = pattern(n, 7);
  gpu::device_buffer a(n), b(n);
  gpu::copy(a.data(), bytes.data(), n, gpu::copy_kind::host_to_device);
  comm->enqueue_broadcast(a.data(), n, 0);
  auto bcast = gpu::wait_for(*comm, gpu::clock::now() + 30s, "broadcast of 4 MiB");
  std::vector<std::uint8_t> back(n);
  gpu::copy(back.data(), a.data(), n, gpu::copy_kind::device_to_host);
  report(bcast.ok() && back == bytes, "a broadcast from itself leaves the bytes: " + outcome(bcast));
  comm->enqueue_p2p({gpu::p2p_op{true, 0, a.data(), n}, gpu::p2p_op{false, 0, b.data(), n}});
  auto p2p = gpu::wait_for(*comm, gpu::clock::now() + 30s, "send to itself");
  gpu::copy(back.data(), b.data(), n, gpu::copy_kind::device_to_host);
  report(p2p.ok() && back == bytes, "a send to itself arrives in its receive (one group): " + outcome(p2p));
  comm->abort();
  std::string why;
  report(comm->poll(why) == gpu::comm_poll::failed, "an aborted communicator polls failed: " + why);
}

// The backend's link over a communicator of one: staging, broadcast, read.
void check_link_of_one() {
  gpu::comm_layout layout;
  layout.epoch = 1;
  layout.members = {gpu::comm_member::trainer_rank(0)};
  const std::size_t n = (std::size_t{1} << 20) + 13;
  auto link = gpu::nccl_link(gpu::make_nccl_id(), layout, 0, 0, n);
  auto init = gpu::wait_for(*link, gpu::clock::now() + 60s, "init of a link");
  report(init.ok(), "nccl_link initialises: " + outcome(init));
  if (!init.ok())
    return;
  const auto bytes = pattern(n, 3);
  link->broadcast(bytes.data(), n, 0);
  auto done = gpu::wait_for(*link, gpu::clock::now() + 30s, "broadcast through the staging");
  std::vector<std::uint8_t> back(n);
  if (done.ok())
    link->read(back.data(), n);
  report(done.ok() && back == bytes, "nccl_link broadcasts through its staging and reads it back: " + outcome(done));
}

// Rank 0 of two, alone: the init never completes. The wait gives up at its
// deadline and aborts (ncclCommAbort), so a rank that never comes holds
// nobody past it.
void check_missing_member() {
  auto comm = gpu::nccl_comm::start(gpu::make_nccl_id(), 0, 2, 0);
  const auto started = gpu::clock::now();
  auto init = gpu::wait_for(*comm, started + 3s, "init without rank 1");
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(gpu::clock::now() - started);
  report(init.result == gpu::wait_outcome::kind::deadline && took < 60s,
         "an init whose other member never joins ends at its deadline, aborted, in " + std::to_string(took.count())
           + " ms: " + outcome(init));
}

// The coordinator says a member died: the wait aborts at its next poll,
// long before its deadline.
void check_dead_member() {
  auto comm = gpu::nccl_comm::start(gpu::make_nccl_id(), 0, 2, 0);
  gpu::wait_hooks hooks;
  hooks.dead_member = [] { return std::optional<std::string>("engine e worker 0 died"); };
  const auto started = gpu::clock::now();
  auto init = gpu::wait_for(*comm, started + 600s, "init with a dead member", hooks);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(gpu::clock::now() - started);
  report(init.result == gpu::wait_outcome::kind::peer_dead && took < 60s,
         "a wait on a communicator with a dead member aborts at once, in " + std::to_string(took.count())
           + " ms: " + outcome(init));
}

} // namespace

int main() {
  auto info = gpu::query_devices();
  if (!info.compiled_with_cuda || !info.compiled_with_nccl || info.device_count == 0) {
    std::printf("skipping the nccl device checks: %s\n",
                !info.compiled_with_nccl ? "rlsync was built without NCCL" : info.detail.c_str());
    return 77;
  }
  std::printf("device: %s\n", info.detail.c_str());
  for (auto check : {check_comm_of_one, check_link_of_one, check_missing_member, check_dead_member}) {
    try {
      check();
    } catch (const std::exception& e) {
      report(false, std::string("threw: ") + e.what());
    }
  }
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
