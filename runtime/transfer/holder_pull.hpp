#pragma once
// The M:N pull: one engine's workers [0, tp) receive a version from several
// trainer ranks (producers), each holding some tensors, through each
// producer's own weight_puller (any backend).
//
// Per worker, the holder choice (plan/holders.hpp) splits the worker's plan
// into one sub-plan per producer (entries in plan order). Each sub-plan is
// registered on its producer's puller under the engine's (engine, worker)
// (again only when it changed), and one thread per producer with a
// non-empty sub-plan pulls it, so the producers pack in parallel. A group
// served whole by one producer passes straight to the sink (no copy); the
// parts of a group served by several are copied into the group's packed
// bytes in plan order and handed on once the last part is in. The sink
// sees each group once, complete, in the order groups complete (not group
// order: the engine applies a group wherever it lands), and never two calls
// for one worker at once. Memory: besides the backends' own buffers, at most
// the worker's bytes of the groups split over producers whose parts are
// not all in yet (bounded by the worker's plan bytes).
//
// Broadcast: every producer a worker uses streams its full groups (the
// backends' broadcast stream has no plan); the pull keeps each tensor from
// the producer chosen for it (the same rule, by tensor) and drops the rest,
// so each tensor reaches the sink once. Reported bytes are those of the
// tensors kept.
//
// Retry. A producer that fails mid-pull with a timeout, cancellation,
// producer failure, missing registration or a version it does not hold is
// excluded for that worker, and the entries it had not delivered are
// re-planned on the remaining holders and pulled from them (groups already
// delivered stay). A checksum mismatch is not retried: bytes that differ
// from what was packed are reported, and the update is void, as with one
// producer. So that a retry has time left, a producer whose every entry has
// another holder gets half the remaining time; one that is the last holder
// of something gets all of it. No holder left: a transfer_error (the last
// failure's kind) naming the tensor and every producer tried with its error.
#include "runtime/config/model_config.hpp"
#include "runtime/control/protocol.hpp"
#include "runtime/plan/plan.hpp"
#include "runtime/transfer/puller.hpp"

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace rlsync::transfer {

/// One producer as an engine's M:N pull sees it: the trainer rank, its
/// puller, and which sub-plan is registered on it for each worker.
class producer_link {
public:
  producer_link(producer_holding holding, std::shared_ptr<weight_puller> puller);
  /// Forgets the engine's registrations on the puller.
  void unregister(const std::string& engine);

  const producer_holding& holding() const { return holding_; }
  weight_puller& puller() const { return *puller_; }
  /// Registers the entries `indices` of `plan` as the worker's sub-plan
  /// under `engine`, unless exactly those are registered already.
  void ensure_registered(const std::string& engine, const plan::worker_plan& plan,
                         const std::vector<std::size_t>& indices);

private:
  producer_holding holding_;
  std::shared_ptr<weight_puller> puller_;
  std::mutex mutex_;
  std::map<int, std::vector<std::size_t>> registered_; // worker -> entry indices of its plan
};

/// An engine's links, by trainer rank.
using producer_links = std::map<std::uint32_t, std::shared_ptr<producer_link>>;

/// The links for `holdings` (a transfer order's trainer ranks, in order),
/// each behind the puller of its rank's current incarnation: a kept link is
/// reused; a rank that is new, or holds anew, gets a link to
/// `make_puller(i)`'s puller, and the link it replaces forgets `engine`'s
/// registrations. Throws std::runtime_error naming the rank when no puller
/// is made (make_puller threw or gave none); `links` then holds no link
/// for that rank that is not whole.
std::vector<std::shared_ptr<producer_link>>
links_for(producer_links& links, const std::vector<producer_holding>& holdings, const std::string& engine,
          const std::function<std::shared_ptr<weight_puller>(std::size_t)>& make_puller);

struct holder_pull_request {
  std::string engine;
  std::uint64_t version = 0;
  transfer_mode mode = transfer_mode::sharded;
  clock::time_point deadline;
};

/// Pulls `req.version` for the workers of `plans` (index = worker) from
/// `producers` (see the top of this file) and sums the workers' reports as
/// pull_engine does. Throws transfer_error when a worker cannot complete,
/// std::invalid_argument for an empty producer list or a plan that does not
/// fit the model, and whatever the sink throws.
transfer_report pull_from_holders(const model_config& c, const holder_pull_request& req,
                                  const std::vector<std::shared_ptr<const plan::worker_plan>>& plans,
                                  const std::vector<std::shared_ptr<producer_link>>& producers,
                                  const group_sink& sink);

} // namespace rlsync::transfer
