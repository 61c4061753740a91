#pragma once
// The data plane of last resort: weights through CAF itself. Each engine
// worker asks the trainer actor (rank) for every group of a version it
// holds (full tensors, one checksummed bucket per group) and slices them
// with its own loader, as in broadcast mode, whatever mode the pull names
// (the sink's on_full_group receives them). Works wherever the middleman
// reaches: `rlsync node` uses it for remote engines when the head runs no
// UCX producer (transfer.backend local; ucx pulls over UCX,
// ucx_transfer.hpp; cuda_ipc through the device, ipc_puller.hpp).
// Runs at CAF's ~0.6 GB/s and moves tp times the bytes of a sharded pull.
#include "actors/interfaces.hpp"
#include "runtime/config/model_config.hpp"
#include "runtime/transfer/puller.hpp"

#include <caf/actor_system.hpp>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace rlsync {

/// Each group's tensors in a model (name and shape), built once per puller:
/// what a trainer's whole group may hold.
class group_tensors {
public:
  explicit group_tensors(const model_config& model);
  /// Why `tensors` are not tensors of group `group`: an unknown or repeated
  /// name, another group's tensor, or a shape other than the model's; empty
  /// when each is one of the group's, once (a rank may hold part of a group:
  /// finish_update checks that everything arrived).
  std::string problem(std::uint32_t group, const std::vector<tensor_view>& tensors) const;

private:
  std::vector<std::map<std::string, std::vector<std::int64_t>>> shapes_; ///< per group: name -> shape
};

class caf_puller final : public transfer::weight_puller {
public:
  /// `trainer()` is asked at each pull (a node that rejoins a restarted
  /// head swaps it); `groups`: the groups the trainer (rank) holds, which a
  /// pull streams; none: every group of the model.
  /// `groups_in_flight` (transfer.groups_in_flight, at least 1): groups
  /// asked for before the first of them arrives.
  caf_puller(caf::actor_system& sys, std::function<trainer_actor()> trainer, model_config model,
             std::optional<std::vector<std::uint32_t>> groups = std::nullopt, std::size_t groups_in_flight = 2);

  /// No plans needed: the trainer sends whole groups, each worker slices them.
  void register_worker(const std::string&, std::shared_ptr<const plan::worker_plan>) override {}
  void unregister_engine(const std::string&) override {}
  /// Blocks the calling thread (a pulling thread, never an actor's handler).
  transfer::pull_report pull(const transfer::pull_request& req, const transfer::group_sink& sink) override;

private:
  caf::actor_system& sys_;
  std::function<trainer_actor()> trainer_;
  model_config model_;
  group_tensors expected_; ///< each group's tensors in model_: what a whole group may hold
  std::vector<std::uint32_t> groups_; ///< pulled, in order
  std::size_t groups_in_flight_;
  /// How long one group may take. A request to a remote actor whose node is
  /// gone only ever times out (CAF 0.17 answers request_timeout, never
  /// request_receiver_down), so each group gets its own, shorter deadline:
  /// 2 s plus the largest group at 10 MB/s.
  std::chrono::milliseconds group_deadline_;
};

/// The groups holding `held` (tensor names, a trainer rank's), ascending:
/// what a whole-group pull from that rank streams. Unknown names are skipped.
std::vector<std::uint32_t> groups_holding(const model_config& model, const std::vector<std::string>& held);

/// `groups`, or every group of `model` when none are given.
std::vector<std::uint32_t> groups_or_all(const model_config& model, std::optional<std::vector<std::uint32_t>> groups);

/// 2 s plus the model's largest group (as f32) at 10 MB/s: how long one
/// group may take to arrive whole-tensor from a trainer.
std::chrono::milliseconds whole_group_deadline(const model_config& model);

/// What one group of a whole-group pull may wait for: the group deadline or
/// what is left of the pull's, whichever is sooner. Throws transfer_error
/// (timeout) when the pull's deadline has passed.
std::chrono::milliseconds group_wait(const transfer::pull_request& req, std::uint32_t group,
                                     std::chrono::milliseconds group_deadline);

/// Turns a trainer's refusal of group `group` into the transfer_error it
/// means (the version gone, a timeout, a producer failure). Never returns.
[[noreturn]] void throw_trainer_refusal(caf::actor_system& sys, const caf::error& failure, std::uint32_t group);

/// Checks a whole-group bucket a trainer sent for group `group` of
/// `req.version` (layout, identity, checksum, and that its tensors are the
/// group's in the model's shapes, as `expected` has them: a peer can lie), hands its tensors to
/// sink.on_full_group and adds it to `report`. Returns the tensors handed on
/// (views into `bucket`). Throws transfer_error.
std::vector<tensor_view> deliver_whole_group(const group_tensors& expected, const transfer::pull_request& req,
                                             std::uint32_t group,
                                             const weight_bucket& bucket, const transfer::group_sink& sink,
                                             transfer::pull_report& report);

} // namespace rlsync
