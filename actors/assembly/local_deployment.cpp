#include "actors/assembly/local_deployment.hpp"
#include "actors/assembly/nccl_plane.hpp"
#include "gpu/engine_device.hpp"

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/transfer/external_source.hpp"

#include "actors/fleet_metrics.hpp"
#include "runtime/metrics/http_endpoint.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <map>
#include <mutex>
#include <stdexcept>

namespace rlsync {

std::function<std::string(const std::string&, const caf::node_id&)>
origin_check(std::map<std::string, std::string> node_of, caf::node_id own, std::string here,
             std::function<std::optional<std::string>(const caf::node_id&)> name_of) {
  return [node_of = std::move(node_of), own, here = std::move(here),
          name_of = std::move(name_of)](const std::string& member, const caf::node_id& sender) -> std::string {
    auto placed = node_of.find(member);
    if (placed == node_of.end())
      return "the topology places no " + member;
    const std::string from = sender == own ? here : name_of(sender).value_or("");
    if (from.empty())
      return "the sender's node is not admitted";
    if (from != placed->second)
      return "it runs on node '" + placed->second + "', not on the sender's node '" + from + "'";
    return {};
  };
}

rollout_engine_config engine_config_from(const topology& t, const engine_spec& e,
                                         std::shared_ptr<transfer::weight_puller> puller, dtype source_dtype,
                                         int device) {
  rollout_engine_config cfg;
  cfg.model = t.model.config;
  cfg.options.name = e.name;
  cfg.options.tp = static_cast<int>(e.tp);
  cfg.options.expert_parallel = e.expert_parallel;
  cfg.options.dp = static_cast<int>(e.dp);
  cfg.options.balance = e.dp_balance == "prefix_affinity" ? engine::dp_balance::prefix_affinity
                                                          : engine::dp_balance::least_outstanding; // validated
  cfg.options.weights = engine::weight_format_of(e.weights).value_or(engine::weight_format::received); // validated
  cfg.options.max_batch = static_cast<std::uint32_t>(e.max_batch);
  cfg.options.queue_limit = static_cast<std::uint32_t>(e.queue_limit);
  cfg.options.block_tokens = e.kv_block_tokens;
  cfg.options.prefix_cache_blocks = static_cast<std::size_t>(e.prefix_cache_blocks);
  cfg.options.source_dtype = source_dtype;
  cfg.options.preallocate_staging = true;
  if (e.device == "cuda") // throws, naming the missing device (start-up checked it: backend_device_problem)
    cfg.options.device = gpu::make_engine_device(device);
  cfg.node = e.node;
  cfg.puller = std::move(puller);
  cfg.transfer_deadline_ms = static_cast<std::uint64_t>(t.sync.deadlines.transfer.count());
  return cfg;
}

vllm_engine_config vllm_engine_config_from(const topology& t, const engine_spec& e,
                                           std::shared_ptr<transfer::weight_puller> puller, dtype source_dtype) {
  vllm_engine_config cfg;
  cfg.model = t.model.config;
  cfg.name = e.name;
  cfg.node = e.node;
  cfg.url = "http://" + (e.url_host.find(':') != std::string::npos ? "[" + e.url_host + "]" : e.url_host) + ":"
            + std::to_string(e.url_port);
  if (!e.api_key_file.empty())
    cfg.bearer_token = metrics::read_api_key_file(e.api_key_file, "engines '" + e.name + "' api_key_file");
  cfg.weights_dir = e.weights_dir;
  cfg.source_dtype = source_dtype;
  cfg.server_tp = static_cast<int>(e.tp);
  cfg.puller = std::move(puller);
  const auto& d = t.sync.deadlines;
  auto ms = [](std::chrono::milliseconds x) { return static_cast<std::uint64_t>(x.count()); };
  cfg.pause_deadline_ms = ms(d.pause);
  cfg.flush_deadline_ms = ms(d.flush);
  cfg.start_deadline_ms = ms(d.start);
  cfg.transfer_deadline_ms = ms(d.transfer);
  cfg.finish_deadline_ms = ms(d.finish);
  cfg.resume_deadline_ms = ms(d.resume);
  // A lost server must show before the coordinator's heartbeat timeout does.
  cfg.health_interval_ms = ms(t.cluster.heartbeat_interval);
  cfg.health_timeout_ms = ms(t.cluster.heartbeat_timeout);
  cfg.max_streams = static_cast<std::uint32_t>(e.max_batch + e.queue_limit); // at most max_vllm_streams (validated)
  return cfg;
}

namespace {

/// Registers `engine` with `coordinator` as `info` without blocking the caller
/// (an actor's thread): the answer, or the refusal, is logged.
void register_async(caf::actor_system& sys, const coordinator_actor& coordinator, const engine_info& info,
                    const caf::actor& engine, std::function<void(const std::string&)> log) {
  if (!coordinator)
    return;
  sys.spawn([=](caf::event_based_actor* self) {
    auto say = [log](const std::string& line) {
      if (log)
        log(line);
      else
        std::cerr << (line + "\n");
    };
    self->request(coordinator, std::chrono::seconds(10), register_atom::value, info,
                  caf::actor_cast<rollout_engine_actor>(engine))
      .then(
        [=](const registration&) {
          say(info.name + ": its server answers again; registered as incarnation " + std::to_string(info.incarnation)
              + " (unroutable until a sync brings it current)");
        },
        [=](caf::error& err) {
          say(info.name + ": its server answers again, but the coordinator refused it: " + self->system().render(err));
        });
  });
}

std::uint64_t now_ms() {
  return static_cast<std::uint64_t>(
    std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

} // namespace

rollout_engine_actor spawn_replica(caf::actor_system& sys, const topology& t, const engine_spec& spec,
                                   const replica_wiring& w) {
  if (spec.kind == engine_kind::builtin) {
    const bool on_device = spec.device == "cuda" || w.make_device;
    const int device = on_device ? engine_device_ordinal(w.nccl.get(), spec.name) : 0;
    auto cfg = engine_config_from(t, spec, w.puller, w.source_dtype, device);
    if (w.make_device)
      cfg.options.device = w.make_device(device);
    cfg.producer_puller = w.producer_puller;
    cfg.authorize = w.authorize;
    cfg.vouched_router = w.vouched_router;
    cfg.log = w.log;
    cfg.faults = w.faults;
    cfg.metrics = engine_metrics_in(w.metrics, spec.name);
    if (w.nccl) {
      cfg.nccl_join = engine_nccl_join(w.nccl, spec.name, static_cast<int>(spec.tp));
      cfg.nccl_dead = [m = w.nccl](std::uint64_t epoch, const std::string& who) { m->mark_dead(epoch, who); };
    }
    return spawn_rollout_engine(sys, std::move(cfg));
  }
  auto cfg = vllm_engine_config_from(t, spec, w.puller, w.source_dtype);
  cfg.producer_puller = w.producer_puller;
  cfg.authorize = w.authorize;
  cfg.vouched_router = w.vouched_router;
  cfg.log = w.log;
  cfg.metrics = engine_metrics_in(w.metrics, spec.name);
  // Its own address, known once spawned (an address, not a handle: the
  // adapter must not keep itself alive).
  struct self_slot {
    std::mutex mutex;
    caf::actor_addr address;
  };
  auto slot = std::make_shared<self_slot>();
  auto incarnation = std::make_shared<std::atomic<std::uint64_t>>(w.incarnation);
  cfg.on_recovered = [&sys, slot, incarnation, spec, coordinator = w.coordinator, log = w.log] {
    caf::actor engine;
    {
      std::lock_guard<std::mutex> lock(slot->mutex);
      engine = caf::actor_cast<caf::actor>(slot->address);
    }
    if (!engine || !coordinator)
      return;
    // The server holds its initial weights: a restart of this replica.
    const auto next = std::max(incarnation->load() + 1, now_ms());
    incarnation->store(next);
    register_async(sys, coordinator(), engine_info_of(spec, next, 0, false), engine, log);
  };
  auto engine = spawn_vllm_engine(sys, std::move(cfg));
  {
    std::lock_guard<std::mutex> lock(slot->mutex);
    slot->address = engine.address();
  }
  return engine;
}

dtype source_dtype_of(const topology& t, const transfer::weight_source& source) {
  if (t.model.weights_dtype)
    return *t.model.weights_dtype;
  // The parameters, not the latest snapshot: the trainer may not have
  // published its first version yet when a head is assembled.
  auto parameters = source.parameters();
  return parameters.empty() ? dtype::bf16 : parameters.front().type;
}

std::uint64_t next_incarnation() {
  static std::atomic<std::uint64_t> last{0};
  const auto now = static_cast<std::uint64_t>(
    std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  auto prev = last.load();
  std::uint64_t next;
  do
    next = std::max(now, prev + 1);
  while (!last.compare_exchange_weak(prev, next));
  return next;
}

engine_info engine_info_of(const engine_spec& spec, std::uint64_t incarnation, std::uint64_t version, bool dirty) {
  return engine_info{spec.name, spec.node, static_cast<std::uint32_t>(spec.tp), version, dirty, incarnation};
}

std::string await_engine_ready(caf::actor_system& sys, const caf::actor& engine) {
  std::string failure;
  caf::scoped_actor self{sys};
  self->request(caf::actor_cast<rollout_engine_actor>(engine), engine_ready_deadline, status_atom::value)
    .receive([](const engine_status&) {}, [&](caf::error& err) { failure = sys.render(err); });
  return failure;
}

std::string register_engine(caf::actor_system& sys, const coordinator_actor& coordinator, const engine_info& info,
                            const caf::actor& engine, std::chrono::milliseconds deadline) {
  std::string failure;
  caf::scoped_actor self{sys};
  self->request(coordinator, deadline, register_atom::value, info, caf::actor_cast<rollout_engine_actor>(engine))
    .receive([](const registration&) {}, [&](caf::error& err) { failure = sys.render(err); });
  return failure;
}

std::string register_rank(caf::actor_system& sys, const coordinator_actor& coordinator, const topology& t,
                          const hosted_rank& r, std::chrono::milliseconds deadline) {
  const auto& node = r.rank < t.trainer.ranks.size() ? t.trainer.ranks[r.rank].node : t.trainer.node;
  auto info = rank_info_of(*r.trainer.source, r.rank, node, r.incarnation);
  std::string failure;
  caf::scoped_actor self{sys};
  self->request(coordinator, deadline, register_atom::value, info, r.trainer.actor)
    .receive([&](const registration& reg) { catch_up(r.trainer.actor, reg.current_version); },
             [&](caf::error& err) { failure = sys.render(err); });
  return failure;
}

std::vector<hosted_rank> spawn_ranks(caf::actor_system& sys, const topology& t, const std::string& node,
                                     const sender_policy& authorize, std::uint64_t incarnation,
                                     const sender_policy& placements_from,
                                     std::shared_ptr<gpu::nccl_membership> nccl) {
  std::vector<hosted_rank> out;
  try {
    // External ranks are their own processes' (external_rank.hpp).
    for (std::size_t i = 0; t.trainer.source != trainer_source::external && i < t.trainer.ranks.size(); ++i)
      if (node.empty() || t.trainer.ranks[i].node == node)
        out.push_back({static_cast<std::uint32_t>(i), incarnation, make_local_trainer(sys, t, i, authorize, placements_from, nullptr, nccl)});
  } catch (...) { // a source that cannot be built: the ranks already spawned go too
    std::vector<caf::actor> spawned;
    for (auto& r : out)
      spawned.push_back(caf::actor_cast<caf::actor>(r.trainer.actor));
    stop_and_await(sys, std::move(spawned));
    throw;
  }
  return out;
}

bool follows_single_trainer(const topology& t, const std::string& node) {
  return t.trainer.source != trainer_source::external && t.trainer.ranks.size() == 1 && (node.empty() || t.trainer.ranks[0].node == node);
}

producer_puller_factory rank_pullers(const std::vector<hosted_rank>& ranks, producer_puller_factory remote) {
  std::map<std::uint32_t, std::shared_ptr<transfer::weight_puller>> local;
  for (const auto& r : ranks)
    local[r.rank] = r.trainer.transfer;
  return [local = std::move(local), remote = std::move(remote)](
           const producer_holding& h, const trainer_actor& handle) -> std::shared_ptr<transfer::weight_puller> {
    if (auto i = local.find(h.rank); i != local.end())
      return i->second; // in this process: no copy over any wire
    return remote ? remote(h, handle) : nullptr;
  };
}

bool stop_and_await(caf::actor_system& sys, std::vector<caf::actor> actors, std::chrono::milliseconds deadline) {
  caf::scoped_actor self{sys};
  std::size_t alive = 0;
  for (auto& a : actors)
    if (a) {
      self->monitor(a); // a terminated actor answers with a down message at once
      ++alive;
    }
  for (auto& a : actors)
    if (a)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  actors.clear();
  auto until = std::chrono::steady_clock::now() + deadline;
  bool late = false;
  while (alive > 0 && !late)
    self->receive([&](const caf::down_msg&) { --alive; },
                  caf::after(std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::max(until - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration::zero())))
                    >> [&] { late = true; });
  return alive == 0;
}

namespace {

/// Spawns hosted engine `i` as replica `spec`, with its fault gate.
rollout_engine_actor spawn_engine(caf::actor_system& sys, const local_deployment& d, const topology& t,
                                  const engine_spec& spec, std::size_t i) {
  replica_wiring w;
  w.puller = d.trainer.transfer;
  w.producer_puller = rank_pullers(d.ranks, d.remote_pullers);
  w.source_dtype = d.source_dtype;
  // This process's actors drive it, and the router the coordinator vouches
  // for when one registers from another node (router.node elsewhere).
  w.authorize = local_or_driver(sys.node(), d.drivers);
  w.vouched_router = [drivers = d.drivers](const caf::strong_actor_ptr& sender, const caf::actor_addr& r) {
    return drivers->vouch(sender, r);
  };
  w.faults = d.gates[i];
  w.metrics = d.metrics;
  w.coordinator = [ref = d.current_coordinator] { return ref->get(); };
  w.incarnation = d.incarnations[i];
  w.nccl = d.nccl;
  return spawn_replica(sys, t, spec, w);
}


} // namespace

std::string backend_device_problem(const topology& t, const gpu::device_info& devices, const std::string& node) {
  if (devices.device_count > 0)
    return {};
  for (const auto& e : t.engines)
    if (e.device == "cuda" && (node.empty() || e.node == node))
      return "engine '" + e.name + "' runs on device cuda, and this process sees no CUDA device ("
             + (devices.detail.empty() ? std::string("no CUDA device") : devices.detail) + ")";
  const bool on_device = t.transfer.backend == transfer_backend::cuda_ipc || t.transfer.backend == transfer_backend::nccl;
  if (!on_device)
    return {};
  // The GPU planes run where weights are: a trainer rank's node and a
  // built-in engine's. A node of the coordinator or the router alone moves none.
  const auto here = [&](const std::string& n) { return node.empty() || n == node; };
  const bool moves_weights =
    std::any_of(t.trainer.ranks.begin(), t.trainer.ranks.end(), [&](const trainer_rank& r) { return here(r.node); })
    || (t.trainer.ranks.empty() && here(t.trainer.node))
    || std::any_of(t.engines.begin(), t.engines.end(),
                   [&](const engine_spec& e) { return e.kind == engine_kind::builtin && here(e.node); });
  if (!moves_weights)
    return {};
  return "transfer.backend " + std::string{to_string(t.transfer.backend)} + " needs a CUDA device at start-up, and this process sees none ("
         + (devices.detail.empty() ? std::string("no CUDA device") : devices.detail) + ")";
}

namespace {

/// Stops what a deployment being assembled had started (its actors, its
/// HTTP endpoint) unless dismissed, so that an assembly failing halfway
/// leaves nothing running: CAF 0.17's actor system waits for every actor at
/// its end, and a trainer left ticking would hold the process for good.
class stop_unless_dismissed {
public:
  stop_unless_dismissed(caf::actor_system& sys, const local_deployment& d) : sys_(sys), d_(d) {}
  stop_unless_dismissed(const stop_unless_dismissed&) = delete;
  stop_unless_dismissed& operator=(const stop_unless_dismissed&) = delete;
  ~stop_unless_dismissed() {
    if (dismissed_)
      return;
    try {
      if (d_.http)
        d_.http->stop();
      stop_and_await(sys_, d_.actors());
    } catch (...) { // unwinding already: the first failure is the one to tell
    }
  }
  void dismiss() { dismissed_ = true; }

private:
  caf::actor_system& sys_;
  const local_deployment& d_;
  bool dismissed_ = false;
};

} // namespace

local_deployment assemble_head(caf::actor_system& sys, const topology& t, const deployment_options& opts) {
  if (auto why = backend_device_problem(t, opts.devices ? *opts.devices : gpu::query_devices(), opts.node); !why.empty())
    throw std::runtime_error(why);
  local_deployment d;
  std::optional<persisted_coordinator> restored; // before anything runs: a bad file stops the head cleanly
  if (!t.coordinator.state_file.empty())
    restored = read_coordinator_state(t.coordinator.state_file); // throws, naming file:line:column
  // Every actor here answers this process and the nodes opts.admit admitted, nobody else.
  d.authorize = local_or_admitted(sys.node(), opts.admit);
  // Every rank placed here, each its own source and actor. The coordinator
  // follows a single rank hosted with it directly, as before ranks existed;
  // otherwise each rank registers (here below, or from its own node).
  d.nccl = opts.nccl;
  stop_unless_dismissed started(sys, d);
  d.ranks = spawn_ranks(sys, t, opts.node, d.authorize, opts.incarnation != 0 ? opts.incarnation : 1, {}, d.nccl);
  if (!d.ranks.empty())
    d.trainer = d.ranks.front().trainer;
  d.single_trainer = follows_single_trainer(t, opts.node);
  d.remote_pullers = opts.remote_pullers;
  d.metrics = opts.metrics;
  const bool router_here = opts.node.empty() || t.router.node == opts.node;
  // The fleet endpoint serves /metrics: it needs a registry if the node has none.
  if (router_here && t.router.http_port && !d.metrics)
    d.metrics = std::make_shared<metrics::registry>();
  // Engines record their plans in the dtype the trainer sends; with no rank
  // here, the checkpoint's headers say (a node of engines does not read the
  // model), else a source built for the question alone (it publishes nothing).
  const bool from_checkpoint = !t.model.weights_dtype && !t.model.checkpoint.empty()
                               && t.trainer.source != trainer_source::checkpoint_dir;
  d.source_dtype = d.trainer.source ? source_dtype_of(t, *d.trainer.source)
                   : t.trainer.source == trainer_source::external ? transfer::external_weights_dtype(t)
                   : from_checkpoint ? checkpoint_dtype_from_headers(t.model.checkpoint)
                                     : source_dtype_of(t, *transfer::make_weight_source(t, 0));
  std::vector<const engine_spec*> hosted;
  for (const auto& e : t.engines) {
    if (!opts.node.empty() && e.node != opts.node)
      continue;
    hosted.push_back(&e);
    d.gates.push_back(opts.fault_gates ? std::make_shared<engine_fault_gate>() : nullptr);
    d.incarnations.push_back(opts.incarnation != 0 ? opts.incarnation : 1);
    if (opts.incarnation == 0 && restored) // one process restarted: its engines reconnect as on record
      for (auto& pm : restored->members)
        if (pm.name == e.name)
          d.incarnations.back() = pm.incarnation;
    d.engines.push_back(spawn_engine(sys, d, t, e, d.engines.size()));
    d.engine_names.push_back(e.name);
  }
  auto rc = router_config_from(t);
  rc.log = opts.router_log;
  if (d.metrics)
    instrument_router(*d.metrics, rc);
  d.router_cfg = rc;
  if (router_here) // else its own node's process registers it
    d.router = spawn_router(sys, rc, d.authorize);
  auto on_router = opts.on_router;
  if (d.router && t.router.http_port) {
    d.http = std::make_shared<router_endpoint>(sys, router_endpoint_options_from(t, d.metrics), d.router);
    // A router restarted here takes the endpoint's requests from then on.
    on_router = [endpoint = std::weak_ptr<router_endpoint>(d.http), next = opts.on_router](const router_actor& r) {
      if (auto e = endpoint.lock())
        e->set_router(r);
      if (next)
        next(r);
    };
  }
  auto cc = coordinator_config_from(t);
  if (d.single_trainer)
    cc.trainer = d.trainer.actor;
  cc.await_ranks = !d.single_trainer; // a lone rank of another process: no cold round before it registers
  cc.router = d.router;
  cc.authorize = d.authorize;
  if (opts.node_name_of) {
    std::map<std::string, std::string> placed{{"router", t.router.node}};
    for (const auto& e : t.engines)
      placed["engine " + e.name] = e.node;
    for (std::size_t r = 0; r < t.trainer.ranks.size(); ++r)
      placed["trainer rank " + std::to_string(r)] = t.trainer.ranks[r].node;
    cc.origin = origin_check(std::move(placed), sys.node(), opts.node, opts.node_name_of);
  }
  cc.log = opts.log;
  cc.on_report = opts.on_sync;
  cc.on_phase = opts.on_phase;
  cc.on_member = opts.on_member;
  cc.on_router = on_router;
  if (d.metrics)
    instrument_coordinator(*d.metrics, cc);
  d.coordinator_cfg = cc;
  cc.restored = restored;
  // Every engine up (its staging faulted in) before the coordinator starts:
  // the first round then takes them all, registered together below.
  for (std::size_t i = 0; i < d.engines.size(); ++i)
    if (auto failure = await_engine_ready(sys, caf::actor_cast<caf::actor>(d.engines[i])); !failure.empty())
      throw std::runtime_error("engine " + hosted[i]->name + " did not come up: " + failure);
  d.coordinator = sys.spawn(coordinator, cc);
  d.drivers->granted(d.coordinator.address(), d.router.address());
  d.current_coordinator->set(d.coordinator);

  if (!d.single_trainer)
    for (const auto& r : d.ranks)
      if (auto failure = register_rank(sys, d.coordinator, t, r, opts.register_deadline);
          !failure.empty())
        throw std::runtime_error("trainer rank " + std::to_string(r.rank)
                                 + " could not register with the coordinator: " + failure);
  for (std::size_t i = 0; i < d.engines.size(); ++i) {
    auto info = engine_info_of(*hosted[i], d.incarnations[i]);
    if (auto failure = register_engine(sys, d.coordinator, info, caf::actor_cast<caf::actor>(d.engines[i]),
                                       opts.register_deadline);
        !failure.empty())
      throw std::runtime_error("engine " + hosted[i]->name + " could not register with the coordinator: " + failure);
  }
  started.dismiss();
  return d;
}

local_deployment deploy_local(caf::actor_system& sys, const topology& t, deployment_options opts) {
  if (t.trainer.source == trainer_source::external)
    throw std::runtime_error("trainer.source: external: the ranks are outside processes that join through the "
                             "head's gatekeeper; run this topology with `rlsync node` or `rlsync launch`");
  opts.node.clear();
  return assemble_head(sys, t, opts);
}

std::string local_deployment::restart_engine(caf::actor_system& sys, const topology& t, std::size_t i,
                                             std::chrono::milliseconds deadline) {
  caf::anon_send_exit(engines[i], caf::exit_reason::kill); // a no-op when it is dead already
  if (gates[i]) { // the new process starts whole
    gates[i]->partitioned = false;
    gates[i]->acks_held_until_ns = 0;
    gates[i]->kill_rank = -1; // a kill the old incarnation never applied dies with it
  }
  const engine_spec* spec = t.find_engine(engine_names[i]);
  if (!spec)
    return "engine " + engine_names[i] + " is not in the topology";
  ++incarnations[i];
  engines[i] = spawn_engine(sys, *this, t, *spec, i);
  if (auto failure = await_engine_ready(sys, caf::actor_cast<caf::actor>(engines[i])); !failure.empty())
    return "did not come up: " + failure;
  return register_engine(sys, coordinator, engine_info_of(*spec, incarnations[i]),
                         caf::actor_cast<caf::actor>(engines[i]), deadline);
}

void local_deployment::restart_coordinator(caf::actor_system& sys, const topology& t, bool kill_first) {
  if (coordinator_cfg.state_file.empty())
    throw std::runtime_error("a coordinator restart needs coordinator.state_file: without it the version counter "
                             "would start again from 0");
  if (kill_first) {
    caf::scoped_actor self{sys};
    self->monitor(coordinator);
    caf::anon_send_exit(coordinator, caf::exit_reason::kill);
    self->receive([](const caf::down_msg&) {}, caf::after(std::chrono::seconds(5)) >> [] {});
  }
  auto cc = coordinator_cfg;
  if (single_trainer)
    cc.trainer = trainer.actor;
  cc.router = router; // a router restarted since is the one to tell
  cc.restored = read_coordinator_state(cc.state_file); // throws, naming file:line:column
  coordinator = sys.spawn(rlsync::coordinator, cc);
  drivers->granted(coordinator.address(), router.address()); // it vouches for routers from now on
  current_coordinator->set(coordinator);
  caf::scoped_actor self{sys};
  for (std::size_t i = 0; i < engines.size(); ++i) {
    std::optional<engine_status> st;
    self->request(engines[i], std::chrono::seconds(2), status_atom::value)
      .receive([&](engine_status& s) { st = s; }, [](caf::error&) {});
    if (!st)
      continue; // dead or cut off: it registers when it is restarted
    const engine_spec* spec = t.find_engine(engine_names[i]);
    if (!spec)
      continue;
    // As it is: paused too, when the old coordinator died mid-round (then it
    // is not routable until a sync continues it).
    auto info = engine_info_of(*spec, incarnations[i], st->version, st->dirty);
    info.paused = st->state != scheduler_state::unpaused;
    // A refusal leaves it out, as a dead one: it registers when it is restarted.
    register_engine(sys, coordinator, info, caf::actor_cast<caf::actor>(engines[i]), std::chrono::seconds(10));
  }
  if (!single_trainer) // the ranks too, as they are (same incarnation: a reconnect)
    for (const auto& r : ranks)
      register_rank(sys, coordinator, t, r, std::chrono::seconds(10));
}

router_actor local_deployment::restart_router(caf::actor_system& sys) {
  { // the requesters must have seen the old one go before they hear of the new one
    caf::scoped_actor self{sys};
    self->monitor(router);
    caf::anon_send_exit(router, caf::exit_reason::kill);
    self->receive([](const caf::down_msg&) {}, caf::after(std::chrono::seconds(5)) >> [] {});
  }
  router = spawn_router(sys, router_cfg, authorize);
  if (http) // at once: the coordinator's word (on_router) comes asynchronously
    http->set_router(router);
  caf::scoped_actor self{sys}; // a named sender: the coordinator refuses anonymous ones
  self->send(coordinator, register_atom::value, router);
  return router;
}

std::string local_deployment::restart_trainer(caf::actor_system& sys, const topology& t, std::size_t hosted) {
  if (hosted >= ranks.size())
    return "no trainer rank " + std::to_string(hosted) + " runs in this process";
  auto& r = ranks[hosted];
  caf::anon_send_exit(r.trainer.actor, caf::exit_reason::kill);
  // The round the old incarnation was in is aborted: its engines' local
  // pulls end now, not at their deadlines (a withheld group, as in
  // bench sync's rank kill, would hold them that long). Later pulls start
  // passes of their own.
  if (r.trainer.transfer)
    r.trainer.transfer->end_passes();
  // Who may ask for an engine's tickets and slots survives the restart:
  // the placements the coordinator told, and who may tell them.
  auto tc = local_trainer_config(r.trainer, t, authorize);
  if (nccl)
    serve_over_nccl(tc, nccl, static_cast<int>(r.rank));
  r.trainer.actor = spawn_trainer(sys, tc);
  ++r.incarnation;
  if (hosted == 0)
    trainer = r.trainer;
  if (!single_trainer)
    return register_rank(sys, coordinator, t, r, std::chrono::seconds(10));
  caf::scoped_actor self{sys}; // a named sender: the coordinator refuses anonymous ones
  self->send(coordinator, register_atom::value, r.trainer.actor);
  return {};
}

std::vector<caf::actor> local_deployment::actors() const {
  std::vector<caf::actor> all{caf::actor_cast<caf::actor>(coordinator), caf::actor_cast<caf::actor>(router)};
  for (const auto& r : ranks)
    all.push_back(caf::actor_cast<caf::actor>(r.trainer.actor));
  for (const auto& e : engines)
    all.push_back(caf::actor_cast<caf::actor>(e));
  return all;
}

void local_deployment::shutdown() {
  if (http)
    http->stop(); // no new requests for actors on their way out
  auto stop = [](const auto& handle) {
    if (handle)
      caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
  };
  for (auto& r : ranks)
    stop(r.trainer.actor);
  stop(coordinator);
  stop(router);
  for (auto& e : engines)
    stop(e);
}

} // namespace rlsync
