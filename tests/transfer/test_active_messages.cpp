// The UCX backend's control-message inbox: what waits in it before anyone
// checked who sent it is bounded. Eager messages (their bytes handed to the
// callback) need no UCX worker, so the callback is driven directly here.
#include "runtime/transfer/ucx/active_messages.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

using namespace rlsync::transfer::ucx_detail;

namespace {

// An eager message of `bytes` as UCX hands it to the callback.
void deliver(am_inbox& inbox, std::vector<std::uint8_t> bytes) {
  ucp_am_recv_param_t param{};
  param.recv_attr = 0; // eager, no reply endpoint
  am_inbox::on_message(&inbox, nullptr, 0, bytes.data(), bytes.size(), &param);
}

} // namespace

TEST_CASE("an inbox keeps at most max_ready messages not yet taken, and drops and counts more") {
  am_inbox inbox;
  inbox.limit = 16;
  for (std::size_t i = 0; i < am_inbox::max_ready; ++i)
    deliver(inbox, {static_cast<std::uint8_t>(i), 1, 2});
  CHECK(inbox.ready.size() == am_inbox::max_ready);
  CHECK(inbox.dropped == 0);
  deliver(inbox, {9, 9, 9});
  deliver(inbox, {});
  CHECK(inbox.ready.size() == am_inbox::max_ready);
  CHECK(inbox.dropped == 2);
  // Taking one makes room for the next, which arrives whole.
  inbox.ready.pop_front();
  deliver(inbox, {7, 8});
  CHECK(inbox.ready.size() == am_inbox::max_ready);
  CHECK(inbox.ready.back().bytes == std::vector<std::uint8_t>{7, 8});
  CHECK(inbox.dropped == 2);
}

namespace {

// A large message, announced for a rendezvous fetch, from `reply_ep`.
ucs_status_t announce(am_inbox& inbox, std::size_t length, ucp_ep_h reply_ep) {
  ucp_am_recv_param_t param{};
  param.recv_attr = UCP_AM_RECV_ATTR_FLAG_RNDV | UCP_AM_RECV_ATTR_FIELD_REPLY_EP;
  param.reply_ep = reply_ep;
  return am_inbox::on_message(&inbox, nullptr, 0, nullptr, length, &param);
}

} // namespace

TEST_CASE("large messages: strangers get a small share of the bytes being fetched, members the rest") {
  am_inbox inbox;
  inbox.limit = 4 << 20;
  inbox.max_pending_bytes = 8 << 20;
  auto* stranger = reinterpret_cast<ucp_ep_h>(0x1000);
  auto* member = reinterpret_cast<ucp_ep_h>(0x2000);
  inbox.is_member = [&](ucp_ep_h ep) { return ep == member; };
  // Past the strangers' share: refused before any fetch, the sender's send
  // failing with the status, its descriptor dropped.
  CHECK(announce(inbox, am_inbox::max_stranger_bytes + 1, stranger) == UCS_ERR_REJECTED);
  CHECK(announce(inbox, am_inbox::max_stranger_bytes + 1, nullptr) == UCS_ERR_REJECTED);
  inbox.stranger_bytes = am_inbox::max_stranger_bytes - 10;
  inbox.pending_bytes = inbox.stranger_bytes;
  CHECK(announce(inbox, 11, stranger) == UCS_ERR_REJECTED);
  CHECK(inbox.dropped == 3);
  CHECK(inbox.pending.empty());
  // Over the bytes left to fetch in all: refused even from a member.
  inbox.pending_bytes = (8 << 20) - 100;
  CHECK(announce(inbox, 101, member) == UCS_ERR_REJECTED);
  CHECK(inbox.dropped == 4);
  // Over the limit: answered as too big (by size only), whoever sent it.
  CHECK(announce(inbox, 5 << 20, stranger) == UCS_OK);
  REQUIRE(inbox.ready.size() == 1);
  CHECK(inbox.ready[0].too_big == 5 << 20);
  CHECK(inbox.ready[0].reply_ep == stranger);
  CHECK(inbox.pending.empty());
}

TEST_CASE("a message over the inbox's limit is kept as its size only") {
  am_inbox inbox;
  inbox.limit = 4;
  deliver(inbox, {1, 2, 3, 4});
  deliver(inbox, {1, 2, 3, 4, 5});
  REQUIRE(inbox.ready.size() == 2);
  CHECK(inbox.ready[0].bytes.size() == 4);
  CHECK(inbox.ready[0].too_big == 0);
  CHECK(inbox.ready[1].bytes.empty());
  CHECK(inbox.ready[1].too_big == 5);
}

TEST_CASE("forgetting a closing endpoint drops its messages and marks its fetches, and no other's") {
  am_inbox inbox;
  inbox.limit = 16;
  auto* closing = reinterpret_cast<ucp_ep_h>(std::uintptr_t{0x1000});
  auto* other = reinterpret_cast<ucp_ep_h>(std::uintptr_t{0x2000});
  for (auto ep : {closing, other, closing}) {
    ucp_am_recv_param_t param{};
    param.recv_attr = UCP_AM_RECV_ATTR_FIELD_REPLY_EP; // eager, with a reply endpoint
    param.reply_ep = ep;
    std::vector<std::uint8_t> bytes{1, 2};
    am_inbox::on_message(&inbox, nullptr, 0, bytes.data(), bytes.size(), &param);
  }
  // Fetches in flight, as a rendezvous leaves them (their requests are UCX's).
  inbox.pending.push_back({nullptr, {{}, closing, 0}, false});
  inbox.pending.push_back({nullptr, {{}, other, 0}, false});
  inbox.forget(closing);
  REQUIRE(inbox.ready.size() == 1);
  CHECK(inbox.ready[0].reply_ep == other);
  CHECK(inbox.pending.front().discard);
  CHECK_FALSE(inbox.pending.back().discard);
  inbox.pending.clear(); // no UCX request behind them to free
}
