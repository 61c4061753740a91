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

TEST_CASE("an inbox keeps at most max_ready messages not yet taken; more are dropped and counted") {
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
