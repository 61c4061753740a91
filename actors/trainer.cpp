#include "actors/trainer.hpp"
#include "actors/trainer_internal.hpp"

#include "runtime/base/bounded_queue.hpp"
#include "runtime/base/checksum.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/config/topology.hpp"
#include "gpu/ipc_producer.hpp"
#include "gpu/nccl_comm.hpp"
#include "gpu/device_pack.hpp"
#include "gpu/nccl_membership.hpp"
#include "runtime/plan/groups.hpp"

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>
#include <caf/system_messages.hpp>

#include <algorithm>
#include <iostream>
#include <thread>

namespace rlsync {

namespace {

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

namespace trainer_detail {

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

} // namespace trainer_detail

using namespace trainer_detail;

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
      return serve_nccl_pull(self, data_guard, req);
    }),
    authorized(self, data_guard, [=](nccl_broadcast_atom, const nccl_pull& req) -> caf::result<nccl_manifest> {
      return serve_nccl_broadcast(self, data_guard, req);
    }),
    authorized(self, data_guard, [=](nccl_plan_atom, const nccl_plan& req) -> caf::result<std::uint64_t> {
      return register_nccl_plan(self, data_guard, req);
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
      return join_nccl(self, msg);
    }),
    authorized(self, placements_guard, [=](nccl_dead_atom, std::uint64_t epoch, const std::string& who) {
      mark_nccl_dead(self, epoch, who);
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
