#pragma once
// Who is in an NCCL communicator, and when to rebuild it: pure functions
// the coordinator's sync round calls, tested without a device.
//
// A communicator's ranks are its members in one canonical order: the
// trainer's producer ranks first (the roots of a broadcast, the senders of
// a sharded pull), then engine workers by (engine, worker). Every member
// computes its rank from the same list, so a rendezvous carries the list
// and nothing else need agree.
//
// NCCL cannot drop a rank from a live communicator: a collective with a
// dead member never completes. So the rule (DESIGN's fault model, with a
// rejoin only at a sync boundary) is:
//
//              member died / comm failed           boundary, members changed
//   [healthy] --------------------------> abort   ----------------------------> rebuild (epoch + 1)
//       |  mid-round: newcomers wait               boundary, nobody to talk to
//       +------------------------------> keep      ----------------------------> close
#include "runtime/control/protocol.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rlsync::gpu {

/// NCCL's ncclUniqueId: 128 opaque bytes (NCCL_UNIQUE_ID_BYTES), made by the
/// root (producer rank 0) and passed to every member through the coordinator.
inline constexpr std::size_t nccl_id_bytes = 128;
using nccl_id = std::array<std::uint8_t, nccl_id_bytes>;

/// Members in one communicator at most: every replica's workers plus the
/// trainer ranks of the largest topology the validator accepts stay below.
inline constexpr std::size_t max_comm_members = 65536;

struct comm_member {
  bool producer = false; ///< a trainer rank that sends; else an engine worker that receives
  std::string engine;    ///< the replica's name; empty for a producer
  int rank = 0;          ///< the trainer rank, or the worker (tp rank) in its engine

  static comm_member trainer_rank(int r) { return {true, {}, r}; }
  static comm_member worker(std::string engine, int w) { return {false, std::move(engine), w}; }

  /// "trainer rank 1" / "engine rollout-0 worker 1": how errors name it.
  std::string describe() const;
  bool operator==(const comm_member& o) const;
  bool operator!=(const comm_member& o) const { return !(*this == o); }
  /// The canonical order: producers (by rank) before workers (by engine, worker).
  bool operator<(const comm_member& o) const;
};

struct comm_layout {
  std::uint64_t epoch = 0;         ///< 1 for the first communicator, + 1 at every rebuild; 0: none yet
  std::vector<comm_member> members; ///< NCCL rank i is members[i]

  int size() const { return static_cast<int>(members.size()); }
  /// The member's NCCL rank, or -1 when it is not in the communicator.
  int rank_of(const comm_member& m) const;
};

/// `members` in the canonical order under `epoch`. Throws
/// std::invalid_argument naming the problem: a member named twice, no
/// producer or no worker (nothing to send or nobody to receive), more than
/// max_comm_members, or a negative rank.
comm_layout make_layout(std::uint64_t epoch, std::vector<comm_member> members);

enum class comm_action {
  keep,      ///< the communicator serves as it is
  abort_now, ///< ncclCommAbort: a member died or the communicator failed
  rebuild,   ///< at a boundary: a new communicator of `next` (after aborting any old one)
  close,     ///< at a boundary: nobody left to send to or receive from; free it
};

const char* to_string(comm_action a);

struct comm_decision {
  comm_action action = comm_action::keep;
  comm_layout next; ///< rebuild: the new members under epoch + 1; close: none, the epoch kept
  std::string why;  ///< for everything but keep: which member, or what changed
};

/// What to do with `current` given the members that should be in it now
/// (`wanted`: the live producers and the live engine workers that hold, or
/// are about to receive, the current version). `healthy`: the communicator
/// exists and no operation on it failed. Mid-round (`at_boundary` false) a
/// communicator is only ever kept or aborted; newcomers wait for the
/// boundary. Pure: no NCCL call.
comm_decision decide(const comm_layout& current, bool healthy, const std::vector<comm_member>& wanted,
                     bool at_boundary);

/// The collective baseline with several trainer ranks broadcasts each
/// rank's groups in a communicator of its own (a broadcast has one root,
/// and NCCL needs every member of a communicator in each collective: the
/// other ranks would receive bytes they do not want), as RL frameworks give
/// each pipeline stage its own group: `main`'s producer `rank` first (NCCL
/// rank 0, the root), then every worker of `main` in its order, under
/// `main`'s epoch. Throws std::invalid_argument when `rank` is not a
/// producer of `main`.
comm_layout root_layout(const comm_layout& main, int rank);

/// What the coordinator sends every member of a new communicator.
struct nccl_rendezvous {
  std::uint64_t epoch = 0;
  nccl_id id{};
  std::vector<comm_member> members; ///< in rank order
  /// With the collective and several trainer ranks: per producer of
  /// `members` (in their order), the id of its root_layout's communicator,
  /// made in that rank's process. Empty otherwise.
  std::vector<nccl_id> root_ids;
};

/// A member's answer to a rendezvous it received: its rank, or why it
/// refuses (a peer that lies or replays gets a reason, never a hang).
struct join_result {
  int rank = -1;
  std::string error; ///< empty when rank >= 0
};

/// Checks a rendezvous before `me` joins it: the epoch must be newer than
/// the one it holds (`held_epoch`; a replay or reordering is stale), the id
/// must not be all zeros, the members must be in canonical order without
/// duplicates, within max_comm_members, with a producer and a worker, and
/// `me` must be one of them; root ids, if any, one per producer, none all
/// zeros, no two alike nor like `id`.
join_result join_rank(const nccl_rendezvous& r, const comm_member& me, std::uint64_t held_epoch);

/// The rendezvous as the coordinator's messages carry it, and back.
/// from_wire throws std::invalid_argument naming what is wrong: an id that
/// is not NCCL's 128 bytes, more than max_comm_members members, a negative
/// rank, an engine name on a producer or none on a worker. (join_rank
/// checks the rest: epoch, order, duplicates.)
nccl_rendezvous_msg to_wire(const nccl_rendezvous& r);
nccl_rendezvous from_wire(const nccl_rendezvous_msg& m);

} // namespace rlsync::gpu
