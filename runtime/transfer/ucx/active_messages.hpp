#pragma once
// Internal to the ucx backend: control messages (ucx_wire.hpp) travel as
// UCX active messages, requests to the producer and replies to the consumer.
#include "runtime/transfer/ucx/ucx_transfer.hpp"
#include "runtime/transfer/ucx/ucx_wire.hpp"

#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <unordered_map>
#include <vector>

namespace rlsync::transfer::ucx_detail {

// Active message ids (part of the wire): requests go to the producer, replies to the consumer.
inline constexpr unsigned am_request = ucx_wire::am_request_id;
inline constexpr unsigned am_reply = ucx_wire::am_reply_id;

// Receives whole control messages on a worker: eager ones are copied in the
// callback (their data lives only during it); rendezvous ones (large plans
// or manifests) are fetched into a buffer of their announced size, which
// must not exceed `limit`. What waits here is bounded: max_ready messages
// not yet taken, max_pending_bytes being fetched (4 x limit), at most
// max_fetches_per_sender of them from one endpoint. With
// `is_member` set (the producer), only members' messages wait: one from
// any other endpoint goes to `admit` in the callback, the only place its
// endpoint is sure to be alive (UCX frees an endpoint nobody made their
// own once its peer fails), and is dropped after. A message beyond a
// bound is dropped and counted; a large one's send fails with
// UCS_ERR_REJECTED, a small one's sender waits into its deadline.
struct am_inbox {
  struct incoming {
    std::vector<std::uint8_t> bytes;
    ucp_ep_h reply_ep = nullptr;
    std::size_t too_big = 0; // announced size when over the limit (bytes empty)
  };
  struct fetching {
    void* request = nullptr;
    incoming msg;
    bool discard = false; // its endpoint is closing: dropped once UCX is done with it
  };
  // A message from an endpoint that is not a member, as the callback has it.
  struct first_message {
    ucp_ep_h reply_ep = nullptr;
    const void* header = nullptr;
    std::size_t header_length = 0;
    const void* data = nullptr; // nullptr when it came by rendezvous (not fetched)
    std::size_t length = 0;
  };
  static constexpr std::size_t max_ready = 4096;

  ucp_worker_h worker = nullptr;
  std::size_t limit = 0;
  std::size_t max_pending_bytes = 0;
  std::size_t pending_bytes = 0; // the buffers of `pending`
  // A sender that stops progressing holds its rendezvous fetches until its
  // endpoint goes: where many senders share the inbox (the producer's), each
  // one's share of `pending` is bounded, not only the sum. 0: no bound (a
  // puller's inbox has one sender, its producer).
  std::size_t max_fetches_per_sender = 0;
  std::unordered_map<ucp_ep_h, std::size_t> fetches_by_sender; // of `pending`
  std::uint64_t dropped = 0;     // messages dropped at a bound
  std::function<bool(ucp_ep_h reply_ep)> is_member; // empty: every sender is one
  std::function<void(const first_message&)> admit;  // set with is_member
  std::deque<incoming> ready;
  std::list<fetching> pending;

  static ucs_status_t on_message(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                 const ucp_am_recv_param_t* param);
  void install(ucp_worker_h w, unsigned id, std::size_t max_bytes);
  void poll();
  /// Drops what waits from `ep`, whose close began: the messages taken, and
  /// the fetches in flight once UCX is done with their buffers. A message
  /// answered or admitted from a closing endpoint would send on (or close
  /// again) an endpoint UCX is freeing.
  void forget(ucp_ep_h ep);
  void abandon(std::vector<std::vector<std::uint8_t>>& keep);
};

// Control messages being sent; each owns its bytes until UCX is done with them.
struct am_outbox {
  struct sending {
    void* request = nullptr;
    ucp_ep_h ep = nullptr;
    std::vector<std::uint8_t> bytes;
    std::vector<std::uint8_t> header;
    bool refusal = false;
  };
  // Answers to senders that are not members: a stranger that keeps sending
  // and never reads must not make the outbox grow.
  static constexpr std::size_t max_refusals = 64;
  std::list<sending> inflight;
  std::size_t refusals = 0; // of inflight
  std::unordered_map<ucp_ep_h, std::size_t> per_endpoint; // of inflight, by endpoint
  std::uint64_t failed_sends = 0;       // completed with an error (a peer's inbox refused one, or it went)
  ucs_status_t first_failure = UCS_OK; // the first such error

  bool send(ucp_ep_h ep, unsigned id, std::vector<std::uint8_t> bytes, bool reply,
            std::vector<std::uint8_t> header = {});
  /// A reply to a stranger; false (and nothing sent) with max_refusals in flight.
  bool refuse(ucp_ep_h ep, unsigned id, std::vector<std::uint8_t> bytes);
  void poll();
  bool pending_on(ucp_ep_h ep) const;
  /// Sends to `ep` that UCX has not completed: what its peer has not read.
  std::size_t in_flight_to(ucp_ep_h ep) const;
  void abandon(std::vector<std::vector<std::uint8_t>>& keep);
};

} // namespace rlsync::transfer::ucx_detail
