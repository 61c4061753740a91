// What a trainer rank serves over nccl (transfer.backend nccl): a worker's
// pull of a group sent point to point (whole, or packed as the worker's
// registered plan says, on the device when the rank has a copy there), the
// collective broadcast baseline, and joining the communicator the
// coordinator builds. The handlers in trainer.cpp call these.
#include "actors/trainer_internal.hpp"

#include "gpu/nccl_comm.hpp"
#include "gpu/nccl_membership.hpp"
#include "gpu/nccl_sender.hpp"
#include "runtime/base/checksum.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/transfer/bucket.hpp"
#include "runtime/transfer/packing.hpp"
#include "runtime/transfer/plan_intake.hpp"

#include <algorithm>

namespace rlsync::trainer_detail {

namespace {

/// nccl, sharded: the plan the worker registered under digest req.plan.
caf::expected<std::shared_ptr<const plan::grouped_plan>> registered_plan(self_ptr self, const nccl_pull& req) {
  auto it = self->state.nccl_plans.find({req.engine, req.worker});
  if (it == self->state.nccl_plans.end() || it->second.digest != req.plan)
    return make_error(errc::unknown_name, "trainer: nccl: plan " + checksum_hex(req.plan) + " of engine '"
                                            + printable(req.engine) + "' worker " + std::to_string(req.worker)
                                            + " is not registered with this rank");
  return it->second.plan;
}

/// nccl, sharded: the worker's entries of the group, packed on the CPU as
/// its plan says.
caf::expected<weight_bucket> packed_bucket(self_ptr self, const nccl_pull& req) {
  auto registered = registered_plan(self, req);
  if (!registered)
    return registered.error();
  auto s = held_group(self, req.version, req.group);
  if (!s)
    return s.error();
  const auto& plan = **registered;
  weight_bucket b;
  b.version = req.version;
  b.group = req.group;
  try {
    b.data.resize(static_cast<std::size_t>(plan.bytes(req.group)));
    b.checksum = transfer::pack_group_checksummed(plan, req.group, **s, b.data.data());
  } catch (const std::exception& e) { // an entry of a tensor this rank does not hold
    return make_error(errc::malformed, "trainer: nccl: packing group " + std::to_string(req.group) + " for engine '"
                                         + printable(req.engine) + "' worker " + std::to_string(req.worker) + ": "
                                         + e.what());
  }
  return b;
}

/// Queues `job` (its bytes or its fill already set) to the worker `req`
/// came from, NCCL rank `peer`, and answers what the worker will receive:
/// the size, `bucket` without data, and whether a checksum trailer follows.
caf::expected<nccl_chunk> queue_send(const std::shared_ptr<gpu::nccl_sender>& sender, const nccl_pull& req, int peer,
                                     gpu::clock::time_point deadline, gpu::nccl_sender::job job,
                                     weight_bucket bucket, bool trailer) {
  job.peer = peer;
  job.deadline = deadline;
  job.what = "group " + std::to_string(req.group) + " of version " + std::to_string(req.version) + " to engine '"
             + printable(req.engine) + "' worker " + std::to_string(req.worker);
  const std::uint64_t bytes = job.bytes ? job.bytes->size() : job.fill_bytes;
  if (auto why = sender->submit(std::move(job)); !why.empty())
    return make_error(errc::unknown_name, "trainer: nccl: " + why);
  nccl_chunk out;
  out.epoch = sender->layout().epoch;
  out.root = sender->rank();
  out.bytes = bytes;
  out.bucket = std::move(bucket);
  out.trailer = trailer;
  return out;
}

/// nccl, broadcast mode, from the device: the group's whole tensors copied
/// from the rank's device copy into the link's staging on the sender's
/// thread, device to device (the checksum is XXH3, as on the CPU path).
/// Nullopt when there is no device copy: the CPU path then.
std::optional<caf::expected<nccl_chunk>> device_whole_chunk(self_ptr self,
                                                            const std::shared_ptr<gpu::nccl_sender>& sender,
                                                            const nccl_pull& req, int peer,
                                                            gpu::clock::time_point deadline) {
  auto s = held_group(self, req.version, req.group);
  if (!s)
    return caf::expected<nccl_chunk>{s.error()};
  auto copy = device_copy(self, **s, *self->state.cfg.nccl_pack_device);
  if (!copy)
    return std::nullopt;
  auto [pieces, bucket] = device_group(**s, req.group, *copy);
  gpu::nccl_sender::job job;
  job.fill = [pieces = std::move(pieces), copy, device = self->state.cfg.nccl_pack_device](void* staging) {
    device->concat(pieces, staging);
  };
  job.fill_bytes = static_cast<std::size_t>((*s)->group_bytes(req.group));
  return queue_send(sender, req, peer, deadline, std::move(job), std::move(bucket), false);
}

/// nccl, sharded, packing on the device: the worker's entries of the group
/// gathered from the rank's device copy of the version straight into the
/// link's staging, with mixsum64 after them (nccl_chunk::trailer). The
/// sender thread runs the gathers when the send's turn comes. Nullopt when
/// the group is to be packed on the CPU instead: no device copy, or a plan
/// the device pack does not take (a view flatten() refuses, pieces out of
/// alignment), which the CPU pack judges for itself.
std::optional<caf::expected<nccl_chunk>> device_packed_chunk(self_ptr self,
                                                             const std::shared_ptr<gpu::nccl_sender>& sender,
                                                             const nccl_pull& req, int peer,
                                                             gpu::clock::time_point deadline) {
  auto registered = registered_plan(self, req);
  if (!registered)
    return caf::expected<nccl_chunk>{registered.error()};
  auto s = held_group(self, req.version, req.group);
  if (!s)
    return caf::expected<nccl_chunk>{s.error()};
  auto layout = std::make_shared<gpu::pack_layout>();
  try {
    *layout = gpu::layout_group(**registered, req.group, **s);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  auto copy = device_copy(self, **s, *self->state.cfg.nccl_pack_device);
  if (!copy)
    return std::nullopt;
  gpu::nccl_sender::job job;
  job.fill = [layout, copy, device = self->state.cfg.nccl_pack_device](void* staging) {
    device->pack(*layout, copy->sources(), staging);
  };
  job.fill_bytes = static_cast<std::size_t>(layout->bytes) + transfer::checksum_trailer_bytes;
  weight_bucket bucket; // no checksum: the trailer carries it
  bucket.version = req.version;
  bucket.group = req.group;
  return queue_send(sender, req, peer, deadline, std::move(job), std::move(bucket), true);
}

/// nccl, the collective baseline: the answer to a worker's ask for
/// `req.version` (see nccl_manifest). The broadcast starts at the ask that
/// completes the communicator's workers, within the join window of the first
/// ask; after the window, or once it ran, every ask is sent point to point.
caf::result<nccl_manifest> collective_broadcast(self_ptr self, const std::shared_ptr<gpu::nccl_sender>& sender,
                                                const nccl_pull& req) {
  auto& st = self->state;
  // With several ranks, the rank's own communicator (it and every worker).
  const auto& layout = sender->collective_layout();
  if (auto why = sender->failure(); !why.empty())
    return make_error(errc::unknown_name, "trainer: nccl: the communicator of epoch " + std::to_string(layout.epoch)
                                            + " failed (" + why + "): it is rebuilt at the next sync boundary");
  const auto producers = std::count_if(layout.members.begin(), layout.members.end(),
                                       [](const gpu::comm_member& m) { return m.producer; });
  if (producers != 1)
    return make_error(errc::unknown_name, "trainer: nccl: a collective broadcast needs a communicator with one "
                                          "trainer rank, epoch " + std::to_string(layout.epoch) + " has "
                                            + std::to_string(producers) + " and no communicator of this rank's own");
  auto s = st.cfg.source->find(req.version);
  if (!s)
    return version_not_held(self, req.version);
  const auto now = std::chrono::steady_clock::now();
  if (!st.nccl_broadcast || st.nccl_broadcast->version != req.version || st.nccl_broadcast->epoch != layout.epoch) {
    const auto queued_until = st.nccl_broadcast && st.nccl_broadcast->epoch == layout.epoch ? st.nccl_broadcast->done_at : 0;
    st.nccl_broadcast = trainer_state::collective_broadcast{};
    st.nccl_broadcast->version = req.version;
    st.nccl_broadcast->epoch = layout.epoch;
    st.nccl_broadcast->first_ask = now;
    st.nccl_broadcast->done_at = queued_until;
  }
  auto& b = *st.nccl_broadcast;
  nccl_manifest answer;
  answer.epoch = layout.epoch;
  answer.root = sender->collective_rank();
  if (b.phase == trainer_state::collective_broadcast::started) {
    // Every member took part in it, or it is over: asked again, nobody else would join.
    if (sender->broadcast() >= b.done_at || now >= b.deadline)
      b.phase = trainer_state::collective_broadcast::closed;
    else
      return b.manifest;
  }
  if (b.phase == trainer_state::collective_broadcast::closed) {
    answer.status = nccl_manifest::point_to_point;
    return answer;
  }
  b.asked.emplace(req.engine, req.worker); // a member: checked by the handler
  const auto workers = static_cast<std::size_t>(layout.size() - producers);
  if (b.asked.size() < workers) {
    if (now - b.first_ask < st.cfg.nccl_join_window) {
      answer.status = nccl_manifest::wait;
      return answer;
    }
    b.phase = trainer_state::collective_broadcast::closed; // a member is not in this round
    log(self, "trainer: nccl: " + std::to_string(b.asked.size()) + " of " + std::to_string(workers)
                + " workers asked for version " + std::to_string(req.version) + " within "
                + std::to_string(st.cfg.nccl_join_window.count()) + " ms: it moves point to point");
    answer.status = nccl_manifest::point_to_point;
    return answer;
  }
  for (auto g : s->groups()) {
    answer.buckets.push_back(group_layout(*s, g));
    answer.bytes.push_back(s->group_bytes(g) + transfer::checksum_trailer_bytes);
    if (answer.bytes.back() > sender->collective_capacity())
      return make_error(errc::unknown_name, "trainer: nccl: group " + std::to_string(g) + " broadcasts "
                                              + std::to_string(answer.bytes.back()) + " bytes, more than the staging's "
                                              + std::to_string(sender->collective_capacity()));
  }
  // Each broadcast carries whole consecutive groups, each with its checksum,
  // back to back up to bucket_bytes (vLLM's packed broadcast); a group larger
  // goes alone (it fits the staging: checked above).
  const auto room = std::min<std::uint64_t>(st.cfg.nccl_bucket_bytes, sender->collective_capacity());
  struct span {
    std::size_t first = 0, count = 0; // groups, by index in groups
    std::uint64_t bytes = 0;          // theirs and their checksums'
  };
  auto spans = std::make_shared<std::vector<span>>();
  for (std::size_t i = 0; i < answer.bytes.size();) {
    span next{i, 1, answer.bytes[i]};
    while (i + next.count < answer.bytes.size() && next.bytes < room && answer.bytes[i + next.count] <= room - next.bytes)
      next.bytes += answer.bytes[i + next.count++];
    spans->push_back(next);
    answer.packed.push_back(static_cast<std::uint32_t>(next.count));
    i += next.count;
  }
  const auto groups = s->groups();
  gpu::nccl_sender::collective c;
  c.buckets = spans->size();
  // From the rank's device copy when it has one at hand (an upload would
  // stall this handler; the CPU pack overlaps the wire instead): each
  // group's tensors copied into the staging device to device on the
  // sender's thread, then the XXH3 of their host bytes, as the CPU pack
  // appends it, taken while the bucket before is on the wire.
  const auto& device = st.cfg.nccl_pack_device;
  if (auto copy = device ? device_copy_at_hand(self, *s, *device) : nullptr) {
    for (const auto& sp : *spans)
      c.fill_bytes.push_back(static_cast<std::size_t>(sp.bytes));
    auto sums = std::make_shared<std::vector<std::uint64_t>>(groups.size());
    c.prepare = [s, sums, spans, groups](std::size_t k) {
      const auto& sp = (*spans)[k];
      for (std::size_t j = sp.first; j < sp.first + sp.count; ++j)
        (*sums)[j] = group_checksum(*s, groups[j]);
    };
    c.fill = [s, copy, sums, spans, groups, device](std::size_t k, void* staging) {
      auto* at = static_cast<std::uint8_t*>(staging);
      const auto& sp = (*spans)[k];
      for (std::size_t j = sp.first; j < sp.first + sp.count; ++j) {
        device->concat(device_pieces(*s, groups[j], *copy), at);
        at += s->group_bytes(groups[j]);
        std::uint8_t trailer[transfer::checksum_trailer_bytes];
        transfer::write_checksum_trailer((*sums)[j], trailer);
        device->upload(at, trailer, sizeof trailer);
        at += sizeof trailer;
      }
    };
  } else {
    c.pack = [s, spans, groups](std::size_t k, std::vector<std::uint8_t>& out) {
      out.clear(); // keeps its capacity: the two buffers are reused broadcast after broadcast
      const auto& sp = (*spans)[k];
      out.reserve(static_cast<std::size_t>(sp.bytes)); // once: growing group by group would copy the bucket again each time
      for (std::size_t j = sp.first; j < sp.first + sp.count; ++j) {
        const auto start = out.size();
        for (const auto& t : s->group(groups[j])) {
          auto* p = reinterpret_cast<const std::uint8_t*>(t.data);
          out.insert(out.end(), p, p + t.size);
        }
        const auto sum = checksum64(out.data() + start, out.size() - start);
        out.resize(out.size() + transfer::checksum_trailer_bytes);
        transfer::write_checksum_trailer(sum, out.data() + out.size() - transfer::checksum_trailer_bytes);
      }
    };
  }
  // The members' waits bound the broadcast's; never longer than a phase may last.
  c.deadline = gpu::clock::now() + std::chrono::milliseconds(std::min<std::uint32_t>(req.wait_ms, 600'000));
  c.what = "version " + std::to_string(req.version) + " broadcast to epoch " + std::to_string(layout.epoch)
           + "'s members";
  const auto deadline = c.deadline;
  const auto done_at = std::max(sender->broadcast(), b.done_at) + c.buckets; // behind any broadcast still queued
  if (auto why = sender->submit(std::move(c)); !why.empty())
    return make_error(errc::unknown_name, "trainer: nccl: " + why);
  b.phase = trainer_state::collective_broadcast::started;
  b.manifest = answer;
  b.done_at = done_at;
  b.deadline = deadline;
  return answer;
}

/// The rank's nccl sender, for a message from engine worker (engine,
/// worker) about communicator `epoch`: refused when the rank runs none,
/// the asking node did not register the engine, the epoch is not the
/// current one, or the worker is no member of it.
caf::expected<std::shared_ptr<gpu::nccl_sender>>
nccl_member_sender(self_ptr self, const std::shared_ptr<sender_guard>& data_guard, const std::string& engine,
                   std::int32_t worker, std::uint64_t epoch, const char* message, const std::string& what) {
  auto sender = self->state.cfg.nccl ? self->state.cfg.nccl->producer() : nullptr;
  if (!sender)
    return make_error(errc::unknown_name, "this trainer runs no nccl sender");
  if (auto refused = engine_from_sender(self, data_guard, engine, worker, message, what))
    return *refused;
  const auto& layout = sender->layout();
  if (epoch != layout.epoch)
    return make_error(errc::unknown_name, "trainer: nccl: " + what + " on epoch " + std::to_string(epoch)
                                            + " asked; this rank's communicator is epoch "
                                            + std::to_string(layout.epoch));
  if (layout.rank_of(gpu::comm_member::worker(engine, worker)) < 0)
    return make_error(errc::unknown_name, "trainer: nccl: " + what + ": engine '" + printable(engine) + "' worker "
                                            + std::to_string(worker) + " is not in epoch "
                                            + std::to_string(layout.epoch) + "'s communicator");
  return sender;
}

} // namespace

caf::result<nccl_chunk> serve_nccl_pull(self_ptr self, const std::shared_ptr<sender_guard>& data_guard,
                                        const nccl_pull& req) {
  // A worker's wait bounds the send's (from its arrival: a device copy
  // made first takes from it); never longer than a phase may last.
  const auto deadline = gpu::clock::now() + std::chrono::milliseconds(std::min<std::uint32_t>(req.wait_ms, 600'000));
  auto member = nccl_member_sender(self, data_guard, req.engine, req.worker, req.epoch, "ncclpull", "a pull");
  if (!member)
    return member.error();
  const auto& sender = *member;
  const int peer = sender->layout().rank_of(gpu::comm_member::worker(req.engine, req.worker));
  if (self->state.cfg.nccl_pack_device)
    if (auto on_device = req.plan == 0 ? device_whole_chunk(self, sender, req, peer, deadline)
                                       : device_packed_chunk(self, sender, req, peer, deadline)) {
      if (!*on_device)
        return on_device->error();
      return std::move(**on_device);
    }
  auto bucket = req.plan == 0 ? held_bucket(self, req.version, req.group) : packed_bucket(self, req);
  if (!bucket)
    return bucket.error();
  gpu::nccl_sender::job job;
  job.bytes = std::make_shared<const std::vector<std::uint8_t>>(std::move(bucket->data));
  bucket->data.clear();
  auto answer = queue_send(sender, req, peer, deadline, std::move(job), std::move(*bucket), false);
  if (!answer)
    return answer.error();
  return std::move(*answer);
}

caf::result<nccl_manifest> serve_nccl_broadcast(self_ptr self, const std::shared_ptr<sender_guard>& data_guard,
                                                const nccl_pull& req) {
  auto member = nccl_member_sender(self, data_guard, req.engine, req.worker, req.epoch, "ncclbcast",
                                   "a broadcast ask");
  if (!member)
    return member.error();
  return collective_broadcast(self, *member, req);
}

caf::result<std::uint64_t> register_nccl_plan(self_ptr self, const std::shared_ptr<sender_guard>& data_guard,
                                              const nccl_plan& req) {
  auto member = nccl_member_sender(self, data_guard, req.engine, req.worker, req.epoch, "ncclplan", "a plan");
  if (!member)
    return member.error();
  const auto& layout = (*member)->layout();
  const auto who = "engine '" + printable(req.engine) + "' worker " + std::to_string(req.worker);
  auto& st = self->state;
  const auto digest = checksum64(req.plan.data(), req.plan.size());
  const std::pair<std::string, std::int32_t> key{req.engine, req.worker};
  if (auto it = st.nccl_plans.find(key); it != st.nccl_plans.end() && it->second.digest == digest)
    return digest;
  std::shared_ptr<const plan::grouped_plan> plan;
  try {
    // Made for each plan (one per worker and communicator): a checkpoint
    // source learns its dtype at its first snapshot, so a kept one could be stale.
    plan = transfer::plan_intake(*st.cfg.source).accept(req.plan.data(), req.plan.size());
  } catch (const transfer::plan_intake::refusal& e) {
    return make_error(errc::malformed, "trainer: nccl: the plan of " + who + ": " + e.what());
  }
  if (plan->worker() != req.worker)
    return make_error(errc::malformed, "trainer: nccl: " + who + " registered the plan of worker "
                                         + std::to_string(plan->worker()));
  // Members of an older communicator pull no more: their plans go.
  for (auto it = st.nccl_plans.begin(); it != st.nccl_plans.end();)
    it = layout.rank_of(gpu::comm_member::worker(it->first.first, it->first.second)) < 0 ? st.nccl_plans.erase(it)
                                                                                        : std::next(it);
  st.nccl_plans[key] = {digest, std::move(plan)};
  return digest;
}

caf::result<std::uint64_t> join_nccl(self_ptr self, const nccl_rendezvous_msg& msg) {
  const auto& cfg = self->state.cfg;
  if (!cfg.nccl_membership || !cfg.nccl)
    return make_error(errc::unknown_name, "this trainer joins no nccl communicator");
  const auto me = gpu::comm_member::trainer_rank(cfg.nccl_rank);
  try {
    const auto r = gpu::from_wire(msg);
    // A retry after a lost reply: the rank serves this very rendezvous already.
    if (auto serving = cfg.nccl->producer();
        serving && serving->layout().epoch == r.epoch && cfg.nccl_membership->joined(r, me))
      return r.epoch;
    if (auto why = cfg.nccl_membership->join(r, {me}); !why.empty())
      return make_error(errc::malformed, "trainer rank " + std::to_string(cfg.nccl_rank) + ": " + why);
    // Left out of this epoch (the coordinator rebuilt without it): it serves no nccl pulls.
    auto link = cfg.nccl_membership->link(me);
    // With the collective and several ranks, also the root of its own communicator.
    auto own = cfg.nccl_membership->root_link(me, cfg.nccl_rank);
    cfg.nccl->open(link ? std::make_shared<gpu::nccl_sender>(link, cfg.nccl_send_queue,
                                                             gpu::dead_member_hooks(cfg.nccl_membership), own)
                        : nullptr);
    return r.epoch;
  } catch (const std::exception& e) {
    return make_error(errc::malformed, "trainer rank " + std::to_string(cfg.nccl_rank) + ": " + e.what());
  }
}

void mark_nccl_dead(self_ptr self, std::uint64_t epoch, const std::string& who) {
  const auto& cfg = self->state.cfg;
  if (cfg.nccl_membership && cfg.nccl_membership->mark_dead(epoch, who))
    log(self, "trainer rank " + std::to_string(cfg.nccl_rank) + ": nccl: " + who + " died in epoch "
                + std::to_string(epoch) + ": its sends abort");
}

} // namespace rlsync::trainer_detail
