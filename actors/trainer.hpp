#pragma once
// The trainer: publishes weight versions from its WeightSource
// and serves them. It never computes on its mailbox: each step's version
// (a perturbation, or a poll of a checkpoint directory) runs as a job on a
// job_runner, which reports back with a message; at most one is in flight.
//
//          spawn ──▶ producing ──(produced v)──▶ publish v to subscribers
//                        ▲                            │
//                        └──── tick (step_time after  ◀┘
//                              the step started)       (produced nothing /
//                                                       failed: just tick)
//
// step_atom starts a step at once when none is in flight (a benchmark that
// drives syncs explicitly sets a very long step_time); it is answered when
// that step ends. It leaves the timer's cadence alone: at most one tick is
// ever pending, so an explicit step never adds a second tick chain.
//
// Bytes reach engines two ways:
//   - the data plane: an in-process engine pulls from a
//     transfer::local_transfer built on the same source (make_local_trainer
//     builds both; the trainer itself does not touch it), other backends
//     from their producers;
//   - the CAF fallback: pull_atom returns one group's full tensors inline.
//     They are copied on a packer thread, never on the mailbox, so that a
//     heartbeat or a step result never waits behind such a copy: at most
//     caf_reply_budget_bytes of replies are being packed at once (one group
//     always goes), up to max_waiting_pulls more wait in order, and the rest
//     are refused (queue_full). (The nccl backend's host fallback still
//     packs on the mailbox.)
// Subscribers (the coordinator) hear of every version published, and of the
// current one when they subscribe; they are monitored and dropped once down.
//
// A trainer rank (rank_checksums) publishes with each version the checksum64
// of every tensor it holds, in held-name order (rank_info_of), computed in
// the step job, so that the coordinator finds two ranks holding one tensor
// with different bytes. A restarted rank catches up (catch_up) to the version
// the coordinator's registration reply names: its next step advances through
// every version up to it (each derives from the one before) and publishes
// only the last, so that it meets the other ranks at a version they hold.
#include "actors/interfaces.hpp"
#include "actors/sender_guard.hpp"
#include "runtime/plan/grouped_plan.hpp"
#include "runtime/transfer/local/local_transfer.hpp"
#include "runtime/transfer/weight_source.hpp"

#include <caf/actor_system.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

namespace rlsync::gpu {
class ipc_producer; // gpu/ipc_producer.hpp
class nccl_sender;  // gpu/nccl_sender.hpp
class nccl_membership; // gpu/nccl_membership.hpp
class pack_device;     // gpu/device_pack.hpp
class device_snapshot; // gpu/device_pack.hpp
} // namespace rlsync::gpu

namespace rlsync {

/// Runs jobs off the actor's mailbox (where a version is computed).
class job_runner {
public:
  virtual ~job_runner() = default;
  /// Queues `job`; false when refused (full or stopped).
  virtual bool post(std::function<void()> job) = 0;
};

/// One background thread, a bounded queue of jobs. The destructor waits for
/// the running job and drops queued ones.
std::shared_ptr<job_runner> make_thread_runner(std::size_t queue_limit = 2);

/// Where the trainer gets UCX tickets: empty until the node starts its UCX
/// producer (after the trainer), emptied before the producer goes.
/// Thread-safe.
class ucx_ticket_office {
public:
  using issuer = std::function<ucx_ticket(const std::string& engine, int worker)>;
  void open(issuer f) {
    std::lock_guard<std::mutex> lock(mutex_);
    issue_ = std::move(f);
  }
  void close() { open(nullptr); }
  /// Throws std::runtime_error when no producer runs.
  ucx_ticket issue(const std::string& engine, int worker) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!issue_)
      throw std::runtime_error("this trainer runs no UCX producer");
    return issue_(engine, worker);
  }

private:
  mutable std::mutex mutex_;
  issuer issue_;
};

/// A producer the trainer serves from (a cuda_ipc producer, an nccl
/// sender), opened by the node that made it (it needs a device, which a
/// trainer may lack), swapped when it is rebuilt and closed when the node
/// stops.
template <class Producer>
class producer_desk {
public:
  void open(std::shared_ptr<Producer> p) {
    std::lock_guard<std::mutex> lock(mutex_);
    producer_ = std::move(p);
  }
  void close() { open(nullptr); }
  std::shared_ptr<Producer> producer() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return producer_;
  }

private:
  mutable std::mutex mutex_;
  std::shared_ptr<Producer> producer_;
};

using ipc_desk = producer_desk<gpu::ipc_producer>;
using nccl_desk = producer_desk<gpu::nccl_sender>;

/// What the trainer is spawned with.
struct trainer_config {
  std::shared_ptr<transfer::weight_source> source;
  /// Synthetic: one version per step_time. Checkpoint directory: how often
  /// it is polled.
  std::chrono::milliseconds step_time{200};
  /// Where versions are computed; none: a thread of the trainer's own.
  std::shared_ptr<job_runner> runner;
  /// Where CAF pull replies are copied; none: a thread of the trainer's own.
  std::shared_ptr<job_runner> packer;
  /// CAF pull replies being packed (or packed and not yet handed to CAF) at
  /// once, in bytes; a group larger than this goes alone.
  std::uint64_t caf_reply_budget_bytes = std::uint64_t(256) << 20;
  /// CAF pulls waiting for that budget (every engine worker asks
  /// groups_in_flight ahead), at least 1; one more is refused (queue_full).
  std::size_t max_waiting_pulls = 65536;
  /// Receives one line per failed step (and per refused message); empty: quiet
  /// (refusals then go to stderr).
  std::function<void(const std::string&)> log;
  /// UCX tickets for member engines; none: the trainer issues none.
  std::shared_ptr<ucx_ticket_office> ucx_tickets;
  /// The cuda_ipc producer engines pull from; none: the trainer serves none.
  std::shared_ptr<ipc_desk> cuda_ipc;
  /// The rank's nccl sender, swapped at every rebuild of the communicator;
  /// none: the trainer serves no nccl pulls.
  std::shared_ptr<nccl_desk> nccl;
  /// The process's NCCL membership, through which this rank (as trainer
  /// rank `nccl_rank`) joins the coordinator's rendezvous and opens its
  /// sender in `nccl`; none: nccl_join_atom is refused.
  std::shared_ptr<gpu::nccl_membership> nccl_membership;
  int nccl_rank = 0;
  std::size_t nccl_send_queue = 256; ///< sends queued at most (one per worker and group in flight)
  /// The collective baseline starts a version's broadcast once every worker
  /// of the communicator asked for it within this long of the first ask;
  /// otherwise every worker pulls it point to point (a round that leaves
  /// members out would never complete a broadcast).
  std::chrono::milliseconds nccl_join_window{2000};
  /// The collective baseline's broadcasts carry whole consecutive groups,
  /// back to back, up to this many bytes (or the link's staging, if less);
  /// a group larger goes alone (transfer.bucket_bytes).
  std::uint64_t nccl_bucket_bytes = std::uint64_t(64) << 20;
  /// nccl: where this rank fills the link's staging from a copy of the
  /// version on its device (gpu/device_pack.hpp): a worker's sharded entries
  /// with mixsum64 after them, whole groups, and the collective's buckets;
  /// none: all packed on the CPU, with XXH3 (serve_over_nccl takes the
  /// membership's).
  std::shared_ptr<gpu::pack_device> nccl_pack_device;
  /// Makes a communicator's unique id (gpu::make_nccl_id: NCCL listens for
  /// the members' bootstrap here); none: nccl_id_atom is refused.
  std::function<std::vector<std::uint8_t>()> make_nccl_id;
  /// Who may send to the trainer besides itself (local_or_admitted); empty:
  /// this process's actors only. Every other sender is refused, on every message.
  sender_policy authorize;
  /// Where the registered engines run, as the coordinator says
  /// (register_atom with placements). Set: a UCX ticket for an engine goes
  /// only to the node that registered it, and the nodes hosting engines may
  /// also ask for weights (meta, version, pull, heartbeat, tickets), nothing
  /// else. Null: tickets go to whoever `authorize` admits.
  std::shared_ptr<engine_nodes> engines;
  /// Who may say where engines run: the coordinator's process. Empty: this
  /// process only (never an admitted member: it could claim any engine).
  sender_policy placements_from;
  /// Listeners kept at once (subscribe_atom); more are refused.
  std::size_t max_subscribers = 64;
  /// A trainer rank: each published version carries the checksums of the
  /// tensors held (version_info::checksums, in rank_info_of's held order).
  bool rank_checksums = false;
};

/// Versions one catch-up may advance through; a larger gap fails the step
/// (the rank is too far behind to meet the others by stepping).
constexpr std::uint64_t max_catch_up_versions = std::uint64_t{1} << 20;

// Private to the trainer: a step finished.
using produced_atom = caf::atom_constant<caf::atom("produced")>;
// Private to the trainer: a CAF pull reply was packed (or failed to).
using packed_atom = caf::atom_constant<caf::atom("packed")>;

/// The trainer's own interface: trainer_actor plus what it sends itself.
/// Handles given out are trainer_actor.
using trainer_impl_actor = trainer_actor::extend<
  // time for the next step
  caf::reacts_to<caf::tick_atom>,
  // a step ended: the version it made (with its checksums for a rank), or
  // version 0 when there was nothing new
  caf::reacts_to<produced_atom, version_info>,
  // a step failed: why
  caf::reacts_to<produced_atom, std::string>,
  // CAF pull reply `id` is packed, or why not
  caf::reacts_to<packed_atom, std::uint64_t, weight_bucket>,
  caf::reacts_to<packed_atom, std::uint64_t, std::string>>;

struct trainer_state {
  ~trainer_state(); ///< answers the CAF pulls still held
  trainer_config cfg;
  /// The newest version published (version 0: none yet).
  version_info published;
  std::map<caf::actor_addr, version_listener_actor> subscribers;
  bool producing = false;
  bool frozen = false; ///< no new steps; a step in flight still publishes
  std::vector<caf::typed_response_promise<version_info>> freeze_waiters; ///< answered once that step ends
  /// step_atom requests, answered when the step in flight ends (an error
  /// when it failed).
  std::vector<caf::typed_response_promise<version_info>> step_waiters;
  bool tick_pending = false; ///< a tick is on its way: schedule no second one
  std::uint64_t catch_up_to = 0; ///< the next steps advance at least this far
  caf::actor_clock::time_point step_started;
  std::uint64_t steps = 0;
  std::uint64_t failed_steps = 0;
  /// CAF pulls: those waiting for the reply budget, in order, and those
  /// being packed (by id) with their bytes.
  struct caf_pull {
    transfer::snapshot_ptr version;
    std::uint32_t group = 0;
    std::uint64_t bytes = 0;
    caf::typed_response_promise<weight_bucket> reply;
  };
  std::deque<caf_pull> waiting_pulls;
  std::map<std::uint64_t, caf_pull> packing_pulls;
  std::uint64_t packing_bytes = 0;
  std::uint64_t next_pack = 1;
  std::string last_error;
  /// Refuses (counts, logs) messages from senders cfg.authorize does not admit.
  std::shared_ptr<sender_guard> guard;
  /// For what engines ask: cfg.authorize or a node hosting an engine.
  std::shared_ptr<sender_guard> data_guard;
  /// For engine placements: cfg.placements_from.
  std::shared_ptr<sender_guard> placements_guard;
  /// nccl, sharded: the plan each engine worker registered (nccl_plan_atom)
  /// and its digest. Only members of the rank's current communicator keep
  /// one, so it holds at most as many as the communicator has members.
  struct registered_plan {
    std::uint64_t digest = 0;
    std::shared_ptr<const plan::grouped_plan> plan;
  };
  std::map<std::pair<std::string, std::int32_t>, registered_plan> nccl_plans;
  /// nccl, the collective baseline: the version last broadcast (or being
  /// broadcast) to every member, on which communicator, and what it sends.
  struct collective_broadcast {
    std::uint64_t version = 0;
    std::uint64_t epoch = 0;
    enum { gathering, started, closed } phase = gathering;
    std::set<std::pair<std::string, std::int32_t>> asked; ///< workers that asked (members only)
    std::chrono::steady_clock::time_point first_ask;
    nccl_manifest manifest;              ///< once started
    std::uint64_t done_at = 0;           ///< the sender's broadcast() count once it completed
    std::chrono::steady_clock::time_point deadline; ///< the broadcast's
  };
  std::optional<collective_broadcast> nccl_broadcast;
  /// nccl and cuda_ipc: the versions this rank uploaded to the device, two
  /// at most (a send still queued keeps its own copy alive), each with the
  /// pack device it lives on; and the last version whose upload failed.
  /// Copies pushed with a version are adopted, not kept here.
  struct device_copy_entry {
    const gpu::pack_device* on = nullptr;
    std::shared_ptr<const gpu::device_snapshot> copy;
  };
  std::map<std::uint64_t, device_copy_entry> device_copies;
  std::uint64_t device_copy_failed = 0;

  static inline const char* name = "trainer";
};

/// The trainer's behaviour (spawn it with spawn_trainer).
trainer_impl_actor::behavior_type trainer(trainer_impl_actor::stateful_pointer<trainer_state> self,
                                          trainer_config cfg);

/// Spawns a trainer. Throws std::invalid_argument without a source.
trainer_actor spawn_trainer(caf::actor_system& sys, trainer_config cfg);

/// A trainer for one process holding the engines too: the topology's source
/// (rank `rank`), the local data plane on it, and the trainer.
struct local_trainer {
  std::shared_ptr<transfer::weight_source> source;
  std::shared_ptr<transfer::local_transfer> transfer;
  std::shared_ptr<ucx_ticket_office> ucx_tickets; ///< opened by a node that runs a UCX producer
  std::shared_ptr<ipc_desk> cuda_ipc;               ///< opened by a node that runs a cuda_ipc producer
  std::shared_ptr<nccl_desk> nccl;                  ///< opened by a node in an nccl communicator
  std::shared_ptr<engine_nodes> engines;            ///< where engines run, as the coordinator said
  sender_policy placements_from;                    ///< who may say it
  trainer_actor actor;
};

/// The configuration of `parts`' trainer actor: the parts it serves with
/// and what the topology says (step time, rank checksums, bucket bytes);
/// the same for a first start and a restart (serve_over_nccl adds the
/// collective's end).
trainer_config local_trainer_config(const local_trainer& parts, const topology& t, sender_policy authorize);

/// The process's end of the nccl communicator (nccl_plane.hpp) for trainer
/// rank `rank`: it joins the coordinator's rendezvous there, opens its
/// sender in cfg.nccl, and makes unique ids (gpu::make_nccl_id) as a root.
void serve_over_nccl(trainer_config& cfg, std::shared_ptr<gpu::nccl_membership> membership, int rank);

/// With its own engine_nodes: tickets go only to an engine's own node.
/// `placements_from`: trainer_config::placements_from. `source`: the rank's
/// source when another part of the process owns it (an external rank's
/// publishes, which the trainer polls every external_poll_interval between
/// the steps publishing asks for); null: make_weight_source(t, rank).
local_trainer make_local_trainer(caf::actor_system& sys, const topology& t, std::size_t rank = 0,
                                 sender_policy authorize = {}, sender_policy placements_from = {},
                                 std::shared_ptr<transfer::weight_source> source = nullptr,
                                 std::shared_ptr<gpu::nccl_membership> nccl = nullptr);

/// How often a trainer on an external source looks for a version pushed
/// while a step was in flight (each push also asks for a step at once).
constexpr std::chrono::milliseconds external_poll_interval{20};

/// Has a trainer this process spawned (spawn_trainer) advance until version
/// `version` and publish only that one, off its mailbox: a restarted rank
/// calls it with its registration's current_version. A version it already
/// published changes nothing; a step in flight finishes first.
void catch_up(const trainer_actor& trainer, std::uint64_t version);

/// How a trainer rank registers: its index and node, this incarnation, and
/// the names of the tensors `source` holds, ascending (the order of its
/// version_info::checksums).
rank_info rank_info_of(const transfer::weight_source& source, std::uint32_t rank, std::string node,
                       std::uint64_t incarnation);

/// What the trainer publishes for `s`, a version of `source`: version,
/// groups, bytes, since when its bytes are the same, and with `checksums`
/// the checksum64 of each tensor held, in ascending name order.
version_info published_info(const transfer::weight_source& source, const transfer::weight_snapshot& s,
                            bool checksums);

/// The whole tensors of group `g` of `s` as one checksummed bucket.
weight_bucket group_bucket(const transfer::weight_snapshot& s, std::uint32_t g);
/// As group_bucket, without the bytes or their checksum: the entries only.
weight_bucket group_layout(const transfer::weight_snapshot& s, std::uint32_t g);

} // namespace rlsync
