#pragma once
// Internal to the ucx backend: UCX contexts and workers, the transports this
// machine offers (UCX_TLS, UCX_NET_DEVICES) and those an endpoint's lanes
// use, waiting on a worker until a deadline, and closing endpoints.
#include "runtime/transfer/ucx/ucx_transfer.hpp"

#include <ucp/api/ucp.h>

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace rlsync::transfer::ucx_detail {

inline void say(const ucx_log& log, const std::string& line) {
  if (log)
    log(line);
}

inline std::chrono::milliseconds ms_until(clock::time_point t, clock::time_point now = clock::now()) {
  return std::chrono::ceil<std::chrono::milliseconds>(std::max(t - now, clock::duration::zero()));
}

// -- contexts and workers -----------------------------------------------------------------

struct ucx_context {
  ucp_context_h handle = nullptr;
  std::string tls; // what UCX_TLS was set to ("" = UCX's default)
  ~ucx_context() {
    if (handle)
      ucp_cleanup(handle);
  }
};

/// A UCP context with UCX_TLS set from `named` (throws ucx_error naming what
/// this machine lacks) and UCX_NET_DEVICES from `net_devices`; `role`
/// ("producer", "puller") prefixes its errors.
std::unique_ptr<ucx_context> make_context(const std::vector<ucx_transport>& named, const std::string& net_devices,
                                          const std::string& role);

struct worker_handle {
  ucp_worker_h handle = nullptr;
  int efd = -1;
};

worker_handle make_worker(ucp_context_h ctx, const std::string& role);
// The worker's address, as a peer's ucp_ep_create takes it.
std::vector<std::uint8_t> worker_address(ucp_worker_h w, const std::string& role);

// What one endpoint's lanes use, parsed from ucp_ep_print_info (UCX 1.13
// has no query for it):
//   lane[1]:  2:sysv/memory.0 md[2]  -> md[2]/sysv/sysdev[255] am am_bw#0
struct lane_info {
  std::string text;                // "sysv/memory.0 am am_bw#0, cma/memory.0 rma_bw#0"
  std::set<ucx_transport> kinds;   // of lanes that carry data
  std::vector<std::string> data_tls;
  std::string summary() const; ///< the kinds of the data lanes: "shm/cma", "tcp"
};

lane_info ep_lanes(ucp_ep_h ep);

// Empty when every data lane uses a named transport (or none was named).
std::string lanes_refused(const lane_info& l, const std::vector<ucx_transport>& named);

// -- waiting ------------------------------------------------------------------------------

// Drives worker `w` until `done()` holds or `until` passes (false), even
// while messages keep arriving. Spins
// while there is progress and briefly after, then sleeps on the worker's
// event fd so that an idle wait costs no CPU; sleeps are capped at `nap` so
// that the deadline and other threads' requests are seen in time even if an
// event is missed.
template <class Done>
bool drive(const worker_handle& w, clock::time_point until, Done done,
           std::chrono::milliseconds nap = std::chrono::milliseconds(5)) {
  int idle = 0;
  for (;;) {
    if (done())
      return true;
    if (ucp_worker_progress(w.handle) != 0) {
      idle = 0;
      // A peer that never stops sending must not hold the wait past its deadline.
      if (clock::now() >= until)
        return done();
      continue;
    }
    if (done())
      return true;
    const auto now = clock::now();
    if (now >= until)
      return false;
    if (++idle < 200)
      continue; // replies usually come within microseconds
    idle = 0;
    const ucs_status_t st = ucp_worker_arm(w.handle);
    if (st == UCS_ERR_BUSY)
      continue; // events pending: progress them
    const auto wait = std::clamp(ms_until(until, now), std::chrono::milliseconds(1), nap);
    pollfd p{w.efd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(wait.count()));
  }
}

// -- closing endpoints --------------------------------------------------------------------

// Why endpoints are closed with care. UCX 1.13 aborts the process ("Bug:
// pending request ... on ep ... should have been flushed") when a worker is
// destroyed while one of its endpoints still queues a send, such as a hello
// waiting for a connection that failed, and it cannot force-close an
// endpoint without peer error handling (which these endpoints do not use).
// So an endpoint with sends outstanding is closed gracefully (UCX completes
// its queued sends, logging flush errors when the peer is gone) before its
// worker goes; one without is left to the worker, and a worker whose close
// does not complete is not destroyed.

// Starts closing `ep` gracefully and progresses `w` for at most `grace`.
// Returns the close request if it is still running (nullptr when done).
void* close_ep(const worker_handle& w, ucp_ep_h ep, std::chrono::milliseconds grace);

} // namespace rlsync::transfer::ucx_detail
