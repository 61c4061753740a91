// The hostile peer's wire code: endpoints, frames in and out, what counts as
// a member's traffic. (The attacks themselves run in
// tests/integration/hostile_peer.sh against a real head.)
#include "actors/system_config.hpp"
#include "actors/type_ids.hpp"
#include "tests/hostile/basp_wire.hpp"
#include "tests/hostile/transport.hpp"

#include <caf/actor_system_config.hpp>
#include <caf/make_message.hpp>
#include <doctest/doctest.h>

using namespace rlsync::hostile;

namespace {

struct wire_fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys;
  static caf::actor_system_config& init(caf::actor_system_config& c) {
    rlsync::register_rlsync_types(c);
    return c;
  }
  wire_fixture() : sys(init(cfg)) {}
};

} // namespace

TEST_CASE("endpoints are HOST:PORT with a numeric host") {
  struct row {
    const char* text;
    bool ok;
    const char* host;
    std::uint16_t port;
  };
  const row rows[] = {
    {"127.0.0.1:7411", true, "127.0.0.1", 7411}, {"[::1]:80", true, "::1", 80},
    {"10.0.0.2:65535", true, "10.0.0.2", 65535}, {"127.0.0.1", false, "", 0},
    {"127.0.0.1:0", false, "", 0},               {"127.0.0.1:65536", false, "", 0},
    {"127.0.0.1:12a", false, "", 0},             {"head:7411", false, "", 0},
    {"[::1]7411", false, "", 0},                 {":7411", false, "", 0},
    {"127.0.0.1:", false, "", 0},                {"127.0.0.1:0000080", false, "", 0},
  };
  for (auto& r : rows) {
    CAPTURE(r.text);
    if (!r.ok) {
      CHECK_THROWS_AS(parse_endpoint(r.text), std::invalid_argument);
      continue;
    }
    auto e = parse_endpoint(r.text);
    CHECK(e.host == r.host);
    CHECK(e.port == r.port);
    CHECK(to_string(e) == r.text);
  }
}

TEST_CASE_FIXTURE(wire_fixture, "frames come out whole, however the bytes arrive") {
  auto node = fresh_node_id();
  auto hs = client_handshake(sys, node, true);
  auto req = direct_request(sys, 1, 8, 42, caf::make_message(rlsync::status_atom_v));
  bytes stream = hs;
  stream.insert(stream.end(), req.begin(), req.end());
  frame_reader reader{1 << 20};
  std::vector<frame> got;
  for (char c : stream) { // one byte at a time: the worst a socket does
    reader.append(&c, 1);
    while (auto f = reader.next(sys))
      got.push_back(std::move(*f));
  }
  REQUIRE(got.size() == 2);
  CHECK(got[0].hdr.operation == message_type::client_handshake);
  CHECK(got[0].hdr.has(header::select_connection_flag));
  CHECK(got[0].payload.size() == hs.size() - caf::io::basp::header_size);
  CHECK(got[1].hdr.operation == message_type::direct_message);
  CHECK(got[1].hdr.dest_actor == 8);
  CHECK(got[1].hdr.source_actor == 1);
  CHECK((got[1].hdr.operation_data & caf::message_id::request_id_mask) == 42);
  CHECK_FALSE(read_reply(sys, got[1])); // a request, not a reply
  CHECK_FALSE(reader.broken());
}

TEST_CASE_FIXTURE(wire_fixture, "an announced payload beyond the bound stops the reader") {
  frame_reader reader{1024};
  auto hdr = encode_header(sys, header{message_type::direct_message, 0, 1u << 30, 0, 1, 2});
  reader.append(hdr.data(), hdr.size());
  CHECK_FALSE(reader.next(sys));
  CHECK(reader.broken());
  CHECK(reader.problem().find("1073741824") != std::string::npos);
}

TEST_CASE_FIXTURE(wire_fixture, "request ids outside 1 .. 2^60-1 are refused") {
  auto msg = caf::make_message(rlsync::status_atom_v);
  CHECK_THROWS_AS(direct_request(sys, 1, 2, 0, msg), std::out_of_range);
  CHECK_THROWS_AS(direct_request(sys, 1, 2, caf::message_id::request_id_mask + 1, msg), std::out_of_range);
  CHECK_NOTHROW(direct_request(sys, 1, 2, caf::message_id::request_id_mask, msg));
}

TEST_CASE("a member's traffic is what is addressed to its actors") {
  struct row {
    message_type op;
    std::uint8_t flags;
    bool member;
  };
  const row rows[] = {
    {message_type::server_handshake, 0, false}, {message_type::client_handshake, 0, false},
    {message_type::heartbeat, 0, false},        {message_type::direct_message, 0, true},
    {message_type::direct_message, header::named_receiver_flag, false},
    {message_type::routed_message, 0, true},    {message_type::monitor_message, 0, true},
    {message_type::down_message, 0, true},
  };
  for (auto& r : rows) {
    CAPTURE(caf::io::basp::to_string(r.op));
    CHECK(meant_for_member(header{r.op, r.flags, 0, 0, 0, 0}) == r.member);
  }
}
