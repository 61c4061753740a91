#include "actors/assembly/head_node.hpp"

#include "actors/gatekeeper.hpp"
#include "actors/tls.hpp"

#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <stdexcept>
#include <thread>

namespace rlsync {

std::string cluster_layout_problem(const topology& t) {
  const node_spec* head = t.find_node(t.coordinator.node);
  if (t.router.node != head->name || t.trainer.node != head->name)
    return "the router and the trainer must run on the coordinator's node (" + head->name + ") for now";
  if (head->port == 0 && t.nodes.size() > 1)
    return "nodes '" + head->name + "': the coordinator's node needs a fixed port for the others to reach it (port: 0)";
  return {};
}

std::string ucx_net_devices_for(const node_spec& node, const std::vector<ucx_transport>& transports,
                                const std::function<void(const std::string&)>& log) {
  // An RDMA device has no IP of its own to find it by: leave the choice to
  // UCX (or the operator's UCX_NET_DEVICES) when the topology names rdma.
  if (std::find(transports.begin(), transports.end(), ucx_transport::rdma) != transports.end())
    return {};
  std::string why;
  std::string device = transfer::ucx_net_device_for(node.address, &why);
  if (device.empty() && log)
    log("ucx: node " + node.name + ": UCX may use every network interface: " + why);
  return device;
}

head_node::head_node(caf::actor_system& sys, const topology& t, const node_spec& node,
                     std::map<std::string, std::string> member_secrets, head_hooks hooks)
    : sys_(sys) {
  auto admitted = std::make_shared<admitted_nodes>();
  deployment_options opts;
  opts.node = node.name;
  opts.admit = [admitted](const caf::node_id& n) { return admitted->contains(n); };
  opts.incarnation = process_incarnation();
  opts.register_deadline = t.cluster.connect_deadline;
  opts.log = hooks.log;
  opts.on_sync = hooks.on_report;
  opts.on_phase = hooks.on_phase;
  actors_ = assemble_head(sys, t, opts); // throws with nothing left running
  gatekeeper_config gc;
  gc.secrets = std::move(member_secrets);
  gc.grant = {actors_.coordinator, actors_.trainer.actor, actors_.router};
  gc.grant.source_dtype = static_cast<std::uint8_t>(actors_.source_dtype);
  gc.admitted = admitted;
  gc.log = hooks.line;
  try {
    // Remote engines pull from the trainer's UCX producer. It opens no
    // port: members ask the trainer for its address and a token per engine
    // worker (ucx_ticket_atom).
    if (t.transfer.backend == transfer_backend::ucx) {
      transfer::ucx_producer_options po;
      po.transports = t.transfer.ucx_transports;
      po.net_devices = ucx_net_devices_for(node, t.transfer.ucx_transports, hooks.log);
      po.max_packed_groups = static_cast<std::size_t>(std::max<std::int64_t>(2, 2 * t.transfer.groups_in_flight));
      auto log = hooks.log;
      po.log = [log](const std::string& line) {
        if (log)
          log("ucx producer: " + line);
      };
      try {
        producer_ = std::make_unique<transfer::ucx_producer>(actors_.trainer.source, po);
      } catch (const std::exception& e) {
        throw std::runtime_error(std::string("transfer.backend ucx: ") + e.what());
      }
      actors_.trainer.ucx_tickets->open([p = producer_.get()](const std::string& engine, int worker) {
        auto c = p->issue(engine, worker);
        return ucx_ticket{std::move(c.producer), std::move(c.token)};
      });
      gc.grant.ucx = true;
    }
    gate_ = caf::actor_cast<caf::actor>(sys.spawn(gatekeeper, gc));
    auto port = publish_node(sys, caf::actor_cast<gatekeeper_actor>(gate_), node.port, node.address);
    if (!port)
      throw std::runtime_error("cannot listen on " + node.address + ":" + std::to_string(node.port) + ": "
                               + sys.render(port.error()));
    port_ = *port;
  } catch (...) {
    stop();
    throw;
  }
}

bool head_node::corrupt_next_group(const std::string& engine) {
  if (!producer_)
    return false;
  transfer::corruption c; // any worker, any version; group 0, once
  c.engine = engine;
  producer_->corrupt(c);
  return true;
}

head_node::~head_node() {
  stop();
}

std::size_t head_node::members() const {
  caf::scoped_actor self{sys_};
  std::size_t n = 0;
  self->request(actors_.coordinator, std::chrono::seconds(5), status_atom::value)
    .receive([&](const coordinator_status& s) { n = s.members.size(); }, [](caf::error&) {});
  return n;
}

std::size_t head_node::await_members(std::size_t n, std::chrono::milliseconds deadline,
                                     const std::function<bool()>& stop_requested) const {
  auto give_up = std::chrono::steady_clock::now() + deadline;
  auto seen = members();
  while (seen < n && std::chrono::steady_clock::now() < give_up && !(stop_requested && stop_requested())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50)); // polls the coordinator and a signal's flag
    seen = members();
  }
  return seen;
}

std::size_t head_node::routable() const {
  caf::scoped_actor self{sys_};
  std::size_t n = 0;
  self->request(actors_.coordinator, std::chrono::seconds(5), status_atom::value)
    .receive([&](const coordinator_status& s) { n = s.routable.size(); }, [](caf::error&) {});
  return n;
}

bool head_node::stop(std::chrono::milliseconds deadline) {
  if (stopped_)
    return true;
  stopped_ = true;
  if (port_ != 0)
    sys_.middleman().close(port_);
  std::vector<caf::actor> all;
  for (const auto& e : actors_.engines)
    all.push_back(caf::actor_cast<caf::actor>(e));
  for (auto a : {gate_, caf::actor_cast<caf::actor>(actors_.coordinator), caf::actor_cast<caf::actor>(actors_.router),
                 caf::actor_cast<caf::actor>(actors_.trainer.actor)})
    all.push_back(a);
  actors_.engines.clear();
  bool ok = stop_and_await(sys_, std::move(all), deadline);
  if (actors_.trainer.ucx_tickets)
    actors_.trainer.ucx_tickets->close();
  producer_.reset(); // after every actor that could hand out its tickets
  return ok;
}

} // namespace rlsync
