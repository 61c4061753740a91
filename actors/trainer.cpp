#include "actors/trainer.hpp"

#include "runtime/base/bounded_queue.hpp"
#include "runtime/base/checksum.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/config/topology.hpp"
#include "gpu/ipc_producer.hpp"
#include "gpu/nccl_comm.hpp"
#include "gpu/device_pack.hpp"
#include "gpu/nccl_membership.hpp"
#include "gpu/nccl_sender.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/transfer/bucket.hpp"
#include "runtime/transfer/packing.hpp"
#include "runtime/transfer/plan_intake.hpp"

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>
#include <caf/system_messages.hpp>

#include <algorithm>
#include <iostream>
#include <thread>

namespace rlsync {

namespace {

using self_ptr = trainer_impl_actor::stateful_pointer<trainer_state>;

class thread_runner final : public job_runner {
  using queue = bounded_queue<std::function<void()>>;

public:
  // The thread owns the queue with the runner: see the destructor.
  explicit thread_runner(std::size_t queue_limit)
    : jobs_(std::make_shared<queue>(queue_limit)), thread_([jobs = jobs_] { run(*jobs); }) {}
  ~thread_runner() override {
    jobs_->close();
    // A job that held the trainer's last reference destroys its state, and
    // so this runner, on the runner's own thread: that thread then finds
    // the queue (its own reference) closed and ends by itself.
    if (thread_.get_id() == std::this_thread::get_id())
      thread_.detach();
    else
      thread_.join();
  }

  bool post(std::function<void()> job) override { return jobs_->try_push(std::move(job)); }

private:
  static void run(queue& jobs) {
    for (;;) {
      // close() wakes the wait at once; the deadline only bounds it.
      auto job = jobs.pop_until(std::chrono::steady_clock::now() + std::chrono::seconds(1));
      if (jobs.closed())
        return; // shutting down: queued jobs are dropped
      if (job)
        (*job)();
    }
  }

  std::shared_ptr<queue> jobs_;
  std::thread thread_;
};

void log(self_ptr self, const std::string& line) {
  if (self->state.cfg.log)
    self->state.cfg.log(line);
}

void schedule_tick(self_ptr self) {
  if (self->state.tick_pending)
    return; // an explicit step ended before the timer's: keep its cadence
  self->state.tick_pending = true;
  // The next step starts step_time after this one started, or now if it
  // took longer.
  auto now = self->clock().now();
  auto due = self->state.step_started + self->state.cfg.step_time;
  auto wait = due > now ? std::chrono::duration_cast<caf::timespan>(due - now) : caf::timespan{0};
  self->delayed_send(self, wait, caf::tick_atom::value);
}

/// Starts a step on the runner; false when none could start (one is in
/// flight, frozen, or the runner refused it).
bool start_step(self_ptr self) {
  auto& st = self->state;
  if (st.producing || st.frozen)
    return false;
  st.producing = true;
  st.step_started = self->clock().now();
  auto source = st.cfg.source;
  auto me = caf::actor_cast<trainer_impl_actor>(self);
  auto target = st.catch_up_to;
  bool catching_up = target > st.published.version;
  bool checksums = st.cfg.rank_checksums;
  // Sent as the trainer itself: its guard refuses anonymous messages.
  bool posted = st.cfg.runner->post([source, me, target, catching_up, checksums] {
    try {
      // A trainer restarted on a source that already holds the version it
      // must catch up to publishes that one: making another would put this
      // rank a version ahead of the others.
      auto latest = source->latest();
      auto s = catching_up && latest && latest->version() >= target ? latest : source->advance();
      // Catching up: every version derives from the one before, so each is
      // made; only the last is published to subscribers.
      if (s && s->version() < target && target - s->version() > max_catch_up_versions)
        throw std::runtime_error("catching up from v" + std::to_string(s->version()) + " to v" + std::to_string(target)
                                 + ": more than " + std::to_string(max_catch_up_versions) + " versions");
      while (s && s->version() < target) {
        auto next = source->advance();
        if (!next)
          break; // nothing newer to make (a checkpoint directory)
        s = std::move(next);
      }
      caf::send_as(me, me, produced_atom::value, s ? published_info(*source, *s, checksums) : version_info{});
    } catch (const std::exception& e) {
      caf::send_as(me, me, produced_atom::value, std::string(e.what()));
    }
  });
  if (!posted) {
    st.producing = false;
    log(self, "trainer: the job runner refused a step; retrying in one step_time");
    schedule_tick(self);
  }
  return posted;
}

void publish(self_ptr self, const version_info& vi) {
  auto& st = self->state;
  st.published = vi;
  for (auto& [addr, listener] : st.subscribers)
    self->send(listener, version_atom::value, st.published);
}

} // namespace

trainer_state::~trainer_state() {
  // A stopping trainer answers the pulls it still holds: their engines learn
  // it now, not at their deadlines (CAF drops an undelivered promise).
  auto stopping = [](caf_pull& p) {
    p.reply.deliver(make_error(errc::round_aborted, "trainer: stopped before group " + std::to_string(p.group)
                                                      + " of version "
                                                      + std::to_string(p.version ? p.version->version() : 0)
                                                      + " was sent"));
  };
  for (auto& p : waiting_pulls)
    stopping(p);
  for (auto& [id, p] : packing_pulls)
    stopping(p);
}

void catch_up(const trainer_actor& trainer, std::uint64_t version) {
  auto me = caf::actor_cast<trainer_impl_actor>(trainer);
  caf::send_as(me, me, catch_up_atom::value, version); // as itself: its guard admits it
}

rank_info rank_info_of(const transfer::weight_source& source, std::uint32_t rank, std::string node,
                       std::uint64_t incarnation) {
  rank_info out{rank, std::move(node), incarnation, {}};
  for (const auto& p : source.parameters())
    out.held.push_back(p.name);
  std::sort(out.held.begin(), out.held.end());
  return out;
}

version_info published_info(const transfer::weight_source& source, const transfer::weight_snapshot& s,
                            bool checksums) {
  version_info vi{s.version(), plan::group_count(s.config()), s.total_bytes(), {}};
  vi.same_bytes_since = source.same_bytes_since(s.version()); // 0 once the source dropped it
  if (!checksums)
    return vi;
  std::vector<const tensor_view*> held;
  for (const auto& t : s.tensors())
    held.push_back(&t);
  std::sort(held.begin(), held.end(), [](const tensor_view* a, const tensor_view* b) { return a->name < b->name; });
  for (const auto* t : held)
    vi.checksums.push_back(checksum64(t->data, t->size));
  return vi;
}

std::shared_ptr<job_runner> make_thread_runner(std::size_t queue_limit) {
  return std::make_shared<thread_runner>(queue_limit);
}

weight_bucket group_layout(const transfer::weight_snapshot& s, std::uint32_t g) {
  weight_bucket b;
  b.version = s.version();
  b.group = g;
  std::uint64_t offset = 0;
  for (const auto& t : s.group(g)) {
    bucket_entry e;
    e.name = t.name;
    e.dtype = static_cast<std::uint8_t>(t.type);
    e.shape = t.shape;
    e.offset = offset;
    e.bytes = t.size;
    offset += t.size;
    b.entries.push_back(std::move(e));
  }
  return b;
}

weight_bucket group_bucket(const transfer::weight_snapshot& s, std::uint32_t g) {
  auto b = group_layout(s, g);
  b.data.reserve(static_cast<std::size_t>(s.group_bytes(g)));
  for (const auto& t : s.group(g)) {
    auto* p = reinterpret_cast<const std::uint8_t*>(t.data);
    b.data.insert(b.data.end(), p, p + t.size);
  }
  b.checksum = checksum64(b.data.data(), b.data.size());
  return b;
}

caf::error version_not_held(self_ptr self, std::uint64_t version) {
  std::string held;
  for (auto v : self->state.cfg.source->versions())
    held += (held.empty() ? "" : ", ") + std::to_string(v);
  return make_error(errc::version_gone, "version " + std::to_string(version) + " is not held (held: "
                                            + (held.empty() ? "none" : held) + ")");
}

/// Version `version` when group `group` of it is held, else why not.
caf::expected<transfer::snapshot_ptr> held_group(self_ptr self, std::uint64_t version, std::uint32_t group) {
  auto s = self->state.cfg.source->find(version);
  if (!s)
    return version_not_held(self, version);
  if (!s->holds_group(group))
    return make_error(errc::unknown_name, "group " + std::to_string(group) + " is not held by this trainer");
  return s;
}

/// Group `group` of `version` as a bucket, or why the source cannot give it.
caf::expected<weight_bucket> held_bucket(self_ptr self, std::uint64_t version, std::uint32_t group) {
  auto s = held_group(self, version, group);
  if (!s)
    return s.error();
  return group_bucket(**s, group);
}

/// CAF pulls handed to the packer at once (with the byte budget): the
/// packer's queue bound.
constexpr std::size_t caf_packs_in_flight = 64;

/// Hands waiting CAF pulls to the packer while the reply budget allows:
/// at least one at a time, however large its group.
void pack_waiting_pulls(self_ptr self) {
  auto& st = self->state;
  while (!st.waiting_pulls.empty()) {
    auto& next = st.waiting_pulls.front();
    if (!st.packing_pulls.empty()
        && (st.packing_pulls.size() >= caf_packs_in_flight
            || st.packing_bytes + next.bytes > st.cfg.caf_reply_budget_bytes))
      return; // a reply packed and handed on frees its share, then this one goes
    const auto id = st.next_pack++;
    auto pull = std::move(next);
    st.waiting_pulls.pop_front();
    // Weak until the end: a job must not keep a stopped trainer alive.
    bool posted = st.cfg.packer->post([snapshot = pull.version, group = pull.group, id,
                                       me = caf::actor_cast<caf::actor_addr>(self)] {
      auto trainer = caf::actor_cast<trainer_impl_actor>(me);
      if (!trainer)
        return;
      try {
        caf::send_as(trainer, trainer, packed_atom::value, id, group_bucket(*snapshot, group));
      } catch (const std::exception& e) {
        caf::send_as(trainer, trainer, packed_atom::value, id, std::string(e.what()));
      }
    });
    if (!posted) {
      if (!st.packing_pulls.empty()) { // it takes this one once a pack in flight ends
        st.waiting_pulls.push_front(std::move(pull));
        return;
      }
      pull.reply.deliver(make_error(errc::queue_full, "trainer: the packer refused a pull of group "
                                                        + std::to_string(pull.group)));
      continue;
    }
    st.packing_bytes += pull.bytes;
    st.packing_pulls.emplace(id, std::move(pull));
  }
}

/// CAF pull reply `id` was packed (or failed): answers its requester and
/// frees its bytes of the budget.
void answer_packed_pull(self_ptr self, std::uint64_t id, caf::expected<weight_bucket> bucket) {
  auto& st = self->state;
  auto it = st.packing_pulls.find(id);
  if (it == st.packing_pulls.end())
    return;
  auto pull = std::move(it->second);
  st.packing_pulls.erase(it);
  st.packing_bytes -= pull.bytes;
  if (bucket)
    pull.reply.deliver(std::move(*bucket));
  else
    pull.reply.deliver(bucket.error());
  pack_waiting_pulls(self);
}

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

/// Version `s`'s device copy on `device` that needs no upload: the one it
/// was pushed with (a PyTorch rank's CUDA tensors; not cached here, its
/// source bounds those, and each pull's snapshot holds it while it is read),
/// or one this rank uploaded before. Null otherwise.
std::shared_ptr<const gpu::device_snapshot> device_copy_at_hand(self_ptr self, const transfer::weight_snapshot& s,
                                                                const gpu::pack_device& device) {
  if (auto pushed = gpu::device_snapshot::adopt(s, device))
    return pushed;
  const auto& copies = self->state.device_copies;
  if (auto it = copies.find(s.version()); it != copies.end() && it->second.on == &device)
    return it->second.copy;
  return nullptr;
}

/// The rank's device copy of version `s` on `device` (the nccl link's, or
/// the cuda_ipc buffer's): one at hand, else uploaded at the version's first
/// pull on the actor's thread. At most two uploads are kept (and those a
/// queued send still holds); the one asked for is never the one evicted.
/// Null when the upload failed (out of device memory): said once, not
/// retried for that version, and the caller packs on the CPU instead.
std::shared_ptr<const gpu::device_snapshot> device_copy(self_ptr self, const transfer::weight_snapshot& s,
                                                        gpu::pack_device& device) {
  if (auto at_hand = device_copy_at_hand(self, s, device))
    return at_hand;
  auto& st = self->state;
  auto& copies = st.device_copies;
  if (st.device_copy_failed == s.version())
    return nullptr;
  copies.erase(s.version());
  while (copies.size() >= 2) // evicted first: two copies at most while the next is made
    copies.erase(copies.begin());
  try {
    auto made = std::make_shared<const gpu::device_snapshot>(s, device);
    copies[s.version()] = {&device, made};
    return made;
  } catch (const std::exception& e) {
    st.device_copy_failed = s.version();
    log(self, "trainer: version " + std::to_string(s.version()) + " could not be copied to the device (" + e.what()
                + "): its groups are packed on the CPU");
    return nullptr;
  }
}

/// XXH3 of group `g`'s whole tensors, read in place from the host bytes.
std::uint64_t group_checksum(const transfer::weight_snapshot& s, std::uint32_t g) {
  checksum64_stream sum;
  for (const auto& t : s.group(g))
    sum.update(t.data, t.size);
  return sum.digest();
}

/// Group `g`'s whole tensors in the device copy `copy` of `s`, in order.
std::vector<gpu::pack_device::piece> device_pieces(const transfer::weight_snapshot& s, std::uint32_t g,
                                                    const gpu::device_snapshot& copy) {
  std::vector<gpu::pack_device::piece> pieces;
  for (const auto& t : s.group(g)) {
    const auto index = static_cast<std::size_t>(s.find(t.name) - s.tensors().data());
    pieces.push_back({copy.sources().at(index), t.size});
  }
  return pieces;
}

/// Group `g` of `s` as pieces of its device copy `copy`, and its bucket
/// without data: the layout, and the XXH3 of the host bytes taken in place.
std::pair<std::vector<gpu::pack_device::piece>, weight_bucket>
device_group(const transfer::weight_snapshot& s, std::uint32_t g, const gpu::device_snapshot& copy) {
  auto bucket = group_layout(s, g);
  bucket.checksum = group_checksum(s, g);
  return {device_pieces(s, g, copy), std::move(bucket)};
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

/// An engine worker's own credentials (a UCX ticket, a cuda_ipc slot) go
/// only to the node that registered the engine: another member could act
/// as that engine. Returns the refusal, or nothing when the sender may.
std::optional<caf::error> engine_from_sender(self_ptr self, const std::shared_ptr<sender_guard>& data_guard,
                                             const std::string& engine, std::int32_t worker, const char* message,
                                             const std::string& what) {
  if (engine.size() > 4096 || worker < 0)
    return make_error(errc::malformed, what + " for an engine name of " + std::to_string(engine.size())
                                         + " bytes, worker " + std::to_string(worker));
  const auto& sender = self->current_sender();
  if (const auto& engines = self->state.cfg.engines;
      engines && sender->node() != self->node() && !engines->hosts(sender->node(), engine)) {
    data_guard->refuse(sender, message, "engine '" + printable(engine) + "' is not registered from that node");
    return make_error(errc::unauthenticated, "trainer: " + what + " for engine '" + printable(engine)
                                               + "': that engine is not registered from the asking node");
  }
  return std::nullopt;
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

trainer_impl_actor::behavior_type trainer(self_ptr self, trainer_config cfg) {
  if (!cfg.runner)
    cfg.runner = make_thread_runner();
  if (!cfg.packer)
    cfg.packer = make_thread_runner(caf_packs_in_flight);
  self->state.cfg = std::move(cfg);
  self->set_down_handler([=](const caf::down_msg& dm) { self->state.subscribers.erase(dm.source); });
  start_step(self);
  // Every handler: a peer that was not admitted pulls, steps and learns nothing.
  auto guard = self->state.guard
    = std::make_shared<sender_guard>("trainer", self->state.cfg.authorize, self->state.cfg.log);
  sender_policy engines_ask = self->state.cfg.authorize;
  if (auto engines = self->state.cfg.engines)
    engines_ask = [own = self->node(), authorize = self->state.cfg.authorize,
                   engines](const caf::strong_actor_ptr& sender) {
      return (authorize ? authorize(sender) : sender->node() == own) || engines->hosts_any(sender->node());
    };
  auto data_guard = self->state.data_guard
    = std::make_shared<sender_guard>("trainer", std::move(engines_ask), self->state.cfg.log);
  auto placements_guard = self->state.placements_guard
    = std::make_shared<sender_guard>("trainer", self->state.cfg.placements_from, self->state.cfg.log);
  refuse_stray_errors(self, guard);
  return {
    authorized(self, data_guard, [=](meta_atom) -> std::vector<tensor_meta> {
      std::vector<tensor_meta> out;
      for (const auto& p : self->state.cfg.source->parameters())
        out.push_back(tensor_meta{p.name, static_cast<std::uint8_t>(p.type), p.shape});
      return out;
    }),
    authorized(self, data_guard, [=](version_atom) -> version_info { return self->state.published; }),
    authorized(self, data_guard, [=](pull_atom, std::uint64_t version, std::uint32_t group) -> caf::result<weight_bucket> {
      auto s = held_group(self, version, group);
      if (!s)
        return s.error();
      auto& st = self->state;
      if (st.waiting_pulls.size() >= std::max<std::size_t>(1, st.cfg.max_waiting_pulls))
        return make_error(errc::queue_full, "trainer: " + std::to_string(st.waiting_pulls.size())
                                              + " CAF pulls already wait for the reply budget (trainer_config."
                                                "max_waiting_pulls); group "
                                              + std::to_string(group) + " of version " + std::to_string(version)
                                              + " is refused");
      auto rp = self->make_response_promise<weight_bucket>();
      st.waiting_pulls.push_back({*s, group, (*s)->group_bytes(group), rp});
      pack_waiting_pulls(self);
      return rp;
    }),
    authorized(self, guard, [=](subscribe_atom, const version_listener_actor& listener) {
      if (!listener)
        return;
      auto addr = listener.address();
      auto& subscribers = self->state.subscribers;
      if (subscribers.count(addr) == 0 && subscribers.size() >= self->state.cfg.max_subscribers) {
        log(self, "trainer: refused a subscription: " + std::to_string(subscribers.size())
                    + " listeners reach the bound of trainer_config.max_subscribers = "
                    + std::to_string(self->state.cfg.max_subscribers));
        return;
      }
      if (subscribers.emplace(addr, listener).second) {
        self->monitor(listener);
        if (self->state.published.version > 0)
          self->send(listener, version_atom::value, self->state.published);
      }
    }),
    authorized(self, data_guard, [=](heartbeat_atom, const heartbeat& hb) -> heartbeat { return hb; }),
    authorized(self, data_guard, [=](ucx_ticket_atom, const std::string& engine, std::int32_t worker) -> caf::result<ucx_ticket> {
      const auto& office = self->state.cfg.ucx_tickets;
      if (!office)
        return make_error(errc::unknown_name, "this trainer runs no UCX producer");
      if (auto refused = engine_from_sender(self, data_guard, engine, worker, "ucxticket", "a UCX ticket"))
        return *refused;
      try {
        return office->issue(engine, worker);
      } catch (const std::exception& e) {
        return make_error(errc::unknown_name, e.what());
      }
    }),
    authorized(self, data_guard, [=](ipc_pull_atom, const ipc_pull& req) -> caf::result<ipc_chunk> {
      auto producer = self->state.cfg.cuda_ipc ? self->state.cfg.cuda_ipc->producer() : nullptr;
      if (!producer)
        return make_error(errc::unknown_name, "this trainer runs no cuda_ipc producer");
      if (auto refused = engine_from_sender(self, data_guard, req.engine, req.worker, "ipcpull", "a cuda_ipc pull"))
        return *refused;
      // A worker number no engine has would take a slot another engine needs.
      if (const auto most = producer->workers_per_engine(); most > 0 && static_cast<std::size_t>(req.worker) >= most)
        return make_error(errc::malformed, "trainer: cuda_ipc: worker " + std::to_string(req.worker) + " of engine '"
                                             + printable(req.engine) + "': engines have at most "
                                             + std::to_string(most) + " workers");
      auto s = held_group(self, req.version, req.group);
      if (!s)
        return s.error();
      try {
        // The group's tensors go from the rank's device copy of the version
        // (made at its first pull) into the slot, device to device; their
        // XXH3 is taken from the host bytes in place. Without a copy: from
        // the host, packed.
        const auto slot = req.engine + "/" + std::to_string(req.worker);
        weight_bucket bucket;
        gpu::ipc_placement at;
        if (auto copy = device_copy(self, **s, *producer->packer())) {
          auto [pieces, layout] = device_group(**s, req.group, *copy);
          bucket = std::move(layout);
          at = producer->place_from_device(slot, req.session, req.chunk, pieces);
        } else {
          bucket = group_bucket(**s, req.group);
          at = producer->place(slot, req.session, req.chunk, bucket.data.data(), bucket.data.size());
          bucket.data.clear();
        }
        ipc_chunk out;
        out.session = at.session;
        out.chunk = at.chunk;
        out.handle.assign(at.handle.begin(), at.handle.end());
        out.buffer_bytes = at.buffer_bytes;
        out.offset = at.offset;
        out.bytes = at.bytes;
        out.bucket = std::move(bucket);
        return out;
      } catch (const std::exception& e) {
        return make_error(errc::unknown_name, std::string("trainer: cuda_ipc: ") + e.what());
      }
    }),
    authorized(self, data_guard, [=](ipc_release_atom, const ipc_pull& req) {
      auto producer = self->state.cfg.cuda_ipc ? self->state.cfg.cuda_ipc->producer() : nullptr;
      if (producer && !engine_from_sender(self, data_guard, req.engine, req.worker, "ipcrelease", "a cuda_ipc release"))
        producer->release(req.engine + "/" + std::to_string(req.worker), req.session);
    }),
    authorized(self, data_guard, [=](nccl_pull_atom, const nccl_pull& req) -> caf::result<nccl_chunk> {
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
    }),
    authorized(self, data_guard, [=](nccl_broadcast_atom, const nccl_pull& req) -> caf::result<nccl_manifest> {
      auto member = nccl_member_sender(self, data_guard, req.engine, req.worker, req.epoch, "ncclbcast",
                                       "a broadcast ask");
      if (!member)
        return member.error();
      return collective_broadcast(self, *member, req);
    }),
    authorized(self, data_guard, [=](nccl_plan_atom, const nccl_plan& req) -> caf::result<std::uint64_t> {
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
    }),
    authorized(self, placements_guard, [=](nccl_id_atom) -> caf::result<std::vector<std::uint8_t>> {
      if (!self->state.cfg.make_nccl_id)
        return make_error(errc::unknown_name, "this trainer makes no nccl ids");
      try {
        return self->state.cfg.make_nccl_id();
      } catch (const std::exception& e) {
        return make_error(errc::unknown_name, std::string("trainer: nccl id: ") + e.what());
      }
    }),
    authorized(self, placements_guard, [=](nccl_join_atom, const nccl_rendezvous_msg& msg) -> caf::result<std::uint64_t> {
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
    }),
    authorized(self, placements_guard, [=](nccl_dead_atom, std::uint64_t epoch, const std::string& who) {
      const auto& cfg = self->state.cfg;
      if (cfg.nccl_membership && cfg.nccl_membership->mark_dead(epoch, who))
        log(self, "trainer rank " + std::to_string(cfg.nccl_rank) + ": nccl: " + who + " died in epoch "
                    + std::to_string(epoch) + ": its sends abort");
    }),
    authorized(self, placements_guard, [=](register_atom, const std::vector<engine_placement>& placements) {
      if (!self->state.cfg.engines)
        return;
      if (auto why = self->state.cfg.engines->assign(placements); !why.empty())
        log(self, "trainer: refused engine placements: " + why);
    }),
    authorized(self, guard, [=](caf::tick_atom) {
      self->state.tick_pending = false;
      start_step(self);
    }),
    authorized(self, guard, [=](step_atom) -> caf::result<version_info> {
      auto& st = self->state;
      if (!st.producing) {
        if (st.frozen)
          return st.published;
        if (!start_step(self))
          return make_error(errc::queue_full, "trainer: the job runner refused the step");
      }
      auto rp = self->make_response_promise<version_info>();
      st.step_waiters.push_back(rp);
      return rp;
    }),
    authorized(self, guard, [=](freeze_atom) -> caf::result<version_info> {
      auto& st = self->state;
      st.frozen = true;
      if (!st.producing)
        return st.published;
      auto rp = self->make_response_promise<version_info>();
      st.freeze_waiters.push_back(rp);
      return rp;
    }),
    authorized(self, guard, [=](pin_atom, std::uint64_t version) {
      if (!self->state.cfg.source->pin(version))
        log(self, "trainer: cannot keep version " + std::to_string(version) + " for the round: already dropped");
    }),
    authorized(self, guard, [=](catch_up_atom, std::uint64_t version) {
      auto& st = self->state;
      if (version <= st.published.version)
        return;
      st.catch_up_to = std::max(st.catch_up_to, version);
      start_step(self); // or, with one in flight, the next step catches up
    }),
    authorized(self, guard, [=](produced_atom, const version_info& made) {
      auto& st = self->state;
      st.producing = false;
      ++st.steps;
      st.last_error.clear();
      if (made.version > st.published.version)
        publish(self, made);
      for (auto& rp : std::exchange(st.freeze_waiters, {}))
        rp.deliver(st.published);
      for (auto& rp : std::exchange(st.step_waiters, {}))
        rp.deliver(st.published); // unchanged when the source had nothing new
      schedule_tick(self);
    }),
    authorized(self, guard, [=](packed_atom, std::uint64_t id, weight_bucket& bucket) {
      if (self->current_sender() == self->ctrl()) // only its packer's, sent as itself
        answer_packed_pull(self, id, std::move(bucket));
    }),
    authorized(self, guard, [=](packed_atom, std::uint64_t id, const std::string& error) {
      if (self->current_sender() == self->ctrl())
        answer_packed_pull(self, id, make_error(errc::malformed, "trainer: packing a CAF pull: " + error));
    }),
    authorized(self, guard, [=](produced_atom, const std::string& error) {
      auto& st = self->state;
      st.producing = false;
      ++st.failed_steps;
      if (error != st.last_error) // the same failure every step is said once
        log(self, "trainer: step failed: " + error);
      st.last_error = error;
      for (auto& rp : std::exchange(st.freeze_waiters, {}))
        rp.deliver(st.published);
      // Whoever asked for this step must not mistake the old version for its result.
      for (auto& rp : std::exchange(st.step_waiters, {}))
        rp.deliver(make_error(errc::malformed, "trainer: step failed: " + error));
      schedule_tick(self);
    }),
  };
}

trainer_actor spawn_trainer(caf::actor_system& sys, trainer_config cfg) {
  if (!cfg.source)
    throw std::invalid_argument("trainer: no weight source");
  return sys.spawn(trainer, std::move(cfg));
}

void serve_over_nccl(trainer_config& cfg, std::shared_ptr<gpu::nccl_membership> membership, int rank) {
  cfg.nccl_pack_device = membership->packer(gpu::comm_member::trainer_rank(rank));
  cfg.nccl_membership = std::move(membership);
  cfg.nccl_rank = rank;
  cfg.make_nccl_id = [] { // NCCL's bootstrap listens in the process that made it: the root's
    const auto id = gpu::make_nccl_id();
    return std::vector<std::uint8_t>(id.begin(), id.end());
  };
}

local_trainer make_local_trainer(caf::actor_system& sys, const topology& t, std::size_t rank,
                                 sender_policy authorize, sender_policy placements_from,
                                 std::shared_ptr<transfer::weight_source> source,
                                 std::shared_ptr<gpu::nccl_membership> nccl) {
  local_trainer out;
  out.source = source ? std::move(source) : transfer::make_weight_source(t, rank);
  transfer::local_transfer_options o;
  o.groups_in_flight = static_cast<std::size_t>(std::max<std::int64_t>(1, t.transfer.groups_in_flight));
  out.transfer = std::make_shared<transfer::local_transfer>(out.source, o);
  out.ucx_tickets = std::make_shared<ucx_ticket_office>();
  out.cuda_ipc = std::make_shared<ipc_desk>();
  out.nccl = std::make_shared<nccl_desk>();
  out.engines = std::make_shared<engine_nodes>();
  out.placements_from = std::move(placements_from);
  auto cfg = local_trainer_config(out, t, std::move(authorize));
  if (nccl)
    serve_over_nccl(cfg, std::move(nccl), static_cast<int>(rank));
  out.actor = spawn_trainer(sys, std::move(cfg));
  return out;
}

trainer_config local_trainer_config(const local_trainer& parts, const topology& t, sender_policy authorize) {
  trainer_config cfg;
  cfg.source = parts.source;
  cfg.ucx_tickets = parts.ucx_tickets;
  cfg.cuda_ipc = parts.cuda_ipc;
  cfg.nccl = parts.nccl;
  cfg.engines = parts.engines;
  cfg.placements_from = parts.placements_from;
  cfg.step_time = t.trainer.source == trainer_source::external ? external_poll_interval : t.trainer.step_time;
  cfg.log = [](const std::string& line) { std::cerr << (line + '\n'); };
  cfg.authorize = std::move(authorize);
  cfg.rank_checksums = t.trainer.ranks.size() > 1; // the coordinator's layout check compares ranks' bytes
  cfg.nccl_bucket_bytes = static_cast<std::uint64_t>(std::max<std::int64_t>(1, t.transfer.bucket_bytes));
  return cfg;
}

} // namespace rlsync
