#include "actors/assembly/external_rank.hpp"

#include "actors/assembly/head_node.hpp"
#include "actors/assembly/member_node.hpp"
#include "actors/gatekeeper.hpp"
#include "actors/system_config.hpp"
#include "actors/tls.hpp"
#include "gpu/device_pack.hpp"
#include "runtime/config/build_features.hpp"

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <future>
#include <optional>
#include <stdexcept>

namespace rlsync {

external_rank::external_rank(const topology& t, std::uint32_t rank, external_rank_options o)
    : topology_(t), rank_(rank), options_(std::move(o)) {
  if (t.trainer.source != trainer_source::external)
    throw std::invalid_argument(t.source + ": trainer.source is " + std::string(to_string(t.trainer.source))
                                + ", not external: its nodes run the trainer ranks themselves");
  if (rank >= t.trainer.ranks.size())
    throw std::invalid_argument(t.source + ": no trainer rank " + std::to_string(rank) + " (the topology has "
                                + std::to_string(t.trainer.ranks.size()) + ")");
  node_ = t.trainer.ranks[rank].node;
  if (auto problem = cluster_layout_problem(t); !problem.empty())
    throw std::invalid_argument(problem);
  // Without CUDA compiled in there is nothing to read device memory with:
  // the caller stages CUDA tensors on the host first (reads_device()).
  source_ = transfer::make_external_source(t, rank, options_.allow_nonfinite,
                                           cuda_compiled_in() ? gpu::cuda_tensor_device() : nullptr);
  const std::string file = options_.secret_file.empty() ? t.cluster.secret_file : options_.secret_file;
  config_ = std::make_unique<system_config>();
  secret_ = read_cluster_secret(with_node_name(file, node_), t.cluster.secret_env); // throws naming the file
  configure_node_tls(*config_, t, node_); // throws naming a TLS file
  // Heartbeats on both sides, as every node: a silent partition is noticed.
  config_->set("middleman.heartbeat-interval", caf::timespan{t.cluster.heartbeat_interval});
  config_->set("middleman.connection-timeout", caf::timespan{t.cluster.heartbeat_timeout});
  system_ = std::make_unique<caf::actor_system>(*config_);
  serving_ = std::thread([this] { serve(); });
  std::unique_lock<std::mutex> lock(mutex_);
  // Joining is bounded by connect_deadline (join, then each registration).
  const auto deadline = t.cluster.connect_deadline * 3;
  changed_.wait_for(lock, deadline, [this] { return ready_ || finished_; });
  if (ready_) {
    lock.unlock();
    // Where the fleet stands: a trainer restarted from its checkpoint that
    // counts again from an older step would publish versions no round ever
    // syncs (the fleet is past them) while wait_synced says they are served.
    try {
      source_->raise_floor(status(t.cluster.connect_deadline).version);
    } catch (const std::runtime_error& e) {
      if (options_.log)
        options_.log(std::string("could not learn the fleet's version (") + e.what()
                     + "): versions at or below it are not refused here");
    }
    return;
  }
  std::string why = finished_ ? failure_ : "not registered within " + std::to_string(deadline.count()) + " ms";
  lock.unlock();
  close();
  throw std::runtime_error("trainer rank " + std::to_string(rank) + " (node " + node_ + "): "
                           + (why.empty() ? std::string("could not join the cluster") : why));
}

external_rank::~external_rank() {
  close();
}

void external_rank::serve() {
  member_node_options mo;
  mo.stop_requested = [this] { return stop_.load(); };
  mo.log = [this](const std::string& line) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!ready_)
        failure_ = line; // the last line before giving up says why
    }
    if (options_.log)
      options_.log(line);
  };
  mo.external_rank = rank_;
  mo.external_source = source_;
  mo.coordinator = coordinator_;
  mo.drill_arms = drill_arms_;
  mo.on_ranks = [this](const std::vector<hosted_rank>& ranks) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!ranks.empty())
      trainer_ = ranks.front().trainer.actor;
  };
  mo.on_registered = [this](const std::vector<std::pair<std::string, caf::actor>>&) {
    std::lock_guard<std::mutex> lock(mutex_);
    ready_ = true;
    changed_.notify_all();
    return std::string{};
  };
  const node_spec* node = topology_.find_node(node_);
  const node_spec* head = topology_.find_node(topology_.coordinator.node);
  auto end = run_member_node(*system_, topology_, *node, *head, secret_, mo);
  std::lock_guard<std::mutex> lock(mutex_);
  finished_ = true;
  if (failure_.empty() && end.exit_code != 0)
    failure_ = "stopped with exit code " + std::to_string(end.exit_code);
  trainer_ = nullptr;
  changed_.notify_all();
}

void external_rank::publish(std::uint64_t version, const std::vector<transfer::tensor_input>& tensors) {
  std::shared_lock<std::shared_mutex> using_system(in_use_);
  if (closed_)
    throw std::logic_error("trainer rank " + std::to_string(rank_) + ": closed");
  trainer_actor trainer;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_)
      throw std::runtime_error("trainer rank " + std::to_string(rank_) + " left the cluster: " + failure_);
    trainer = trainer_;
  }
  source_->push(version, tensors); // throws std::invalid_argument naming the tensor
  if (auto why = source_->device_copy_problem(); !why.empty() && options_.log)
    options_.log("version " + std::to_string(version) + " has no device copy (" + why
                 + "): it is served from its host bytes, as a CPU publish is");
  // Publish now rather than at the next poll; a step in flight finishes first.
  caf::scoped_actor self{*system_};
  self->send(trainer, step_atom::value);
}

std::vector<std::string> external_rank::drill_withhold(std::uint64_t version, std::chrono::milliseconds release_after) {
  return drill_arms_->withhold(version, release_after);
}

coordinator_status external_rank::status(std::chrono::milliseconds deadline) const {
  std::shared_lock<std::shared_mutex> using_system(in_use_);
  auto coordinator = coordinator_->get();
  if (!coordinator || closed_)
    throw std::runtime_error("trainer rank " + std::to_string(rank_) + ": not in a cluster");
  caf::scoped_actor self{*system_};
  std::optional<coordinator_status> out;
  std::string failure;
  self->request(coordinator, deadline, status_atom::value)
    .receive([&](coordinator_status& s) { out = std::move(s); },
             [&](caf::error& err) { failure = system_->render(err); });
  if (!out)
    throw std::runtime_error("the coordinator did not answer: " + failure);
  return std::move(*out);
}

sync_progress external_rank::wait_synced(std::uint64_t version, std::chrono::milliseconds timeout,
                                         const std::function<bool()>& interrupted) const {
  sync_progress p;
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - std::chrono::steady_clock::now());
    try {
      p.status = status(std::clamp(left, std::chrono::milliseconds(100), std::chrono::milliseconds(5000)));
      p.answered = true;
      p.synced = p.status.live > 0 && p.status.version >= version;
    } catch (const std::runtime_error&) {
      // not answering now (a restarting head): ask again until the timeout
    }
    if (p.synced || std::chrono::steady_clock::now() >= give_up || closed_ || (interrupted && interrupted()))
      return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(20)); // the coordinator has no version push for outsiders
  }
}

void external_rank::close() {
  const bool again = closed_.exchange(true);
  std::unique_lock<std::shared_mutex> no_call_uses_the_system(in_use_); // calls begun before it end first
  if (again)
    return; // a close on another thread held the lock until it was done
  stop_ = true;
  if (serving_.joinable())
    serving_.join(); // the loop polls stop_ every 50 ms and stops the rank's actors (bounded)
  if (!system_)
    return;
  // Leaving the actor system waits for every actor object to be destroyed;
  // CAF 0.17's middleman sometimes keeps one referenced after its peer
  // vanished (see `rlsync node`). Give it a bounded wait, then leave it to
  // the process's exit rather than hang the caller.
  auto* sys = system_.release();
  auto* cfg = config_.release();
  auto done = std::make_shared<std::promise<void>>();
  auto finished = done->get_future();
  std::thread([sys, cfg, done] {
    delete sys;
    delete cfg;
    done->set_value();
  }).detach();
  if (finished.wait_for(std::chrono::seconds(5)) != std::future_status::ready && options_.log)
    options_.log("the actor system is still shutting down 5 s after close; left to the process's exit");
}

} // namespace rlsync
