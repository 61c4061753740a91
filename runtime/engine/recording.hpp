#pragma once
// Sharding plans by recording. make_plan runs the engine's own loader
// (loader.hpp) on recording views: shape and dtype, no data. Every
// copy_into becomes a plan entry (plan/plan.hpp). The plan is correct by
// construction because it comes from the loader; an op a strided view
// cannot express (a view() of non-contiguous elements) throws at plan time,
// naming the tensor and the op chain.
#include "runtime/config/model_config.hpp"
#include "runtime/engine/shard.hpp"
#include "runtime/engine/weight_view.hpp"
#include "runtime/plan/plan.hpp"

#include <memory>
#include <string>
#include <vector>

namespace rlsync::engine {

/// A recording view over a tensor of `type` and `shape` called `name`;
/// copy_into appends to `sink`.
weight_ptr recording_weight(std::string name, dtype type, std::vector<std::int64_t> shape,
                            std::shared_ptr<std::vector<plan::plan_entry>> sink);

/// The plan of worker `worker` of `tp` (experts placed whole when
/// `expert_parallel`) for a whole checkpoint of `c` in `source` dtype.
/// Checks that it writes every element of every parameter exactly once
/// (std::logic_error otherwise). Throws what the loader throws.
plan::worker_plan make_plan(const model_config& c, int tp, int worker, dtype source = dtype::bf16,
                            bool expert_parallel = false);
/// The plan for the tensors `sources` only (a trainer rank holding some
/// layers); ignored names are skipped. No coverage check.
plan::worker_plan make_plan(const model_config& c, int tp, int worker, const std::vector<tensor_spec>& sources,
                            bool expert_parallel = false);

/// The plan of the worker `shard` describes (any layout shard_spec::make
/// accepts, experts over dp x tp workers included) for the tensors
/// `sources`, checked for coverage when `check` (std::logic_error naming
/// the worker). plan.worker is the shard's tp worker.
plan::worker_plan make_plan(const shard_spec& shard, const std::vector<tensor_spec>& sources, bool check);

/// Problems with the coverage of the worker's parameters: elements written
/// twice or never. Empty when the plan fills every parameter exactly once.
std::vector<std::string> check_coverage(const plan::worker_plan& p, const model_config& c,
                                        bool expert_parallel = false);
std::vector<std::string> check_coverage(const plan::worker_plan& p, const shard_spec& shard);

} // namespace rlsync::engine
