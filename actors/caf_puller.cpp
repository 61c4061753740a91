#include "actors/caf_puller.hpp"

#include "runtime/plan/groups.hpp"
#include "runtime/transfer/bucket.hpp"

#include "runtime/checkpoint/checkpoint.hpp"

#include <caf/scoped_actor.hpp>

#include "runtime/base/printable.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <set>

namespace rlsync {

using transfer::transfer_error;
using transfer::transfer_failure;

std::vector<std::uint32_t> groups_holding(const model_config& model, const std::vector<std::string>& held) {
  const std::set<std::string> names(held.begin(), held.end());
  std::set<std::uint32_t> groups;
  for (const auto& spec : llama_parameter_specs(model, dtype::f32))
    if (names.count(spec.name))
      groups.insert(plan::group_of(model, spec.name));
  return {groups.begin(), groups.end()};
}

std::vector<std::uint32_t> groups_or_all(const model_config& model, std::optional<std::vector<std::uint32_t>> groups) {
  if (groups)
    return std::move(*groups);
  std::vector<std::uint32_t> all(plan::group_count(model));
  for (std::uint32_t g = 0; g < all.size(); ++g)
    all[g] = g;
  return all;
}

std::chrono::milliseconds whole_group_deadline(const model_config& model) {
  // f32: the largest element type.
  const auto largest = plan::largest_group_bytes(model, llama_parameter_specs(model, dtype::f32), dtype::f32);
  return std::chrono::milliseconds(2000 + largest / 10000);
}

std::chrono::milliseconds group_wait(const transfer::pull_request& req, std::uint32_t group,
                                     std::chrono::milliseconds group_deadline) {
  auto left = std::min(group_deadline, std::chrono::duration_cast<std::chrono::milliseconds>(
                                         req.deadline - transfer::clock::now()));
  if (left.count() <= 0)
    throw transfer_error(transfer_failure::timeout, "group " + std::to_string(group) + " of version "
                                                      + std::to_string(req.version) + ": deadline passed");
  return left;
}

void throw_trainer_refusal(caf::actor_system& sys, const caf::error& failure, std::uint32_t group) {
  auto why = sys.render(failure);
  if (is(failure, errc::version_gone))
    throw transfer_error(transfer_failure::version_unavailable, why);
  if (failure == caf::sec::request_timeout)
    throw transfer_error(transfer_failure::timeout, "group " + std::to_string(group) + ": " + why);
  throw transfer_error(transfer_failure::producer_failed, "trainer: " + why);
}

group_tensors::group_tensors(const model_config& model) : shapes_(plan::group_count(model)) {
  for (const auto& spec : llama_parameter_specs(model, dtype::f32))
    shapes_.at(plan::group_of(model, spec.name)).emplace(spec.name, spec.shape);
}

std::string group_tensors::problem(std::uint32_t g, const std::vector<tensor_view>& tensors) const {
  if (g >= shapes_.size())
    return "group " + std::to_string(g) + ": the model has " + std::to_string(shapes_.size()) + " groups";
  const auto& expected = shapes_[g];
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    auto it = expected.find(t.name);
    if (it == expected.end())
      return "'" + printable(t.name) + "' is not a tensor of group " + std::to_string(g) + " of the model";
    if (!seen.insert(t.name).second)
      return "'" + printable(t.name) + "' comes twice";
    if (t.shape != it->second)
      return "'" + printable(t.name) + "' has shape " + shape_string(t.shape) + ", the model's is "
             + shape_string(it->second);
  }
  return {};
}

std::vector<tensor_view> deliver_whole_group(const group_tensors& expected, const transfer::pull_request& req, std::uint32_t g,
                                             const weight_bucket& bucket, const transfer::group_sink& sink,
                                             transfer::pull_report& report) {
  if (auto why = check(bucket); !why.empty())
    throw transfer_error(transfer_failure::producer_failed, "trainer sent a malformed bucket: " + why);
  if (bucket.version != req.version || bucket.group != g)
    throw transfer_error(transfer_failure::producer_failed, "trainer answered group " + std::to_string(g)
                                                              + " of version " + std::to_string(req.version)
                                                              + " with another");
  if (!transfer::verify_bucket(bucket))
    throw transfer_error(transfer_failure::checksum_mismatch, "group " + std::to_string(g) + " of version "
                                                                + std::to_string(req.version)
                                                                + ": the trainer's bytes do not match their checksum");
  std::vector<tensor_view> views;
  try {
    views = transfer::whole_tensor_views(bucket);
  } catch (const std::invalid_argument& e) {
    throw transfer_error(transfer_failure::producer_failed, e.what());
  }
  if (auto why = expected.problem(g, views); !why.empty())
    throw transfer_error(transfer_failure::producer_failed, "trainer sent group " + std::to_string(g) + " of version "
                                                              + std::to_string(req.version) + " with " + why);
  if (sink.on_full_group)
    sink.on_full_group(req.worker, g, views);
  report.bytes += bucket.data.size();
  ++report.groups;
  return views;
}

caf_puller::caf_puller(caf::actor_system& sys, std::function<trainer_actor()> trainer, model_config model,
                       std::optional<std::vector<std::uint32_t>> groups, std::size_t groups_in_flight)
  : sys_(sys), trainer_(std::move(trainer)), model_(std::move(model)), expected_(model_), groups_(groups_or_all(model_, std::move(groups))),
    groups_in_flight_(std::max<std::size_t>(1, groups_in_flight)), group_deadline_(whole_group_deadline(model_)) {}

transfer::pull_report caf_puller::pull(const transfer::pull_request& req, const transfer::group_sink& sink) {
  transfer::pull_report report;
  report.engine = req.engine;
  report.worker = req.worker;
  report.version = req.version;
  auto t0 = transfer::clock::now();
  caf::scoped_actor self{sys_};
  const trainer_actor trainer = trainer_();
  // Up to groups_in_flight asked ahead; the answers are taken in order
  // (a blocking receive for one answer leaves the others in the mailbox).
  // A group asked k places ahead may wait for the k before it as well.
  using handle = decltype(self->request(trainer, std::chrono::milliseconds(1), pull_atom::value, req.version,
                                        std::uint32_t{0}));
  std::deque<std::pair<std::uint32_t, handle>> asked;
  std::size_t next = 0;
  const std::string who = "engine '" + req.engine + "' worker " + std::to_string(req.worker);
  while (next < groups_.size() || !asked.empty()) {
    // Answers still due die with `self`: leaving here holds nothing.
    transfer::stop_if_abandoned(sink, who, report.groups, groups_.size());
    while (next < groups_.size() && asked.size() < groups_in_flight_) {
      const std::uint32_t g = groups_[next++];
      const auto left = group_wait(req, g, group_deadline_ * static_cast<int>(asked.size() + 1));
      asked.emplace_back(g, self->request(trainer, left, pull_atom::value, req.version, g));
    }
    const std::uint32_t g = asked.front().first;
    std::optional<weight_bucket> bucket;
    caf::error failure;
    asked.front().second.receive([&](weight_bucket& b) { bucket = std::move(b); },
                                 [&](caf::error& e) { failure = std::move(e); });
    asked.pop_front();
    if (!bucket)
      throw_trainer_refusal(sys_, failure, g); // the answers still due die with `self`
    deliver_whole_group(expected_, req, g, *bucket, sink, report);
  }
  report.duration = transfer::clock::now() - t0;
  return report;
}

} // namespace rlsync
