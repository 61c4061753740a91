#include "actors/assembly/head_node.hpp"

#include "actors/caf_puller.hpp"
#include "actors/gatekeeper.hpp"
#include "actors/ipc_puller.hpp"
#include "actors/assembly/nccl_plane.hpp"
#include "actors/tls.hpp"
#include "gpu/ipc_producer.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/plan/groups.hpp"

#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <thread>

namespace rlsync {

std::string cluster_layout_problem(const topology& t) {
  const node_spec* head = t.find_node(t.coordinator.node);
  const auto place = [&] { return topology_place(t.source, {"nodes", "name=" + head->name, "port"}) + ": "; };
  if (head->port == 0 && t.nodes.size() > 1)
    return place() + "nodes '" + head->name
           + "': the coordinator's node needs a fixed port for the others to reach it (port: 0)";
  if (head->port == 0 && t.trainer.source == trainer_source::external)
    return place() + "nodes '" + head->name + "': the coordinator's node needs a fixed port for the external trainer ranks "
           "(trainer.source: external) to reach it (port: 0)";
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

transfer::ucx_credentials_source ucx_tickets_from(caf::actor_system& sys, std::function<trainer_actor()> trainer) {
  return [&sys, trainer = std::move(trainer)](const std::string& engine, int worker,
                                              transfer::clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - transfer::clock::now());
    if (left <= std::chrono::milliseconds(0))
      throw std::runtime_error("the deadline passed before a UCX ticket was asked for");
    auto handle = trainer();
    if (!handle)
      throw std::runtime_error("no trainer to ask for a UCX ticket");
    caf::scoped_actor self{sys};
    std::optional<ucx_ticket> ticket;
    std::string failure = "no answer";
    self->request(handle, left, ucx_ticket_atom::value, engine, static_cast<std::int32_t>(worker))
      .receive([&](ucx_ticket& t) { ticket = std::move(t); }, [&](caf::error& err) { failure = sys.render(err); });
    if (!ticket)
      throw std::runtime_error("the trainer gave no UCX ticket: " + failure);
    return transfer::ucx_credentials{std::move(ticket->producer), std::move(ticket->token)};
  };
}

std::shared_ptr<transfer::ucx_puller> make_ucx_puller(caf::actor_system& sys, const topology& t, const node_spec& node,
                                                      std::function<trainer_actor()> trainer,
                                                      const std::function<void(const std::string&)>& log) {
  transfer::ucx_puller_options po;
  po.credentials = ucx_tickets_from(sys, std::move(trainer));
  po.transports = t.transfer.ucx_transports;
  po.net_devices = ucx_net_devices_for(node, t.transfer.ucx_transports, log);
  po.shared_memory = ucx_lends_shared_memory(t.transfer); // else by tag over what ucx_transports names
  po.groups_in_flight = static_cast<std::size_t>(std::max<std::int64_t>(1, t.transfer.groups_in_flight));
  // A producer's manifest sizes the receive buffers: no group may announce
  // more than the model's largest, every element as wide as f32, with the
  // tensors a checkpoint may carry beside the parameters (broadcast sends
  // them whole; the engine drops them).
  auto specs = llama_parameter_specs(t.model.config, dtype::f32);
  for (auto& extra : ignored_weight_specs(t.model.config, dtype::f32))
    specs.push_back(std::move(extra));
  po.max_group_bytes = plan::largest_group_bytes(t.model.config, specs, dtype::f32);
  // The option connect_ahead stays off: the puller registers an engine's
  // workers before the engine registers with the coordinator, and the
  // trainer issues UCX tickets only to registered engines, so a connection
  // then would be refused ("that engine is not registered from the asking
  // node"). The node calls connect_ahead(engine) once it registered.
  po.log = [log](const std::string& line) {
    if (log)
      log("ucx: " + line);
  };
  return std::make_shared<transfer::ucx_puller>(po);
}

producer_puller_factory remote_rank_pullers(caf::actor_system& sys, const topology& t, const node_spec& node,
                                            std::function<void(const std::string&)> log,
                                            std::shared_ptr<gpu::nccl_membership> nccl) {
  auto topo = std::make_shared<const topology>(t); // engines outlive the caller's copy
  return [&sys, topo, node, log = std::move(log), nccl](const producer_holding& h,
                                                        const trainer_actor& rank) -> std::shared_ptr<transfer::weight_puller> {
    if (!rank)
      return nullptr;
    if (topo->transfer.backend == transfer_backend::nccl) {
      if (!nccl) {
        if (log)
          log("trainer rank " + std::to_string(h.rank) + ": transfer.backend nccl: this process joins no communicator");
        return nullptr;
      }
      return std::make_shared<nccl_puller>(sys, [rank] { return rank; }, topo->model.config, nccl_links(nccl),
                                           groups_holding(topo->model.config, h.held), gpu::dead_member_hooks(nccl),
                                           topo->transfer.collective, nccl_packers(nccl),
                                           nccl_root_links(nccl, static_cast<int>(h.rank)));
    }
    if (topo->transfer.backend == transfer_backend::cuda_ipc) {
      try {
        return std::make_shared<ipc_puller>(sys, [rank] { return rank; }, topo->model.config, gpu::cuda_ipc_memory(),
                                            groups_holding(topo->model.config, h.held));
      } catch (const std::exception& e) {
        if (log)
          log("trainer rank " + std::to_string(h.rank) + ": transfer.backend cuda_ipc: " + e.what());
        return nullptr;
      }
    }
    if (topo->transfer.backend != transfer_backend::ucx)
      return std::make_shared<caf_puller>(sys, [rank] { return rank; }, topo->model.config,
                                          groups_holding(topo->model.config, h.held),
                                          static_cast<std::size_t>(topo->transfer.groups_in_flight));
    try { // one puller per rank incarnation: its producer's address changes with a restart
      return make_ucx_puller(sys, *topo, node, [rank] { return rank; }, log);
    } catch (const std::exception& e) {
      if (log)
        log("trainer rank " + std::to_string(h.rank) + ": transfer.backend ucx: " + e.what());
      return nullptr;
    }
  };
}

void open_ipc_producers(const topology& t, const std::vector<hosted_rank>& ranks,
                        std::shared_ptr<gpu::ipc_memory> memory) {
  if (ranks.empty())
    return;
  if (!memory) {
    try {
      memory = gpu::cuda_ipc_memory();
    } catch (const gpu::gpu_error& e) {
      throw std::runtime_error(std::string("transfer.backend cuda_ipc: ") + e.what());
    }
  }
  for (const auto& r : ranks) {
    // A slot per tensor-parallel worker of every engine in another process
    // (those in the rank's own use the local plane, unless the rank is an
    // external trainer's process; data-parallel ranks share their engine's
    // weights), each as large as the rank's largest group. The buffer is
    // allocated now: a device short of memory fails the start, not the
    // first sync.
    const bool rank_alone = t.trainer.source == trainer_source::external;
    std::size_t workers = 0;
    std::size_t largest_tp = 1;
    for (const auto& e : t.engines) {
      largest_tp = std::max(largest_tp, static_cast<std::size_t>(e.tp));
      if (rank_alone || e.node != t.trainer.ranks[r.rank].node)
        workers += static_cast<std::size_t>(e.tp);
    }
    // A checkpoint's dtype is known only once its first snapshot is read:
    // until then, slots hold its groups as f32, the largest element.
    const dtype element = t.model.weights_dtype.value_or(dtype::f32);
    const auto largest = plan::largest_group_bytes(t.model.config, r.trainer.source->parameters(), element);
    try {
      r.trainer.cuda_ipc->open(std::make_shared<gpu::ipc_producer>(memory, static_cast<std::size_t>(largest),
                                                                   std::max<std::size_t>(1, workers), largest_tp));
    } catch (const gpu::gpu_error& e) {
      throw std::runtime_error("transfer.backend cuda_ipc, trainer rank " + std::to_string(r.rank) + ": "
                               + e.what());
    }
  }
}

transfer::ucx_producer_options rank_producer_options(const topology& t, const node_spec& node,
                                                    std::function<void(const std::string&)> log) {
  transfer::ucx_producer_options po;
  po.transports = t.transfer.ucx_transports;
  po.net_devices = ucx_net_devices_for(node, t.transfer.ucx_transports, log);
  po.shared_memory = ucx_lends_shared_memory(t.transfer);
  // transfer.packed_budget_bytes; 0: enough for 2 x groups_in_flight of the largest group.
  po.packed_budget_bytes = static_cast<std::uint64_t>(t.transfer.packed_budget_bytes);
  po.huge_pages = t.transfer.huge_pages;
  po.expected_mode = t.transfer.mode; // packs ahead for engines connected ahead of their first round
  po.default_budget_groups = static_cast<std::size_t>(std::max<std::int64_t>(2, 2 * t.transfer.groups_in_flight));
  // Each engine worker keeps groups_in_flight gets outstanding on its connection.
  po.max_outstanding_per_connection = std::max<std::size_t>(po.max_outstanding_per_connection,
                                                            static_cast<std::size_t>(t.transfer.groups_in_flight));
  // Buffers made ahead hold what the engine of the smallest tp asks for.
  std::int64_t smallest_tp = 0;
  for (const auto& e : t.engines)
    smallest_tp = smallest_tp == 0 ? pulling_workers(e) : std::min(smallest_tp, pulling_workers(e));
  po.prewarm_split = t.transfer.mode == transfer_mode::sharded ? static_cast<std::size_t>(std::max<std::int64_t>(1, smallest_tp)) : 1;
  po.log = std::move(log);
  return po;
}

std::vector<std::unique_ptr<transfer::ucx_producer>> start_rank_producers(
  const topology& t, const node_spec& node, const std::vector<hosted_rank>& ranks,
  const std::function<void(const std::string&)>& log) {
  std::vector<std::unique_ptr<transfer::ucx_producer>> producers;
  if (t.transfer.backend == transfer_backend::cuda_ipc)
    open_ipc_producers(t, ranks);
  if (t.transfer.backend != transfer_backend::ucx)
    return producers;
  // Engines elsewhere pull from each rank's own producer. It opens no port:
  // they ask the rank's trainer actor for its address and a token per
  // engine worker (ucx_ticket_atom).
  for (const auto& r : ranks) {
    const std::string prefix = ranks.size() == 1 && t.trainer.ranks.size() == 1
                                 ? "ucx producer: "
                                 : "trainer rank " + std::to_string(r.rank) + ": ";
    const auto po = rank_producer_options(t, node, [log, prefix](const std::string& line) {
      if (log)
        log(prefix + line);
    });
    try {
      producers.push_back(std::make_unique<transfer::ucx_producer>(r.trainer.source, po));
    } catch (const std::exception& e) {
      for (const auto& opened : ranks)
        opened.trainer.ucx_tickets->close();
      throw std::runtime_error(std::string("transfer.backend ucx") + (t.trainer.ranks.size() == 1 ? "" : ", trainer rank " + std::to_string(r.rank)) + ": " + e.what());
    }
    r.trainer.ucx_tickets->open([p = producers.back().get()](const std::string& engine, int worker) {
      auto c = p->issue(engine, worker);
      return ucx_ticket{std::move(c.producer), std::move(c.token)};
    });
  }
  return producers;
}

head_node::head_node(caf::actor_system& sys, const topology& t, const node_spec& node,
                     std::map<std::string, std::string> member_secrets, head_hooks hooks)
    : sys_(sys) {
  auto admitted = std::make_shared<admitted_nodes>();
  deployment_options opts;
  opts.node = node.name;
  opts.admit = [admitted](const caf::node_id& n) { return admitted->contains(n); };
  opts.node_name_of = [admitted](const caf::node_id& n) { return admitted->name_of(n); };
  opts.incarnation = next_incarnation();
  opts.register_deadline = t.cluster.connect_deadline;
  opts.log = hooks.log;
  opts.on_sync = hooks.on_report;
  opts.on_phase = hooks.on_phase;
  opts.metrics = hooks.metrics;
  opts.devices = hooks.devices;
  if (t.transfer.backend == transfer_backend::nccl)
    opts.nccl = make_nccl_membership(t, hosted_members(t, node.name), hooks.nccl_links);
  opts.remote_pullers = remote_rank_pullers(sys, t, node, hooks.log, opts.nccl);
  opts.on_router = [registered = registered_](const router_actor& router) {
    std::lock_guard<std::mutex> lock(registered->mutex);
    registered->router = router;
  };
  actors_ = assemble_head(sys, t, opts); // throws with nothing left running
  gatekeeper_config gc;
  gc.secrets = std::move(member_secrets);
  // The trainer a single-producer member pulls from (none when the ranks run
  // elsewhere: orders then name each rank, which members reach by its handle).
  gc.grant = {actors_.coordinator, actors_.single_trainer ? actors_.trainer.actor : trainer_actor{}, actors_.router};
  gc.grant.source_dtype = static_cast<std::uint8_t>(actors_.source_dtype);
  gc.admitted = admitted;
  gc.current_router = [registered = registered_] {
    std::lock_guard<std::mutex> lock(registered->mutex);
    return registered->router;
  };
  gc.log = hooks.line;
  try {
    producers_ = start_rank_producers(t, node, actors_.ranks, hooks.log);
    gc.grant.ucx = t.transfer.backend == transfer_backend::ucx;
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

router_actor head_node::router() const {
  if (actors_.router)
    return actors_.router;
  std::lock_guard<std::mutex> lock(registered_->mutex);
  return registered_->router;
}

router_actor head_node::await_router(std::chrono::milliseconds deadline,
                                     const std::function<bool()>& stop_requested) const {
  auto give_up = std::chrono::steady_clock::now() + deadline;
  auto seen = router();
  while (!seen && std::chrono::steady_clock::now() < give_up && !(stop_requested && stop_requested())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50)); // polls what the coordinator's hook wrote
    seen = router();
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
  for (auto a : {gate_, caf::actor_cast<caf::actor>(actors_.coordinator), caf::actor_cast<caf::actor>(actors_.router)})
    all.push_back(a);
  for (const auto& r : actors_.ranks)
    all.push_back(caf::actor_cast<caf::actor>(r.trainer.actor));
  actors_.engines.clear();
  bool ok = stop_and_await(sys_, std::move(all), deadline);
  for (const auto& r : actors_.ranks) {
    if (r.trainer.ucx_tickets)
      r.trainer.ucx_tickets->close();
    if (r.trainer.cuda_ipc)
      r.trainer.cuda_ipc->close();
    if (r.trainer.nccl)
      r.trainer.nccl->close();
  }
  if (actors_.nccl)
    actors_.nccl->leave(); // aborts every link: a peer's wait on this process ends now
  producers_.clear(); // after every actor that could hand out their tickets
  return ok;
}

} // namespace rlsync
