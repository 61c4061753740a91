#pragma once
// A process's members of the current NCCL communicator: its trainer ranks
// and engine workers. At a sync boundary the coordinator sends every
// process hosting a member the same rendezvous (nccl_group.hpp); join()
// checks it (join_rank: a newer epoch, a non-empty id, the canonical
// order), starts a link for each member it names among `hosted`, and only
// then replaces the older epoch's links, aborting them. Each actor joins
// for its own members (two trainer ranks or two engines in one process):
// the same rendezvous again adds the links of members not yet joined, a
// member joined twice or a different rendezvous for the epoch is refused.
// A refused or failed join changes nothing.
//
// A hosted member the rendezvous leaves out (an engine that registered
// after the coordinator planned it) has no link: its pulls fail until the
// next boundary makes it a member, as DESIGN's rejoin rule says.
//
// A rendezvous with root ids (the collective, several trainer ranks) also
// starts, per producer, a link into that producer's own communicator
// (root_layout): every worker joins each, a trainer rank its own. They
// live and die with the epoch's links.
#include "gpu/comm_wait.hpp"
#include "gpu/nccl_link.hpp"

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace rlsync::gpu {
class pack_device;
}

namespace rlsync::gpu {

class nccl_membership {
public:
  /// Starts one member's link: nccl_link() on the member's device, or a
  /// fake world's (tests). Throws on failure.
  using link_factory = std::function<std::unique_ptr<p2p_link>(const nccl_id& id, const comm_layout& layout, int rank)>;

  /// Where a trainer rank hosted here packs workers' shards
  /// (device_pack.hpp), matching its link: CUDA's on the link's device for
  /// nccl_link(), host memory for a fake world's; null: on the CPU.
  using packer_factory = std::function<std::shared_ptr<pack_device>(const comm_member& rank)>;

  explicit nccl_membership(link_factory make, packer_factory packers = {});
  ~nccl_membership(); ///< aborts every link

  /// Joins every member of `hosted` that `r` names. Empty when joined (a
  /// hosted member `r` leaves out gets no link), else why not. Thread-safe.
  std::string join(const nccl_rendezvous& r, const std::vector<comm_member>& hosted);
  /// Aborts and forgets every link (the node stops, or the coordinator
  /// closed the communicator); the epoch is kept, so a replay stays stale.
  void leave();

  /// The member's link in the current epoch; null when it is in none.
  std::shared_ptr<p2p_link> link(const comm_member& m) const;
  /// The member's link into trainer rank `producer`'s own communicator
  /// (root_layout) in the current epoch; null when there is none.
  std::shared_ptr<p2p_link> root_link(const comm_member& m, int producer) const;
  std::uint64_t epoch() const;
  /// The pack device on member `m`'s device (null: none): a trainer rank
  /// packs shards there, an engine worker the whole groups it lands.
  std::shared_ptr<pack_device> packer(const comm_member& m) const { return packers_ ? packers_(m) : nullptr; }
  /// Whether `m` holds a link from this very rendezvous (same epoch, id and
  /// members): a retried join that needs no answer but yes.
  bool joined(const nccl_rendezvous& r, const comm_member& m) const;

  /// The coordinator says `who` (a member, or a whole engine or rank) of
  /// `epoch` died. NCCL leaves a communicator with a dead member undefined,
  /// so every wait on this epoch's links aborts at its next poll (see
  /// dead_member_hooks) instead of waiting out its deadline; the next
  /// boundary rebuilds it without the dead. False, and nothing marked, when
  /// `epoch` is not the one held (stale news, or a newer epoch replaced it).
  bool mark_dead(std::uint64_t epoch, const std::string& who);
  /// Who died in the epoch held, as mark_dead named it (the first named); nullopt: nobody.
  std::optional<std::string> dead_member() const;

private:
  link_factory make_;
  packer_factory packers_;
  std::mutex join_mutex_; ///< joins one at a time; mutex_ guards what readers see
  nccl_rendezvous joined_; ///< the current epoch's rendezvous
  bool left_ = false;      ///< leave() since: the epoch is joined no more
  mutable std::mutex mutex_;
  std::uint64_t epoch_ = 0;
  std::string dead_; ///< the first member of epoch_ the coordinator said died; empty: none
  /// A link's communicator: the main one, or a producer rank's own (its rank).
  static constexpr int main_communicator = -1;
  using link_map = std::map<std::pair<comm_member, int>, std::shared_ptr<p2p_link>>; ///< (member, communicator)
  std::shared_ptr<p2p_link> find(const comm_member& m, int communicator) const;
  static void abort_all(const link_map& links);
  link_map links_;
};

/// Wait hooks whose dead_member asks `m` (while it lives): every NCCL wait
/// of the process's pullers and senders takes these, so a member the
/// coordinator saw die aborts them at once.
wait_hooks dead_member_hooks(const std::shared_ptr<nccl_membership>& m);

} // namespace rlsync::gpu
