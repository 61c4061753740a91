#pragma once
// The `ucx` backend's wire format (ucx_transfer.hpp): the control messages a
// consumer and a producer exchange as UCX active messages, and the binary
// encoding of a sharding plan (plan::worker_plan) that a consumer sends once per
// connection so that the producer can pack its bytes.
//
// Peers are not trusted: every decoder is strict. It reads only inside the
// buffer it is given, checks every count and length against what is left and
// against fixed limits before allocating, rejects unknown message types,
// enum values out of range and trailing bytes, and throws wire_error saying
// what is wrong and at which byte. decode_plan also checks that every entry
// reads inside its source tensor (check_plan), so a hostile plan can make a
// producer neither read out of bounds nor allocate without limit.
//
// Layout: little-endian, no padding. Integers are fixed width; strings and
// byte blobs are a u32 length then the bytes; vectors a u32 count then the
// elements.
//
//   message  = u32 magic "RLUX" | u8 format version (8) | u8 type | fields
//   plan     = u32 magic "RLPL" | u8 format version (8) | i32 tp | i32 worker
//              | u32 entries | entry*
//   entry    = str source | u8 dtype | shape source_shape | u16 ops | str*
//              | i64 view.offset | u8 rank | i64 view.shape[rank]
//              | i64 view.strides[rank] | str param | i64 dst_offset
//   shape    = u8 rank | i64 dims[rank]
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/control/protocol.hpp"
#include "runtime/plan/plan.hpp"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace rlsync::transfer::ucx_wire {

/// The UCX active-message ids messages travel under: requests to the
/// producer, replies to the consumer.
inline constexpr unsigned am_request_id = 17;
inline constexpr unsigned am_reply_id = 18;

/// Malformed bytes from a peer (or a plan no producer may replay).
struct wire_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Limits every decoder enforces, far above what a real model needs.
inline constexpr std::size_t max_string_bytes = 4096;       ///< names, op strings
inline constexpr std::size_t max_error_bytes = 16384;       ///< error texts in replies
inline constexpr std::size_t max_rank = 8;                  ///< tensor and view dimensions
inline constexpr std::size_t max_ops = 64;                  ///< ops per plan entry
inline constexpr std::size_t max_plan_entries = 1u << 22;
inline constexpr std::size_t max_groups = 1u << 20;         ///< groups in a manifest
inline constexpr std::size_t max_group_tensors = 1u << 16;  ///< tensors of one group (broadcast manifest)
inline constexpr std::size_t max_live_buffers = 1u << 12;   ///< shared buffers a manifest names
inline constexpr int max_tp = 1 << 16;
inline constexpr std::size_t max_token_bytes = 64;

// -- sharding plans -------------------------------------------------------------------

std::vector<std::uint8_t> encode_plan(const plan::worker_plan& p);
/// The number both ends give an encoded plan: SHA-256's first 8 bytes. A
/// producer shares packed groups between connections whose plans have the
/// same number, so no consumer may find another plan with a victim's number
/// (a fast hash such as XXH3 would let one craft it).
std::uint64_t plan_digest(const std::uint8_t* data, std::size_t size);
/// Strict: throws wire_error naming the entry, the field and the byte offset;
/// runs check_plan on the result.
plan::worker_plan decode_plan(const std::uint8_t* data, std::size_t size);
/// What a producer requires of a plan before replaying it: tp and worker in
/// range, shapes non-negative and within limits, every view inside its
/// source tensor (no element index below 0 or past the end, without integer
/// overflow), no view larger than its source, non-negative destination
/// offsets. Throws wire_error naming the entry.
void check_plan(const plan::worker_plan& p);

// -- control messages -----------------------------------------------------------------

/// Consumer -> producer: hello (engine, worker, token; answered by ack),
/// plan (ack), open
/// (manifest), get (group header, plus the group's bytes as a tagged
/// message, or where the group lies in shared memory), done (a group lent
/// in shared memory was copied; no answer), close (ends a session; no
/// answer), bye (the consumer is about to go: the producer answers with an
/// ack, then closes the connection; UCX 1.13 tells the consumer nothing of
/// that close). Producer -> consumer: ack, manifest, group, reject (the
/// answer to a message it could not decode).
enum class msg_type : std::uint8_t {
  hello = 1,
  plan = 2,
  open = 3,
  get = 4,
  close = 5,
  bye = 6,
  done = 7,
  ack = 0x81,
  manifest = 0x82,
  group = 0x83,
  reject = 0x84,
};

/// The outcome a producer reports.
enum class status : std::uint8_t {
  ok = 0,
  bad_request,         ///< malformed or inconsistent message
  not_registered,      ///< the plan or session is not known on this connection
  version_unavailable, ///< the version is not (or no longer) held
  producer_failed,     ///< packing failed, or the plan does not fit the model
  busy,                ///< no packing slot or send window before the deadline
  shutting_down,
  not_allowed,         ///< the connection uses a transport the producer may not use
  unauthorized,        ///< no valid token: hello refused, or a request before hello
};
inline constexpr std::uint8_t max_status = static_cast<std::uint8_t>(status::unauthorized);
std::string to_string(status s);

/// The first message on a connection: who is pulling, and the token the
/// producer issued for that engine worker over the control plane. It
/// travels as the header of the connection's first active message, its
/// body empty: UCX hands a header to the receive callback whole, even for
/// a message sent by rendezvous, and only there is the endpoint it came on
/// sure to be alive (UCX frees an endpoint nobody made their own as soon
/// as its peer fails). There the producer checks the token and makes the
/// endpoint its own by connecting to `address` (UCX hands back the endpoint
/// the hello came on), so that UCX reports its failure instead of freeing it.
struct hello_msg {
  std::uint64_t seq = 0;
  std::string engine;
  std::int32_t worker = 0;
  std::vector<std::uint8_t> token; ///< ucx_token_bytes
  /// The consumer's host (its kernel boot id), when it can map the
  /// producer's shared memory; empty: it cannot, or will not.
  std::string host;
  /// The consumer's UCX worker address (read only once the token checks).
  std::vector<std::uint8_t> address;
};
constexpr std::size_t max_host_bytes = 64;
constexpr std::size_t max_worker_address_bytes = 4096; ///< this machine's are 80-220 bytes
struct plan_msg {
  std::uint64_t seq = 0;
  std::vector<std::uint8_t> plan; ///< encode_plan bytes
};
struct open_msg {
  std::uint64_t seq = 0;
  std::string engine;
  std::int32_t worker = 0;
  std::int32_t tp = 1;
  std::uint64_t version = 0;
  transfer_mode mode = transfer_mode::sharded;
  std::uint64_t plan = 0; ///< digest of the registered plan (sharded); 0 for broadcast
  /// The first `prefetch` groups of the manifest are sent right after it, as
  /// if asked by gets with sequence numbers seq+1.. and tags tag_base.. that
  /// the consumer reserved, each waited for timeout_ms: no get round trip
  /// precedes the first group. At most max_prefetch.
  std::uint32_t prefetch = 0;
  std::uint64_t tag_base = 0;
  std::uint32_t timeout_ms = 0;
  /// The consumer mapped the probe the hello's ack named: lend groups in
  /// shared memory rather than send them.
  bool shared = false;
};
constexpr std::uint32_t max_prefetch = 64;
struct get_msg {
  std::uint64_t seq = 0;
  std::uint64_t session = 0;
  std::uint32_t group = 0;
  std::uint64_t tag = 0;         ///< the tag the consumer posted its receive with
  std::uint32_t timeout_ms = 0;  ///< how long the consumer waits for it
};
struct close_msg {
  std::uint64_t seq = 0;
  std::uint64_t session = 0;
};
struct bye_msg {
  std::uint64_t seq = 0;
};
/// Where a producer's shareable buffer is: its process, the memfd there,
/// the length to map and the id its header page carries (id 0: none).
constexpr std::uint64_t shared_header_bytes = 4096;          ///< host_buffer's shared_header::bytes
constexpr std::uint64_t max_shared_bytes = std::uint64_t(1) << 40; ///< a sanity bound on one mapping
struct shared_region {
  std::uint32_t pid = 0;
  std::int32_t fd = -1;
  std::uint64_t bytes = 0;
  std::uint64_t id = 0;
};
struct ack_msg {
  std::uint64_t seq = 0;
  ucx_wire::status status = status::ok;
  std::uint64_t digest = 0; ///< plan: the digest requests name it by
  std::string error;
  /// A hello from the producer's host: a probe buffer the consumer maps to
  /// learn whether it can map the producer's memory (id 0: none offered).
  shared_region probe;
  /// With a probe: the shareable buffers the producer holds now (at most
  /// max_live_buffers), which a consumer connecting ahead of its first pull
  /// may map and fault in then, rather than inside the pull.
  std::vector<shared_region> buffers;
};
struct group_info {
  std::uint32_t group = 0;
  std::uint64_t bytes = 0;
  /// Broadcast: the full tensors, in layout order. Lent in place: the
  /// group's tensors in the version's memory, in group order.
  std::vector<tensor_spec> tensors;
  /// Lent in place: where each of `tensors` starts, in bytes from the data
  /// of the buffer its groups are lent in (empty otherwise).
  std::vector<std::uint64_t> offsets;
};
struct manifest_msg {
  std::uint64_t seq = 0;
  ucx_wire::status status = status::ok;
  std::string error;
  std::uint64_t session = 0;
  std::vector<group_info> groups; ///< ascending
  bool shared = false; ///< the session's groups are lent in shared memory
  /// A shared session whose groups are lent in place: each lend names the
  /// version's own memory, and the consumer gathers its packed bytes from
  /// the tensors `groups` place there (nothing is packed for it).
  bool in_place = false;
  /// A shared session: the ids of the shareable buffers the producer holds
  /// now (at most max_live_buffers). The consumer keeps its mappings of
  /// these and drops the rest (freed: a mapping would keep them alive).
  std::vector<std::uint64_t> live_buffers;
};
struct group_msg {
  std::uint64_t seq = 0; ///< the get's
  ucx_wire::status status = status::ok;
  std::string error;
  std::uint32_t group = 0;
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0; ///< checksum64 of the packed bytes
  /// A shared session's group: the buffer it lies in, its bytes from the
  /// data start (a header page in); lent until the consumer says done.
  shared_region shared;
};
struct done_msg {
  std::uint64_t seq = 0;     ///< the get's (or the open's carried get's)
  std::uint64_t session = 0;
  std::uint32_t group = 0;
};
struct reject_msg {
  std::uint64_t seq = 0; ///< 0 when not even the header could be read
  ucx_wire::status status = status::bad_request;
  std::string error;
};

using message = std::variant<hello_msg, plan_msg, open_msg, get_msg, close_msg, bye_msg, done_msg, ack_msg,
                             manifest_msg, group_msg, reject_msg>;

std::vector<std::uint8_t> encode(const message& m);
/// Strict; throws wire_error.
message decode(const std::uint8_t* data, std::size_t size);
/// The sequence number of a message whose header and seq field are intact
/// (0 otherwise), so that a producer can answer even a malformed request.
std::uint64_t peek_seq(const std::uint8_t* data, std::size_t size);

} // namespace rlsync::transfer::ucx_wire
