#include "actors/assembly/member_node.hpp"

#include "actors/assembly/local_deployment.hpp"
#include "actors/caf_puller.hpp"
#include "actors/ipc_puller.hpp"
#include "actors/assembly/nccl_plane.hpp"
#include "actors/nccl_puller.hpp"
#include "actors/fleet_metrics.hpp"
#include "actors/gatekeeper.hpp"
#include "actors/tls.hpp"
#include "actors/rollout_engine.hpp"
#include "runtime/base/version.hpp"
#include "runtime/http/client.hpp"
#include "runtime/transfer/ucx/ucx_transfer.hpp"

#include <boost/asio.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/assembly/head_node.hpp"

#include <algorithm>
#include <mutex>
#include <optional>
#include <thread>

namespace rlsync {

namespace {

using clock_type = std::chrono::steady_clock;

/// Waits until `stop` or `done` says so, polling every 50 ms; bounded by
/// nothing else on purpose: a node serves until told to stop.
void wait_until(const std::function<bool()>& stop, const std::function<bool()>& done) {
  while (!(stop && stop()) && !done())
    std::this_thread::sleep_for(std::chrono::milliseconds(50)); // polls a flag a signal handler sets
}

} // namespace

std::string probe_tcp(const std::string& host, std::uint16_t port, clock_type::time_point until,
                      const std::function<bool()>& stop, std::string* reached) {
  namespace asio = boost::asio;
  boost::system::error_code ec;
  std::vector<asio::ip::tcp::endpoint> endpoints;
  if (const auto address = asio::ip::make_address(host, ec); !ec) {
    endpoints.emplace_back(address, port);
  } else { // a host name: looked up within the same deadline
    try {
      for (const auto& a : http::resolve_addresses(host, until))
        endpoints.emplace_back(asio::ip::make_address(a), port);
    } catch (const std::exception& e) {
      return e.what();
    }
  }
  asio::io_context ioc;
  asio::ip::tcp::socket socket(ioc); // declared after ioc: closed (its connect abandoned) first
  bool done = false;
  asio::async_connect(socket, endpoints, [&](const boost::system::error_code& e, const asio::ip::tcp::endpoint& at) {
    ec = e;
    done = true;
    if (!e && reached)
      *reached = at.address().to_string();
  });
  while (!done) {
    if (stop && stop())
      return "stopped";
    const auto now = clock_type::now();
    if (now >= until)
      return "no answer to a TCP connection by the deadline";
    ioc.run_for(std::min<clock_type::duration>(until - now, std::chrono::milliseconds(100)));
  }
  return ec ? ec.message() : std::string{};
}

std::optional<join_grant> join_cluster(caf::actor_system& sys, const topology& t, const node_spec& node,
                                       const node_spec& head, const std::string& secret,
                                       const std::function<bool()>& stop_requested, std::string& why) {
  auto give_up = clock_type::now() + t.cluster.connect_deadline;
  auto backoff = std::chrono::milliseconds(50);
  caf::expected<gatekeeper_actor> gate{caf::error{}};
  int attempts = 0;
  std::string failure = "stopped";
  while (!(stop_requested && stop_requested())) {
    ++attempts;
    std::string reached; // the address that answered: CAF then resolves nothing
    if (auto unreachable = probe_tcp(head.address, head.port, give_up, stop_requested, &reached);
        !unreachable.empty()) {
      failure = unreachable;
    } else {
      gate = connect_node<gatekeeper_actor>(sys, reached, head.port);
      if (gate)
        break;
      failure = sys.render(gate.error());
    }
    if (clock_type::now() + backoff >= give_up)
      break;
    std::this_thread::sleep_for(backoff); // backoff between connection attempts
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  if (!gate) {
    why = "cannot reach the coordinator's node " + head.name + " at " + head.address + ":" + std::to_string(head.port)
          + " after " + std::to_string(attempts) + " attempts: " + failure;
    return std::nullopt;
  }
  // Prove the secret: hello -> challenge -> admit(HMAC, nonce) -> the
  // cluster's handles, taken only once the head proved it holds the secret too.
  // A gatekeeper busy with other peers says so (queue_full): try again,
  // with backoff, until the deadline.
  caf::scoped_actor self{sys};
  std::optional<join_grant> grant;
  failure.clear();
  for (backoff = std::chrono::milliseconds(100);; backoff = std::min(backoff * 2, std::chrono::milliseconds(2000))) {
    auto answer = ask_admission(self, *gate, node.name, secret, give_up);
    if (answer.unproved) {
      why = "whoever answers at " + head.address + ":" + std::to_string(head.port) + " admitted this node without "
            + "proving it holds " + node.name + "'s secret: it is not " + head.name
            + " (or it runs another rlsync build); refusing its orders";
      return std::nullopt;
    }
    grant = std::move(answer.grant);
    if (!grant)
      failure = sys.render(answer.error);
    const bool busy = is(answer.error, errc::queue_full);
    if (grant || !busy || clock_type::now() + backoff >= give_up || (stop_requested && stop_requested()))
      break;
    std::this_thread::sleep_for(backoff); // the gatekeeper asked to retry later
  }
  if (!grant) {
    why = head.name + " refused to admit this node: " + failure;
  } else if (grant->source_dtype > static_cast<std::uint8_t>(dtype::f32)) { // a peer can lie
    why = head.name + " announced an unknown source dtype " + std::to_string(grant->source_dtype);
    grant.reset();
  }
  return grant;
}

member_node_end run_member_node(caf::actor_system& sys, const topology& t, const node_spec& node,
                                const node_spec& head, const std::string& secret, const member_node_options& opts) {
  auto log = [&](const std::string& line) {
    if (opts.log)
      opts.log(line);
  };
  member_node_end end;
  if (auto problem = backend_device_problem(t, opts.devices ? *opts.devices : gpu::query_devices(), node.name); !problem.empty()) {
    log(problem); // before joining: a node that cannot move weights never registers
    end.exit_code = 1;
    return end;
  }
  // transfer.backend nccl: this process's end of the communicator, which
  // its ranks and engines join (nccl_plane.hpp). Made before joining: a
  // process short of a GPU for each member it hosts never registers.
  std::shared_ptr<gpu::nccl_membership> nccl;
  if (t.transfer.backend == transfer_backend::nccl) {
    try {
      nccl = make_nccl_membership(t, hosted_members(t, node.name, opts.external_rank), opts.nccl_links);
    } catch (const std::exception& e) {
      log(e.what());
      end.exit_code = 1;
      return end;
    }
  }
  const auto stopping = [&] { return opts.stop_requested && opts.stop_requested(); };
  std::string why;
  auto grant = join_cluster(sys, t, node, head, secret, opts.stop_requested, why);
  if (!grant) {
    if (stopping()) { // told to stop while joining: a clean stop, not an unreachable head
      log("stopped before " + head.name + " admitted this node");
      return end;
    }
    log(why);
    end.exit_code = 1;
    return end;
  }
  log("admitted by " + head.name);
  std::shared_ptr<transfer::weight_puller> puller;
  std::shared_ptr<transfer::ucx_puller> ucx;
  // The trainer every puller asks (for UCX tickets, cuda_ipc slots, groups
  // over CAF), read at each connection or pull: replaced when the node
  // rejoins (a restarted head has a new trainer and producer address).
  struct ticket_desk {
    std::mutex mutex;
    trainer_actor trainer;
  };
  auto desk = std::make_shared<ticket_desk>();
  desk->trainer = grant->trainer;
  auto current_trainer = [desk] {
    std::lock_guard<std::mutex> lock(desk->mutex);
    return desk->trainer;
  };
  if (opts.external_rank) {
    // A rank's own process pulls nothing.
  } else if (nccl) {
    puller = std::make_shared<nccl_puller>(sys, current_trainer, t.model.config, nccl_links(nccl), std::nullopt,
                                           gpu::dead_member_hooks(nccl), t.transfer.collective, nccl_packers(nccl));
  } else if (t.transfer.backend == transfer_backend::cuda_ipc) {
    try {
      puller = std::make_shared<ipc_puller>(sys, current_trainer, t.model.config, gpu::cuda_ipc_memory());
    } catch (const std::exception& e) {
      log(std::string("transfer.backend cuda_ipc: ") + e.what());
      end.exit_code = 1;
      return end;
    }
  } else if (grant->ucx) {
    try {
      puller = ucx = make_ucx_puller(sys, t, node, current_trainer, opts.log);
    } catch (const std::exception& e) {
      log(std::string("transfer.backend ucx: ") + e.what());
      end.exit_code = 1;
      return end;
    }
  } else {
    puller = std::make_shared<caf_puller>(sys, current_trainer, t.model.config, std::nullopt,
                                          static_cast<std::size_t>(t.transfer.groups_in_flight));
  }
  // Engines record their plans in the dtype the trainer sends, as the head's own do.
  const auto source_dtype = static_cast<dtype>(grant->source_dtype);
  const auto incarnation = next_incarnation();
  // The engines take orders only from this process and the coordinator of
  // the grant they registered under (replaced when it rejoins) and the
  // router it names: the grant's, or one that registered on a member node
  // since, which the coordinator vouches for to every engine.
  auto drivers = std::make_shared<engine_drivers>();
  router_actor router; // when the topology places it here (local: trusted anyway)
  std::unique_ptr<router_endpoint> http; // router.http_port: the router's own endpoint
  // The coordinator an adapter whose server came back registers with (actor threads read it).
  auto current_coordinator = std::make_shared<coordinator_ref>();
  auto trust_grant = [&] {
    drivers->granted(grant->coordinator.address(), grant->router.address());
    current_coordinator->set(grant->coordinator);
    if (opts.coordinator)
      opts.coordinator->set(grant->coordinator);
  };
  trust_grant();
  // The router placed here answers this process and whatever reaches it
  // over its one link, the authenticated connection to the head (a member
  // publishes no port).
  auto fabric = local_or_admitted(sys.node(), [](const caf::node_id&) { return true; });
  // Trainer ranks placed here are driven only by this process and the head's
  // (the coordinator of the grant, its main job); engines of other nodes may
  // ask them for weights and tickets once the coordinator says where they
  // run (trainer_config::engines). Not `fabric`: the head forwards traffic
  // of peers it never admitted too (CAF routes by node id).
  auto rank_drivers = std::make_shared<trusted_actors>();
  rank_drivers->assign({grant->coordinator.address()});
  auto rank_policy = local_or_nodes_of(sys.node(), rank_drivers);
  std::vector<hosted_rank> ranks;
  std::vector<std::unique_ptr<transfer::ucx_producer>> producers;
  std::vector<caf::actor> engines;
  std::vector<const engine_spec*> specs;
  // Everything this node runs, stopped; the producers after every actor
  // that could hand out their tickets.
  auto stop_all = [&] {
    if (http)
      http->stop(); // no new requests for actors on their way out
    std::vector<caf::actor> all = std::move(engines);
    all.push_back(caf::actor_cast<caf::actor>(router));
    for (const auto& r : ranks)
      all.push_back(caf::actor_cast<caf::actor>(r.trainer.actor));
    bool ok = stop_and_await(sys, std::move(all));
    for (const auto& r : ranks) {
      r.trainer.ucx_tickets->close();
      r.trainer.cuda_ipc->close();
      r.trainer.nccl->close();
    }
    if (nccl)
      nccl->leave(); // aborts every link: a peer's wait on this process ends now
    if (opts.drill_arms)
      opts.drill_arms->detach();
    producers.clear();
    return ok;
  };
  auto deadline = t.cluster.connect_deadline;
  auto register_all = [&](const coordinator_actor& coordinator) {
    for (const auto& r : ranks)
      if (auto failure = register_rank(sys, coordinator, t, r, deadline);
          !failure.empty())
        return "trainer rank " + std::to_string(r.rank) + " could not register with the coordinator: " + failure;
    if (router) {
      caf::scoped_actor self{sys}; // a named sender: the coordinator refuses anonymous ones
      self->send(coordinator, register_atom::value, router);
    }
    for (std::size_t i = 0; i < engines.size(); ++i) {
      if (auto failure = register_engine(sys, coordinator, engine_info_of(*specs[i], incarnation), engines[i], deadline);
          !failure.empty())
        return "engine " + specs[i]->name + " could not register with the coordinator: " + failure;
      // Registered, its workers get credentials: the cold sync then finds
      // their connections made and the trainer's memory mapped.
      if (puller)
        puller->connect_ahead(specs[i]->name);
    }
    return std::string{};
  };
  std::string failure;
  try {
    if (opts.external_rank)
      ranks.push_back({*opts.external_rank, incarnation,
                       make_local_trainer(sys, t, *opts.external_rank, rank_policy, rank_policy, opts.external_source,
                                          nccl)});
    else
      ranks = spawn_ranks(sys, t, node.name, rank_policy, incarnation, rank_policy, nccl);
    if (opts.on_ranks)
      opts.on_ranks(ranks);
    producers = start_rank_producers(t, node, ranks, opts.log);
    if (opts.drill_arms)
      opts.drill_arms->attach(ranks, producers);
    if (t.router.node == node.name && !opts.external_rank) {
      auto rc = router_config_from(t);
      rc.log = opts.log;
      if (opts.metrics)
        instrument_router(*opts.metrics, rc);
      router = spawn_router(sys, rc, fabric);
      if (t.router.http_port) {
        http = std::make_unique<router_endpoint>(sys, router_endpoint_options_from(t, opts.metrics), router);
        log("completions on " + http->url() + "/v1/completions");
      }
    }
    const auto pullers = rank_pullers(ranks, remote_rank_pullers(sys, t, node, opts.log, nccl));
    for (const auto& e : t.engines)
      if (e.node == node.name && !opts.external_rank) {
        replica_wiring w;
        w.puller = puller;
        w.producer_puller = pullers;
        w.source_dtype = source_dtype;
        w.authorize = local_or_driver(sys.node(), drivers);
        w.vouched_router = [drivers](const caf::strong_actor_ptr& sender, const caf::actor_addr& r) {
          return drivers->vouch(sender, r);
        };
        w.log = opts.log;
        w.metrics = opts.metrics;
        w.coordinator = [current_coordinator] { return current_coordinator->get(); };
        w.incarnation = incarnation;
        w.nccl = nccl;
        engines.push_back(caf::actor_cast<caf::actor>(spawn_replica(sys, t, e, w)));
        specs.push_back(&e);
      }
    for (std::size_t i = 0; i < engines.size() && failure.empty(); ++i)
      if (auto why = await_engine_ready(sys, engines[i]); !why.empty())
        failure = "engine " + specs[i]->name + " did not come up: " + why;
    if (failure.empty())
      failure = register_all(grant->coordinator);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!failure.empty()) {
    log(failure);
    end.all_terminated = stop_all();
    end.exit_code = 1;
    return end;
  }
  log(std::to_string(engines.size()) + " engines registered"
      + (ranks.empty() ? std::string{} : ", " + std::to_string(ranks.size()) + " trainer ranks")
      + (router ? ", the router" : ""));
  if (opts.on_registered) {
    std::vector<std::pair<std::string, caf::actor>> registered;
    for (std::size_t i = 0; i < engines.size(); ++i)
      registered.emplace_back(specs[i]->name, engines[i]);
    std::string refusal;
    try {
      refusal = opts.on_registered(registered);
    } catch (const std::exception& e) {
      refusal = e.what();
    }
    if (!refusal.empty()) {
      log(refusal);
      end.all_terminated = stop_all();
      end.exit_code = 1;
      return end;
    }
  }
  // Serve until told to stop or the job ended (the coordinator stopped). A
  // lost link (a partition, a flaky switch) is not the end: reconnect, prove
  // the secret again and register the same engines again (same incarnation:
  // a reconnect, not a restart); the coordinator brings them current at the
  // next round. Bounded by connect_deadline per attempt to rejoin.
  caf::scoped_actor self{sys};
  for (;;) {
    self->monitor(grant->coordinator);
    std::optional<caf::error> down;
    wait_until(opts.stop_requested, [&] {
      self->receive([&](caf::down_msg& dm) { down = dm.reason; }, caf::after(std::chrono::milliseconds(0)) >> [] {});
      return down.has_value();
    });
    if (!down)
      break; // told to stop
    if (*down != caf::exit_reason::remote_link_unreachable) {
      log("the coordinator is gone (" + sys.render(*down) + "); stopping");
      break;
    }
    log("lost the link to " + head.name + "; rejoining (up to " + std::to_string(t.cluster.connect_deadline.count())
        + " ms)");
    grant = join_cluster(sys, t, node, head, secret, opts.stop_requested, why);
    if (!grant) {
      if (stopping()) {
        log("stopped while rejoining " + head.name);
        break;
      }
      log("could not rejoin: " + why + "; stopping");
      end.exit_code = 1;
      break;
    }
    {
      std::lock_guard<std::mutex> lock(desk->mutex);
      desk->trainer = grant->trainer; // tickets (and a restarted head's producer address) come from it now
    }
    if (ucx)
      ucx->reset_connections(); // a restarted head's producer is another
    trust_grant(); // before registering: the new coordinator's first order may follow at once
    rank_drivers->assign({grant->coordinator.address()}); // a restarted head is another node
    if (auto failure = register_all(grant->coordinator); !failure.empty()) {
      log(failure + "; stopping");
      end.exit_code = 1;
      break;
    }
    log("rejoined " + head.name + ", " + std::to_string(engines.size()) + " engines registered again"
        + (ranks.empty() ? std::string{} : ", " + std::to_string(ranks.size()) + " trainer ranks"));
  }
  end.all_terminated = stop_all();
  return end;
}

} // namespace rlsync
