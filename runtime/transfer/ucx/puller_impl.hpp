#pragma once
// Internal to the ucx backend: the puller's state (ucx_transfer.hpp has the
// protocol). Each pull runs on its caller's thread over a connection of its
// own (a channel: a UCX worker and one endpoint), taken from the idle ones
// or made anew, and returned for reuse after a successful pull.
// puller_connections.cpp: connecting with retries until the deadline,
// reuse and closing; puller.cpp: requests and the pull itself.
#include "runtime/transfer/ucx/active_messages.hpp"
#include "runtime/transfer/ucx/context.hpp"
#include "runtime/transfer/ucx/shared_memory.hpp"
#include "runtime/transfer/host_buffer.hpp"
#include "runtime/transfer/ucx/ucx_transfer.hpp"
#include "runtime/transfer/ucx/ucx_wire.hpp"

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

namespace rlsync::transfer::ucx_detail {

namespace wire = ucx_wire;

inline std::string who(const pull_request& r) {
  return "engine '" + r.engine + "' worker " + std::to_string(r.worker);
}

// What is wrong with a manifest's groups, "" when nothing: groups out of
// order, one above `max_group_bytes`, or (sharded: `plan_bytes` given, the
// bytes the worker's plan keeps) more in all than the worker keeps. They
// size the receive buffers before any byte arrives, so a producer that
// lies about them must not decide this process's memory.
std::string manifest_size_problem(const std::vector<wire::group_info>& groups, std::uint64_t max_group_bytes,
                                  std::optional<std::uint64_t> plan_bytes);

// Replies a connection holds that no wait has taken yet: a pull waits for
// at most its window of groups plus those its open carried (max_prefetch).
constexpr std::size_t max_waiting_replies = 1024;
// ...and at most this many bytes of them as they came (a manifest of the
// largest models is a few MiB; decoded, a message takes up to ~11x its size).
constexpr std::size_t max_waiting_reply_bytes = std::size_t{64} << 20;
// One reply's largest size on the wire: the inbox drops (and reports) a larger one.
constexpr std::size_t max_reply_bytes = std::size_t{64} << 20;

// One connection to the producer: a UCX worker of its own (UCX workers are
// single-threaded), one endpoint, the receive buffers. Used by one pull at
// a time; kept between pulls.
struct channel {
  std::string peer;                  // "ucx-<checksum of the address>", for messages
  std::vector<std::uint8_t> address; // the producer's worker address
  std::string engine;                // the engine worker its token was for
  int engine_worker = 0;
  worker_handle worker;
  ucp_ep_h ep = nullptr;
  am_inbox inbox;
  am_outbox outbox;
  bool failed = false;
  std::string failure;
  std::set<std::uint64_t> plans; // digests registered on this connection
  std::uint64_t seq = 0;
  std::uint64_t tag = 0;
  std::map<std::uint64_t, wire::message> replies; // by seq; 0: a reject the producer could not attribute
  std::map<std::uint64_t, std::size_t> reply_bytes; // each held reply's size as it came
  std::size_t held_reply_bytes = 0;                 // their sum
  std::vector<host_buffer> slots;
  lane_info lanes;
  bool connected = false;  // the producer answered hello
  clock::time_point idle_since; // when it was last given back
  std::string refused;     // the producer refused the hello's token: do not retry
  void* closing = nullptr; // a close that has not completed (see close_ep)
  // Shared memory: whether the producer's probe mapped (then sessions ask
  // for lent groups), and the producer buffers mapped, by id, with the
  // pull that last used each (kept while the producer's manifests name
  // them: one it no longer holds is unmapped at the next open).
  bool shared = false;
  std::uint32_t shared_pid = 0; // the producer process whose probe mapped: lent regions must name it
  std::string shared_why;       // why not: turned off, or what failed when the producer offered it
  struct mapped {
    shared_mapping map;
    std::uint64_t last_pull = 0;
  };
  std::map<std::uint64_t, mapped> maps;
  std::uint64_t pulls = 0;

  static void on_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    auto* self = static_cast<channel*>(arg);
    self->failed = true;
    self->failure = ucs_status_string(status);
  }

  // Takes a held reply out (erase only through here: the byte count follows).
  void erase_reply(std::map<std::uint64_t, wire::message>::iterator it) {
    if (auto b = reply_bytes.find(it->first); b != reply_bytes.end()) {
      held_reply_bytes -= b->second;
      reply_bytes.erase(b);
    }
    replies.erase(it);
  }
  void clear_replies() {
    replies.clear();
    reply_bytes.clear();
    held_reply_bytes = 0;
  }

  // Decodes what arrived into `replies`; a reply that does not decode is a
  // broken producer.
  void pump() {
    inbox.poll();
    outbox.poll();
    // A request the producer's inbox refused (at one of its bounds) would
    // otherwise go unanswered until the pull's deadline.
    if (outbox.failed_sends != 0 && !failed) {
      failed = true;
      failure = std::string("a message to the producer failed (") + ucs_status_string(outbox.first_failure)
                + "): its inbox refused it at a bound, or it is gone";
    }
    while (!inbox.ready.empty()) {
      auto in = std::move(inbox.ready.front());
      inbox.ready.pop_front();
      if (in.too_big) {
        failed = true;
        failure = "the producer sent a reply of " + std::to_string(in.too_big) + " bytes";
        continue;
      }
      try {
        auto m = wire::decode(in.bytes.data(), in.bytes.size());
        const std::uint64_t s = std::visit([](const auto& x) { return x.seq; }, m);
        // Replies answer requests this side made, and are taken as they
        // come: one to a request never made, or more than any pull leaves
        // waiting, is a producer that lies, not one to buffer without end.
        if (s > seq) {
          failed = true;
          failure = "the producer answered request " + std::to_string(s) + ", never made (the last was "
                    + std::to_string(seq) + ")";
          continue;
        }
        if (replies.size() >= max_waiting_replies && !replies.count(s)) {
          failed = true;
          failure = "the producer sent more than " + std::to_string(max_waiting_replies)
                    + " replies waiting to be taken";
          continue;
        }
        if (auto old = replies.find(s); old != replies.end())
          erase_reply(old); // the same request answered again: the later answer counts
        if (held_reply_bytes + in.bytes.size() > max_waiting_reply_bytes) {
          failed = true;
          failure = "the producer sent more than " + std::to_string(max_waiting_reply_bytes)
                    + " bytes of replies waiting to be taken";
          continue;
        }
        held_reply_bytes += in.bytes.size();
        reply_bytes[s] = in.bytes.size();
        replies[s] = std::move(m);
      } catch (const wire::wire_error& e) {
        failed = true;
        failure = std::string("malformed reply: ") + e.what();
      }
    }
  }
};

struct registration {
  std::shared_ptr<const plan::worker_plan> plan;
  std::shared_ptr<const std::vector<std::uint8_t>> encoded;
  std::uint64_t digest = 0;
};

// A receive posted for one group.
struct posted {
  void* request = nullptr;
  bool done = false;
  ucs_status_t status = UCS_OK;
  std::size_t length = 0;
  std::uint64_t seq = 0;
  std::uint64_t tag = 0;
};

struct puller_impl {
  ucx_puller_options options;
  std::unique_ptr<ucx_context> ctx;

  mutable std::mutex mutex;
  std::vector<std::uint8_t> producer; // the newest producer address the credentials named
  std::map<std::pair<std::string, int>, registration> workers;
  std::vector<std::unique_ptr<channel>> idle;
  std::vector<host_buffer> spare; // receive buffers of connections that were closed
  std::vector<std::unique_ptr<channel>> parked; // closing; see close_ep
  /// UCX workers made when engine workers registered, for their first
  /// connections: making one opens every transport (18-37 ms measured here),
  /// which would otherwise fall inside the first sync's stall. At most one
  /// per registered engine worker.
  std::vector<worker_handle> ready;
  /// Connections being made ahead (connect_ahead): each thread and whether
  /// it has finished; finished ones are joined as new ones start, the rest
  /// on destruction.
  struct connecting {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<connecting> ahead;
  /// Engine workers being connected ahead: their first pull waits for that
  /// connection (ahead_done) instead of making a second one.
  std::set<std::pair<std::string, int>> connecting_ahead;
  /// Engine workers with a pull under way (each holds its connection out of
  /// `idle`), by how many: connect_ahead leaves them alone.
  std::map<std::pair<std::string, int>, int> pulling;
  std::condition_variable ahead_done;
  std::atomic<bool> stopping{false}; // no new connection ahead starts; those under way give up
  ucx_puller_stats st;
  std::string last_lanes;

  ~puller_impl();

  // -- connections --------------------------------------------------------------------

  std::unique_ptr<channel> acquire(const pull_request& req);
  void release(std::unique_ptr<channel> ch);
  void destroy(std::unique_ptr<channel> ch, std::chrono::milliseconds grace = std::chrono::milliseconds(500));
  void destroy_worker(channel& ch);
  void recycle_buffers(channel& ch);
  void reap_parked();
  std::string parked_bound_reached(const std::vector<std::uint8_t>& producer_address);
  static constexpr std::size_t parked_bound_factor = 4; // all producers together: this many times the bound
  std::unique_ptr<channel> new_channel(const ucx_credentials& creds, const pull_request& req);
  /// Makes a worker ahead (for a newly registered engine worker) while
  /// fewer are ready than engine workers registered.
  void make_ready_worker();
  /// Destroys ready workers beyond the registered engine workers.
  void trim_ready_workers();
  ucx_credentials credentials(const pull_request& req);
  bool create_endpoint(channel& ch, std::string& why);
  /// `map_ahead`: map and fault in the buffers the producer's answer names.
  std::unique_ptr<channel> connect(const pull_request& req, bool map_ahead = false);
  std::string try_connect(channel& ch, const ucx_credentials& creds, clock::time_point deadline, bool map_ahead);
  /// Maps and faults in `regions` of the producer whose probe mapped.
  void map_ahead(channel& ch, const std::vector<wire::shared_region>& regions, clock::time_point deadline);
  /// Starts connecting engine worker (engine, worker) in the background.
  void start_connect_ahead(const std::string& engine, int worker);

  // -- request/reply ------------------------------------------------------------------

  [[noreturn]] void lost(channel& ch, const pull_request& req, const std::string& doing);
  void send(channel& ch, const pull_request& req, const wire::message& m, const std::string& doing);
  wire::message await(channel& ch, const pull_request& req, std::uint64_t seq, const std::string& doing);
  void register_plan(channel& ch, const pull_request& req, const registration& r);

  // -- the pull -----------------------------------------------------------------------

  pull_report pull(const pull_request& req, const group_sink& sink);
  void ensure_slots(channel& ch, std::size_t window, std::size_t size);
  /// Where a group lent in region `r` lies in this process: the region
  /// mapped (once, then kept while pulls use it), checked to hold `bytes`.
  const std::uint8_t* mapped_group(channel& ch, const pull_request& req, const wire::shared_region& r,
                                   std::uint64_t bytes);
  static constexpr std::size_t max_mappings = 256; // per connection
};

} // namespace rlsync::transfer::ucx_detail
