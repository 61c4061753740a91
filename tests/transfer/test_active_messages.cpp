// The UCX backend's control-message inbox: what waits in it is bounded,
// and a non-member's message never waits. Eager messages (their bytes handed to the
// callback) need no UCX worker, so the callback is driven directly here.
#include "runtime/transfer/ucx/active_messages.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <stdexcept>
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

TEST_CASE("a non-member's message goes to admit in the callback, header and all, and never waits") {
  am_inbox inbox;
  inbox.limit = 4 << 20;
  inbox.max_pending_bytes = 8 << 20;
  auto* stranger = reinterpret_cast<ucp_ep_h>(0x1000);
  auto* member = reinterpret_cast<ucp_ep_h>(0x2000);
  inbox.is_member = [&](ucp_ep_h ep) { return ep == member; };
  std::vector<am_inbox::first_message> seen;
  std::vector<std::vector<std::uint8_t>> headers;
  inbox.admit = [&](const am_inbox::first_message& m) {
    seen.push_back(m);
    const auto* h = static_cast<const std::uint8_t*>(m.header);
    headers.emplace_back(h, h + m.header_length);
  };
  // By rendezvous: admit sees the header, no data; nothing is fetched, and
  // the descriptor is dropped with UCS_OK (the sender's send succeeds).
  std::vector<std::uint8_t> hello{1, 2, 3};
  ucp_am_recv_param_t param{};
  param.recv_attr = UCP_AM_RECV_ATTR_FLAG_RNDV | UCP_AM_RECV_ATTR_FIELD_REPLY_EP;
  param.reply_ep = stranger;
  CHECK(am_inbox::on_message(&inbox, hello.data(), hello.size(), nullptr, 5 << 20, &param) == UCS_OK);
  // Eager, and without a reply endpoint: admit sees both (and answers neither here).
  std::vector<std::uint8_t> body{4, 5};
  param.recv_attr = UCP_AM_RECV_ATTR_FIELD_REPLY_EP;
  CHECK(am_inbox::on_message(&inbox, nullptr, 0, body.data(), body.size(), &param) == UCS_OK);
  param.recv_attr = 0;
  CHECK(am_inbox::on_message(&inbox, nullptr, 0, body.data(), body.size(), &param) == UCS_OK);
  REQUIRE(seen.size() == 3);
  CHECK(seen[0].reply_ep == stranger);
  CHECK(headers[0] == hello);
  CHECK(seen[0].data == nullptr);
  CHECK(seen[0].length == 5 << 20);
  CHECK(seen[1].data == body.data());
  CHECK(seen[1].header_length == 0);
  CHECK(seen[2].reply_ep == nullptr);
  CHECK(inbox.ready.empty());
  CHECK(inbox.pending.empty());
  CHECK(inbox.dropped == 0);
  // An admit that throws drops the message, counted.
  inbox.admit = [](const am_inbox::first_message&) { throw std::runtime_error("no memory"); };
  CHECK(am_inbox::on_message(&inbox, nullptr, 0, body.data(), body.size(), &param) == UCS_OK);
  CHECK(inbox.dropped == 1);
  // A member's large message past the bytes left to fetch is refused, the
  // sender's send failing with the status; one over the limit is answered
  // as too big (by size only).
  param.recv_attr = UCP_AM_RECV_ATTR_FLAG_RNDV | UCP_AM_RECV_ATTR_FIELD_REPLY_EP;
  param.reply_ep = member;
  inbox.pending_bytes = (8 << 20) - 100;
  CHECK(am_inbox::on_message(&inbox, nullptr, 0, nullptr, 101, &param) == UCS_ERR_REJECTED);
  CHECK(inbox.dropped == 2);
  CHECK(am_inbox::on_message(&inbox, nullptr, 0, nullptr, 5 << 20, &param) == UCS_OK);
  REQUIRE(inbox.ready.size() == 1);
  CHECK(inbox.ready[0].too_big == 5 << 20);
  CHECK(inbox.ready[0].reply_ep == member);
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
  inbox.pending.push_back({nullptr, {{}, closing, 0}});
  inbox.pending.push_back({nullptr, {{}, other, 0}});
  inbox.forget(closing);
  REQUIRE(inbox.ready.size() == 1);
  CHECK(inbox.ready[0].reply_ep == other);
  CHECK(inbox.pending.front().discard);
  CHECK_FALSE(inbox.pending.back().discard);
  inbox.pending.clear(); // no UCX request behind them to free
}

TEST_CASE("an outbox answers at most max_refusals strangers at once, the rest go unanswered") {
  am_outbox outbox;
  outbox.refusals = am_outbox::max_refusals;
  // At the bound nothing reaches UCX (no endpoint is needed to show it).
  CHECK_FALSE(outbox.refuse(nullptr, 18, {1, 2, 3}));
  CHECK(outbox.inflight.empty());
  CHECK(outbox.refusals == am_outbox::max_refusals);
}

TEST_CASE("one sender's fetches in flight are bounded: a large message past its share is refused, counted") {
  am_inbox inbox;
  inbox.limit = 1 << 20;
  inbox.max_pending_bytes = 4 << 20;
  inbox.max_fetches_per_sender = 4;
  auto* stuck = reinterpret_cast<ucp_ep_h>(std::uintptr_t{0x1000});
  // A sender that stopped progressing holds its share of fetches (their
  // requests are UCX's; none stands behind these).
  inbox.fetches_by_sender[stuck] = 4;
  ucp_am_recv_param_t param{};
  param.recv_attr = UCP_AM_RECV_ATTR_FLAG_RNDV | UCP_AM_RECV_ATTR_FIELD_REPLY_EP;
  param.reply_ep = stuck;
  CHECK(am_inbox::on_message(&inbox, nullptr, 0, nullptr, 100, &param) == UCS_ERR_REJECTED);
  CHECK(inbox.dropped == 1);
  CHECK(inbox.pending.empty());
  CHECK(inbox.fetches_by_sender[stuck] == 4);
  // Its eager messages still arrive: they wait for no fetch.
  std::vector<std::uint8_t> small{1, 2, 3};
  param.recv_attr = UCP_AM_RECV_ATTR_FIELD_REPLY_EP;
  CHECK(am_inbox::on_message(&inbox, nullptr, 0, small.data(), small.size(), &param) == UCS_OK);
  CHECK(inbox.ready.size() == 1);
}
