#pragma once
// The `ucx` data-plane backend: engine workers in other processes or on
// other nodes pull a version from a trainer rank over UCX.
//
//   trainer rank:  ucx_producer  UCX context + worker (no listener: consumers
//                                connect to its worker address), one
//                                progress thread, packing threads
//   engine:        ucx_puller    implements weight_puller; one connection
//                                (UCX worker + endpoint) per concurrent pull,
//                                kept and reused between pulls
//
// Protocol (ucx_wire.hpp): control messages travel as UCX active messages,
// group bytes as tagged messages that the consumer receives straight into a
// buffer it posted beforehand (zero-copy rendezvous over shm/cma). Tag
// send/recv was measured fastest here: 64 MiB messages, window 2, loopback,
// tag 1.7-1.9 GB/s against ucp_get 0.6-1.2 GB/s over shm/cma, and 0.3-0.7
// against 0.3 GB/s over tcp (a loaded 2-core VM; UCX's tcp put runs at
// ~26 MiB/s here, 227 MiB/s with UCX_TCP_TX_SEG_SIZE=64K).
//
// Admission. The producer listens on no port. A consumer asks the control
// plane (the trainer, members only) for credentials per engine worker: the
// producer's UCX worker address and a token (ucx_token_bytes random bytes)
// the producer issued for that engine and worker, usable for
// token_lifetime, at most max_tokens kept. The consumer creates an endpoint
// to the address; the first message on it must be a hello with that
// engine, worker and token. Anything else (no hello, a token unknown,
// expired or issued for another worker, garbage) is answered
// `unauthorized`, counted (stats.rejected, refused_hellos), logged at a
// bounded rate, and its endpoint is closed at once: an unauthenticated
// endpoint leaves no state behind. Every session on a connection must name
// the connection's engine worker. UCX's own tcp transport still listens
// (one ephemeral port per device); net_devices (UCX_NET_DEVICES, from the
// node's address: ucx_net_device_for) keeps it to the node's interface.
//
//   control plane ── ticket (worker address, token) ──► consumer
//   consumer                                   producer
//   hello (engine, worker, token) ─────────►   (first on a connection;
//         ◄──────────────────────────── ack    token checked, then transports
//                                              checked, logged)
//   plan (encoded sharding plan) ──────────►   decoded strictly, checked
//         ◄──────────────────── ack (digest)   against the model; kept for
//                                              the connection
//   open (engine, worker, tp, version, mode,   the version's snapshot is
//         plan digest, prefetch n, tags,       held for the session
//         timeout) ────────────────────────►
//         ◄──── manifest (session, groups, sizes; broadcast: tensor specs)
//         ◄────────── group bytes (tagged)     the first n groups follow at
//         ◄──── group header (size, checksum)  once, as if asked by gets
//                                              (n = groups_in_flight): the
//                                              consumer posts their receives
//                                              when the manifest arrives
//   (lent in shared memory, see below: no tagged bytes; the consumer
//    maps the named buffer, copies, and sends done (session, group))
//   get (session, group, tag), each after      packed once per (plan,
//         posting the receive for that tag ►   version, group) and shared by
//         ◄────────── group bytes (tagged)     every consumer with that plan
//         ◄──── group header (size, checksum)
//   ... the next get as each group is verified and handed to the sink
//   close (session) ───────────────────────►
//   bye (when the connection is dropped) ──►   closes its side first
//
// Sharing and memory. Packed bytes depend only on the plan (the same worker
// rank of every replica has the same plan, hence the same digest) and the
// version, so the producer keeps packed groups keyed by (plan digest,
// version, group), or (broadcast, version, group), within a byte budget
// (packed_budget_bytes; spare buffers kept for reuse count against it).
// Packing ahead: when a version is published, the packing threads pack it
// for the plans consumers opened sessions with before (and broadcast, if a
// consumer used it), or, with expected_mode, the plans they registered
// (their hellos, in broadcast) before any session, group by group in order,
// as far as the budget allows, before any get; the checksum is folded into
// the packing pass. Holding: a packed group stays until every replica known
// to use its plan (a live connection that opened a session with it, or is
// expected to) has been sent it in that
// version, so one packing serves all replicas of a worker rank, and the
// replicas, holding the budget between them, take groups together. To make
// room, in order: groups every replica has, or of older versions, go
// first; a get may then drop groups packed ahead for replicas that have no
// session (for another version, or soft_pin_grace after the first session
// of its own version opened: a replica in a later wave); a get never drops
// a group an open session still needs (it waits, until its deadline),
// unless every such session is itself waiting for room (then it drops one:
// stats.evictions counts every drop a replica still needed). A session pins
// groups only until its pull's deadline, a closed connection not at all. A
// consumer receiving by tag holds groups_in_flight receive buffers per
// concurrent pull, allocated and touched once, reused by later pulls (one
// whose groups are lent in shared memory needs none).
//
// Shared memory. On one host the bytes need not travel: the producer packs
// into memfd-backed buffers (host_buffer.hpp, a header page naming each)
// and lends them. A consumer's hello names its host (the kernel's boot
// id); from the same host, the ack names a probe buffer, which the
// consumer maps through /proc/<pid>/fd/<fd> (the access CMA needs too) and
// checks against its header. When that works, its opens ask for lent
// groups: a group's header then names the buffer (pid, fd, length, id)
// instead of a tagged message following, the consumer maps it (once per
// buffer, kept while the producer holds it) and copies the group straight into
// its staging with the checksum folded into that one copy, then says done;
// the producer holds the group until then. One not given back (the get's
// deadline passed, the connection closed) leaves the cache and its buffer
// is freed, never reused: the consumer may still map it, and a buffer is
// rewritten only once every lend of it came back. Lent groups are given back in order, so a session's gets are
// served in order too (a later group lent ahead of an earlier one waiting
// for room could hold the budget that one needs). A group the producer
// cannot lend (a buffer that is not shared, the corrupt drill) comes by
// tag even in such a session. Across hosts, or when the probe does not
// map, everything goes by tag as above. A shared manifest names the
// buffers the producer holds; the consumer unmaps the others as it opens
// (a mapping would keep freed memory alive beyond the producer's budget)
// and keeps at most max_mappings: a buffer is mapped once, not per pull.
// What a peer names is not trusted: the consumer opens it without blocking
// (a FIFO), maps it only if it is a memfd sealed against shrinking (the
// producer seals each buffer at its size: no SIGBUS), checks its header,
// and maps nothing of another process than its probe's.
//
// In place. Where the version itself lies in shareable memory (a source
// that makes its versions so: weight_snapshot::from_shared), a shared
// session packs nothing: its manifest places each group's tensors in the
// version's buffer (offsets from its data), each lend names that buffer,
// and the consumer gathers its plan's bytes of the group (broadcast: the
// tensors whole) straight from the version's tensors into its staging, the
// checksum folded into that copy. The producer's part is the checksum, read
// only, in packed order, ahead of the gets as packing was (it holds none
// of the packed budget); the lend holds the version until done. The
// consumer checks the placement (every tensor inside the mapping, as its
// plan recorded it, the bytes adding up to the group's) before reading.
// Versions a source no longer holds leave the shared manifest's buffers
// like freed packed buffers. One copy per byte per consumer, none on the
// producer: the path MPI's single-copy broadcast takes, plus a checksum.
//
// Deadlines. A network partition gives UCX no error (none in 45 s here,
// even with keepalives at 1 s; a killed peer shows in ~5 ms), so every wait
// is bounded by the application: connecting retries with backoff until the
// pull's deadline and then fails naming the producer; each group
// must arrive by the pull's deadline (transfer_failure::timeout); the
// producer gives up a send when the consumer's announced deadline has
// passed: it closes that connection and the group leaves its cache (the
// buffer itself goes once UCX lets go of it). Idle connections, a dead
// consumer's included (worker-address endpoints without peer error
// handling report no reset), are closed after idle_timeout, and at most
// max_connections exist; a consumer, which is not told of that close,
// reuses an idle connection only for max_idle (shorter) and then makes a
// new one.
//
// Transports. An empty transport list lets UCX choose (its UCX_TLS). A list
// (topology transfer.ucx_transports) must name transports this machine has
// (otherwise construction fails, listing what there is), becomes the
// contexts' UCX_TLS (plus tcp where present), and every endpoint's lanes
// are checked against it: a connection that would move bytes over a
// transport the list does not name fails instead of silently running slower.
// Each endpoint's transports are logged ("sysv/memory am, cma/memory rma_bw
// [shm/cma]"). Endpoints use no peer error handling: with it UCX uses tcp
// lanes only, even between processes of one host (UCX 1.13). Without
// it UCX 1.13 cannot force-close an endpoint, so a consumer says bye and the
// producer closes first; an endpoint that failed is left to its worker.
//
// Code. This header is the backend's interface; the rest of this folder is
// internal to it: context (UCX contexts, workers, transports, waiting),
// active_messages (control messages), address (names, network devices), ucx_wire (the
// wire format), shared_memory (the host id, mapping a lent buffer), producer_impl.hpp (producer.cpp: setup, progress thread,
// requests; packed_cache.cpp: the cache, packers, sends) and puller_impl.hpp
// (puller_connections.cpp: connecting, reuse, closing; puller.cpp: the pull).
#include "runtime/config/topology.hpp"
#include "runtime/transfer/faults.hpp"
#include "runtime/transfer/puller.hpp"
#include "runtime/transfer/weight_source.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace rlsync::transfer {

namespace ucx_detail { // the backend's internals (runtime/transfer/ucx/*_impl.hpp)
struct producer_impl;
struct puller_impl;
} // namespace ucx_detail

/// UCX could not start, or the transports asked for are not available.
struct ucx_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Whether UCX can create a context on this machine; `why` says why not.
bool ucx_available(std::string* why = nullptr);
/// What this machine's UCX offers, by kind: "shm (posix, sysv), cma, tcp (eth0, lo)".
std::string ucx_transports_here();
/// Receives one line per event worth logging (connections and the UCX
/// transports each uses, rejected requests, failures).
using ucx_log = std::function<void(const std::string&)>;

struct ucx_producer_options {
  /// Transports the producer may use; empty: UCX decides.
  std::vector<ucx_transport> transports;
  /// UCX_NET_DEVICES ("lo" keeps a loopback connection off eth0); empty: UCX's.
  std::string net_devices;
  /// The producer's memory bound: bytes of packed groups (and spare buffers)
  /// held at once. 0: default_budget_groups times the model's largest full
  /// group. A group larger than the budget is refused when a plan or a
  /// broadcast session would need it.
  std::uint64_t packed_budget_bytes = 0;
  /// The default budget, in largest full groups (>= 1).
  std::size_t default_budget_groups = 4;
  /// Pack each version for the plans known as soon as it is published.
  bool pack_ahead = true;
  /// The mode consumers will open sessions in (the topology's
  /// transfer.mode). Set, a consumer is expected before its first session:
  /// in sharded, each plan it registers, in broadcast, its hello, counts as
  /// a stream it opened at no version yet, so the newest version is packed
  /// (or, lent in place, checksummed) ahead for it, e.g. while the fleet
  /// gathers for its first round (sync.first_round_wait_ms). Unset: only
  /// sessions opened count.
  std::optional<transfer_mode> expected_mode;
  /// At start, make and write the budget's worth of packed buffers, so that
  /// the first sync does not pay for fresh memory in the stall: as many as
  /// the budget holds (at most 64) of the largest full group divided by
  /// prewarm_split and 1/64 more. A sharded engine of
  /// tp t packs about 1/t of a group, so the head passes the smallest tp
  /// (1 for broadcast). A group that does not fit gets a fresh buffer, as
  /// without prewarming.
  bool prewarm_buffers = true;
  std::size_t prewarm_split = 1;
  /// Packed groups live in shared memory (memfd) and consumers on this
  /// host that can map it copy from there straight into their staging:
  /// one copy on the receiving side instead of two ("Shared memory" above).
  bool shared_memory = true;
  /// Shared buffers in huge pages from the kernel's hugetlb pool when it
  /// has them free (vm.nr_hugepages), 4 KiB pages otherwise: consumers map
  /// a fresh buffer at a fault per 2 MiB instead of per page.
  bool huge_pages = true;
  /// How long after the first session of a version opens a group packed
  /// ahead stays reserved for replicas that have not opened one yet: the
  /// replicas of one round open theirs within milliseconds; a replica in a
  /// later wave should not hold up the first.
  std::chrono::milliseconds soft_pin_grace{250};
  /// Until its first get says the pull's deadline, a session pins groups this long.
  std::chrono::milliseconds first_get_grace{10000};
  /// Threads packing groups (>= 1), next to the one progress thread. Two:
  /// a sync that starts as a version is published waits on packing, and a
  /// second packer cut the warm sharded transfer by ~10 % here (2 cores,
  /// four engine workers copying beside it).
  unsigned pack_threads = 2;
  /// Gets a connection may have outstanding (not yet sent or lent); twice
  /// as many groups may be sent or lent to it and not yet taken or given
  /// back. A puller asks for its groups_in_flight at once: at least that.
  std::size_t max_outstanding_per_connection = 16;
  /// Largest control message accepted (a plan).
  std::size_t max_message_bytes = std::size_t(64) << 20;
  /// Cap on how long a send may wait for its consumer, whatever deadline
  /// the consumer announced.
  std::chrono::milliseconds max_send_time{std::chrono::minutes(10)};
  /// A connection with no request for this long is closed (its sessions and
  /// plans dropped); a partitioned consumer holds nothing forever.
  std::chrono::milliseconds idle_timeout{std::chrono::minutes(30)};
  /// A token may open connections for this long after it was issued.
  std::chrono::milliseconds token_lifetime{std::chrono::minutes(10)};
  /// Tokens held at once (>= 1); issuing one more forgets the oldest of the
  /// engine that holds the most.
  std::size_t max_tokens = 4096;
  /// Tokens held for one engine worker (>= 1); issuing one more forgets
  /// that worker's oldest, so a node asking in a loop pushes out only its own.
  std::size_t max_tokens_per_worker = 16;
  /// Connections that presented a valid token, at once (>= 1); a hello
  /// beyond it is refused.
  std::size_t max_connections = 1024;
  ucx_log log; ///< connections, transports, rejected requests; may be empty
};

/// Bytes in a session token.
inline constexpr std::size_t ucx_token_bytes = 32;

/// What a consumer needs to pull for one engine worker, handed to it over
/// the authenticated control plane: the producer's UCX worker address
/// (there is no listening port) and a token the producer issued for that
/// engine worker.
struct ucx_credentials {
  std::vector<std::uint8_t> producer; ///< the producer's UCX worker address
  std::vector<std::uint8_t> token;    ///< ucx_token_bytes random bytes
};

/// The UCX_NET_DEVICES value that keeps UCX on the interface holding
/// `address` ("127.0.0.1" -> "lo", a host's own IP -> its interface).
/// Empty, with `why` set, when the address is a wildcard, does not resolve
/// or belongs to no interface of this machine (UCX then picks devices).
std::string ucx_net_device_for(const std::string& address, std::string* why = nullptr);

/// Cumulative since construction.
struct ucx_producer_stats {
  std::uint64_t connections = 0;    ///< accepted
  std::uint64_t requests = 0;       ///< messages received
  std::uint64_t rejected = 0;       ///< malformed or refused messages, refused hellos included
  std::uint64_t refused_hellos = 0; ///< hellos without a valid token, and requests before a hello
  std::uint64_t endpoint_failures = 0; ///< connections closed as UCX reported their endpoint failed (consumer gone)
  std::uint64_t unread_closes = 0; ///< connections closed for leaving max_unread_replies answers unread
  std::uint64_t tokens_issued = 0;
  std::uint64_t packs = 0;          ///< groups packed
  std::uint64_t packs_ahead = 0;    ///< of which packed ahead, before any get asked for them
  std::uint64_t packed_bytes = 0;
  std::uint64_t buffers_made = 0;   ///< packed buffers allocated (the rest reused one): each new one is faulted in, and mapped anew by consumers
  std::uint64_t buffers_prewarmed = 0; ///< made and written at start, before any version (not in buffers_made)
  std::uint64_t huge_buffers = 0;   ///< of the shared buffers made (prewarmed included), those in huge pages
  std::size_t peak_packed = 0;      ///< most packed groups alive at once
  std::uint64_t budget_bytes = 0;   ///< packed_budget_bytes as resolved
  std::uint64_t peak_packed_bytes = 0; ///< most bytes held at once: packed groups and spare buffers
  std::uint64_t evictions = 0;      ///< packed groups dropped while a replica still needed them
  std::uint64_t groups_sent = 0;
  std::uint64_t gets_carried = 0;   ///< of the gets served, those an open carried (no get message)
  std::uint64_t groups_lent = 0;    ///< of the groups sent, those lent in shared memory (the rest went by tag)
  std::uint64_t groups_lent_in_place = 0; ///< of those, lent straight from the version's memory (nothing packed)
  std::uint64_t bytes_sent = 0;
  std::uint64_t corruptions = 0;    ///< sends the corrupt hook altered
  std::uint64_t withheld = 0;       ///< gets the withhold hook dropped
  /// The UCX transports ("sysv", "cma", "tcp"...) of the data lanes of every
  /// connection accepted, as their log lines name them.
  std::set<std::string> data_transports;
  /// The progress thread (every send and answer) so far: on a core, and
  /// runnable waiting for one (thread_schedule; zeros where not known).
  std::chrono::nanoseconds progress_ran{0};
  std::chrono::nanoseconds progress_queued{0};
};

class ucx_producer {
public:
  /// Starts serving. Throws ucx_error when UCX cannot start or a named
  /// transport is not available.
  explicit ucx_producer(std::shared_ptr<const weight_source> source, ucx_producer_options options = {});
  /// Stops serving and closes every connection: pulls in progress fail.
  ~ucx_producer();
  ucx_producer(const ucx_producer&) = delete;
  ucx_producer& operator=(const ucx_producer&) = delete;

  /// The UCX worker address consumers connect to (ucp_worker_get_address).
  const std::vector<std::uint8_t>& worker_address() const;
  /// A fresh token for `engine`'s worker `worker`, with the worker address:
  /// a hello must present it with that engine and worker, within
  /// token_lifetime. Thread-safe. Hand it out only to admitted members.
  ucx_credentials issue(const std::string& engine, int worker);
  const weight_source& source() const;

  ucx_producer_stats stats() const;

  /// Fault hooks (drills, tests). corrupt: the matching consumer receives
  /// the group with one byte flipped (after the checksum was computed), so
  /// its pull fails with checksum_mismatch.
  void corrupt(corruption c);
  /// Gets for `group` (of `version`; 0: any) arriving before `until` are
  /// never answered: the consumer times out.
  void withhold(std::uint32_t group, std::uint64_t version = 0,
                fault_hooks::clock::time_point until = fault_hooks::clock::time_point::max());
  void clear_faults();

private:
  std::unique_ptr<ucx_detail::producer_impl> impl_;
};

/// Fetches credentials for one engine worker over the control plane (from
/// the trainer); throws std::exception when it cannot by `deadline`.
using ucx_credentials_source =
    std::function<ucx_credentials(const std::string& engine, int worker, clock::time_point deadline)>;

struct ucx_puller_options {
  /// Asked before each new connection (connections are kept and reused).
  ucx_credentials_source credentials;
  /// Transports the connections may use (the topology's
  /// transfer.ucx_transports); empty: UCX decides.
  std::vector<ucx_transport> transports;
  std::string net_devices; ///< UCX_NET_DEVICES; empty: UCX's
  /// Groups requested ahead per pull (>= 1); each needs a receive buffer.
  std::size_t groups_in_flight = 2;
  /// Map the packed groups of producers on this host (when they offer it
  /// and their memory can be mapped) rather than receive them by tag. Off
  /// where the topology's ucx_transports name no shm (ucx_lends_shared_memory).
  bool shared_memory = true;
  /// One connection attempt (connect + hello) may take this long before it
  /// is abandoned and retried.
  std::chrono::milliseconds connect_attempt_timeout{1000};
  /// Pause between attempts: doubles from backoff_initial up to backoff_max.
  std::chrono::milliseconds backoff_initial{10};
  std::chrono::milliseconds backoff_max{500};
  /// An idle connection older than this is closed instead of reused: a
  /// producer closes connections idle for its idle_timeout (30 min by
  /// default) without this side hearing of it, so keep this below that.
  std::chrono::milliseconds max_idle{std::chrono::minutes(10)};
  /// Largest group a producer may announce (receive buffers are this big at most).
  std::uint64_t max_group_bytes = std::uint64_t(16) << 30;
  /// When an engine worker registers its plan, connect it ahead at once
  /// (see ucx_puller::connect_ahead). It needs credentials at that time:
  /// rlsync's trainers issue tickets only once the engine registered with
  /// the coordinator, which comes later, so rlsync's nodes leave this off
  /// and call connect_ahead(engine) then instead.
  bool connect_ahead = false;
  std::chrono::milliseconds connect_ahead_timeout{5000};
  /// Connections whose close has not completed (a producer that stopped
  /// answering) keep their UCX worker until it does: destroying a worker
  /// with a close in flight is not safe. At this many to one producer (or
  /// four times this many in all), no new connection to it is made (each
  /// attempt fails, saying why) until one of them closes.
  std::size_t max_parked_connections = 16;
  ucx_log log;
};

struct ucx_puller_stats {
  std::uint64_t connections = 0;     ///< established
  std::uint64_t connect_attempts = 0;
  std::uint64_t goodbyes_answered = 0; ///< connections closed after the producer answered their goodbye
  std::size_t parked = 0;            ///< now: connections whose close has not completed
  std::size_t peak_parked = 0;
  std::uint64_t attempts_held_back = 0; ///< connection attempts not made: max_parked_connections reached
  std::uint64_t workers_made_ahead = 0; ///< UCX workers made at registration, before any connection
  std::uint64_t workers_taken_ahead = 0; ///< connections that started on one of them
  std::uint64_t connected_ahead = 0; ///< connections made at registration (connect_ahead)
  std::uint64_t mapped_ahead = 0;    ///< producer buffers they mapped and faulted in
  std::uint64_t pulls = 0;           ///< completed
  std::uint64_t bytes = 0;           ///< received and verified
  std::size_t buffers = 0;           ///< receive buffers allocated (each touched once)
  std::uint64_t buffer_bytes = 0;
  std::uint64_t groups_mapped = 0;   ///< groups copied from the producer's shared memory (the rest came by tag)
  std::uint64_t mappings = 0;        ///< producer buffers mapped
  std::size_t peak_mapped_bytes = 0; ///< most bytes mapped at once on one connection
};

class ucx_puller final : public weight_puller {
public:
  /// Throws ucx_error when UCX cannot start or a named transport is not available.
  explicit ucx_puller(ucx_puller_options options);
  /// Call once no pull is running.
  ~ucx_puller() override;
  ucx_puller(const ucx_puller&) = delete;
  ucx_puller& operator=(const ucx_puller&) = delete;

  /// Validates and encodes the plan (std::invalid_argument when it is not
  /// one a producer would accept); the producer checks it against the model
  /// when a connection first uses it.
  void register_worker(const std::string& engine, std::shared_ptr<const plan::worker_plan> plan) override;
  void unregister_engine(const std::string& engine) override;
  /// Connects each registered worker of `engine` that holds no connection
  /// in the background (ticket, endpoint, hello), and maps and faults in
  /// the buffers the producer names in its answer (the versions it holds
  /// in shareable memory, its packed buffers), so that the first pull finds
  /// a connection with warm mappings instead of making them inside the
  /// stall. A pull that comes while it connects waits for it (until the
  /// pull's deadline); one whose connection failed connects itself.
  void connect_ahead(const std::string& engine) override;
  /// Blocks until every group of the version the producer holds has been
  /// received, verified and handed to the sink, or throws transfer_error:
  /// timeout (connecting or a group, by req.deadline, naming the producer),
  /// checksum_mismatch, version_unavailable, not_registered,
  /// producer_failed (the producer refused or failed, refused the token,
  /// no credentials could be had, or the connection uses a transport not
  /// allowed), cancelled (the producer went away).
  /// Safe to call from several threads at once (one connection each).
  pull_report pull(const pull_request& req, const group_sink& sink) override;

  /// The producer may have changed (the node rejoined a restarted head):
  /// idle connections are closed, and the next pulls ask for credentials.
  void reset_connections();

  ucx_puller_stats stats() const;
  /// The transports of the latest connection made, as logged.
  std::string last_transports() const;

  /// Diagnostics and tests: sends `message` as-is on a fresh connection and
  /// returns the producer's answer as "status: text" (e.g. a malformed
  /// message's rejection), or "" when it sent none before `deadline`.
  /// The connection says hello first, with credentials for engine "(raw)"
  /// worker 0, unless `hello_first` is false (then `message`, with
  /// `header` as its header, is the first thing the producer sees). Unless
  /// `say_goodbye`, the connection then vanishes as a dead consumer's does
  /// (no goodbye, no close). Throws transfer_error when it cannot connect.
  std::string send_raw(const std::vector<std::uint8_t>& message, clock::time_point deadline,
                       bool hello_first = true, bool say_goodbye = true, const std::vector<std::uint8_t>& header = {});
  /// For tests: a consumer that asks and never reads. Connects (hello
  /// first, as send_raw), sends `message` `count` times without progressing
  /// its worker, so nothing the producer answers is read, until `stop`
  /// returns true or `until`; then reads for half a second and vanishes (no
  /// goodbye, no close). Returns why its connection failed, or "".
  std::string flood_raw(const std::vector<std::uint8_t>& message, std::size_t count,
                        const std::function<bool()>& stop, clock::time_point until);
  /// For tests: a consumer that reads every answer and takes no group.
  /// Connects (hello first, as send_raw), sends each of `messages` in turn
  /// and waits for the answer under its sequence number: "status: text"
  /// each, "" when none came before `deadline`. It never receives a group
  /// sent by tag nor gives back one lent. Then it reads on until `release`
  /// (if given) returns true or `deadline`, and vanishes (no goodbye).
  std::vector<std::string> converse_raw(const std::vector<std::vector<std::uint8_t>>& messages,
                                        clock::time_point deadline, const std::function<bool()>& release = {});

private:
  std::unique_ptr<ucx_detail::puller_impl> impl_;
};

} // namespace rlsync::transfer
