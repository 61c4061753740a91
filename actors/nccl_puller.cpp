#include "actors/nccl_puller.hpp"

#include "actors/caf_puller.hpp"
#include "actors/type_ids.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/plan/groups.hpp"

#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <mutex>
#include <stdexcept>

namespace rlsync {

using transfer::transfer_error;
using transfer::transfer_failure;

nccl_puller::nccl_puller(caf::actor_system& sys, std::function<trainer_actor()> trainer, model_config model,
                         link_of links, std::optional<std::vector<std::uint32_t>> groups, gpu::wait_hooks hooks)
  : sys_(sys), trainer_(std::move(trainer)), model_(std::move(model)), links_(std::move(links)),
    groups_(groups_or_all(model_, std::move(groups))), hooks_(std::move(hooks)),
    group_deadline_(whole_group_deadline(model_)),
    largest_group_bytes_(plan::largest_group_bytes(model_, llama_parameter_specs(model_, dtype::f32), dtype::f32)) {
  if (!links_)
    throw std::invalid_argument("an nccl puller without links");
}

namespace {

/// A failed wait: past the deadline is a timeout, anything else the
/// communicator's failure (the link is aborted either way).
[[noreturn]] void throw_wait_failure(const gpu::wait_outcome& out) {
  throw transfer_error(out.result == gpu::wait_outcome::kind::deadline ? transfer_failure::timeout
                                                                       : transfer_failure::producer_failed,
                       "nccl: " + out.why);
}

} // namespace

transfer::pull_report nccl_puller::pull(const transfer::pull_request& req, const transfer::group_sink& sink) {
  transfer::pull_report report;
  report.engine = req.engine;
  report.worker = req.worker;
  report.version = req.version;
  const auto t0 = transfer::clock::now();
  const auto me = "engine " + printable(req.engine) + " worker " + std::to_string(req.worker);
  auto link = links_(req.engine, req.worker);
  if (!link)
    throw transfer_error(transfer_failure::not_registered,
                         "nccl: " + me + " is in no communicator yet: it joins at the next sync boundary");
  const auto& layout = link->layout();
  {
    // Under the turn: polled by two pulls at once, one could see (and
    // abort) the other's exchange.
    std::unique_lock<std::timed_mutex> turn(link->turn(), std::defer_lock);
    if (!turn.try_lock_until(req.deadline))
      throw transfer_error(transfer_failure::timeout, "nccl: " + me + ": the link stayed busy past the deadline");
    if (auto init = gpu::wait_for(*link, req.deadline, "init of epoch " + std::to_string(layout.epoch), hooks_);
        !init.ok())
      throw_wait_failure(init);
  }
  auto refuse = [&](const std::string& why) {
    link->abort(); // nothing was posted, but a lying trainer ends this communicator for us
    return transfer_error(transfer_failure::producer_failed, "trainer over nccl: " + why);
  };
  caf::scoped_actor self{sys_};
  const trainer_actor trainer = trainer_();
  nccl_pull ask;
  ask.engine = req.engine;
  ask.worker = req.worker;
  ask.version = req.version;
  ask.epoch = layout.epoch;
  for (const std::uint32_t g : groups_) {
    const auto left = group_wait(req, g, group_deadline_);
    const auto until = transfer::clock::now() + left; // the ask, the receive and the read together
    const auto what = "group " + std::to_string(g) + " of version " + std::to_string(req.version) + " to " + me;
    // One exchange on the link at a time: this worker may pull from other trainer ranks at once.
    std::unique_lock<std::timed_mutex> turn(link->turn(), std::defer_lock);
    if (!turn.try_lock_until(until))
      throw transfer_error(transfer_failure::timeout, "nccl: " + what + ": the link stayed busy past the deadline");
    // What is left after waiting for the turn: the trainer must not be
    // promised more than this worker waits, or its send outlives the receive.
    const auto rest = std::chrono::duration_cast<std::chrono::milliseconds>(until - transfer::clock::now());
    if (rest.count() <= 0)
      throw transfer_error(transfer_failure::timeout, "nccl: " + what + ": the deadline passed waiting for the link");
    ask.group = g;
    ask.wait_ms = static_cast<std::uint32_t>(std::min<std::int64_t>(rest.count(), 600'000));
    std::optional<nccl_chunk> chunk;
    caf::error failure;
    self->request(trainer, rest, nccl_pull_atom::value, ask)
      .receive([&](nccl_chunk& c) { chunk = std::move(c); }, [&](caf::error& e) { failure = std::move(e); });
    if (!chunk) {
      // Unanswered, the send may be queued all the same: a later receive
      // would take its bytes for another group's. The link cannot be trusted.
      if (failure == caf::sec::request_timeout)
        link->abort();
      throw_trainer_refusal(sys_, failure, g);
    }
    if (chunk->epoch != layout.epoch)
      throw refuse("group " + std::to_string(g) + " on epoch " + std::to_string(chunk->epoch) + ", this worker is in "
                   + std::to_string(layout.epoch));
    if (chunk->root < 0 || chunk->root >= layout.size() || !layout.members[static_cast<std::size_t>(chunk->root)].producer)
      throw refuse("group " + std::to_string(g) + " from rank " + std::to_string(chunk->root)
                   + ", which is no trainer rank of epoch " + std::to_string(layout.epoch));
    if (chunk->bytes > largest_group_bytes_ || chunk->bytes > link->capacity())
      throw refuse("group " + std::to_string(g) + " of " + std::to_string(chunk->bytes)
                   + " bytes, more than the model's largest group (" + std::to_string(largest_group_bytes_)
                   + ") or the staging (" + std::to_string(link->capacity()) + ")");
    const auto n = static_cast<std::size_t>(chunk->bytes);
    try {
      link->recv(n, chunk->root);
    } catch (const std::exception& e) {
      link->abort();
      throw transfer_error(transfer_failure::producer_failed, "nccl: " + what + ": " + e.what());
    }
    if (auto got = gpu::wait_for(*link, until, what, hooks_); !got.ok())
      throw_wait_failure(got);
    auto& bucket = chunk->bucket;
    bucket.data.resize(n);
    try {
      link->read(bucket.data.data(), n);
    } catch (const std::exception& e) {
      link->abort();
      throw transfer_error(transfer_failure::producer_failed, "nccl: reading " + what + ": " + e.what());
    }
    turn.unlock(); // the bytes are out of the staging: the next exchange may begin
    deliver_whole_group(req, g, bucket, sink, report);
  }
  report.duration = transfer::clock::now() - t0;
  return report;
}

} // namespace rlsync
