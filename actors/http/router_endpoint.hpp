#pragma once
// The fleet's one HTTP endpoint (topology `router.http_port`), on the
// router's node: a rollout client talks to it as to one vLLM server and the
// router spreads its requests over every live, current engine.
//
//   POST /v1/completions  through the router (queued while engines are paused,
//                         rerouted on failure, weight_versions per choice)
//   GET  /health          200 when the router answers a heartbeat within 2 s, else 503
//   GET  /v1/models       the served model
//   GET  /metrics         the node's registry (router, coordinator, engines)
//
// It binds the router node's address only and takes cluster.http_api_key_file's
// bearer token for /v1/completions and /metrics. A router restarted in this
// process (set_router) takes the requests from then on.
#include "actors/http/completions_route.hpp"
#include "actors/interfaces.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/http/server.hpp"
#include "runtime/metrics/registry.hpp"

#include <caf/actor_system.hpp>

#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace rlsync {

struct router_endpoint_options {
  http::server_options http;            ///< host, port, bounds, bearer token
  std::string served_model = "rlsync"; ///< /v1/models' id; requests naming another get 404
  vllm::model_limits model;
  /// Longest one completion may wait for its answer, queueing included.
  std::chrono::milliseconds request_deadline{std::chrono::minutes(10)};
  std::shared_ptr<const metrics::registry> metrics; ///< GET /metrics; nullptr: an empty exposition
};

/// The endpoint's options from the topology: the router node's address,
/// router.http_port, cluster.http_api_key_file's token (read here: throws
/// std::runtime_error naming the file), the model's name and limits.
router_endpoint_options router_endpoint_options_from(const topology& t,
                                                     std::shared_ptr<const metrics::registry> metrics);

class router_endpoint {
public:
  /// Mounts the routes and listens. Throws std::runtime_error naming the
  /// address when it cannot bind.
  router_endpoint(caf::actor_system& sys, router_endpoint_options options, router_actor router);
  ~router_endpoint(); ///< stops
  router_endpoint(const router_endpoint&) = delete;
  router_endpoint& operator=(const router_endpoint&) = delete;

  /// New requests go to `router` from now on (a restarted router); thread-safe.
  void set_router(const router_actor& router);
  std::uint16_t port() const { return port_; }
  /// "http://host:port"
  std::string url() const;
  void stop();

private:
  router_endpoint_options options_;
  std::unique_ptr<http::server> server_;
  std::unique_ptr<completions_route> completions_;
  caf::actor_system& sys_;
  std::mutex mu_;
  router_actor router_; ///< the one /health asks
  std::uint16_t port_ = 0;
};

} // namespace rlsync
