#pragma once
// The deployment `rlsync bench sync` runs its cases on, shared by its
// translation units: bench_sync.cpp (the cases and the report) and
// bench_sync_rank_kill.cpp (the rank-kill case). Nothing else includes it.

#include "actors/jobs/bench_sync.hpp"

#include "actors/assembly/head_node.hpp"
#include "actors/gatekeeper.hpp"
#include "runtime/process/launcher.hpp"

#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace rlsync::jobs::bench_detail {

using clock_type = std::chrono::steady_clock;

/// The other nodes of a deployment, as `rlsync node` children of a
/// supervisor running on its own thread; their output is kept (the last
/// lines) for a failure, and passed on with --verbose.
class node_children {
public:
  node_children(std::vector<child_spec> children, const bench_session& s) {
    supervisor_options o;
    o.grace = std::chrono::seconds(5);
    o.sink = [this, &s](output_stream, std::string_view line) {
      std::string text(line);
      if (!text.empty() && text.back() == '\n')
        text.pop_back();
      if (s.verbose())
        s.note(text);
      std::lock_guard<std::mutex> lock(mutex_);
      tail_.push_back(std::move(text));
      if (tail_.size() > 60)
        tail_.pop_front();
    };
    sup_ = std::make_unique<supervisor>(o);
    if (!children.empty())
      thread_ = std::thread([this, children = std::move(children)] {
        result_ = sup_->run(children);
        ended_ = true; // every node process is gone (one failing stops the others)
      });
  }
  ~node_children() { stop(); }
  void stop() {
    if (thread_.joinable()) {
      sup_->request_stop();
      thread_.join();
    }
  }
  /// Whether the node processes have all exited.
  bool ended() const { return ended_; }
  std::string tail() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string s;
    for (auto& l : tail_)
      s += (s.empty() ? "" : "\n") + l;
    return s;
  }

private:
  std::unique_ptr<supervisor> sup_;
  std::thread thread_;
  launch_result result_;
  std::atomic<bool> ended_{false};
  mutable std::mutex mutex_;
  std::deque<std::string> tail_;
};

/// `t` as the bench deploys it: `model` from a synthetic source, `ranks`
/// ranks on the coordinator's node sharing the layers, `mode`, the
/// session's secret and TLS.
inline void bench_layout(const bench_session& s, topology& t, const model_config& model, transfer_mode mode, int ranks) {
  t.model.config = model;
  if (model.arch != model_arch::qwen3_moe) // the control case's tiny dense model: no experts to place
    for (auto& e : t.engines)
      e.expert_parallel = false;
  t.model.checkpoint.clear();
  t.model.weights_dtype = dtype::bf16;
  t.trainer.source = trainer_source::synthetic;
  t.trainer.node = t.coordinator.node; // this process steps every rank
  t.trainer.ranks = split_layers(t.coordinator.node, model.num_hidden_layers, ranks);
  t.transfer.mode = mode;
  t.cluster.secret_env = "RLSYNC_BENCH_SECRET";
  t.cluster.secret_file.clear();
  t.cluster.tls = s.tls();
  t.cluster.allow_insecure_network = false;
}

/// One deployment of a case: the head in this process (every trainer rank
/// with it), the other nodes as `rlsync node` children, every round's
/// report kept.
class bench_deployment {
public:
  using phase_hook = std::function<void(std::uint64_t, std::uint64_t, sync_phase, const std::vector<std::string>&)>;

  bench_deployment(bench_session& s, topology t, std::string name) : s_(s), t_(std::move(t)), name_(std::move(name)) {}
  ~bench_deployment() { stop(); }

  const topology& topo() const { return t_; }
  head_node& head() { return *head_; }

  /// Writes the nodes' topology, starts the head and the nodes, and waits
  /// until every engine has registered and synced once: empty, or why not.
  std::string start() {
    // The nodes' copy of the topology: the same model, mode and nodes.
    const std::string path = s_.dir() + "/bench-" + sanitized(name_) + ".yaml";
    {
      std::ofstream f(path);
      f << node_yaml(t_);
      if (!f)
        return "cannot write " + path;
    }
    // This process drives: no step unless asked, no round unless asked. Phase
    // deadlines are generous: a large model on a loaded 2-core machine is slow
    // everywhere, and a bench that evicts measures nothing.
    t_.trainer.step_time = std::chrono::hours(24);
    t_.sync.every_versions = std::int64_t(1) << 40;
    for (auto* phase : {&t_.sync.deadlines.pause, &t_.sync.deadlines.start, &t_.sync.deadlines.finish})
      *phase = std::max(*phase, std::chrono::milliseconds(60000));
    // The cold round is the fleet's first sync, every engine at once (the
    // bytes of a warm round), not one per engine as each registers while
    // other engine processes still start beside it on these cores.
    t_.sync.first_round_wait = t_.cluster.connect_deadline * 2;

    const node_spec* head_spec = t_.find_node(t_.coordinator.node);
    std::vector<child_spec> children;
    for (const auto& n : t_.nodes)
      if (n.name != head_spec->name)
        children.push_back({n.name, {s_.exe(), "node", "--topology", path, "--node", n.name, "--supervised"}});
    auto& s = s_;
    try {
      head_ = std::make_unique<head_node>(
        s_.system(), t_, *head_spec, member_secrets(t_, head_spec->name, s_.secret()),
        head_hooks{[&s](const std::string& l) {
                     if (s.verbose())
                       s.note(l);
                   },
                   {},
                   [this](const sync_report& rep) {
                     std::lock_guard<std::mutex> lock(mutex_);
                     reports_.push_back(rep);
                   },
                   [this](std::uint64_t round, std::uint64_t version, sync_phase phase,
                          const std::vector<std::string>& engines) {
                     phase_hook hook;
                     {
                       std::lock_guard<std::mutex> lock(mutex_);
                       hook = on_phase_;
                     }
                     if (hook)
                       hook(round, version, phase, engines);
                   }});
    } catch (const std::exception& e) {
      return e.what();
    }
    nodes_ = std::make_unique<node_children>(std::move(children), s_);

    // Cold: every engine registered, then synced once. A round that evicts
    // somebody (a slow first session start, say) is retried by asking for the
    // next one: this process asks for every round itself.
    caf::scoped_actor self{s_.system()};
    auto cold_deadline = clock_type::now() + t_.cluster.connect_deadline * 2 + round_time();
    // A node process that exits (a topology it refuses, a port taken) ends
    // the wait at once: its engines will never register.
    while (head_->members() < t_.engines.size() && clock_type::now() < cold_deadline && !nodes_->ended())
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (nodes_->ended() && head_->members() < t_.engines.size())
      return failure("the node processes exited before their engines registered (their last lines are above)");
    while (head_->routable() < t_.engines.size() && clock_type::now() < cold_deadline)
      self->request(head_->coordinator(), round_time() * 2, sync_atom::value)
        .receive([](const sync_report&) {}, [](caf::error&) {});
    if (head_->routable() < t_.engines.size())
      return failure("only " + std::to_string(head_->routable()) + " of " + std::to_string(t_.engines.size())
                     + " engines registered and synced in time");
    return {};
  }

  std::vector<sync_report> reports() {
    std::lock_guard<std::mutex> lock(mutex_);
    return reports_;
  }

  void on_phase(phase_hook hook) {
    std::lock_guard<std::mutex> lock(mutex_);
    on_phase_ = std::move(hook);
  }

  std::chrono::milliseconds round_time() const {
    auto& d = t_.sync.deadlines;
    return d.pause + d.flush + d.start + d.transfer + d.finish + d.resume;
  }
  std::chrono::milliseconds long_wait() const { return t_.cluster.connect_deadline + t_.sync.deadlines.transfer; }

  /// One trainer step on every rank (the version barrier waits for all):
  /// empty, or why not.
  std::string step_all() {
    caf::scoped_actor self{s_.system()};
    for (const auto& r : head_->ranks()) {
      std::string error = "no answer";
      bool stepped = false;
      self->request(r.trainer.actor, long_wait(), step_atom::value)
        .receive([&](const version_info&) { stepped = true; }, [&](caf::error& err) { error = s_.system().render(err); });
      if (!stepped)
        return failure("trainer rank " + std::to_string(r.rank) + " did not step: " + error);
    }
    return {};
  }

  /// The next round's report; nullopt with `error` set when none came.
  std::optional<sync_report> sync(std::string& error) {
    caf::scoped_actor self{s_.system()};
    std::optional<sync_report> rep;
    self->request(head_->coordinator(), long_wait() * 2, sync_atom::value)
      .receive([&](const sync_report& x) { rep = x; }, [&](caf::error& err) { error = s_.system().render(err); });
    if (!rep)
      error = failure("sync failed: " + error);
    return rep;
  }

  /// `what`, with the nodes' last lines noted (unless they were shown).
  std::string failure(const std::string& what) const {
    auto tail = nodes_ ? nodes_->tail() : std::string{};
    if (!tail.empty() && !s_.verbose())
      s_.note("bench " + name_ + ": the nodes' last lines:\n" + tail);
    return what;
  }

  void stop() {
    on_phase({});
    if (head_)
      head_->stop();
    if (nodes_)
      nodes_->stop();
  }

private:
  static std::string sanitized(std::string name) {
    std::replace(name.begin(), name.end(), '/', '-');
    return name;
  }

  bench_session& s_;
  topology t_;
  std::string name_;
  std::mutex mutex_;
  std::vector<sync_report> reports_;
  phase_hook on_phase_;
  std::unique_ptr<head_node> head_;
  std::unique_ptr<node_children> nodes_;
};

} // namespace rlsync::jobs::bench_detail
