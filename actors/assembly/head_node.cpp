#include "actors/assembly/head_node.hpp"

#include "actors/assembly/local_deployment.hpp"
#include "actors/coordinator.hpp"
#include "actors/gatekeeper.hpp"
#include "actors/rollout_engine.hpp"
#include "actors/router.hpp"

#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <stdexcept>

namespace rlsync {

using clock_type = std::chrono::steady_clock;

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
  auto until = clock_type::now() + deadline;
  bool late = false;
  while (alive > 0 && !late)
    self->receive([&](const caf::down_msg&) { --alive; },
                  caf::after(std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::max(until - clock_type::now(), clock_type::duration::zero())))
                    >> [&] { late = true; });
  return alive == 0;
}

void register_engine(caf::actor_system& sys, const coordinator_actor& coordinator, const engine_spec& spec,
                     const caf::actor& engine, std::chrono::milliseconds deadline) {
  caf::scoped_actor self{sys};
  std::string failure;
  // Each process is a new incarnation of its replicas: a restarted node's
  // engines replace their dead predecessors and count as restarts.
  static const auto incarnation = static_cast<std::uint64_t>(
    std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  engine_info info{spec.name, spec.node, static_cast<std::uint32_t>(spec.tp), 0, true, incarnation};
  self->request(coordinator, deadline, register_atom::value, info, caf::actor_cast<rollout_engine_actor>(engine))
    .receive([](const registration&) {}, [&](caf::error& err) { failure = sys.render(err); });
  if (!failure.empty())
    throw std::runtime_error("engine " + spec.name + " could not register with the coordinator: " + failure);
}

head_node::head_node(caf::actor_system& sys, const topology& t, const node_spec& node, const std::string& secret,
                     head_hooks hooks)
    : sys_(sys) {
  std::optional<persisted_coordinator> restored; // before anything runs: a bad file stops the node cleanly
  if (!t.coordinator.state_file.empty())
    restored = read_coordinator_state(t.coordinator.state_file); // throws, naming file:line:column
  trainer_ = make_local_trainer(sys, t, 0);
  router_ = spawn_router(sys, router_config_from(t));
  auto admitted = std::make_shared<admitted_nodes>();
  auto cc = coordinator_config_from(t);
  cc.trainer = trainer_.actor;
  cc.router = router_;
  cc.admit = [admitted](const caf::node_id& n) { return admitted->contains(n); };
  cc.log = hooks.log;
  cc.on_report = hooks.on_report;
  cc.restored = std::move(restored);
  coordinator_ = sys.spawn(rlsync::coordinator, cc);
  gatekeeper_config gc;
  gc.secret = secret;
  gc.grant = {coordinator_, trainer_.actor, router_};
  gc.admitted = admitted;
  gc.log = hooks.line;
  try {
    // Remote engines pull from the trainer's UCX producer, on an ephemeral
    // port announced in the join grant.
    if (t.transfer.backend == transfer_backend::ucx) {
      transfer::ucx_producer_options po;
      po.listen_address = node.address;
      po.transports = t.transfer.ucx_transports;
      po.max_packed_groups = static_cast<std::size_t>(std::max<std::int64_t>(2, 2 * t.transfer.groups_in_flight));
      auto log = hooks.log;
      po.log = [log](const std::string& line) {
        if (log)
          log("ucx producer: " + line);
      };
      try {
        producer_ = std::make_unique<transfer::ucx_producer>(trainer_.source, po);
      } catch (const std::exception& e) {
        throw std::runtime_error(std::string("transfer.backend ucx: ") + e.what());
      }
      gc.grant.ucx_port = producer_->port();
    }
    gate_ = caf::actor_cast<caf::actor>(sys.spawn(gatekeeper, gc));
    auto port = sys.middleman().publish(caf::actor_cast<gatekeeper_actor>(gate_), node.port, node.address.c_str(), true);
    if (!port)
      throw std::runtime_error("cannot listen on " + node.address + ":" + std::to_string(node.port) + ": "
                               + sys.render(port.error()));
    port_ = *port;
    auto first = trainer_.source->latest();
    dtype source_dtype = t.model.weights_dtype.value_or(
      first && !first->tensors().empty() ? first->tensors().front().type : dtype::bf16);
    for (const auto& e : t.engines)
      if (e.node == node.name) {
        engines_.push_back(caf::actor_cast<caf::actor>(
          spawn_rollout_engine(sys, engine_config_from(t, e, trainer_.transfer, source_dtype))));
        register_engine(sys, coordinator_, e, engines_.back(), t.cluster.connect_deadline);
      }
  } catch (...) {
    stop();
    throw;
  }
}

head_node::~head_node() {
  stop();
}

std::size_t head_node::members() const {
  caf::scoped_actor self{sys_};
  std::size_t n = 0;
  self->request(coordinator_, std::chrono::seconds(5), status_atom::value)
    .receive([&](const coordinator_status& s) { n = s.members.size(); }, [](caf::error&) {});
  return n;
}

std::size_t head_node::routable() const {
  caf::scoped_actor self{sys_};
  std::size_t n = 0;
  self->request(coordinator_, std::chrono::seconds(5), status_atom::value)
    .receive([&](const coordinator_status& s) { n = s.routable.size(); }, [](caf::error&) {});
  return n;
}

bool head_node::stop(std::chrono::milliseconds deadline) {
  if (stopped_)
    return true;
  stopped_ = true;
  if (port_ != 0)
    sys_.middleman().close(port_);
  std::vector<caf::actor> all = engines_;
  for (auto a : {gate_, caf::actor_cast<caf::actor>(coordinator_), caf::actor_cast<caf::actor>(router_),
                 caf::actor_cast<caf::actor>(trainer_.actor)})
    all.push_back(a);
  engines_.clear();
  bool ok = stop_and_await(sys_, std::move(all), deadline);
  producer_.reset(); // after every actor that could hand out its port
  return ok;
}

} // namespace rlsync
