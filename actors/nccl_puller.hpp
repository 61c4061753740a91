#pragma once
// The consumer side of the nccl backend: each engine worker is a member of
// the current NCCL communicator (its link), and asks the trainer (rank) for
// every group of a version (nccl_pull_atom). The trainer queues the group's
// bytes for its sender (gpu/nccl_sender.hpp) and answers with their size
// and checksum; the worker posts the matching receive, waits for it against
// the group's deadline (never blindly: comm_wait.hpp), copies the bytes out
// of its device staging and verifies them. For an engine serving from a
// device, each group also lands in its device copy from the staging
// (land_on_device.hpp): a sharded group's runs as they lie, a whole group
// packed there by the worker's plan first.
//
//   broadcast  the trainer sends the group whole; the worker slices whole
//              tensors as the CAF path does;
//   broadcast, collective (the baseline, vLLM's packed NCCL broadcast; with
//              several trainer ranks on the rank's own communicator, one
//              rank after another): the worker asks once for the version
//              (nccl_broadcast_atom) and joins the rank's broadcast of every
//              group, in the order its manifest gives, with every other
//              member of the communicator; each bucket carries its checksum
//              after its bytes. The rank starts it once every worker asked
//              (it answers "wait" until then); if they do not all ask within
//              its join window (a round that leaves members out), or the
//              version was broadcast already, the worker pulls the groups
//              point to point as without it. A member that stops during the
//              broadcast holds the others up to their deadlines, which is
//              why it is the baseline;
//   sharded    the worker registers its plan with the trainer once per
//              communicator and trainer (nccl_plan_atom, answered with the
//              plan's digest); the trainer packs the worker's entries of
//              each group (≈ 1/tp of it) and sends only those, which the
//              worker hands on packed (or stores in place).
//
// A worker that is in no communicator (it joined after the last boundary)
// fails its pull; so does any failure of the link, which is then aborted:
// NCCL cannot mend a communicator, the coordinator rebuilds it at the next
// boundary. A trainer that lies (another epoch, a root that is no
// producer, more bytes than the largest group or the staging, a sharded
// group of another size than the plan packs) is refused before a receive
// is posted.
#include "actors/caf_puller.hpp"
#include "actors/interfaces.hpp"
#include "actors/land_on_device.hpp"
#include "gpu/device_pack.hpp"
#include "gpu/nccl_link.hpp"
#include "runtime/config/model_config.hpp"
#include "runtime/plan/grouped_plan.hpp"
#include "runtime/transfer/puller.hpp"

#include <caf/actor_system.hpp>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace rlsync {

class nccl_puller final : public transfer::weight_puller {
public:
  /// The worker's link to the current communicator; null when it is in none.
  using link_of = std::function<std::shared_ptr<gpu::p2p_link>(const std::string& engine, int worker)>;

  /// Where the worker's link's device packs (nccl_membership::packer); null: nowhere.
  using packer_of = std::function<std::shared_ptr<gpu::pack_device>(const std::string& engine, int worker)>;

  /// `trainer()` is asked at each pull (a node that rejoins a restarted
  /// head swaps it); `groups`: those the trainer (rank) holds, none: all;
  /// `hooks`: comm_wait's world (tests); `collective`: broadcast mode joins
  /// the rank's collective broadcast instead of pulling groups point to
  /// point (every member of the communicator must pull each version);
  /// `packers`: where a whole group received for an engine on a device is
  /// packed to land in its copy (none: whole groups are not landed);
  /// `root_links`: with several trainer ranks, the worker's link into this
  /// rank's own communicator, where its collective runs (null, or none
  /// given: the collective runs on `links`').
  nccl_puller(caf::actor_system& sys, std::function<trainer_actor()> trainer, model_config model, link_of links,
              std::optional<std::vector<std::uint32_t>> groups = std::nullopt, gpu::wait_hooks hooks = {},
              bool collective = false, packer_of packers = {}, link_of root_links = {});

  /// Keeps the worker's plan: sharded pulls send it, whole groups landed
  /// on an engine's device are packed by it.
  /// Throws std::invalid_argument for a plan that does not fit the model.
  void register_worker(const std::string& engine, std::shared_ptr<const plan::worker_plan> plan) override;
  void unregister_engine(const std::string& engine) override;
  /// Blocks the calling thread (a pulling thread, never an actor's handler).
  transfer::pull_report pull(const transfer::pull_request& req, const transfer::group_sink& sink) override;
  bool lands_on_device() const override { return true; }
  /// The collective: a worker pulling from several ranks takes their
  /// broadcasts one rank after another, in rank order, so that every
  /// device runs the ranks' communicators in the same order (NCCL's rule
  /// for several communicators; else two workers could each wait in
  /// another communicator for the other).
  bool needs_rank_order(transfer_mode mode) const override {
    return collective_ && mode == transfer_mode::broadcast;
  }

private:
  /// A worker's plan, and where it was last registered.
  struct registration {
    std::shared_ptr<const plan::grouped_plan> plan;
    std::vector<std::uint8_t> encoded; ///< the ucx wire's plan encoding
    std::uint64_t digest = 0;          ///< checksum64 of `encoded`
    caf::actor_addr trainer;           ///< registered with this trainer (rank) ...
    std::uint64_t epoch = 0;           ///< ... in this communicator
  };
  /// The worker's plan and its digest, registered with `trainer` in `epoch`
  /// (asking it now unless it was already). Throws transfer_error.
  std::pair<std::shared_ptr<const plan::grouped_plan>, std::uint64_t>
  registered_plan(caf::scoped_actor& self, const trainer_actor& trainer, const transfer::pull_request& req,
                  std::uint64_t epoch);

  /// How `req`'s worker lands whole groups on its engine's device, decided
  /// once per pull; empty when they are not landed.
  whole_group_landing landing_of(const transfer::pull_request& req, const transfer::group_sink& sink);
  /// A whole group received for `req`'s worker: delivered from `bucket`,
  /// then landed from the link's staging, where its `n` bytes begin at
  /// `offset` (under the turn).
  void deliver_and_land(const transfer::pull_request& req, std::uint32_t g, const weight_bucket& bucket,
                        gpu::p2p_link& link, std::size_t offset, std::size_t n, const whole_group_landing& landing,
                        const transfer::group_sink& sink, transfer::pull_report& report);

  /// Broadcast mode, collective: the whole version through the rank's
  /// broadcasts; false when the rank says to pull it point to point.
  bool pull_collective(const transfer::pull_request& req, const transfer::group_sink& sink, gpu::p2p_link& link,
                       transfer::pull_report& report);
  /// The manifest's broadcasts, broadcast k carrying `spans[k]` whole groups back to back.
  void receive_broadcasts(const transfer::pull_request& req, const nccl_manifest& m,
                          const std::vector<std::size_t>& spans, gpu::p2p_link& link,
                          const transfer::group_sink& sink, transfer::pull_report& report);

  caf::actor_system& sys_;
  std::function<trainer_actor()> trainer_;
  model_config model_;
  group_tensors expected_; ///< each group's tensors in model_: what a whole group may hold
  link_of links_;
  link_of root_links_;
  std::vector<std::uint32_t> groups_; ///< pulled, in order
  gpu::wait_hooks hooks_;
  std::chrono::milliseconds group_deadline_;
  std::uint64_t largest_group_bytes_ = 0; ///< as f32: what no group may exceed
  bool collective_ = false;
  packer_of packers_;
  mutable std::mutex mutex_; ///< pulls of several workers run at once
  std::map<std::pair<std::string, int>, registration> plans_;
  worker_scratches scratches_; ///< where whole groups are packed to land (land_on_device.hpp)
};

} // namespace rlsync
