#pragma once
// What a cluster's head node runs, in this process: the head's actors as
// assemble_head builds them (the coordinator, and whatever else the topology
// places on this node: the router, trainer ranks with their local data
// planes, engines, registered), plus the gatekeeper published on the node's
// address and, for transfer.backend ucx, each local rank's UCX producer. Used by `rlsync node` on
// the coordinator's node and by `rlsync bench sync/control`.
#include "actors/assembly/local_deployment.hpp"
#include "actors/interfaces.hpp"
#include "actors/trainer.hpp"
#include "gpu/ipc_memory.hpp"
#include "gpu/nccl_membership.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/transfer/ucx/ucx_transfer.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace rlsync {

/// UCX_NET_DEVICES for a node's UCX producer or puller: the interface that
/// holds the node's address ("127.0.0.1" -> "lo"), so that UCX's tcp
/// transport listens there only. Empty (UCX picks; said on `log`) when the
/// topology names rdma or the address belongs to no interface here.
std::string ucx_net_devices_for(const node_spec& node, const std::vector<ucx_transport>& transports,
                                const std::function<void(const std::string&)>& log);

/// Why `t` cannot run as one process per node, prefixed with the place in
/// its file (file:line:col): the coordinator's node needs a fixed port when
/// other nodes must reach it. Empty when it can.
/// Trainer ranks, the router and engines may run on any node.
std::string cluster_layout_problem(const topology& t);

/// UCX credentials asked of the trainer (rank) `trainer()` returns, with
/// the deadline left (ucx_ticket_atom). Call only on a pulling thread: it
/// blocks.
transfer::ucx_credentials_source ucx_tickets_from(caf::actor_system& sys, std::function<trainer_actor()> trainer);

/// A UCX puller on `node` whose connections get their credentials from
/// ucx_tickets_from(trainer). Throws ucx_error when UCX cannot start.
std::shared_ptr<transfer::ucx_puller> make_ucx_puller(caf::actor_system& sys, const topology& t, const node_spec& node,
                                                      std::function<trainer_actor()> trainer,
                                                      const std::function<void(const std::string&)>& log);

/// How engines on `node` pull from a trainer rank hosted in another
/// process: for transfer.backend ucx, a UCX puller whose credentials come
/// from the rank's handle; for cuda_ipc, an ipc_puller on the rank's
/// exported buffer; for nccl, an nccl_puller over the links of `nccl`
/// (the process's membership, nccl_plane.hpp); otherwise whole groups over
/// CAF from it.
producer_puller_factory remote_rank_pullers(caf::actor_system& sys, const topology& t, const node_spec& node,
                                            std::function<void(const std::string&)> log,
                                            std::shared_ptr<gpu::nccl_membership> nccl = nullptr);

/// For transfer.backend cuda_ipc: opens a cuda_ipc producer on each of
/// `ranks` (their trainer actors then serve pulls through it) in `memory`
/// (none: the CUDA device's). Throws std::runtime_error naming the missing
/// device or CUDA. Close the ranks' cuda_ipc desks when the node stops.
void open_ipc_producers(const topology& t, const std::vector<hosted_rank>& ranks,
                        std::shared_ptr<gpu::ipc_memory> memory = nullptr);

/// The options of a trainer rank's UCX producer on `node`: the topology's
/// transfer section, and as many gets per connection as an engine worker
/// keeps in flight (transfer.groups_in_flight).
transfer::ucx_producer_options rank_producer_options(const topology& t, const node_spec& node,
                                                    std::function<void(const std::string&)> log);

/// For transfer.backend ucx: a UCX producer on each of `ranks` (its own
/// source), whose trainer actor then hands out its tickets; none for other
/// backends (for cuda_ipc it calls open_ipc_producers). Close the ranks'
/// ticket offices before the producers go. Throws std::runtime_error naming
/// the rank when UCX cannot start.
std::vector<std::unique_ptr<transfer::ucx_producer>> start_rank_producers(
  const topology& t, const node_spec& node, const std::vector<hosted_rank>& ranks,
  const std::function<void(const std::string&)>& log);

struct head_hooks {
  std::function<void(const std::string&)> log;     ///< coordinator and producer events
  std::function<void(const std::string&)> line;    ///< gatekeeper events
  std::function<void(const sync_report&)> on_report; ///< every round
  /// As each phase of a round is sent (coordinator_config::on_phase); may be empty.
  decltype(coordinator_config::on_phase) on_phase = {};
  /// Where the head's coordinator, router and engines record their metrics; nullptr: nowhere.
  std::shared_ptr<metrics::registry> metrics = {};
  /// transfer.backend nccl: how the head's members start their links;
  /// empty: nccl_link on each member's device (tests give a fake world's).
  gpu::nccl_membership::link_factory nccl_links = {};
  /// The devices the start-up check reads; empty: gpu::query_devices().
  std::optional<gpu::device_info> devices = {};
};

class head_node {
public:
  /// Starts everything and registers the local engines. `member_secrets`:
  /// each member node's name and the secret it must prove (see
  /// member_secrets() in gatekeeper.hpp). The gatekeeper is published over
  /// TLS when `sys` has it (publish_node). Throws std::runtime_error naming
  /// what failed (the port, UCX, a registration); whatever had started is
  /// stopped first.
  head_node(caf::actor_system& sys, const topology& t, const node_spec& node,
            std::map<std::string, std::string> member_secrets, head_hooks hooks);
  /// Stops every actor (see stop()).
  ~head_node();
  head_node(const head_node&) = delete;
  head_node& operator=(const head_node&) = delete;

  coordinator_actor coordinator() const { return actors_.coordinator; }
  /// The first trainer rank on this node; empty when it hosts none.
  trainer_actor trainer() const { return actors_.trainer.actor; }
  /// Every trainer rank on this node.
  const std::vector<hosted_rank>& ranks() const { return actors_.ranks; }
  /// The router: this node's, or the last one that registered with the
  /// coordinator from another node; empty while none has.
  router_actor router() const;
  /// The fleet's HTTP endpoint ("http://host:port") when router.http_port
  /// puts it on this node; empty otherwise.
  std::string router_url() const { return actors_.http ? actors_.http->url() : std::string{}; }
  /// Polls router() until there is one, `deadline` has passed or
  /// `stop_requested()` says so; the router last seen (empty: none).
  router_actor await_router(std::chrono::milliseconds deadline, const std::function<bool()>& stop_requested) const;
  std::shared_ptr<transfer::weight_source> source() const { return actors_.trainer.source; }
  std::shared_ptr<transfer::local_transfer> local_transfer() const { return actors_.trainer.transfer; }
  /// The first rank's UCX producer; nullptr unless transfer.backend is ucx
  /// and a rank runs here.
  const transfer::ucx_producer* producer() const { return producers_.empty() ? nullptr : producers_.front().get(); }
  /// Each hosted rank's UCX producer, in ranks() order; empty unless
  /// transfer.backend is ucx.
  const std::vector<std::unique_ptr<transfer::ucx_producer>>& rank_producers() const { return producers_; }
  /// Kills hosted rank `hosted` (when alive) and starts it again on the same
  /// source and producer as the next incarnation (local_deployment::
  /// restart_trainer): the coordinator's refusal, or empty. Blocking.
  std::string restart_rank(const topology& t, std::size_t hosted) { return actors_.restart_trainer(sys_, t, hosted); }
  std::uint16_t port() const { return port_; }
  /// The engines of this node, spawned and registered.
  const std::vector<rollout_engine_actor>& local_engines() const { return actors_.engines; }

  /// Registered engines, as the coordinator says (0 when it does not answer in time).
  std::size_t members() const;
  /// Polls members() until `n` engines have registered, `deadline` has
  /// passed or `stop_requested()` says so; the count last seen.
  std::size_t await_members(std::size_t n, std::chrono::milliseconds deadline,
                            const std::function<bool()>& stop_requested) const;
  /// Engines that completed a round and serve (routable).
  std::size_t routable() const;

  /// Closes the port, stops every actor and waits up to `deadline` until
  /// each has terminated; true if all did. Idempotent.
  bool stop(std::chrono::milliseconds deadline = std::chrono::seconds(10));

private:
  caf::actor_system& sys_;
  /// The router that registered last (the coordinator's thread writes it).
  struct registered_router {
    mutable std::mutex mutex;
    router_actor router;
  };
  std::shared_ptr<registered_router> registered_ = std::make_shared<registered_router>();
  local_deployment actors_;
  std::vector<std::unique_ptr<transfer::ucx_producer>> producers_; ///< one per rank here (ucx)
  caf::actor gate_;
  std::uint16_t port_ = 0;
  bool stopped_ = false;
};

} // namespace rlsync
