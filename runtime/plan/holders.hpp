#pragma once
// Holder choice for the M:N pull: which trainer rank (producer) serves each
// entry of one engine worker's sharding plan. Pure functions.
//
// The unit of holding is the tensor: a producer holds a list of tensor
// names (a pipeline stage holds its layers' tensors; replicas of one stage
// hold the same names; a block's experts may be split over ranks). For plan
// entry e of source tensor t in group g, the holders of t (the producers
// not excluded that hold t, sorted by rank) give
//
//     holder(e) = holders[(worker + g) % holders.size()]
//
// so the tensors of a group that share one set of holders come from one
// producer; the same worker rank of every replica picks the same producer
// (its sub-plan, hence its packing, is identical: packed once, served to
// every replica), and different worker ranks and groups spread over the
// holders. Excluding producers (those that failed a pull) re-plans their
// entries on the remaining holders.
#include "runtime/config/model_config.hpp"
#include "runtime/control/protocol.hpp"
#include "runtime/plan/plan.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace rlsync::plan {

/// Who holds which tensor, built once from the producers of a transfer.
class holder_index {
public:
  /// Throws std::invalid_argument when two producers have the same rank.
  explicit holder_index(const std::vector<producer_holding>& producers);

  std::size_t producer_count() const { return ranks_.size(); }
  std::uint32_t rank(std::size_t producer) const { return ranks_.at(producer); }

  /// The producer (index into the producers given) serving tensor `name` of
  /// group `group` to worker `worker`, skipping producers whose `excluded`
  /// flag is set (`excluded` is empty or has one flag per producer).
  /// Throws std::invalid_argument naming the tensor when no producer left
  /// holds it.
  std::size_t choose(const std::string& name, std::uint32_t group, int worker,
                     const std::vector<bool>& excluded = {}) const;

  /// How many producers not excluded hold tensor `name`.
  std::size_t holders_left(const std::string& name, const std::vector<bool>& excluded = {}) const;

  /// "rank 0 (incarnation 3), rank 2 (incarnation 1)" for the producers
  /// whose flag is set in `which`.
  std::string describe(const std::vector<bool>& which) const;

private:
  std::vector<std::uint32_t> ranks_;
  std::vector<std::uint64_t> incarnations_;
  /// Tensor name -> holders, indices into the producers, sorted by rank.
  std::unordered_map<std::string, std::vector<std::size_t>> holders_;
};

/// The holder choice for one worker's plan.
struct holder_choice {
  /// Per plan entry: the producer (index into the producers) serving it.
  std::vector<std::size_t> holder;
  /// Per producer: the indices of the plan entries it serves, ascending
  /// (plan order); empty when it serves none.
  std::vector<std::vector<std::size_t>> entries;
};

/// Chooses a holder for every entry of `p` (see the top of this file).
/// Throws std::invalid_argument naming the tensor for an entry that no
/// producer left holds, and what plan::group_of throws for a source in no group.
holder_choice choose_holders(const model_config& c, const worker_plan& p, const holder_index& holders,
                             const std::vector<bool>& excluded = {});

/// The same for the entries of `p` listed in `only` (ascending indices);
/// the other entries get no holder (holder[i] == producer_count()).
holder_choice choose_holders(const model_config& c, const worker_plan& p, const holder_index& holders,
                             const std::vector<std::size_t>& only, const std::vector<bool>& excluded);

/// The plan made of `p`'s entries at `indices` (in that order), same tp and worker.
std::shared_ptr<const worker_plan> sub_plan(const worker_plan& p, const std::vector<std::size_t>& indices);

} // namespace rlsync::plan
