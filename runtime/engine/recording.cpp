#include "runtime/engine/recording.hpp"

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/loader.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>

namespace rlsync::engine {

using plan::plan_entry;
using plan::strided;

namespace {

class recording_view final : public weight_view {
public:
  recording_view(std::shared_ptr<const std::string> name, dtype type, std::vector<std::int64_t> source_shape,
                 strided geometry, std::vector<std::string> ops, std::shared_ptr<std::vector<plan_entry>> sink)
      : name_(std::move(name)), type_(type), source_shape_(std::move(source_shape)), geometry_(std::move(geometry)),
        ops_(std::move(ops)), sink_(std::move(sink)) {}

  const std::string& name() const override { return *name_; }
  dtype type() const override { return type_; }
  const std::vector<std::int64_t>& shape() const override { return geometry_.shape; }

  weight_ptr narrow(int dim, std::int64_t start, std::int64_t length) const override {
    return derive(plan::narrow(geometry_, dim, start, length),
                  "narrow(" + std::to_string(dim) + ", " + std::to_string(start) + ", " + std::to_string(length) + ")");
  }

  weight_ptr transpose(int d0, int d1) const override {
    return derive(plan::transpose(geometry_, d0, d1),
                  "transpose(" + std::to_string(d0) + ", " + std::to_string(d1) + ")");
  }

  weight_ptr view(std::vector<std::int64_t> shape) const override {
    const std::string op = "view(" + shape_string(shape) + ")";
    auto g = plan::reshape(geometry_, std::move(shape));
    if (!g)
      throw std::logic_error("sharding plan: cannot record " + plan::op_chain(*name_, ops_) + "." + op
                             + ": the viewed elements (shape " + shape_string(geometry_.shape) + ", strides "
                             + shape_string(geometry_.strides)
                             + ") are not evenly strided, so no strided view of the source expresses the result; "
                               "the loader must not reshape a non-contiguous slice");
    return derive(std::move(*g), op);
  }

  void copy_into(parameter& dst, std::int64_t dst_offset) const override {
    const std::int64_t n = geometry_.numel();
    if (dst_offset < 0 || dst_offset + n > dst.numel())
      throw std::out_of_range("sharding plan: " + plan::op_chain(*name_, ops_) + " -> '" + dst.name + "': elements ["
                              + std::to_string(dst_offset) + ", " + std::to_string(dst_offset + n)
                              + ") outside its " + std::to_string(dst.numel()));
    sink_->push_back(plan_entry{*name_, type_, source_shape_, ops_, geometry_, dst.name, dst_offset});
  }

private:
  weight_ptr derive(strided g, std::string op) const {
    auto ops = ops_;
    ops.push_back(std::move(op));
    return std::make_shared<recording_view>(name_, type_, source_shape_, std::move(g), std::move(ops), sink_);
  }

  std::shared_ptr<const std::string> name_;
  dtype type_;
  std::vector<std::int64_t> source_shape_;
  strided geometry_;
  std::vector<std::string> ops_;
  std::shared_ptr<std::vector<plan_entry>> sink_;
};

} // namespace

weight_ptr recording_weight(std::string name, dtype type, std::vector<std::int64_t> shape,
                            std::shared_ptr<std::vector<plan_entry>> sink) {
  auto geometry = strided::dense(shape);
  return std::make_shared<recording_view>(std::make_shared<const std::string>(std::move(name)), type,
                                          std::move(shape), std::move(geometry), std::vector<std::string>{},
                                          std::move(sink));
}

plan::worker_plan make_plan(const shard_spec& shard, const std::vector<tensor_spec>& sources, bool check) {
  // Shapes only: the storage dtype plays no part in a plan.
  worker_weights shapes(shard, dtype::f32, /*allocate=*/false);
  auto sink = std::make_shared<std::vector<plan_entry>>();
  for (const auto& spec : sources)
    if (!ignored_weight(shard.config, spec.name))
      load_weight(*recording_weight(spec.name, spec.type, spec.shape, sink), shapes);
  plan::worker_plan p;
  p.tp = shard.tp;
  p.worker = shard.worker;
  p.entries = std::move(*sink);
  if (check) {
    auto problems = check_coverage(p, shard);
    if (!problems.empty()) {
      std::string all;
      for (const auto& e : problems)
        all += "\n  " + e;
      throw std::logic_error("sharding plan for worker " + std::to_string(shard.worker) + " of "
                             + std::to_string(shard.tp)
                             + (shard.dp > 1 ? " (data-parallel rank " + std::to_string(shard.dp_rank) + ")" : "")
                             + " does not fill the engine's parameters:" + all);
    }
  }
  return p;
}

plan::worker_plan make_plan(const model_config& c, int tp, int worker, const std::vector<tensor_spec>& sources,
                            bool expert_parallel) {
  return make_plan(shard_spec::make(c, tp, worker, expert_parallel), sources, false);
}

plan::worker_plan make_plan(const model_config& c, int tp, int worker, dtype source, bool expert_parallel) {
  return make_plan(shard_spec::make(c, tp, worker, expert_parallel), llama_parameter_specs(c, source), true);
}

std::vector<std::string> check_coverage(const plan::worker_plan& p, const model_config& c, bool expert_parallel) {
  return check_coverage(p, shard_spec::make(c, p.tp, p.worker, expert_parallel));
}

std::vector<std::string> check_coverage(const plan::worker_plan& p, const shard_spec& shard) {
  worker_weights shapes(shard, dtype::f32, /*allocate=*/false);
  std::map<std::string, std::vector<std::pair<std::int64_t, std::int64_t>>> ranges; // param -> [begin, end)
  std::vector<std::string> problems;
  for (const auto& e : p.entries) {
    if (!shapes.find(e.param))
      problems.push_back(e.describe() + ": no such parameter");
    else
      ranges[e.param].push_back({e.dst_offset, e.dst_offset + e.numel()});
  }
  for (const auto& param : shapes.params()) {
    auto& r = ranges[param.name];
    std::sort(r.begin(), r.end());
    std::int64_t covered = 0;
    for (const auto& [begin, end] : r) {
      if (begin > covered)
        problems.push_back(param.name + ": elements [" + std::to_string(covered) + ", " + std::to_string(begin)
                           + ") never written");
      else if (begin < covered)
        problems.push_back(param.name + ": elements [" + std::to_string(begin) + ", "
                           + std::to_string(std::min(end, covered)) + ") written twice");
      covered = std::max(covered, end);
    }
    if (covered < param.numel())
      problems.push_back(param.name + ": elements [" + std::to_string(covered) + ", "
                         + std::to_string(param.numel()) + ") never written");
  }
  return problems;
}

} // namespace rlsync::engine
