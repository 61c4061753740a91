#include "actors/caf_puller.hpp"

#include "runtime/plan/groups.hpp"
#include "runtime/transfer/bucket.hpp"

#include "runtime/checkpoint/checkpoint.hpp"

#include <caf/scoped_actor.hpp>

#include <algorithm>

namespace rlsync {

caf_puller::caf_puller(caf::actor_system& sys, trainer_actor trainer, model_config model)
  : sys_(sys), trainer_(std::move(trainer)), model_(std::move(model)) {
  std::vector<std::uint64_t> group_bytes(plan::group_count(model_), 0);
  for (const auto& spec : llama_parameter_specs(model_, dtype::f32)) // f32: the largest element type
    group_bytes[plan::group_of(model_, spec.name)] += spec.bytes();
  auto largest = *std::max_element(group_bytes.begin(), group_bytes.end());
  group_deadline_ = std::chrono::milliseconds(2000 + largest / 10000);
}

transfer::pull_report caf_puller::pull(const transfer::pull_request& req, const transfer::group_sink& sink) {
  using transfer::transfer_error;
  using transfer::transfer_failure;
  transfer::pull_report report;
  report.engine = req.engine;
  report.worker = req.worker;
  report.version = req.version;
  auto t0 = transfer::clock::now();
  caf::scoped_actor self{sys_};
  const auto groups = plan::group_count(model_);
  for (std::uint32_t g = 0; g < groups; ++g) {
    auto left = std::min(group_deadline_, std::chrono::duration_cast<std::chrono::milliseconds>(
                                            req.deadline - transfer::clock::now()));
    if (left.count() <= 0)
      throw transfer_error(transfer_failure::timeout, "group " + std::to_string(g) + " of version "
                                                        + std::to_string(req.version) + ": deadline passed");
    std::optional<weight_bucket> bucket;
    caf::error failure;
    self->request(trainer_, left, pull_atom::value, req.version, g)
      .receive([&](weight_bucket& b) { bucket = std::move(b); }, [&](caf::error& e) { failure = std::move(e); });
    if (!bucket) {
      auto why = sys_.render(failure);
      if (is(failure, errc::version_gone))
        throw transfer_error(transfer_failure::version_unavailable, why);
      if (failure == caf::sec::request_timeout)
        throw transfer_error(transfer_failure::timeout, "group " + std::to_string(g) + ": " + why);
      throw transfer_error(transfer_failure::producer_failed, "trainer: " + why);
    }
    // A peer can lie: check the layout, then the bytes.
    if (auto why = check(*bucket); !why.empty())
      throw transfer_error(transfer_failure::producer_failed, "trainer sent a malformed bucket: " + why);
    if (bucket->version != req.version || bucket->group != g)
      throw transfer_error(transfer_failure::producer_failed, "trainer answered group " + std::to_string(g)
                                                                + " of version " + std::to_string(req.version)
                                                                + " with another");
    if (!transfer::verify_bucket(*bucket))
      throw transfer_error(transfer_failure::checksum_mismatch,
                           "group " + std::to_string(g) + " of version " + std::to_string(req.version));
    std::vector<tensor_view> views;
    try {
      views = transfer::whole_tensor_views(*bucket);
    } catch (const std::invalid_argument& e) {
      throw transfer_error(transfer_failure::producer_failed, e.what());
    }
    if (sink.on_full_group)
      sink.on_full_group(req.worker, g, views);
    report.bytes += bucket->data.size();
    ++report.groups;
  }
  report.duration = transfer::clock::now() - t0;
  return report;
}

} // namespace rlsync
