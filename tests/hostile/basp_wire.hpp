#pragma once
// CAF 0.17.6's wire protocol (BASP version 3) as a test client needs it:
// frames in and out, the two handshakes, a request as a direct message, and
// what a reply means. The header is 32 bytes in network byte order:
//   operation u8 | pad u8 | pad u8 | flags u8 | payload_len u32 |
//   operation_data u64 | source_actor u64 | dest_actor u64
// followed by payload_len bytes. CAF's own serializers write every field, so
// that the client speaks exactly what a CAF node speaks.
#include <caf/actor_system.hpp>
#include <caf/io/basp/header.hpp>
#include <caf/message.hpp>
#include <caf/node_id.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace rlsync::hostile {

using caf::io::basp::header;
using caf::io::basp::message_type;
using bytes = std::vector<char>;

/// One frame: a header and its payload.
struct frame {
  header hdr;
  bytes payload;
};

/// Header and payload serialized back to back. Throws std::length_error when
/// the payload does not fit BASP's 32-bit length field.
bytes encode_frame(caf::actor_system& sys, header hdr, const bytes& payload);

/// Only the header, with any announced length (the huge-header attack).
bytes encode_header(caf::actor_system& sys, const header& hdr);

/// The client handshake claiming `self` (CAF sends it after reading the
/// server's); `select_connection` asks the server to route `self`'s traffic
/// over this connection.
bytes client_handshake(caf::actor_system& sys, const caf::node_id& self, bool select_connection);

/// A request as CAF sends it: a direct message from actor `source` to actor
/// `dest`, request id `request` (1 .. 2^60-1), no forwarding stages.
bytes direct_request(caf::actor_system& sys, caf::actor_id source, caf::actor_id dest, std::uint64_t request,
                     const caf::message& content);

/// The same request to actor `dest` of node `dest_node`, which the receiving
/// node forwards (a routed message), claiming to come from actor `source`
/// of node `source_node`. CAF 0.17 checks neither claim against the
/// connection it arrives on.
bytes routed_request(caf::actor_system& sys, const caf::node_id& source_node, const caf::node_id& dest_node,
                     caf::actor_id source, caf::actor_id dest, std::uint64_t request, const caf::message& content);

/// Splits a byte stream into frames. A frame announcing more than
/// `max_payload` bytes stops the parser (the peer is then treated as broken:
/// this client allocates no more than it chose to).
class frame_reader {
public:
  explicit frame_reader(std::size_t max_payload) : max_payload_(max_payload) {}
  void append(const char* data, std::size_t n) { buffer_.insert(buffer_.end(), data, data + n); }
  /// The next complete frame, or nothing yet. After an oversized or
  /// undecodable header, `broken()` is set and nothing more comes out.
  std::optional<frame> next(caf::actor_system& sys);
  bool broken() const { return !problem_.empty(); }
  const std::string& problem() const { return problem_; }

private:
  std::size_t max_payload_;
  bytes buffer_;
  std::string problem_;
};

/// What the server's handshake said about it.
struct server_hello {
  caf::node_id node;
  std::vector<std::string> app_ids;
  caf::actor_id published = 0; ///< the published actor (rlsync: the gatekeeper)
  std::set<std::string> interface;
};

/// Decodes a server handshake frame; an error message when it is none.
std::optional<server_hello> read_server_hello(caf::actor_system& sys, const frame& f, std::string& problem);

/// What a reply to one of our requests was.
enum class reply_kind {
  answered,    ///< a value (or an empty reply from a handler returning nothing): the request got through
  error,       ///< an error message: refused, unknown actor, unexpected message
  undecodable, ///< a reply this client cannot read (e.g. it carries actor handles): it got through
};

struct reply {
  std::uint64_t request = 0;
  reply_kind kind = reply_kind::error;
  std::string text; ///< rendered, escaped, cut to a line
  caf::message content; ///< the value, when answered
};

/// If `f` is a reply to a request of ours (a direct or routed message whose
/// message id has the response flag), what it says.
std::optional<reply> read_reply(caf::actor_system& sys, const frame& f);

/// True for the frames a node sends only to a connected member: messages for
/// its actors, proxies, monitors. (The server handshake, BASP heartbeats and
/// messages to CAF's named system actors go to every connection.)
bool meant_for_member(const header& hdr);

/// A node id nobody has: random host id and process id.
caf::node_id fresh_node_id();

} // namespace rlsync::hostile
