#pragma once
// The coordinator: owns membership and runs the sync rounds.
//
// One round at a time, in waves of at most sync.wave_size engines (0: one
// wave of every engine of the round). Each phase of a wave is fanned out to
// the wave's engines at once, with that phase's deadline, so a round always ends.
//
//   idle --(version due | newcomer registered | sync_atom)--> snapshot
//    ^                                                          |
//    |                     +------------------------------------+
//    |                     v
//    |     wave k: pause ==> flush ==> start(v) ==> transfer ==> finish(v) ==> resume
//    |                                                                          |
//    |          wave ends: its survivors routable at v (router: route) <--------+
//    |          more waves left: wave k+1 pauses; engines of later waves
//    |          keep serving their version meanwhile (within the staleness bound)
//    |                                                                          |
//    +-- done (no wave left): report, history, waiters; maybe the next round ---+
//
//   ==>  a barrier: no engine of the wave gets phase n+1 before every live
//        engine of the wave acknowledged phase n or was evicted. An engine
//        is paused only within its own wave, so it never mixes versions.
//   In any phase, per engine: error | deadline missed | down_msg
//        --> evicted: out of the round and out of routing (router: failed,
//            its paused requests move elsewhere; evicted before its wave:
//            router: evict, its requests go on there); the wave goes on with
//            the others, or ends when none is left; the later waves run regardless.
//
// Every handler records what happened and ends with `settle`, one loop that
// advances the round while barriers are reached: it sends the next phase,
// ends waves and the round, and starts the next round when one is due.
//
// Membership: a registered engine is monitored and is *not routable* until it
// completes a round (health is not freshness). An engine evicted but alive
// stays registered and unroutable; the next round includes it again and its
// full transfer brings it current. A dead engine is removed until it
// re-registers; a re-registration with a higher incarnation replaces the old
// handle and counts as a restart; past sync.max_restarts the replica is
// retired and refused from then on.
//
// Failure detection, per member:
//
//   live ──(down_msg)──────────────────────────▶ removed (router reroutes)
//    │ ▲
//    │ └─(answers a heartbeat again)── unreachable: out of rounds and routing;
//    │                                  the next round brings it current
//    └──(no heartbeat answer for heartbeat_timeout)──▶ unreachable
//                                       (router: failed → reroute its requests)
//
// sync.min_live_engines counts the members that are live and serving: reachable,
// routable (not evicted or dirty since their last round) and within
// sync.staleness of the trainer's newest version, or in the round that brings
// them there. Fewer than that, once that many had served, is an alert:
// logged loudly (checked at membership changes and as each round ends) and
// counted in the status; rounds go on regardless. The trainer's newest
// version is also told to the router (version_atom), which measures
// staleness against it.
//
// The trainer is monitored. If it dies during a round, the round is aborted:
// no later wave starts, and a wave before `finish` skips to `continue`, where
// each engine closes the update session — one that received part of the new
// version says it is dirty and stays out of routing until a complete update;
// the others serve their old version again (a wave at `finish` or later
// completes). A trainer replaced mid-round (another registers before the
// old one's down message came) aborts it the same way. No round starts until
// a trainer attaches again (register_atom with its handle); the next round
// then retries, and so does a newcomer's cold sync the abort cut short.
//
// Trainer ranks: a trainer that is many processes (trainer.ranks), each
// holding part of the model, registers rank by rank (register_atom with a
// rank_info). A single trainer (cfg.trainer) is the one-rank case whose
// orders name no producers; once any rank registers (or the topology has
// more than one), the coordinator follows ranks only:
//
//   rank: registered ──(down_msg)──▶ down ──(higher incarnation registers)──▶ registered
//          │   ▲                       (a lower one is refused; the same handle is a retry)
//          │   └──(answers a heartbeat again)── unreachable
//          └──(no heartbeat answer for heartbeat_timeout)──▶ unreachable
//
// Versions are told per sender: each rank's go through the version barrier
// (runtime/control/version_barrier), and the round's version is the newest
// every rank published and still holds, whose layout checks out (every
// parameter held; a tensor held twice has the same checksum); what is wrong
// is logged once, naming the ranks and the tensor, and no round starts on it.
// A round starts only when every rank of the topology is registered, live
// and holds that version; it pins it on every rank, and its transfer orders
// name every rank as a producer (rank, incarnation, held) with its handle. A
// rank that dies or turns unreachable mid-round aborts the round as the
// single trainer's death does; once it is back (a new incarnation
// registered, caught up to the newest version the cluster published, which
// its registration reply tells it), the round retries.
//
// With a state file, the version counter, restart counts and who was current
// are written after every change (temporary name, renamed), and a restarted
// coordinator starts from them: an engine that re-registers holding the
// synced version, clean, and was current then, is routable at once.
//
// probe_atom times waves of heartbeats to every member, the control-plane
// floor of a round; it keeps no state here and may run during a round.
#include "actors/interfaces.hpp"
#include "actors/sender_guard.hpp"
#include "gpu/nccl_group.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/control/coordinator_state_file.hpp"
#include "runtime/control/membership_policy.hpp"
#include "runtime/control/round_figures.hpp"
#include "runtime/control/sync_round.hpp"
#include "runtime/control/version_barrier.hpp"

#include <caf/typed_response_promise.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

namespace rlsync {

/// sync requests waiting for the next round at once; one more answers the
/// oldest waiting (queue_full) until a round answers them all.
inline constexpr std::size_t max_sync_waiters = 1024;

/// Writes one line to stderr: the coordinator's default log.
void log_to_stderr(const std::string& line);

/// What the coordinator is spawned with.
struct coordinator_config {
  /// Deadlines per phase, the cadence (every_versions), the pause of each
  /// round (mode, clear_cache), wave_size (waves of at most that many
  /// engines), min_live_engines (counted within staleness) and max_restarts.
  sync_spec sync;
  /// Mode and backend of the transfer orders.
  transfer_spec transfer;
  /// The coordinator subscribes to its versions; none: versions arrive only
  /// as `version_atom` messages.
  trainer_actor trainer;
  /// Told which engines may serve (route) and which may not (evict); none:
  /// nobody is told.
  router_actor router;
  /// The topology's trainer ranks. More than one: rounds wait until every
  /// rank registered (register_atom with a rank_info); one: a rank may
  /// register, or a single trainer attach; 0: rank registrations are refused.
  std::uint32_t trainer_ranks = 0;
  /// Rounds wait for rank registrations even with one rank (it runs in
  /// another process: a member node's or an external one), rather than
  /// taking versions as messages until it registers.
  bool await_ranks = false;
  /// Every parameter of the model, for the ranks' layout check (each held by
  /// some rank); empty: not checked.
  std::vector<std::string> parameter_names;
  /// Versions a rank keeps (its weight source's keep_versions): ranks past
  /// each other by more than this hold no version in common.
  std::size_t rank_keep_versions = 2;
  /// How long the trainer may take to answer the coordinator's version query.
  std::chrono::milliseconds trainer_deadline{5000};
  /// Engine names it keeps records of (every name ever registered); a new
  /// name beyond them is refused. At most the placements' bound.
  std::size_t max_engines = engine_nodes::max_engines;
  /// transfer.backend nccl: after a trainer rank failed a rendezvous, the
  /// next waits this long (an engine that fails is left out at once).
  std::chrono::milliseconds nccl_retry{1000};
  /// transfer.backend nccl: the first communicator's epoch is above this.
  /// A member keeps its epoch across a coordinator restart and refuses
  /// anything not newer, so deployments start it at the wall clock's
  /// milliseconds (coordinator_config_from): a restarted coordinator's
  /// rendezvous are newer than its predecessor's, one per millisecond at most.
  std::uint64_t nccl_epoch_base = 0;
  /// Whether an engine and a producer run in one process (their CAF nodes
  /// match): its workers then take that producer's weights over the local
  /// plane, and join no communicator for it. Empty: compare CAF nodes.
  std::function<bool(const caf::actor_addr& engine, const caf::actor_addr& producer)> shares_process;
  /// Time for the round's figures, in nanoseconds; empty: the actor clock
  /// (the simulated clock under the deterministic test scheduler).
  std::function<std::uint64_t()> now_ns;
  /// Receives one line per round (and one per refused version); empty: quiet.
  std::function<void(const std::string&)> log = log_to_stderr;
  /// Who may send to the coordinator besides itself (local_or_admitted:
  /// this process and the nodes that proved the cluster secret to the
  /// gatekeeper); empty: this process's actors only. Every other sender is
  /// refused, on every message.
  sender_policy authorize;
  /// Whether a member's registration (or an engine's deregistration) may
  /// come from the sender's CAF node: `member` is "engine NAME", "trainer
  /// rank N" or "router"; empty when it may, else why not (its node in the
  /// topology is not the node the sender proved to be). The registered
  /// actor must be on the sender's node too. Empty function: not checked
  /// (one process, tests).
  std::function<std::string(const std::string& member, const caf::node_id& sender)> origin;
  /// Called with every round's report as it ends (e.g. progress lines); may be empty.
  std::function<void(const sync_report&)> on_report;
  /// Called as each phase of a round is sent out, with the engines still in
  /// the round (drills time their faults and draw their timelines by it); may be empty.
  std::function<void(std::uint64_t round, std::uint64_t version, sync_phase phase,
                     const std::vector<std::string>& engines)>
    on_phase;
  /// Called when a member changes: "registered", "routable", "evicted",
  /// "dirty", "unreachable", "reachable", "left", "retired"; may be empty.
  std::function<void(const std::string& engine, const std::string& what)> on_member;
  /// Called when an engine is evicted from a round: the phase it was in
  /// (nullopt: a later wave, nothing sent to it yet) and why; may be empty.
  std::function<void(const std::string& engine, std::optional<sync_phase> phase, const std::string& why)> on_evict;
  /// Called (on the coordinator's thread) with each router that registers
  /// (register_atom): the head's main job drives a router on another node
  /// through it; may be empty.
  std::function<void(const router_actor&)> on_router;
  /// Rounds kept for `status_atom`.
  std::size_t history_limit = 64;
  /// How often every member is sent a heartbeat; 0: never (failures are then
  /// detected by down messages only, as in deterministic tests).
  std::chrono::milliseconds heartbeat_interval{0};
  /// A member that answered no heartbeat for this long is unreachable.
  std::chrono::milliseconds heartbeat_timeout{2000};
  /// Written after every round and membership change; empty: nothing persisted.
  std::string state_file;
  /// What a previous coordinator persisted (read_coordinator_state), to start from.
  std::optional<persisted_coordinator> restored;
  /// The topology's engine replicas: sync.first_round_wait holds the first
  /// round until this many registered.
  std::size_t expected_engines = 0;
};

/// The topology's part of a coordinator's configuration: the sync section,
/// the transfer section, the cluster's heartbeats, the state file, the
/// trainer's rank count, the engine replicas' count and the model's
/// parameter names. The caller adds the actors and hooks (and `restored`).
coordinator_config coordinator_config_from(const topology& t);

/// One registered engine, as the coordinator sees it.
struct coordinator_member {
  /// As registered; `version` and `dirty` follow the rounds.
  engine_info info;
  rollout_engine_actor handle;
  /// Completed a round and the router was told so.
  bool routable = false;
  /// Registered and not yet in any round: it waits for its cold sync.
  bool newcomer = true;
  /// Silent past the heartbeat timeout: out of rounds and routing until it answers.
  bool unreachable = false;
  /// When it last answered a heartbeat (or registered), coordinator clock.
  std::uint64_t last_heard_ns = 0;
};

/// What the coordinator remembers of a replica name across its incarnations.
struct replica_record {
  std::uint64_t incarnation = 0;
  std::uint32_t restarts = 0;
  bool retired = false;
  /// From a state file: the version it held and whether it was current then.
  std::uint64_t version = 0;
  bool was_routable = false;
  /// Its last eviction from a round, "phase: why" (empty: never evicted).
  std::string last_eviction;
};

/// transfer.backend nccl: the communicator the members joined, and the
/// rendezvous that builds the next one (coordinator_nccl.cpp).
struct coordinator_nccl {
  /// What every member joined (epoch 0, no members: none yet).
  gpu::comm_layout layout;
  /// Joined, and no member failed, restarted or was evicted in a transfer since.
  bool healthy = false;
  /// A rendezvous in flight: rounds wait for it.
  bool joining = false;
  /// The newest epoch any rendezvous named: a retry names a newer one, so
  /// members that joined the failed one take it.
  std::uint64_t epoch_sent = 0;
  /// Engines whose join failed: left out until the round after ends.
  std::set<std::string> left_out;
  /// The epoch whose members were last told that one of them died: a
  /// member's process keeps only the first death, so a node lost with many
  /// engines sends the news once, not once per engine.
  std::uint64_t dead_told_epoch = 0;
  /// After a trainer rank failed the rendezvous: none before this time;
  /// the wait doubles with every failure in a row (up to 30 s).
  std::uint64_t retry_at_ns = 0;
  std::chrono::milliseconds retry_delay{0};
  std::uint32_t failures_in_a_row = 0;
  /// A member restarted or failed while a rendezvous was in flight: the
  /// one joined is built again at once.
  bool suspect_while_joining = false;
  std::uint64_t rebuilds = 0;
};

/// One registered trainer rank, as the coordinator sees it.
struct coordinator_rank {
  rank_info info;
  trainer_actor handle;
  /// Its down message arrived: gone until a newer incarnation registers.
  bool down = false;
  /// Silent past the heartbeat timeout: no round until it answers.
  bool unreachable = false;
  /// When it last answered a heartbeat (or registered), coordinator clock.
  std::uint64_t last_heard_ns = 0;
  /// The version it was last told to catch up to (0: none).
  std::uint64_t catch_up_sent = 0;
  /// The newest version it published, and the one the last round pinned on
  /// it (0: none yet); for the status.
  std::uint64_t latest_published = 0;
  std::uint64_t pinned = 0;
};

/// The round in progress.
struct coordinator_round {
  coordinator_round(sync_round book, version_info target)
    : book(std::move(book)), target(target) {}

  sync_round book;
  version_info target;
  /// The wave and phase last sent out: `settle` sends the book's current
  /// one when it differs (a new phase, a new wave, or an abort's resume).
  bool sent_any = false;
  std::size_t sent_wave = 0;
  sync_phase sent_phase = sync_phase::pause;
  /// Times per wave, bytes, evictions and outcomes: the report's material.
  round_record record;
  /// Engines of the current wave that said at `continue` that they hold a
  /// partial update (an aborted wave).
  std::set<std::string> dirty_after_abort;
  /// Members that waited for their cold sync when the round opened: where
  /// the round aborts before they serve, they wait for it again (else a
  /// fleet whose trainer holds no newer version would never retry it).
  std::vector<std::string> cold_syncs;
  /// sync_atom requests answered when the round ends.
  std::vector<caf::typed_response_promise<sync_report>> waiters;
  /// The trainer ranks the round pulls from and their handles, in the same
  /// order (empty: the engines' one producer).
  std::vector<producer_holding> producers;
  std::vector<trainer_actor> producer_handles;
  /// The engines' addresses (weak: a round keeps no engine alive), by place
  /// in the book's snapshot; a member whose handle changes (a new
  /// incarnation) leaves the round.
  std::vector<caf::actor_addr> engines_at;
  /// The orders of the phase last sent: the engine at place ordered[i] got
  /// token first_token + i, so an answer finds its engine in O(1), and an
  /// answer with any other token is late (an earlier phase, wave or round).
  std::uint64_t first_token = 0;
  std::vector<std::size_t> ordered;
};

/// Hashes an address by node and id: CAF 0.17's own hash takes the id
/// alone, and actors of different member nodes, numbered by their own
/// counters, share ids, which would pile them into a few buckets.
struct actor_addr_hash {
  std::size_t operator()(const caf::actor_addr& a) const {
    return std::hash<caf::node_id>{}(a.node()) * 31 + std::hash<caf::actor_id>{}(a.id());
  }
};

struct coordinator_state {
  coordinator_config cfg;
  std::map<std::string, coordinator_member> members;
  /// The newest version the trainer published. Never goes backwards.
  version_info newest;
  /// The version of the last completed round. Never goes backwards.
  std::uint64_t synced_version = 0;
  std::optional<coordinator_round> round;
  std::uint64_t next_round_id = 1;
  std::uint64_t rounds = 0;
  /// The last `cfg.history_limit` rounds, oldest first.
  std::deque<sync_report> history;
  /// sync_atom requests that arrived during a round: they get the next one.
  std::vector<caf::typed_response_promise<sync_report>> sync_waiters; ///< at most max_sync_waiters
  /// Every replica name ever registered: incarnations, restarts, retirement.
  std::map<std::string, replica_record> replicas;
  /// A version the current trainer reported: rounds wait for it (a restored
  /// counter knows the number, not the groups; a replaced trainer's newest
  /// may not be the new one's).
  bool newest_heard = false;
  bool asking_version = false; ///< a heartbeat tick's ask of the trainer's version is out
  bool trainer_down = false;
  /// The first version whose unchanged bytes the trainer attached now may
  /// vouch for (version_info::same_bytes_since): one past the newest the
  /// coordinator knew when it attached, since a restarted trainer may
  /// publish numbers its earlier process used, with other bytes.
  std::uint64_t trainer_vouches_from = 0;
  std::uint64_t ignored_versions = 0; ///< older than the counter (logged now and then)
  std::uint64_t heartbeat_seq = 0;
  /// The next phase order's token: never reused, so no answer is taken for a later order.
  std::uint64_t next_token = 1;
  /// Who the last tick sent a heartbeat to (a member's name or a rank),
  /// by address: how an answer, a plain message, finds its sender.
  std::unordered_map<caf::actor_addr, std::variant<std::string, std::uint32_t>, actor_addr_hash> heartbeat_targets;
  /// min_live_engines: armed once that many members served; below it now;
  /// how often it fell below.
  min_live_alert live_alert;
  /// Bookkeeping steps the last round took (sync_round::ops): O(its engines).
  std::uint64_t last_round_ops = 0;
  /// Refuses (counts, logs) messages from senders cfg.authorize does not admit.
  std::shared_ptr<sender_guard> guard;
  /// Registered trainer ranks by index (at most cfg.trainer_ranks).
  std::map<std::uint32_t, coordinator_rank> ranks;
  /// Which version every rank published; the layout check.
  version_barrier barrier;
  /// Every rank holds st.newest, without errors (recomputed as ranks change).
  bool ranks_hold_newest = false;
  /// The barrier's errors last logged (their keys): each is logged once.
  std::set<std::string> barrier_errors;
  std::uint64_t ignored_unranked_versions = 0; ///< versions from no rank (or not the current trainer)
  /// sync.first_round_wait: until when rounds wait for the rest of the
  /// fleet to register; unset once it ended (or none: a coordinator
  /// restored from its state file holds no round).
  std::optional<caf::actor_clock::time_point> gather_until;
  /// transfer.backend nccl only.
  coordinator_nccl nccl;

  static inline const char* name = "coordinator";
};

/// The coordinator's interface plus its own timers: the heartbeat tick and
/// each phase's deadline (by the phase's first token). Handles given out are
/// coordinator_actor.
/// Heartbeats and phase orders go out one-way: CAF sends a handler's result
/// for a one-way message back as a plain message (the `heartbeat` here),
/// which it does not track, so a tick or a phase costs O(members), where n
/// requests in flight cost CAF O(n) per answer.
/// settle_atom: a wait of its own ended (the retry of a failed rendezvous
/// is due, or sync.first_round_wait passed): look again.
using coordinator_impl_actor = coordinator_actor::extend<caf::reacts_to<caf::tick_atom>, caf::reacts_to<heartbeat>,
                                                         caf::reacts_to<caf::timeout_atom, std::uint64_t>,
                                                         caf::reacts_to<settle_atom>>;

/// The coordinator's behaviour; spawn with `sys.spawn(coordinator, cfg)`.
coordinator_impl_actor::behavior_type
coordinator(coordinator_impl_actor::stateful_pointer<coordinator_state> self, coordinator_config cfg);

} // namespace rlsync
