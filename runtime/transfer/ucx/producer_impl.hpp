#pragma once
// Internal to the ucx backend: the producer's state (ucx_transfer.hpp has
// the protocol). One progress thread owns the UCX worker, the connections,
// their sessions and the packed-group cache; packing threads fill cache
// buffers and hand them back. producer.cpp: setup, the progress thread and
// the requests; packed_cache.cpp: the cache, the packers and the sends.
#include "runtime/base/rate_limited_log.hpp"
#include "runtime/plan/grouped_plan.hpp"
#include "runtime/transfer/ucx/active_messages.hpp"
#include "runtime/transfer/ucx/context.hpp"
#include "runtime/transfer/host_buffer.hpp"
#include "runtime/transfer/packing.hpp"
#include "runtime/transfer/plan_intake.hpp"
#include "runtime/transfer/ucx/ucx_transfer.hpp"
#include "runtime/transfer/ucx/ucx_wire.hpp"

#include <ucp/api/ucp.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace rlsync::transfer::ucx_detail {

namespace wire = ucx_wire;

struct cache_key {
  bool broadcast = false;
  std::uint64_t plan = 0; // digest; 0 for broadcast
  std::uint64_t version = 0;
  std::uint32_t group = 0;
  // Lent in place: nothing is packed, the entry holds the checksum of the
  // bytes a consumer gathers from the version's own shareable memory.
  bool in_place = false;
  bool operator<(const cache_key& o) const {
    return std::tie(broadcast, plan, version, group, in_place)
           < std::tie(o.broadcast, o.plan, o.version, o.group, o.in_place);
  }
};

// What a consumer opened sessions with: broadcast or a plan's digest, lent
// in place or packed.
struct stream_key {
  bool broadcast = false;
  std::uint64_t plan = 0;
  bool in_place = false;
  bool operator<(const stream_key& o) const {
    return std::tie(broadcast, plan, in_place) < std::tie(o.broadcast, o.plan, o.in_place);
  }
};

struct session {
  std::uint64_t id = 0;
  std::string engine;
  int worker = 0;
  int tp = 1;
  std::uint64_t version = 0;
  transfer_mode mode = transfer_mode::sharded;
  std::uint64_t digest = 0;
  snapshot_ptr snapshot; // the version stays intact while it is pulled
  std::shared_ptr<const plan::grouped_plan> plan;
  std::set<std::uint32_t> groups;
  bool shared = false; // groups are lent in shared memory
  bool in_place = false; // ... straight from the version's memory (a shareable snapshot)
  clock::time_point last_used;
  // The session keeps the groups it has not been sent from being dropped
  // until then: the deadline its latest get announced (first_get_grace
  // after the open, before any get).
  clock::time_point pin_until;
  bool got_any = false;
};

// Exists only once a hello presented a valid token: what it was issued for
// is what every session on the connection must name.
struct connection {
  std::uint64_t id = 0;
  ucp_ep_h ep = nullptr; // the reply endpoint of the consumer's hello, made ours (claim)
  std::string peer;      // "engine 'e' worker w (connection n)"
  std::string engine;
  int worker = 0;
  bool failed = false; // UCX reported its endpoint failed: not closed (see handle_failures)
  bool not_reading = false; // left max_unread_replies answers unread: closed after this turn
  bool closed = false;
  bool same_host = false; // its hello named this host: it may map our shared memory
  std::string refused; // non-empty: the lanes use a transport not allowed
  std::map<std::uint64_t, std::shared_ptr<const plan::grouped_plan>> plans;
  struct held_plan {
    std::uint64_t digest = 0;
    std::uint64_t encoded_bytes = 0;
  };
  std::deque<held_plan> plan_order; // oldest first
  std::uint64_t plan_bytes = 0;     // their encoded bytes
  std::map<std::uint64_t, session> sessions;
  // The plans this consumer opened sessions with ((true, 0): broadcast),
  // each with the newest version it opened: what a version is packed ahead
  // for, and who a packed group waits for.
  std::map<stream_key, std::uint64_t> opened;
  std::uint64_t next_session = 1;
  std::size_t outstanding = 0; // gets accepted and not finished
  std::size_t sending = 0;     // groups sent or lent whose send has not ended (send_op)
  clock::time_point last_active;
};
using conn_ptr = std::shared_ptr<connection>;

struct get_job {
  conn_ptr conn;
  std::uint64_t seq = 0;
  std::uint32_t group = 0;
  std::uint64_t tag = 0;
  clock::time_point deadline;
  std::string engine;
  int worker = 0;
  std::uint64_t version = 0;
  // What packing the group takes, should it have to be packed.
  cache_key key;
  std::uint64_t bytes = 0; // packed size
  snapshot_ptr snapshot;
  std::shared_ptr<const plan::grouped_plan> plan;
  bool shared = false; // lend it in shared memory where the packed buffer is shared
};

struct cache_entry {
  cache_key key;
  enum class state { packing, ready, failed } st = state::packing;
  host_buffer buffer;
  std::uint64_t buffer_id = 0; // the shareable buffer it is (being) packed into; 0: none yet, or not shareable
  snapshot_ptr lent_from;       // in place: the version whose memory it is lent in (buffer_id that memory's)
  std::uint64_t bytes = 0; // counted against the budget: the packed size
  std::size_t size = 0;
  std::uint64_t checksum = 0;
  std::string error;
  bool ahead = false;   // packed ahead, before any get asked for it
  std::size_t refs = 0; // waiters and sends in flight: not evictable while > 0
  std::vector<get_job> waiters;
  std::uint64_t last_use = 0;
  std::set<std::string> served; // consumers (consumer_of) sent this group
};
using entry_ptr = std::shared_ptr<cache_entry>;

// A buffer kept for reuse, counted against the budget as the bytes it last held.
struct spare_buffer {
  host_buffer buffer;
  std::uint64_t bytes = 0;
};

// Who still needs a packed group: consumers with a session open for its
// version (hard: never dropped for them unless they are all stuck), and
// consumers that used its plan before but have no session yet (soft).
struct pins {
  std::vector<std::string> hard;
  bool soft = false;
};

/// How a consumer (one engine worker) is named in `served`.
std::string consumer_of(const std::string& engine, int worker);

struct pack_job {
  cache_key key;
  snapshot_ptr snapshot;
  std::shared_ptr<const plan::grouped_plan> plan; // sharded
  host_buffer buffer;                       // reused if large enough
};

struct pack_result {
  cache_key key;
  host_buffer buffer;
  std::size_t size = 0;
  std::uint64_t checksum = 0;
  std::string error;
};

struct send_op {
  void* request = nullptr;
  entry_ptr entry;
  conn_ptr conn;
  clock::time_point deadline;
  std::vector<std::uint8_t> altered; // a corrupted private copy (fault hook)
  std::uint64_t bytes = 0;
  std::uint32_t group = 0;
  bool abandoned = false; // past its deadline; kept until UCX lets go of the buffer
  // Lent in shared memory: done when the consumer says so (a done for the
  // get's seq), or its connection closes.
  bool lent = false;
  std::uint64_t seq = 0;
};

// A token the producer issued and for whom.
struct issued_token {
  std::vector<std::uint8_t> token;
  std::string engine;
  int worker = 0;
  clock::time_point expires;
};

struct producer_impl {
  std::shared_ptr<const weight_source> source;
  ucx_producer_options options;
  std::unique_ptr<ucx_context> ctx;
  worker_handle worker;
  std::vector<std::uint8_t> address; // the worker's, handed out with tokens
  am_inbox inbox;
  am_outbox outbox;

  // Tokens issued (any thread), oldest first, at most options.max_tokens.
  std::mutex token_mutex;
  std::deque<issued_token> tokens;

  // Refused hellos are an outsider's to provoke: logged at a bounded rate.
  std::unique_ptr<rate_limited_log> refusal_log;

  // Progress thread only.
  std::map<ucp_ep_h, conn_ptr> conns;
  std::map<cache_key, entry_ptr> cache;
  std::deque<get_job> blocked; // waiting for room in the budget
  std::vector<spare_buffer> spare;
  std::uint64_t budget = 0;                    // packed_budget_bytes, resolved
  snapshot_ptr newest;                         // the newest version published
  std::set<cache_key> packed_in_newest;        // keys of it packed once already
  std::map<std::uint64_t, clock::time_point> first_open; // version -> its first session
  std::list<send_op> sends;
  std::uint64_t use_clock = 0;
  std::uint64_t next_conn = 1;
  std::vector<std::vector<std::uint8_t>> graveyard; // bytes UCX may still read at teardown
  bool retry_blocked = false;                       // room may have freed
  std::list<std::pair<void*, ucp_ep_h>> closes;     // endpoint closes in progress
  std::set<ucp_ep_h> closing;                       // their endpoints: messages from them are dropped
  std::set<ucp_ep_h> connections_closing;           // of them, connections': each counts against max_connections
  std::vector<std::pair<ucp_ep_h, ucs_status_t>> failed_endpoints; // reported by UCX, not yet handled
  std::set<ucp_ep_h> strays; // made to a hello's address that was not its sender's: to close
  std::vector<conn_ptr> not_reading; // to close: see reply()
  bool leak_worker = false;                         // see shutdown()

  // Packers.
  std::mutex pack_mutex;
  std::condition_variable pack_cv;
  std::deque<pack_job> pack_queue;
  std::deque<pack_result> pack_done;
  std::vector<std::thread> packers;

  std::atomic<bool> stopping{false};
  std::thread progress;
  std::atomic<long> progress_tid{0}; // its gettid(), for its schedule figures
  // The source's publish wakes the progress thread (packing ahead starts
  // then, not at the next idle poll); stop() unhooks it before the worker goes.
  struct publish_waker {
    std::mutex mutex;
    ucp_worker_h worker = nullptr;
  };
  std::shared_ptr<publish_waker> waker;
  std::shared_ptr<const std::function<void()>> wake_on_publish;

  mutable std::mutex stats_mutex;
  ucx_producer_stats st;

  fault_hooks faults;

  // Shared memory: this host's boot id (empty: not offered) and the page a
  // consumer on it maps first, to learn whether it can map ours at all.
  std::string host;
  host_buffer probe;
  wire::shared_region region_of(const host_buffer& b) const;
  host_buffer new_buffer(std::size_t bytes); // shareable when offered, in huge pages when the pool has them
  shared_pages pages_for(std::size_t bytes) const; // what new_buffer tries first for a shareable buffer
  host_buffer made_buffer(std::size_t bytes);      // new_buffer, counted (pack thread)
  void prewarm_buffers(std::uint64_t largest);
  static constexpr std::uint64_t max_prewarmed_buffers = 64;
  std::vector<std::uint64_t> live_buffers() const; // shareable buffers held: a shared manifest names them
  mutable std::atomic<bool> unshared_logged{false}; // a buffer that could not be shared was logged
  std::atomic<bool> huge_pool_empty{false};  // a huge-page buffer could not be made: not tried again

  // -- setup --------------------------------------------------------------------------

  void start();
  void stop();

  // -- tokens -------------------------------------------------------------------------

  ucx_credentials issue(const std::string& engine, int worker);
  /// Empty when `m` presents a token issued for its engine and worker that
  /// has not expired; otherwise why not.
  std::string check_token(const wire::hello_msg& m);

  // -- the progress thread ------------------------------------------------------------

  void run();
  void shutdown();
  void start_close(ucp_ep_h ep);
  void poll_closes();
  bool finish_close(std::list<std::pair<void*, ucp_ep_h>>::iterator it);
  bool still_closing(ucp_ep_h ep);
  void close_connection(const conn_ptr& c, const std::string& why, bool loud = true);
  void reply(const conn_ptr& c, const wire::message& m);
  unsigned close_not_reading();
  void count_rejected();
  unsigned handle_messages();
  // A message on an endpoint that is not a connection's, in the receive
  // callback: a hello with a valid token makes it a connection, its
  // endpoint made ours (claim); anything else is answered `unauthorized`,
  // counted, and logged at a bounded rate.
  void admit(const am_inbox::first_message& m);
  void refuse_endpoint(ucp_ep_h ep, std::uint64_t seq, const std::string& why);
  bool claim(ucp_ep_h ep, const wire::hello_msg& hello, std::string& why);
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  // Closes the connections whose endpoints UCX reported failed, and strays.
  unsigned handle_failures();

  template <class T>
  static std::uint64_t seq_of(const T& x) {
    return x.seq;
  }

  void check_lanes(connection& c);

  // -- requests -----------------------------------------------------------------------

  void handle(const conn_ptr& c, const wire::hello_msg& m);

  void handle(const conn_ptr& c, const wire::plan_msg& m);
  void expect(connection& c, bool broadcast, std::uint64_t digest, const plan::grouped_plan* plan);
  void handle(const conn_ptr& c, const wire::open_msg& m);

  void handle(const conn_ptr& c, const wire::close_msg& m) {
    c->sessions.erase(m.session);
    retry_blocked = true; // its pins are gone
  }

  // The consumer is going: answered, then closed from this side first,
  // while the endpoint is healthy (the close flushes the answer). Were the
  // consumer to close first, this side would see its endpoint fail.
  void handle(const conn_ptr& c, const wire::bye_msg& m) {
    reply(c, wire::ack_msg{m.seq, wire::status::ok, 0, "", {}, {}});
    close_connection(c, "the consumer said goodbye", false);
  }
  void handle(const conn_ptr& c, const wire::done_msg& m);

  void handle(const conn_ptr& c, const wire::get_msg& m);
  /// Answers one get of session `s` (a get message, or one the open carried).
  void serve(const conn_ptr& c, session& s, const wire::get_msg& m);

  void handle(const conn_ptr& c, const wire::ack_msg& m) { unexpected(c, m.seq); }
  void handle(const conn_ptr& c, const wire::manifest_msg& m) { unexpected(c, m.seq); }
  void handle(const conn_ptr& c, const wire::group_msg& m) { unexpected(c, m.seq); }
  void handle(const conn_ptr& c, const wire::reject_msg& m) { unexpected(c, m.seq); }
  void unexpected(const conn_ptr& c, std::uint64_t seq);

  // -- the packed-group cache ---------------------------------------------------------

  void start_get(get_job j);
  std::uint64_t packed_size(const cache_key& k, const weight_snapshot& s, const plan::grouped_plan* p) const;
  /// Key `k` lent in place: the bytes its consumer gathers, as pieces of `s` (p: sharded only).
  static std::vector<source_piece> in_place_pieces(const cache_key& k, const weight_snapshot& s,
                                                   const plan::grouped_plan* p);
  std::uint64_t held_bytes() const;
  pins pins_of(const cache_entry& e, clock::time_point now) const;
  // Room for `bytes` more within the budget, dropping what may be dropped
  // for `demand` (nullptr: packing ahead); `reuse` gets a spare buffer large
  // enough, if one is kept. False when there is none to be had now.
  bool make_room(std::uint64_t bytes, const get_job* demand, host_buffer& reuse);
  entry_ptr pick_victim(const get_job* demand, clock::time_point now, bool& still_needed);
  /// The least recently used group of an older version than the newest
  /// that nobody still needs; nullptr when none.
  entry_ptr stale_entry(clock::time_point now) const;
  void drop(const entry_ptr& e);   // leaves the cache, its buffer kept for reuse
  void forget(const entry_ptr& e); // leaves the cache, its buffer freed with the entry
  entry_ptr start_pack(const cache_key& k, snapshot_ptr snapshot, std::shared_ptr<const plan::grouped_plan> plan,
                       std::uint64_t bytes, host_buffer buffer, bool ahead);
  unsigned check_published();
  void forget_old_in_place();
  unsigned pack_ahead();
  void release(const entry_ptr& e);
  void finish_get(const get_job& j);
  void fail_get(const get_job& j, const entry_ptr& e);
  void send_group(get_job j, const entry_ptr& e);
  void count_sent(std::uint64_t bytes);
  std::list<send_op>::iterator end_send(std::list<send_op>::iterator it);
  unsigned poll_sends();
  unsigned start_blocked();
  void sweep(clock::time_point now);
  unsigned handle_packed();

  // -- packers ------------------------------------------------------------------------

  void pack_loop();

  // -- faults -------------------------------------------------------------------------

  bool take_corruption(const get_job& j);
};

} // namespace rlsync::transfer::ucx_detail
