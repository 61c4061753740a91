// rlsync node: the actors a topology places on one node, in this process.
//
// The coordinator's node (the head) runs the coordinator, the router and the
// trainer, publishes only the gatekeeper on its address and port, and hosts
// its own engines, which pull through the in-process data plane. Every other
// node connects to the head (retrying with backoff up to
// cluster.connect_deadline_ms), proves the cluster secret to the gatekeeper,
// spawns its engines and registers them with the coordinator. With
// transfer.backend ucx the head also runs the trainer's UCX producer (an
// ephemeral port, announced in the join grant) and remote engines pull
// their shards from it; otherwise they pull whole groups over CAF. With --run the head drives the
// topology's workload once every engine has registered (the main job), then
// exits; engine nodes exit when the head is gone or on SIGTERM/SIGINT.
#include "actors/assembly/head_node.hpp"
#include "actors/assembly/local_deployment.hpp"
#include "actors/caf_puller.hpp"
#include "actors/gatekeeper.hpp"
#include "actors/jobs/main_job.hpp"
#include "actors/rollout_engine.hpp"
#include "actors/system_config.hpp"
#include "runtime/transfer/ucx/ucx_transfer.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"
#include "tools/job_flags.hpp"

#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include <atomic>
#include <csignal>
#include <iostream>
#include <thread>
#include <unistd.h>

namespace rlsync::tools {

using namespace rlsync::jobs;

namespace {

using clock_type = std::chrono::steady_clock;

std::atomic<int> stop_signal{0};

extern "C" void on_node_stop_signal(int sig) { stop_signal = sig; }

const char* usage =
  "usage: rlsync node --topology T.yaml --node NAME [--secret-file FILE] [--run]\n"
  "                   [--prompts N] [--concurrency C] [--max-tokens M] [--json FILE] [--no-progress]\n"
  "Runs the actors the topology places on node NAME. The coordinator's node publishes a\n"
  "gatekeeper on its address:port; every other node connects to it (retrying up to\n"
  "cluster.connect_deadline_ms), proves the cluster secret (cluster.secret_file or\n"
  "cluster.secret_env; --secret-file overrides the file), and registers its engines.\n"
  "--run (coordinator's node): once every engine registered, run the main job as\n"
  "`rlsync run` does, then exit. Engine nodes exit when the coordinator stops; when\n"
  "the link to it is lost they rejoin (as for the first join, up to connect_deadline_ms).\n"
  "SIGTERM or SIGINT stops a node cleanly.\n";

/// Waits for a stop signal or `done()`, polling; bounded by nothing else on
/// purpose: a node serves until told to stop.
void wait_until(const std::function<bool()>& done) {
  while (!stop_signal && !done())
    std::this_thread::sleep_for(std::chrono::milliseconds(50)); // poll a flag set by a signal handler
}

/// Set once every actor of this node has terminated (see cmd_node's exit).
std::atomic<bool> all_terminated{false};

int run_head(caf::actor_system& sys, const topology& t, const node_spec& node, const std::string& secret,
             const cli::args& a, const std::string& path) {
  auto out = std::make_shared<job_console>(a.has("run") && !a.has("no-progress") && isatty(STDERR_FILENO));
  std::unique_ptr<head_node> head;
  try {
    head = std::make_unique<head_node>(sys, t, node, secret,
                                       head_hooks{[out](const std::string& l) { out->on_log(l); },
                                                  [out](const std::string& l) { out->line(l); },
                                                  [out](const sync_report& r) { out->on_sync(r); }});
  } catch (const std::exception& e) {
    std::cerr << "rlsync node " << node.name << ": " << e.what() << "\n";
    return 1;
  }
  std::cerr << "rlsync node " << node.name << ": coordinator, router and trainer up; gatekeeper on "
            << node.address << ":" << head->port()
            << (head->producer() ? "; UCX producer on " + head->producer()->address() : std::string{}) << std::endl;

  int rc = 0;
  if (a.has("run")) {
    // The main job starts once every engine of the topology has registered.
    auto give_up = clock_type::now() + t.cluster.connect_deadline * 3;
    wait_until([&] { return head->members() == t.engines.size() || clock_type::now() > give_up; });
    if (stop_signal) {
      all_terminated = head->stop();
      return 128 + stop_signal;
    }
    if (auto n = head->members(); n != t.engines.size()) {
      std::cerr << "rlsync node " << node.name << ": only " << n << " of " << t.engines.size()
                << " engines registered within " << (t.cluster.connect_deadline * 3).count() << " ms\n";
      all_terminated = head->stop();
      return 1;
    }
    auto w = workload_from(t, workload_flags(a));
    rc = run_main_job(sys, t, path, w, {head->router(), head->coordinator(), head->trainer(), head->source()}, *out,
                      a.get("json"));
  } else {
    wait_until([] { return false; });
  }
  all_terminated = head->stop();
  return rc;
}

/// Connects to the head's gatekeeper (retrying with backoff up to the
/// connect deadline) and proves the secret: the cluster's handles, or
/// nothing with `why` set.
std::optional<join_grant> join_cluster(caf::actor_system& sys, const topology& t, const node_spec& node,
                                       const node_spec& head, const std::string& secret, std::string& why) {
  auto give_up = clock_type::now() + t.cluster.connect_deadline;
  auto backoff = std::chrono::milliseconds(50);
  caf::expected<gatekeeper_actor> gate{caf::error{}};
  int attempts = 0;
  while (!stop_signal) {
    ++attempts;
    gate = sys.middleman().remote_actor<gatekeeper_actor>(head.address, head.port);
    if (gate || clock_type::now() + backoff >= give_up)
      break;
    std::this_thread::sleep_for(backoff); // backoff between connection attempts
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  if (!gate) {
    why = "cannot reach the coordinator's node " + head.name + " at " + head.address + ":" + std::to_string(head.port)
          + " after " + std::to_string(attempts) + " attempts: " + sys.render(gate.error());
    return std::nullopt;
  }
  // Prove the secret: hello -> challenge -> admit(HMAC) -> the cluster's handles.
  caf::scoped_actor self{sys};
  std::optional<join_grant> grant;
  std::string failure;
  auto deadline = t.cluster.connect_deadline;
  self->request(*gate, deadline, hello_atom::value, node.name)
    .receive(
      [&](const std::string& challenge) {
        self->request(*gate, deadline, admit_atom::value, node.name, join_proof(secret, challenge, node.name))
          .receive([&](join_grant& g) { grant = std::move(g); }, [&](caf::error& err) { failure = sys.render(err); });
      },
      [&](caf::error& err) { failure = sys.render(err); });
  if (!grant)
    why = head.name + " refused to admit this node: " + failure;
  return grant;
}

int run_member(caf::actor_system& sys, const topology& t, const node_spec& node, const node_spec& head,
               const std::string& secret) {
  std::string why;
  auto grant = join_cluster(sys, t, node, head, secret, why);
  if (!grant) {
    std::cerr << "rlsync node " << node.name << ": " << why << "\n";
    return 1;
  }
  std::cerr << "rlsync node " << node.name << ": admitted by " << head.name << std::endl;
  std::shared_ptr<transfer::weight_puller> puller;
  std::shared_ptr<transfer::ucx_puller> ucx;
  if (grant->ucx_port != 0) {
    transfer::ucx_puller_options po;
    po.producer = head.address + ":" + std::to_string(grant->ucx_port);
    po.transports = t.transfer.ucx_transports;
    po.groups_in_flight = static_cast<std::size_t>(std::max<std::int64_t>(1, t.transfer.groups_in_flight));
    auto name = node.name;
    po.log = [name](const std::string& line) { std::cerr << ("rlsync node " + name + ": ucx: " + line + "\n"); };
    try {
      puller = ucx = std::make_shared<transfer::ucx_puller>(po);
    } catch (const std::exception& e) {
      std::cerr << "rlsync node " << node.name << ": transfer.backend ucx: " << e.what() << "\n";
      return 1;
    }
  } else {
    puller = std::make_shared<caf_puller>(sys, grant->trainer, t.model.config);
  }
  std::vector<caf::actor> engines;
  std::vector<const engine_spec*> specs;
  auto deadline = t.cluster.connect_deadline;
  try {
    for (const auto& e : t.engines)
      if (e.node == node.name) {
        engines.push_back(caf::actor_cast<caf::actor>(spawn_rollout_engine(
          sys, engine_config_from(t, e, puller, t.model.weights_dtype.value_or(dtype::bf16)))));
        specs.push_back(&e);
        register_engine(sys, grant->coordinator, e, engines.back(), deadline);
      }
  } catch (const std::exception& e) {
    std::cerr << "rlsync node " << node.name << ": " << e.what() << "\n";
    all_terminated = stop_and_await(sys, std::move(engines));
    return 1;
  }
  std::cerr << "rlsync node " << node.name << ": " << engines.size() << " engines registered" << std::endl;
  // Serve until told to stop or the job ended (the coordinator stopped). A
  // lost link (a partition, a flaky switch) is not the end: reconnect, prove
  // the secret again and register the same engines again (same incarnation:
  // a reconnect, not a restart); the coordinator brings them current at the
  // next round. Bounded by connect_deadline per attempt to rejoin.
  caf::scoped_actor self{sys};
  int rc = 0;
  for (;;) {
    self->monitor(grant->coordinator);
    std::optional<caf::error> down;
    wait_until([&] {
      self->receive([&](caf::down_msg& dm) { down = dm.reason; }, caf::after(std::chrono::milliseconds(0)) >> [] {});
      return down.has_value();
    });
    if (!down)
      break; // a stop signal
    if (*down != caf::exit_reason::remote_link_unreachable) {
      std::cerr << "rlsync node " << node.name << ": the coordinator is gone (" << sys.render(*down) << "); stopping"
                << std::endl;
      break;
    }
    std::cerr << "rlsync node " << node.name << ": lost the link to " << head.name << "; rejoining (up to "
              << t.cluster.connect_deadline.count() << " ms)" << std::endl;
    grant = join_cluster(sys, t, node, head, secret, why);
    if (!grant) {
      std::cerr << "rlsync node " << node.name << ": could not rejoin: " << why << "; stopping\n";
      rc = 1;
      break;
    }
    if (ucx && grant->ucx_port != 0)
      ucx->set_producer(head.address + ":" + std::to_string(grant->ucx_port)); // a restarted head has a new port
    try {
      for (std::size_t i = 0; i < engines.size(); ++i)
        register_engine(sys, grant->coordinator, *specs[i], engines[i], deadline);
    } catch (const std::exception& e) {
      std::cerr << "rlsync node " << node.name << ": " << e.what() << "; stopping\n";
      rc = 1;
      break;
    }
    std::cerr << "rlsync node " << node.name << ": rejoined " << head.name << ", " << engines.size()
              << " engines registered again" << std::endl;
  }
  all_terminated = stop_and_await(sys, std::move(engines));
  return rc;
}

} // namespace

int cmd_node(const arg_list& argv) {
  cli::args a(argv, {"topology", "node", "secret-file", "prompts", "concurrency", "max-tokens", "json"},
              {"run", "no-progress", "help"});
  if (a.has("help")) {
    std::cout << usage;
    return 0;
  }
  const auto path = a.required("topology");
  const auto name = a.required("node");
  auto loaded = load_topology_or_report(path);
  if (!loaded)
    return 1;
  const topology& t = *loaded;
  const node_spec* node = t.find_node(name);
  if (!node) {
    std::string known;
    for (auto& n : t.nodes)
      known += (known.empty() ? "" : ", ") + n.name;
    throw cli::usage_error("--node: no node '" + name + "' in " + path + " (defined: " + known + ")");
  }
  const node_spec* head = t.find_node(t.coordinator.node);
  if (t.router.node != head->name || t.trainer.node != head->name) {
    std::cerr << "rlsync node: " << path << ": the router and the trainer must run on the coordinator's node ("
              << head->name << ") for now\n";
    return 1;
  }
  if (head->port == 0 && t.nodes.size() > 1) {
    std::cerr << "rlsync node: " << path << ": nodes '" << head->name
              << "': the coordinator's node needs a fixed port for the others to reach it (port: 0)\n";
    return 1;
  }
  std::string secret;
  try {
    secret = read_cluster_secret(a.get_or("secret-file", t.cluster.secret_file), t.cluster.secret_env);
  } catch (const std::exception& e) {
    std::cerr << "rlsync node " << name << ": " << e.what() << "\n";
    return 1;
  }
  if (secret.empty())
    std::cerr << "rlsync node " << name << ": WARNING: no cluster secret configured (cluster.secret_file or "
                 "cluster.secret_env): any peer that reaches the coordinator's port can join\n";

  system_config cfg;
  // Heartbeats on both sides, or a silent partition is never noticed and a
  // one-sided timeout declares healthy idle peers dead (caf-0.17.md §7).
  cfg.set("middleman.heartbeat-interval", caf::timespan{t.cluster.heartbeat_interval});
  cfg.set("middleman.connection-timeout", caf::timespan{t.cluster.heartbeat_timeout});
  caf::actor_system sys{cfg};
  auto old_int = std::signal(SIGINT, on_node_stop_signal);
  auto old_term = std::signal(SIGTERM, on_node_stop_signal);
  int rc = name == head->name ? run_head(sys, t, *node, secret, a, path) : run_member(sys, t, *node, *head, secret);
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
