#include "actors/ipc_puller.hpp"

#include "actors/caf_puller.hpp"
#include "actors/land_on_device.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/transfer/bucket.hpp"

#include <caf/scoped_actor.hpp>

#include <algorithm>

namespace rlsync {

using transfer::transfer_error;
using transfer::transfer_failure;

ipc_puller::ipc_puller(caf::actor_system& sys, std::function<trainer_actor()> trainer, model_config model,
                       std::shared_ptr<gpu::ipc_memory> memory, std::optional<std::vector<std::uint32_t>> groups)
  : sys_(sys), trainer_(std::move(trainer)), model_(std::move(model)), expected_(model_), groups_(groups_or_all(model_, std::move(groups))),
    memory_(std::move(memory)), group_deadline_(whole_group_deadline(model_)),
    largest_group_bytes_(plan::largest_group_bytes(model_, llama_parameter_specs(model_, dtype::f32), dtype::f32)),
    scratches_(static_cast<std::size_t>(largest_group_bytes_) + transfer::checksum_trailer_bytes) {
  if (!memory_)
    throw std::invalid_argument("a cuda_ipc puller without device memory");
}

void ipc_puller::register_worker(const std::string& engine, std::shared_ptr<const plan::worker_plan> plan) {
  if (!plan)
    throw std::invalid_argument("cuda_ipc transfer: engine '" + engine + "' registered no plan");
  auto grouped = std::make_shared<const plan::grouped_plan>(model_, plan);
  std::lock_guard<std::mutex> lock(mutex_);
  plans_[engine + "/" + std::to_string(plan->worker)] = std::move(grouped);
}

void ipc_puller::unregister_engine(const std::string& engine) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto prefix = engine + "/";
  for (auto it = books_.lower_bound(prefix); it != books_.end() && it->first.compare(0, prefix.size(), prefix) == 0;)
    it = books_.erase(it);
  for (auto it = plans_.lower_bound(prefix); it != plans_.end() && it->first.compare(0, prefix.size(), prefix) == 0;)
    it = plans_.erase(it);
  scratches_.forget(engine);
}

transfer::pull_report ipc_puller::pull(const transfer::pull_request& req, const transfer::group_sink& sink) {
  transfer::pull_report report;
  report.engine = req.engine;
  report.worker = req.worker;
  report.version = req.version;
  const auto t0 = transfer::clock::now();
  const auto consumer = req.engine + "/" + std::to_string(req.worker);
  caf::scoped_actor self{sys_};
  const trainer_actor trainer = trainer_();
  ipc_pull ask;
  ask.engine = req.engine;
  ask.worker = req.worker;
  ask.version = req.version;
  std::unique_ptr<gpu::ipc_memory::mapping> mapping;
  std::vector<std::uint8_t> handle; // the session's
  // Whatever way the pull ends, the session ends with it on both sides.
  struct end_session {
    ipc_puller& p;
    caf::scoped_actor& self;
    const trainer_actor& trainer;
    ipc_pull& ask;
    const std::string& consumer;
    std::unique_ptr<gpu::ipc_memory::mapping>& mapping;
    ~end_session() {
      mapping.reset();
      if (ask.session == 0)
        return;
      self->send(trainer, ipc_release_atom::value, ask);
      std::lock_guard<std::mutex> lock(p.mutex_);
      if (auto it = p.books_.find(consumer); it != p.books_.end()) // gone: its engine unregistered
        it->second.close(ask.session);
    }
  } ender{*this, self, trainer, ask, consumer, mapping};
  auto refuse = [&](const std::string& why) {
    return transfer_error(transfer_failure::producer_failed, "trainer over cuda_ipc: " + why);
  };
  // An engine on a device lands each group from the mapping, packed there by
  // its plan, and checked against what verified (the trainer can write there).
  std::shared_ptr<const plan::grouped_plan> plan;
  if (sink.on_device) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = plans_.find(consumer); it != plans_.end())
      plan = it->second;
  }
  auto packer = plan ? memory_->packer() : nullptr;
  const auto landing = whole_group_landing_for(sink, std::move(plan), std::move(packer), scratches_, req.engine,
                                               req.worker, /*recheck*/ true);
  for (std::uint32_t k = 0; k < groups_.size(); ++k) {
    transfer::stop_if_abandoned(sink, consumer, k, groups_.size()); // the session ends with `ender`
    const std::uint32_t g = groups_[k];
    auto left = group_wait(req, g, group_deadline_);
    ask.group = g;
    ask.chunk = k;
    std::optional<ipc_chunk> chunk;
    caf::error failure;
    self->request(trainer, left, ipc_pull_atom::value, ask)
      .receive([&](ipc_chunk& c) { chunk = std::move(c); }, [&](caf::error& e) { failure = std::move(e); });
    if (!chunk)
      throw_trainer_refusal(sys_, failure, g);
    if (k == 0)
      ask.session = chunk->session; // from here on the session is released on every way out
    if (chunk->handle.size() != gpu::ipc_handle_bytes)
      throw refuse("a handle of " + std::to_string(chunk->handle.size()) + " bytes");
    if (chunk->bytes > largest_group_bytes_)
      throw refuse("group " + std::to_string(g) + " of " + std::to_string(chunk->bytes)
                   + " bytes, more than the model's largest group (" + std::to_string(largest_group_bytes_) + ")");
    if (k == 0) {
      {
        // A mapping never outlives its pull, so there is no older one to unmap.
        std::lock_guard<std::mutex> lock(mutex_);
        if (auto opened = books_[consumer].open(chunk->session); !opened.error.empty())
          throw refuse(opened.error);
      }
      handle = chunk->handle;
      gpu::ipc_handle h;
      std::copy(handle.begin(), handle.end(), h.begin());
      try {
        mapping = memory_->map(h, static_cast<std::size_t>(chunk->buffer_bytes));
      } catch (const std::exception& e) {
        throw refuse(std::string("cannot map its buffer (cuda_ipc needs the engine on the trainer's host): ")
                     + e.what());
      }
    } else if (chunk->session != ask.session || chunk->handle != handle) {
      throw refuse("group " + std::to_string(g) + " names another session or buffer");
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto why = books_[consumer].chunk(chunk->session, chunk->chunk, chunk->offset, chunk->bytes,
                                            chunk->buffer_bytes);
          !why.empty())
        throw refuse(why);
    }
    auto& bucket = chunk->bucket;
    bucket.data.resize(static_cast<std::size_t>(chunk->bytes));
    try {
      mapping->read(static_cast<std::size_t>(chunk->offset), bucket.data.data(), bucket.data.size());
    } catch (const std::exception& e) {
      throw refuse(std::string("reading group ") + std::to_string(g) + ": " + e.what());
    }
    const auto views = deliver_whole_group(expected_, req, g, bucket, sink, report);
    if (landing)
      land_whole_group(landing, req.worker, g, views, bucket.data.data(), bucket.data.size(),
                       mapping->at(static_cast<std::size_t>(chunk->offset), bucket.data.size()), sink);
  }
  report.duration = transfer::clock::now() - t0;
  return report;
}

} // namespace rlsync
