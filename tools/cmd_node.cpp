// rlsync node: the actors a topology places on one node, in this process.
// The coordinator's node runs a head_node (the coordinator and whatever else
// the topology places there: router, trainer ranks, engines; the gatekeeper
// and, for transfer.backend ucx, the UCX producer) and with --run the main
// job once every engine and the router have registered;
// every other node runs a member node (actors/assembly/member_node.hpp).
#include "actors/assembly/head_node.hpp"
#include "actors/assembly/member_node.hpp"
#include "actors/assembly/rank_drill_arms.hpp"
#include "actors/gatekeeper.hpp"
#include "actors/jobs/main_job.hpp"
#include "actors/jobs/process_faults.hpp"
#include "actors/system_config.hpp"
#include "actors/tls.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/metrics/http_endpoint.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"
#include "tools/job_flags.hpp"

#include <array>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <thread>
#include <unistd.h>

namespace rlsync::tools {

using namespace rlsync::jobs;

namespace {

std::atomic<int> stop_signal{0};

extern "C" void on_node_stop_signal(int sig) { stop_signal = sig; }

/// A drill's orders (only with --drill-events): drill_corrupt_signal() arms
/// a corruption, drill_withhold_signal() a withheld group, in the trainer
/// ranks hosted here. Sent with sigqueue, the value is a drill_order
/// (engine, version); a plain kill: any engine, any version. The handlers
/// store them in rings a watcher thread polls every 5 ms.
drill_order_ring corrupt_orders;
drill_order_ring withhold_orders;

std::uint64_t order_of(const siginfo_t* info) {
  return info && info->si_code == SI_QUEUE ? reinterpret_cast<std::uintptr_t>(info->si_value.sival_ptr) : 0;
}
extern "C" void on_corrupt_signal(int, siginfo_t* info, void*) { corrupt_orders.store(order_of(info)); }
extern "C" void on_withhold_signal(int, siginfo_t* info, void*) { withhold_orders.store(order_of(info)); }

/// The handlers that store a drill's orders, installed as soon as the flags
/// say --drill-events: an order that reaches a node the drill just (re)started
/// waits for its watcher instead of ending the process (the signals' default).
/// The drill starts its nodes with the two signals blocked, so that one sent
/// before this waits pending; unblocked here, it is delivered now.
void store_drill_orders() {
  struct sigaction sa {};
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sa.sa_sigaction = on_corrupt_signal;
  sigaction(drill_corrupt_signal(), &sa, nullptr);
  sa.sa_sigaction = on_withhold_signal;
  sigaction(drill_withhold_signal(), &sa, nullptr);
  const sigset_t orders = drill_order_signals();
  pthread_sigmask(SIG_UNBLOCK, &orders, nullptr);
}

/// Acts on the drill's orders stored by the handlers: arms `arms` as they come,
/// logging one line per rank armed; stop() before the ranks' producers go.
class drill_signal_watch {
public:
  drill_signal_watch(const topology& t, std::shared_ptr<rank_drill_arms> arms,
                     std::function<void(const std::string&)> log)
      : arms_(std::move(arms)), log_(std::move(log)) {
    // A withheld group is released at the latest when the round it was
    // armed for would have timed out: its pause, flush, start and transfer
    // (each at most a day, so the sum fits).
    const auto& d = t.sync.deadlines;
    release_after_ = d.pause + d.flush + d.start + d.transfer;
    for (auto& e : t.engines)
      engines_.push_back(e.name);
    store_drill_orders(); // already, as a rule (see there)
    thread_ = std::thread([this] {
      while (watching_) {
        lost("corrupt", corrupt_orders.take([this](std::uint64_t v) { corrupt(decode_drill_order(v)); }));
        lost("withhold", withhold_orders.take([this](std::uint64_t v) { withhold(decode_drill_order(v)); }));
        std::this_thread::sleep_for(std::chrono::milliseconds(5)); // polls what the signal handlers store
      }
    });
  }
  ~drill_signal_watch() { stop(); }
  void stop() {
    watching_ = false;
    if (thread_.joinable())
      thread_.join();
  }

private:
  void lost(const char* what, std::uint64_t n) {
    if (n)
      log_("drill: " + std::to_string(n) + " " + what + " order(s) lost: more than "
           + std::to_string(drill_order_ring::capacity) + " came between two polls");
  }
  void corrupt(const drill_order& o) {
    std::string engine = o.engine && *o.engine < engines_.size() ? engines_[*o.engine] : std::string();
    auto lines = arms_->corrupt(engine, o.version);
    if (lines.empty())
      log_("drill: corrupt order ignored: no UCX producer to corrupt");
    for (auto& l : lines)
      log_("drill: " + l);
  }
  void withhold(const drill_order& o) {
    auto lines = arms_->withhold(o.version, release_after_);
    if (lines.empty())
      log_("drill: withhold ignored: no trainer rank here");
    for (auto& l : lines)
      log_("drill: " + l);
  }

  std::shared_ptr<rank_drill_arms> arms_;
  std::function<void(const std::string&)> log_;
  std::chrono::milliseconds release_after_{0};
  std::vector<std::string> engines_;
  std::atomic<bool> watching_{true};
  std::thread thread_;
};

const char* description =
  "Runs the actors the topology places on node NAME. The coordinator's node publishes a\n"
  "gatekeeper on its address:port; every other node connects to it (retrying up to\n"
  "cluster.connect_deadline_ms), over mutual TLS when cluster.tls is set, proves its\n"
  "secret (cluster.secret_file, where {node} stands for the node's name, or\n"
  "cluster.secret_env; --secret-file overrides the file), and registers its engines.\n"
  "--run (coordinator's node): once every engine and the router (on any node)\n"
  "registered, run the main job as `rlsync run` does, then exit. Engine nodes exit when the coordinator stops; when\n"
  "the link to it is lost they rejoin (as for the first join, up to connect_deadline_ms).\n"
  "SIGTERM or SIGINT stops a node cleanly.\n";

/// What a node started by hand does not do that its topology asks for: the
/// drill's faults and the restart keys are applied by the processes that
/// start nodes (rlsync drill; rlsync launch, which the systemd unit and the
/// Slurm script run).
std::vector<std::string> unsupervised_notices(const topology& t, const node_spec& node) {
  std::vector<std::string> lines;
  if (!t.drill.faults.empty())
    lines.push_back("the topology's " + std::to_string(t.drill.faults.size())
                    + " drill fault(s) are injected by rlsync drill, not by a node started on its own");
  if (node.restart == node_restart::on_failure)
    lines.push_back("restart: on-failure is applied by rlsync launch (run `rlsync launch TOPOLOGY --nodes "
                    + node.name + "`, as the systemd unit and the Slurm script do); nothing restarts this process");
  return lines;
}

/// Set once every actor of this node has terminated (see cmd_node's exit).
std::atomic<bool> all_terminated{false};

/// What --run asks of the head.
struct head_job {
  bool run = false;
  bool progress = true;
  workload_overrides workload;
  std::optional<std::string> json_path;
  /// Print a structured line on stderr as each phase of a round goes out
  /// (`rlsync drill` times its faults by them).
  bool drill_events = false;
};

int run_head(caf::actor_system& sys, const topology& t, const node_spec& node,
             std::map<std::string, std::string> secrets, const head_job& job, const std::string& path,
             std::shared_ptr<metrics::registry> metrics) {
  auto out = std::make_shared<job_console>(job.run && job.progress && isatty(STDERR_FILENO));
  std::unique_ptr<head_node> head;
  head_hooks hooks{[out](const std::string& l) { out->on_log(l); }, [out](const std::string& l) { out->line(l); },
                   [out, drill = job.drill_events](const sync_report& r) {
                     out->on_sync(r);
                     if (drill) // which rounds completed: an aborted one also sends its continue phase
                       std::cerr << (drill_synced_line(r) + "\n") << std::flush;
                   },
                   {}};
  hooks.metrics = std::move(metrics);
  if (job.drill_events)
    hooks.on_phase = [](std::uint64_t round, std::uint64_t version, sync_phase phase,
                        const std::vector<std::string>& engines) {
      // One write per line: the drill reads them as they come.
      std::cerr << (drill_phase_line(round, version, phase, engines) + "\n") << std::flush;
    };
  try {
    head = std::make_unique<head_node>(sys, t, node, std::move(secrets), std::move(hooks));
  } catch (const std::exception& e) {
    std::cerr << "rlsync node " << node.name << ": " << e.what() << "\n";
    return 1;
  }
  std::cerr << "rlsync node " << node.name << ": coordinator"
            << (head->router() ? ", router" : "")
            << (head->ranks().size() == 1 && t.trainer.ranks.size() == 1 ? std::string(" and trainer")
                : head->ranks().empty() ? std::string{}
                                        : " and " + std::to_string(head->ranks().size()) + " trainer ranks")
            << " up; gatekeeper on " << node.address << ":" << head->port()
            << (head->producer() ? "; UCX producer up (no listening port: members get its address from the trainer)"
                                 : std::string{})
            << std::endl;
  if (auto url = head->router_url(); !url.empty())
    std::cerr << "rlsync node " << node.name << ": completions on " << url << "/v1/completions" << std::endl;

  // A drill's orders arrive as signals (only with --drill-events: their
  // default action would kill the node). Stopped before the head stops (it
  // owns the producers), and on every way out.
  auto arms = std::make_shared<rank_drill_arms>();
  arms->attach(head->ranks(), head->rank_producers());
  std::optional<drill_signal_watch> watch;
  if (job.drill_events)
    watch.emplace(t, arms, [name = node.name](const std::string& line) {
      std::cerr << ("rlsync node " + name + ": " + line + "\n") << std::flush;
    });
  struct stop_watch {
    std::optional<drill_signal_watch>& watch;
    rank_drill_arms& arms;
    void operator()() {
      if (watch)
        watch->stop();
      arms.detach();
    }
    ~stop_watch() { (*this)(); }
  } end_corrupt_watch{watch, *arms};

  int rc = 0;
  if (job.run) {
    // The main job starts once every engine of the topology has registered.
    auto n = head->await_members(t.engines.size(), t.cluster.connect_deadline * 3, [] { return stop_signal != 0; });
    if (stop_signal) {
      end_corrupt_watch();
      all_terminated = head->stop();
      return 128 + stop_signal;
    }
    if (n != t.engines.size()) {
      std::cerr << "rlsync node " << node.name << ": only " << n << " of " << t.engines.size()
                << " engines registered within " << (t.cluster.connect_deadline * 3).count() << " ms\n";
      end_corrupt_watch();
      all_terminated = head->stop();
      return 1;
    }
    // The workload goes through the router; one on another node registers
    // with the coordinator when its node joins.
    auto router = head->await_router(t.cluster.connect_deadline * 3, [] { return stop_signal != 0; });
    if (!router) {
      std::cerr << "rlsync node " << node.name << ": the router (node " << t.router.node
                << ") did not register within " << (t.cluster.connect_deadline * 3).count() << " ms\n";
      end_corrupt_watch();
      all_terminated = head->stop();
      return stop_signal ? 128 + stop_signal : 1;
    }
    auto w = workload_from(t, job.workload);
    job_handles h;
    h.router = router;
    h.coordinator = head->coordinator();
    h.trainer = head->trainer();
    h.source = head->source();
    std::vector<bool> here(t.trainer.ranks.size(), false);
    for (const auto& r : head->ranks()) {
      h.ranks.push_back(r.trainer.actor);
      h.sources.push_back(r.trainer.source);
      here[r.rank] = true;
    }
    // Ranks of other nodes hold what the engines are checked against: a
    // synthetic one is rebuilt here (same options, same bytes); a checkpoint
    // directory's steps (and an external rank's publishes) are not, and
    // leave the check incomplete.
    for (std::size_t i = 0; i < here.size() && t.trainer.source != trainer_source::external; ++i)
      if (!here[i])
        if (auto s = std::dynamic_pointer_cast<transfer::synthetic_source>(transfer::make_weight_source(t, i)))
          h.replayed.push_back(std::move(s));
    rc = run_main_job(sys, t, path, w, h, *out, job.json_path);
  } else {
    while (!stop_signal) // a head serves until told to stop
      std::this_thread::sleep_for(std::chrono::milliseconds(50)); // polls a flag the signal handler sets
  }
  end_corrupt_watch();
  all_terminated = head->stop();
  return rc;
}

} // namespace

int cmd_node(const arg_list& argv) {
  CLI::App app(description, "rlsync node");
  cli::configure(app);
  std::string path, name;
  std::optional<std::string> secret_file;
  head_job job;
  auto topology_flag = app.add_option("--topology", path, "the topology file")->type_name("T.yaml");
  auto node_flag = app.add_option("--node", name, "the node of the topology to run")->type_name("NAME");
  app.add_option_function<std::string>(
       "--secret-file", [&](const std::string& f) { secret_file = f; }, "overrides cluster.secret_file")
    ->type_name("FILE");
  auto run_flag = app.add_flag("--run", "on the coordinator's node: run the main job once every engine registered");
  add_workload_flags(app, job.workload);
  app.add_option_function<std::string>(
       "--json", [&](const std::string& p) { job.json_path = p; }, "with --run: also write the summary as JSON")
    ->type_name("FILE");
  auto no_progress = app.add_flag("--no-progress", "no progress line on a terminal");
  std::optional<std::string> state_file;
  app.add_option_function<std::string>(
       "--state-file", [&](const std::string& f) { state_file = f; },
       "coordinator's node: overrides coordinator.state_file (a restarted head resumes from it)")
    ->type_name("FILE");
  auto drill_events = app.add_flag("--drill-events", "for `rlsync drill`: the coordinator's node prints a line on "
                                                     "stderr as each phase of a round goes out; every node takes "
                                                     "the drill's signals to its trainer ranks (SIGRTMIN+2: corrupt "
                                                     "a group, SIGRTMIN+1: withhold one)");
  auto allow_nonfinite = add_allow_nonfinite_flag(app);
  // Hidden: what launch, drill and bench pass to the nodes they start.
  auto supervised = app.add_flag("--supervised", "started by rlsync launch, drill or bench (no notices about "
                                                 "what they apply)")
                      ->group("");
  if (!cli::parse(app, argv))
    return 0;
  cli::require(topology_flag);
  cli::require(node_flag);
  check_workload_flags(job.workload);
  job.run = run_flag->count() > 0;
  job.progress = no_progress->count() == 0;
  job.drill_events = drill_events->count() > 0;
  if (job.drill_events)
    store_drill_orders();
  auto loaded = load_topology_or_report(path);
  if (!loaded)
    return 1;
  loaded->trainer.allow_nonfinite = allow_nonfinite->count() > 0;
  if (state_file)
    loaded->coordinator.state_file = std::filesystem::absolute(*state_file).string();
  const topology& t = *loaded;
  const node_spec* node = t.find_node(name);
  if (!node) {
    std::string known;
    for (auto& n : t.nodes)
      known += (known.empty() ? "" : ", ") + n.name;
    throw cli::usage_error("--node: no node '" + printable(name) + "' in " + printable(path) + " (defined: " + known + ")");
  }
  if (auto problem = cluster_layout_problem(t); !problem.empty()) {
    std::cerr << "rlsync node: " << problem << "\n";
    return 1;
  }
  const node_spec* head = t.find_node(t.coordinator.node);
  const bool is_head = name == head->name;
  if (supervised->count() == 0)
    for (auto& line : unsupervised_notices(t, *node))
      std::cerr << "rlsync node " << name << ": " << line << "\n";
  // {node} in the file: each node proves its own secret; the head reads every member's.
  const std::string file = secret_file.value_or(t.cluster.secret_file);
  const bool per_node = file.find("{node}") != std::string::npos;
  std::string secret;
  std::map<std::string, std::string> secrets;
  system_config cfg;
  try {
    if (!(is_head && per_node))
      secret = read_cluster_secret(with_node_name(file, name), t.cluster.secret_env);
    if (is_head)
      secrets = member_secrets(t, head->name, secret, file);
    configure_node_tls(cfg, t, name);
  } catch (const std::exception& e) {
    std::cerr << "rlsync node " << name << ": " << e.what() << "\n";
    return 1;
  }
  if (file.empty() && t.cluster.secret_env.empty())
    std::cerr << "rlsync node " << name << ": WARNING: no cluster secret configured (cluster.secret_file or "
                 "cluster.secret_env): any peer that reaches the coordinator's port can join, and any "
                 "peer a member reaches can pose as its head\n";
  if (auto warning = insecure_network_warning(t); !warning.empty())
    std::cerr << warning << std::flush;

  // Heartbeats on both sides, or a silent partition is never noticed and a
  // one-sided timeout declares healthy idle peers dead.
  cfg.set("middleman.heartbeat-interval", caf::timespan{t.cluster.heartbeat_interval});
  cfg.set("middleman.connection-timeout", caf::timespan{t.cluster.heartbeat_timeout});
  // The node's metrics port: its coordinator, router and engines record
  // into one registry, served on the node's own address only.
  std::shared_ptr<metrics::registry> registry;
  std::unique_ptr<metrics::metrics_server> metrics_port;
  // The fleet endpoint (router.http_port) on the router's node serves /metrics too.
  if (node->metrics_port || (t.router.http_port && t.router.node == name))
    registry = std::make_shared<metrics::registry>();
  if (node->metrics_port) {
    try {
      std::optional<std::string> token;
      if (!t.cluster.http_api_key_file.empty())
        token = metrics::read_api_key_file(t.cluster.http_api_key_file);
      metrics_port = std::make_unique<metrics::metrics_server>(registry, node->address, *node->metrics_port, token);
    } catch (const std::exception& e) {
      std::cerr << "rlsync node " << name << ": " << e.what() << "\n";
      return 1;
    }
    std::cerr << "rlsync node " << name << ": metrics on " << metrics_port->url() << std::endl;
  }
  caf::actor_system sys{cfg};
  auto old_int = std::signal(SIGINT, on_node_stop_signal);
  auto old_term = std::signal(SIGTERM, on_node_stop_signal);
  int rc = 0;
  if (is_head) {
    rc = run_head(sys, t, *node, std::move(secrets), job, path, registry);
  } else {
    member_node_options mo;
    mo.stop_requested = [] { return stop_signal != 0; };
    mo.log = [name](const std::string& line) { std::cerr << ("rlsync node " + name + ": " + line + "\n") << std::flush; };
    // A drill arms the trainer ranks hosted here by signals (--drill-events).
    mo.drill_arms = std::make_shared<rank_drill_arms>();
    std::optional<drill_signal_watch> watch;
    if (job.drill_events)
      watch.emplace(t, mo.drill_arms, mo.log);
    mo.metrics = registry;
    auto end = run_member_node(sys, t, *node, *head, secret, mo);
    if (watch)
      watch->stop();
    all_terminated = end.all_terminated;
    rc = end.exit_code;
  }
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);
  if (stop_signal && rc == 0)
    std::cerr << "rlsync node " << name << ": stopped by signal " << stop_signal << std::endl;
  // Leaving the actor system waits until every detached actor's object is
  // destroyed, not just terminated. After its peer vanished, a terminated
  // engine is sometimes still referenced once inside CAF 0.17's middleman
  // (its state is gone; the holder was not found), and the destructor would
  // wait forever. Once every actor has terminated there is nothing left to
  // lose: give the destructor a moment, then exit. A node whose actors did
  // not even terminate gets 10 s.
  auto grace = all_terminated ? std::chrono::milliseconds(500) : std::chrono::milliseconds(10000);
  std::thread([rc, name, grace] {
    std::this_thread::sleep_for(grace);
    if (!all_terminated)
      std::cerr << "rlsync node " << name << ": actors still busy " << grace.count()
                << " ms after stopping; exiting anyway" << std::endl;
    std::cout.flush();
    std::_Exit(rc);
  }).detach();
  return rc;
}

} // namespace rlsync::tools
