#include "actors/nccl_puller.hpp"

#include "actors/caf_puller.hpp"
#include "actors/land_on_device.hpp"
#include "actors/type_ids.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/base/checksum.hpp"
#include "runtime/plan/groups.hpp"
#include "gpu/mixsum.hpp"
#include "runtime/transfer/bucket.hpp"
#include "runtime/transfer/store_in_place.hpp"
#include "runtime/transfer/ucx/ucx_wire.hpp"

#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <tuple>

namespace rlsync {

using transfer::transfer_error;
using transfer::transfer_failure;

nccl_puller::nccl_puller(caf::actor_system& sys, std::function<trainer_actor()> trainer, model_config model,
                         link_of links, std::optional<std::vector<std::uint32_t>> groups, gpu::wait_hooks hooks,
                         bool collective, packer_of packers, link_of root_links)
  : sys_(sys), trainer_(std::move(trainer)), model_(std::move(model)), expected_(model_), links_(std::move(links)),
    root_links_(std::move(root_links)),
    groups_(groups_or_all(model_, std::move(groups))), hooks_(std::move(hooks)),
    group_deadline_(whole_group_deadline(model_)),
    largest_group_bytes_(plan::largest_group_bytes(model_, llama_parameter_specs(model_, dtype::f32), dtype::f32)),
    collective_(collective), packers_(std::move(packers)),
    scratches_(static_cast<std::size_t>(largest_group_bytes_) + transfer::checksum_trailer_bytes) {
  if (!links_)
    throw std::invalid_argument("an nccl puller without links");
}

void nccl_puller::register_worker(const std::string& engine, std::shared_ptr<const plan::worker_plan> plan) {
  if (!plan)
    throw std::invalid_argument("nccl transfer: engine '" + engine + "' registered no plan");
  registration r;
  r.plan = std::make_shared<const plan::grouped_plan>(model_, plan);
  r.encoded = transfer::ucx_wire::encode_plan(*plan);
  r.digest = checksum64(r.encoded.data(), r.encoded.size());
  std::lock_guard<std::mutex> lock(mutex_);
  plans_[{engine, plan->worker}] = std::move(r);
}

void nccl_puller::unregister_engine(const std::string& engine) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = plans_.begin(); it != plans_.end();)
    it = it->first.first == engine ? plans_.erase(it) : std::next(it);
  scratches_.forget(engine);
}

std::pair<std::shared_ptr<const plan::grouped_plan>, std::uint64_t>
nccl_puller::registered_plan(caf::scoped_actor& self, const trainer_actor& trainer, const transfer::pull_request& req,
                             std::uint64_t epoch) {
  const auto me = "engine " + printable(req.engine) + " worker " + std::to_string(req.worker);
  nccl_plan ask;
  std::shared_ptr<const plan::grouped_plan> plan;
  std::uint64_t digest = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = plans_.find({req.engine, req.worker});
    if (it == plans_.end())
      throw transfer_error(transfer_failure::not_registered, "nccl: " + me + " registered no plan");
    plan = it->second.plan;
    digest = it->second.digest;
    if (it->second.trainer == trainer.address() && it->second.epoch == epoch)
      return {plan, digest};
    ask.plan = it->second.encoded;
  }
  ask.engine = req.engine;
  ask.worker = req.worker;
  ask.epoch = epoch;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(req.deadline - transfer::clock::now());
  if (left.count() <= 0)
    throw transfer_error(transfer_failure::timeout, "nccl: " + me + ": the deadline passed before its plan was sent");
  std::optional<std::uint64_t> answer;
  caf::error failure;
  self->request(trainer, left, nccl_plan_atom::value, std::move(ask))
    .receive([&](std::uint64_t d) { answer = d; }, [&](caf::error& e) { failure = std::move(e); });
  if (!answer)
    throw transfer_error(failure == caf::sec::request_timeout ? transfer_failure::timeout
                                                              : transfer_failure::producer_failed,
                         "nccl: " + me + ": the trainer did not take its plan: " + sys_.render(failure));
  if (*answer != digest)
    throw transfer_error(transfer_failure::producer_failed,
                         "trainer over nccl: took the plan of " + me + " as " + checksum_hex(*answer) + ", it is "
                           + checksum_hex(digest));
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = plans_.find({req.engine, req.worker}); it != plans_.end() && it->second.digest == digest) {
    it->second.trainer = trainer.address();
    it->second.epoch = epoch;
  }
  return {plan, digest};
}

namespace {

/// A failed wait: past the deadline is a timeout, anything else the
/// communicator's failure (the link is aborted either way).
[[noreturn]] void throw_wait_failure(const gpu::wait_outcome& out) {
  throw transfer_error(out.result == gpu::wait_outcome::kind::deadline ? transfer_failure::timeout
                                                                       : transfer_failure::producer_failed,
                       "nccl: " + out.why);
}

/// A trainer's answer that lies about the communicator, refused before
/// anything is posted: the link is aborted (a lying trainer ends this
/// communicator for us; the other members wait to their deadlines).
transfer_error refuse_trainer(gpu::p2p_link& link, const std::string& why) {
  link.abort();
  return transfer_error(transfer_failure::producer_failed, "trainer over nccl: " + why);
}

/// Why `what` (a group, a broadcast) cannot come from this communicator:
/// another epoch, or a root that is no trainer rank. Empty when it can.
std::string sender_problem(const gpu::comm_layout& layout, std::uint64_t epoch, std::int32_t root,
                           const std::string& what) {
  if (epoch != layout.epoch)
    return what + " on epoch " + std::to_string(epoch) + ", this worker is in " + std::to_string(layout.epoch);
  if (root < 0 || root >= layout.size() || !layout.members[static_cast<std::size_t>(root)].producer)
    return what + " from rank " + std::to_string(root) + ", which is no trainer rank of epoch "
           + std::to_string(layout.epoch);
  return {};
}

/// Sharded: the worker's entries of group `g`, verified (against XXH3 in
/// `answer`, unless `verified` by the caller), handed on packed or stored
/// in `targets`, where the engine keeps them (none: handed on).
void deliver_packed_group(const transfer::pull_request& req, std::uint32_t g, const weight_bucket& answer,
                          const std::vector<std::uint8_t>& packed, const std::vector<transfer::store_target>& targets,
                          const transfer::group_sink& sink, transfer::pull_report& report, bool verified = false) {
  if (answer.version != req.version || answer.group != g)
    throw transfer_error(transfer_failure::producer_failed, "trainer answered group " + std::to_string(g)
                                                              + " of version " + std::to_string(req.version)
                                                              + " with another");
  // Stored in place, the store hashes as it copies; handed on, the bytes
  // are hashed unless the caller verified them already (a device's mixsum64).
  const auto got = !targets.empty() ? transfer::store_group(packed.data(), targets)
                   : verified       ? answer.checksum
                                    : checksum64(packed.data(), packed.size());
  if (!verified && got != answer.checksum)
    throw transfer_error(transfer_failure::checksum_mismatch,
                         "nccl: group " + std::to_string(g) + " of version " + std::to_string(req.version)
                           + " failed its checksum (sent " + checksum_hex(answer.checksum) + ", received "
                           + checksum_hex(got) + " over " + std::to_string(packed.size())
                           + " bytes); the update is void");
  if (targets.empty())
    sink.on_group(req.worker, g, packed.data(), packed.size());
  else
    sink.on_stored(req.worker, g);
  report.bytes += packed.size();
  ++report.groups;
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
  auto await_init = [&](gpu::p2p_link& l, const std::string& what) {
    // Under the turn: polled by two pulls at once, one could see (and
    // abort) the other's exchange.
    std::unique_lock<std::timed_mutex> turn(l.turn(), std::defer_lock);
    if (!turn.try_lock_until(req.deadline))
      throw transfer_error(transfer_failure::timeout, "nccl: " + me + ": the link stayed busy past the deadline");
    if (auto init = gpu::wait_for(l, req.deadline, what, hooks_); !init.ok())
      throw_wait_failure(init);
  };
  await_init(*link, "init of epoch " + std::to_string(layout.epoch));
  const bool collective = collective_ && req.mode == transfer_mode::broadcast;
  // With several ranks the collective runs in this rank's own communicator.
  auto root = collective && root_links_ ? root_links_(req.engine, req.worker) : nullptr;
  if (root)
    await_init(*root, "init of epoch " + std::to_string(layout.epoch) + "'s communicator of "
                        + root->layout().members.front().describe());
  if (collective && pull_collective(req, sink, root ? *root : *link, report)) {
    report.duration = transfer::clock::now() - t0;
    return report;
  }
  auto refuse = [&](const std::string& why) { return refuse_trainer(*link, why); };
  caf::scoped_actor self{sys_};
  const trainer_actor trainer = trainer_();
  const bool sharded = req.mode == transfer_mode::sharded;
  std::shared_ptr<const plan::grouped_plan> plan;
  nccl_pull ask;
  if (sharded)
    std::tie(plan, ask.plan) = registered_plan(self, trainer, req, layout.epoch);
  ask.engine = req.engine;
  ask.worker = req.worker;
  ask.version = req.version;
  ask.epoch = layout.epoch;
  std::vector<std::uint8_t> packed; // sharded: the group's bytes, reused
  const auto whole_landing = sharded ? whole_group_landing{} : landing_of(req, sink);
  for (const std::uint32_t g : groups_) {
    if (sharded && plan->bytes(g) == 0) { // none of this worker's entries: nothing to move
      sink.on_group(req.worker, g, packed.data(), 0);
      ++report.groups;
      continue;
    }
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
    if (auto why = sender_problem(layout, chunk->epoch, chunk->root, "group " + std::to_string(g)); !why.empty())
      throw refuse(why);
    if (chunk->trailer && !sharded)
      throw refuse("group " + std::to_string(g) + " packed on the device, and " + me + " asked for whole tensors");
    // Packed on the device: mixsum64 follows the packed bytes.
    const std::uint64_t trailer = chunk->trailer ? transfer::checksum_trailer_bytes : 0;
    if (sharded && chunk->bytes != plan->bytes(g) + trailer)
      throw refuse("group " + std::to_string(g) + " of " + std::to_string(chunk->bytes) + " bytes, the plan of " + me
                   + " packs " + std::to_string(plan->bytes(g)) + (trailer ? " and its checksum" : ""));
    if (!sharded && chunk->bytes > largest_group_bytes_)
      throw refuse("group " + std::to_string(g) + " of " + std::to_string(chunk->bytes)
                   + " bytes, more than the model's largest group (" + std::to_string(largest_group_bytes_) + ")");
    if (chunk->bytes > link->capacity()) // the trainer's sender refuses such a send: it lies
      throw refuse("group " + std::to_string(g) + " of " + std::to_string(chunk->bytes)
                   + " bytes, more than the staging (" + std::to_string(link->capacity()) + ")");
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
    auto& into = sharded ? packed : bucket.data;
    into.resize(n);
    // Sharded, the plan's bytes lead the staging (a trailer follows them).
    const auto targets = sharded ? transfer::group_targets(sink, req.worker, g, n - trailer)
                                 : std::vector<transfer::store_target>{};
    // Where its runs land on the engine's device: the store targets when
    // there are any, else those a sink that takes packed bytes names.
    const auto land_at = !sharded || !sink.on_device ? std::vector<transfer::store_target>{}
                         : !targets.empty()          ? targets
                                                     : transfer::landing_targets(sink, req.worker, g, n - trailer);
    try {
      if (!land_at.empty())
        link->use_received([&](const void* staging, int device) { land_packed_runs(land_at, staging, device, sink); },
                           n);
      link->read(into.data(), n);
    } catch (const std::exception& e) {
      link->abort();
      throw transfer_error(transfer_failure::producer_failed, "nccl: reading " + what + ": " + e.what());
    }
    if (whole_landing) { // landed from the staging: it must hold the group until then
      deliver_and_land(req, g, bucket, *link, 0, n, whole_landing, sink, report);
      continue;
    }
    turn.unlock(); // the bytes are out of the staging: the next exchange may begin
    if (sharded && chunk->trailer) {
      const auto sent = transfer::pop_checksum(packed);
      const auto got = gpu::mixsum64(packed.data(), packed.size());
      if (got != sent)
        throw transfer_error(transfer_failure::checksum_mismatch,
                             "nccl: group " + std::to_string(g) + " of version " + std::to_string(req.version)
                               + ", packed on the trainer's device, failed its checksum (sent mixsum64 "
                               + checksum_hex(sent) + ", received " + checksum_hex(got) + " over "
                               + std::to_string(packed.size()) + " bytes); the update is void");
      deliver_packed_group(req, g, bucket, packed, targets, sink, report, /*verified=*/true);
    } else if (sharded)
      deliver_packed_group(req, g, bucket, packed, targets, sink, report);
    else
      deliver_whole_group(expected_, req, g, bucket, sink, report);
  }
  report.duration = transfer::clock::now() - t0;
  return report;
}

bool nccl_puller::pull_collective(const transfer::pull_request& req, const transfer::group_sink& sink,
                                  gpu::p2p_link& link, transfer::pull_report& report) {
  const auto me = "engine " + printable(req.engine) + " worker " + std::to_string(req.worker);
  const auto& layout = link.layout();
  // One exchange for the whole version: its broadcasts follow each other on the link.
  std::unique_lock<std::timed_mutex> turn(link.turn(), std::defer_lock);
  if (!turn.try_lock_until(req.deadline))
    throw transfer_error(transfer_failure::timeout, "nccl: " + me + ": the link stayed busy past the deadline");
  const auto rest = std::chrono::duration_cast<std::chrono::milliseconds>(req.deadline - transfer::clock::now());
  if (rest.count() <= 0)
    throw transfer_error(transfer_failure::timeout, "nccl: " + me + ": the deadline passed waiting for the link");
  nccl_pull ask;
  ask.engine = req.engine;
  ask.worker = req.worker;
  ask.version = req.version;
  ask.epoch = layout.epoch;
  caf::scoped_actor self{sys_};
  std::optional<nccl_manifest> manifest;
  const auto trainer = trainer_();
  // Ask until the rank starts the broadcast or says to pull point to point
  // (it decides within its join window); every ask bounded by the deadline.
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(req.deadline - transfer::clock::now());
    if (left.count() <= 0)
      throw transfer_error(transfer_failure::timeout, "nccl: " + me + ": the deadline passed waiting for the "
                                                        "other members to ask for version "
                                                        + std::to_string(req.version));
    ask.wait_ms = static_cast<std::uint32_t>(std::min<std::int64_t>(left.count(), 600'000));
    caf::error failure;
    manifest.reset();
    self->request(trainer, left, nccl_broadcast_atom::value, ask)
      .receive([&](nccl_manifest& m) { manifest = std::move(m); }, [&](caf::error& e) { failure = std::move(e); });
    if (!manifest) {
      if (failure == caf::sec::request_timeout)
        link.abort(); // the broadcast may run all the same: this member would be missing from it
      throw_trainer_refusal(sys_, failure, 0);
    }
    if (manifest->status == nccl_manifest::point_to_point)
      return false;
    if (manifest->status != nccl_manifest::wait)
      break;
    std::this_thread::sleep_for(std::min(std::chrono::milliseconds(5), left));
  }
  auto refuse = [&](const std::string& why) { return refuse_trainer(link, why); };
  const auto& m = *manifest;
  if (m.status != nccl_manifest::broadcast)
    throw refuse("a manifest of status " + std::to_string(m.status));
  if (auto why = sender_problem(layout, m.epoch, m.root, "a broadcast"); !why.empty())
    throw refuse(why);
  if (m.buckets.size() != m.bytes.size() || m.buckets.size() > plan::group_count(model_))
    throw refuse("a manifest of " + std::to_string(m.buckets.size()) + " buckets and " + std::to_string(m.bytes.size())
                 + " sizes for a model of " + std::to_string(plan::group_count(model_)) + " groups");
  for (std::size_t i = 0; i < m.bytes.size(); ++i)
    if (m.bytes[i] < transfer::checksum_trailer_bytes
        || m.bytes[i] - transfer::checksum_trailer_bytes > largest_group_bytes_ || m.bytes[i] > link.capacity())
      throw refuse("bucket " + std::to_string(i) + " of " + std::to_string(m.bytes[i])
                   + " bytes: not 8 to the model's largest group (" + std::to_string(largest_group_bytes_)
                   + ") and its checksum, within the staging (" + std::to_string(link.capacity()) + ")");
  // Broadcasts of whole consecutive groups, every group in one, each within the staging.
  std::vector<std::size_t> spans(m.buckets.size(), 1); // groups per broadcast
  if (!m.packed.empty()) {
    spans.clear();
    std::size_t next = 0;
    for (std::size_t k = 0; k < m.packed.size(); ++k) {
      const std::size_t n = m.packed[k];
      if (n == 0 || n > m.buckets.size() - next)
        throw refuse("broadcast " + std::to_string(k) + " carries " + std::to_string(n) + " groups, with "
                     + std::to_string(m.buckets.size() - next) + " of the manifest's " + std::to_string(m.buckets.size())
                     + " left");
      std::uint64_t bytes = 0;
      for (std::size_t j = next; j < next + n; ++j)
        bytes += m.bytes[j]; // each checked above: no overflow
      if (bytes > link.capacity())
        throw refuse("broadcast " + std::to_string(k) + " of " + std::to_string(bytes) + " bytes, past the staging ("
                     + std::to_string(link.capacity()) + ")");
      spans.push_back(n);
      next += n;
    }
    if (next != m.buckets.size())
      throw refuse("broadcasts carrying " + std::to_string(next) + " of the manifest's " + std::to_string(m.buckets.size())
                   + " groups");
  }
  // The buckets must be the groups this rank holds, in order: anything else
  // would leave the version incomplete, or apply a group twice.
  bool same_groups = m.buckets.size() == groups_.size();
  for (std::size_t i = 0; same_groups && i < groups_.size(); ++i)
    same_groups = m.buckets[i].group == groups_[i] && m.buckets[i].version == req.version;
  if (!same_groups)
    throw refuse("a manifest of " + std::to_string(m.buckets.size()) + " buckets that are not version "
                 + std::to_string(req.version) + "'s " + std::to_string(groups_.size()) + " groups in order");
  try {
    receive_broadcasts(req, m, spans, link, sink, report);
  } catch (...) {
    // This member is gone from the broadcast: the others' waits end at their
    // own deadlines (an abort is local), but this link takes no more part.
    link.abort();
    throw;
  }
  return true;
}

void nccl_puller::receive_broadcasts(const transfer::pull_request& req, const nccl_manifest& m,
                                     const std::vector<std::size_t>& spans, gpu::p2p_link& link,
                                     const transfer::group_sink& sink, transfer::pull_report& report) {
  const auto me = "engine " + printable(req.engine) + " worker " + std::to_string(req.worker);
  std::vector<std::uint8_t> received;
  const auto whole_landing = landing_of(req, sink);
  std::size_t first = 0; // the broadcast's first group
  for (std::size_t k = 0; k < spans.size(); first += spans[k++]) {
    std::size_t n = 0;
    for (std::size_t j = first; j < first + spans[k]; ++j)
      n += static_cast<std::size_t>(m.bytes[j]);
    const auto what = "broadcast " + std::to_string(k) + " (groups " + std::to_string(m.buckets[first].group)
                      + (spans[k] > 1 ? " to " + std::to_string(m.buckets[first + spans[k] - 1].group) : std::string{})
                      + ") of version " + std::to_string(req.version) + " to " + me;
    try {
      link.broadcast(nullptr, n, m.root);
    } catch (const std::exception& e) {
      throw transfer_error(transfer_failure::producer_failed, "nccl: " + what + ": " + e.what());
    }
    if (auto got = gpu::wait_for(link, req.deadline, what, hooks_); !got.ok())
      throw_wait_failure(got);
    received.resize(n);
    try {
      link.read(received.data(), n);
    } catch (const std::exception& e) {
      throw transfer_error(transfer_failure::producer_failed, "nccl: reading " + what + ": " + e.what());
    }
    std::size_t at = 0; // each group's bytes and checksum, back to back
    for (std::size_t j = first; j < first + spans[k]; ++j) {
      auto bucket = m.buckets[j];
      const auto bytes = static_cast<std::size_t>(m.bytes[j]);
      std::tie(bucket.data, bucket.checksum) = transfer::split_checksum(received.data() + at, bytes);
      if (whole_landing)
        deliver_and_land(req, bucket.group, bucket, link, at, bytes, whole_landing, sink, report);
      else
        deliver_whole_group(expected_, req, bucket.group, bucket, sink, report); // verifies the checksum and the entries
      at += bytes;
    }
  }
}

whole_group_landing nccl_puller::landing_of(const transfer::pull_request& req,
                                            const transfer::group_sink& sink) {
  if (!sink.on_device || !packers_)
    return {};
  std::shared_ptr<const plan::grouped_plan> plan;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = plans_.find({req.engine, req.worker}); it != plans_.end())
      plan = it->second.plan;
  }
  std::shared_ptr<gpu::pack_device> packer;
  try {
    packer = packers_(req.engine, req.worker);
  } catch (const std::exception&) {
    return {}; // no pack device for it (a build without CUDA): delivered on the host only
  }
  return whole_group_landing_for(sink, std::move(plan), std::move(packer), scratches_, req.engine, req.worker);
}

void nccl_puller::deliver_and_land(const transfer::pull_request& req, std::uint32_t g, const weight_bucket& bucket,
                                   gpu::p2p_link& link, std::size_t offset, std::size_t n,
                                   const whole_group_landing& landing, const transfer::group_sink& sink,
                                   transfer::pull_report& report) {
  const auto views = deliver_whole_group(expected_, req, g, bucket, sink, report);
  // Under the turn the staging still holds the broadcast's bytes: the
  // group's from `offset` (a checksum may follow them).
  try {
    link.use_received(
      [&](const void* staging, int) {
        land_whole_group(landing, req.worker, g, views, bucket.data.data(), bucket.data.size(),
                         static_cast<const std::uint8_t*>(staging) + offset, sink);
      },
      offset + n);
  } catch (const std::exception& e) {
    link.abort();
    throw transfer_error(transfer_failure::producer_failed,
                         "nccl: reading group " + std::to_string(g) + " of version " + std::to_string(req.version)
                           + " to land it: " + e.what());
  }
}

} // namespace rlsync
