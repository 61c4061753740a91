#include "tests/hostile/basp_wire.hpp"

#include "runtime/base/printable.hpp"

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/error.hpp>
#include <caf/message_id.hpp>

#include <limits>
#include <random>
#include <stdexcept>

namespace rlsync::hostile {

namespace {

void check(const caf::error& err, caf::actor_system& sys, const char* what) {
  if (err)
    throw std::runtime_error(std::string(what) + ": " + sys.render(err));
}

} // namespace

bytes encode_header(caf::actor_system& sys, const header& hdr) {
  bytes out;
  caf::binary_serializer sink{sys, out};
  auto copy = hdr;
  check(sink(copy), sys, "serializing a BASP header");
  return out;
}

bytes encode_frame(caf::actor_system& sys, header hdr, const bytes& payload) {
  if (payload.size() > std::numeric_limits<std::uint32_t>::max())
    throw std::length_error("BASP payload of " + std::to_string(payload.size()) + " bytes exceeds 2^32-1");
  hdr.payload_len = static_cast<std::uint32_t>(payload.size());
  auto out = encode_header(sys, hdr);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

bytes client_handshake(caf::actor_system& sys, const caf::node_id& self, bool select_connection) {
  bytes payload;
  caf::binary_serializer sink{sys, payload};
  auto node = self;
  check(sink(node), sys, "serializing a node id");
  header hdr{message_type::client_handshake,
             select_connection ? header::select_connection_flag : std::uint8_t{0},
             0, 0, caf::invalid_actor_id, caf::invalid_actor_id};
  return encode_frame(sys, hdr, payload);
}

bytes direct_request(caf::actor_system& sys, caf::actor_id source, caf::actor_id dest, std::uint64_t request,
                     const caf::message& content) {
  if (request == 0 || request > caf::message_id::request_id_mask)
    throw std::out_of_range("request id " + std::to_string(request) + " outside 1 .. 2^60-1");
  bytes payload;
  caf::binary_serializer sink{sys, payload};
  std::vector<caf::strong_actor_ptr> stages;
  auto msg = content;
  check(sink(stages, msg), sys, "serializing a message");
  header hdr{message_type::direct_message, 0, 0, caf::make_message_id(request).integer_value(), source, dest};
  return encode_frame(sys, hdr, payload);
}

bytes routed_request(caf::actor_system& sys, const caf::node_id& source_node, const caf::node_id& dest_node,
                     caf::actor_id source, caf::actor_id dest, std::uint64_t request, const caf::message& content) {
  if (request == 0 || request > caf::message_id::request_id_mask)
    throw std::out_of_range("request id " + std::to_string(request) + " outside 1 .. 2^60-1");
  bytes payload;
  caf::binary_serializer sink{sys, payload};
  std::vector<caf::strong_actor_ptr> stages;
  auto src = source_node;
  auto dst = dest_node;
  auto msg = content;
  check(sink(src, dst, stages, msg), sys, "serializing a routed message");
  header hdr{message_type::routed_message, 0, 0, caf::make_message_id(request).integer_value(), source, dest};
  return encode_frame(sys, hdr, payload);
}

std::optional<frame> frame_reader::next(caf::actor_system& sys) {
  if (broken() || buffer_.size() < caf::io::basp::header_size)
    return std::nullopt;
  frame f;
  caf::binary_deserializer source{sys, buffer_.data(), caf::io::basp::header_size};
  if (auto err = source(f.hdr)) {
    problem_ = "undecodable BASP header: " + sys.render(err);
    return std::nullopt;
  }
  if (f.hdr.payload_len > max_payload_) {
    problem_ = "the peer announced a payload of " + std::to_string(f.hdr.payload_len) + " bytes (this client reads "
               + std::to_string(max_payload_) + " at most)";
    return std::nullopt;
  }
  auto total = caf::io::basp::header_size + std::size_t{f.hdr.payload_len};
  if (buffer_.size() < total)
    return std::nullopt;
  f.payload.assign(buffer_.begin() + caf::io::basp::header_size, buffer_.begin() + total);
  buffer_.erase(buffer_.begin(), buffer_.begin() + total);
  return f;
}

std::optional<server_hello> read_server_hello(caf::actor_system& sys, const frame& f, std::string& problem) {
  if (f.hdr.operation != message_type::server_handshake) {
    problem = "expected a server handshake, got " + caf::io::basp::to_string(f.hdr.operation);
    return std::nullopt;
  }
  server_hello hello;
  caf::binary_deserializer source{sys, f.payload};
  if (auto err = source(hello.node, hello.app_ids, hello.published, hello.interface)) {
    problem = "undecodable server handshake: " + sys.render(err);
    return std::nullopt;
  }
  return hello;
}

std::optional<reply> read_reply(caf::actor_system& sys, const frame& f) {
  if (f.hdr.operation != message_type::direct_message && f.hdr.operation != message_type::routed_message)
    return std::nullopt;
  caf::message_id mid{f.hdr.operation_data};
  if (!mid.is_response())
    return std::nullopt;
  reply r;
  r.request = f.hdr.operation_data & caf::message_id::request_id_mask;
  std::vector<caf::strong_actor_ptr> stages;
  caf::message msg;
  caf::binary_deserializer source{sys, f.payload};
  caf::node_id from, to; // a routed reply names its nodes first
  if (f.hdr.operation == message_type::routed_message)
    if (auto err = source(from, to)) {
      r.kind = reply_kind::undecodable;
      r.text = "a routed reply without its nodes (" + sys.render(err) + ")";
      return r;
    }
  if (auto err = source(stages, msg)) {
    r.kind = reply_kind::undecodable;
    r.text = std::to_string(f.payload.size()) + " bytes (" + sys.render(err) + ")";
    return r;
  }
  if (msg.match_elements<caf::error>()) {
    r.kind = reply_kind::error;
    r.text = printable(sys.render(msg.get_as<caf::error>(0)), 160);
    return r;
  }
  r.kind = reply_kind::answered;
  r.content = msg;
  // A bucket of weights prints as megabytes of numbers: only small replies are shown.
  r.text = f.payload.size() <= 4096 ? printable(caf::to_string(msg), 160)
                                    : std::to_string(f.payload.size()) + " bytes";
  return r;
}

bool meant_for_member(const header& hdr) {
  switch (hdr.operation) {
    case message_type::direct_message:
      // A message to a *named* actor (CAF's spawn and config servers) goes to
      // every node that connects, member or not.
      return !hdr.has(header::named_receiver_flag);
    case message_type::routed_message:
    case message_type::monitor_message:
    case message_type::down_message:
      return true;
    default:
      return false;
  }
}

caf::node_id fresh_node_id() {
  std::random_device rd;
  caf::node_id::default_data::host_id_type host;
  for (auto& b : host)
    b = static_cast<std::uint8_t>(rd());
  auto pid = static_cast<std::uint32_t>(rd()) | 1u; // never 0
  return caf::make_node_id(pid, host);
}

} // namespace rlsync::hostile
