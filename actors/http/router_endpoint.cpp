#include "actors/http/router_endpoint.hpp"

#include "runtime/metrics/http_endpoint.hpp"

#include <caf/all.hpp>

#include <stdexcept>

namespace rlsync {

namespace {

/// How long /health waits for the router's heartbeat: a router that cannot
/// answer within it cannot route either.
constexpr std::chrono::seconds health_deadline{2};

} // namespace

router_endpoint_options router_endpoint_options_from(const topology& t,
                                                     std::shared_ptr<const metrics::registry> metrics) {
  router_endpoint_options o;
  const node_spec* home = t.find_node(t.router.node);
  if (!home || !t.router.http_port)
    throw std::runtime_error("the topology sets no router.http_port");
  o.http.host = home->address;
  o.http.port = *t.router.http_port;
  if (!t.cluster.http_api_key_file.empty())
    o.http.bearer_token = metrics::read_api_key_file(t.cluster.http_api_key_file);
  o.served_model = t.model.synthetic() ? t.name : t.model.checkpoint;
  o.model = {t.model.config.vocab_size, t.model.config.max_position_embeddings};
  o.metrics = std::move(metrics);
  return o;
}

router_endpoint::router_endpoint(caf::actor_system& sys, router_endpoint_options options, router_actor router)
    : options_(std::move(options)), sys_(sys), router_(router) {
  server_ = std::make_unique<http::server>(options_.http);
  completions_route_config rc;
  rc.served_model = options_.served_model;
  rc.model = options_.model;
  rc.request_deadline = options_.request_deadline;
  completions_ = std::make_unique<completions_route>(sys_, std::move(rc), target_of(router));
  completions_->mount(*server_);
  server_->route(
    "GET", "/health",
    [this](const http::request&, std::shared_ptr<http::responder> out) {
      router_actor r;
      {
        std::lock_guard<std::mutex> lock(mu_);
        r = router_;
      }
      // Asked from an actor: the I/O thread must not wait.
      sys_.spawn([r, out](caf::event_based_actor* self) {
        self->request(r, health_deadline, heartbeat_atom_v, heartbeat{"router-endpoint", 0})
          .then([out](const heartbeat&) { out->reply({200, "application/json", "", {}}); },
                [out](const caf::error&) {
                  out->reply({503, "application/json", R"({"error": "the router does not answer"})", {}});
                });
      });
    },
    false);
  server_->route(
    "GET", "/v1/models",
    [name = options_.served_model, len = options_.model.max_model_len](const http::request&,
                                                                       std::shared_ptr<http::responder> out) {
      out->reply({200, "application/json", vllm::models_list(name, len).dump(), {}});
    },
    false);
  metrics::mount_metrics(*server_, options_.metrics ? options_.metrics : std::make_shared<metrics::registry>());
  try {
    port_ = server_->start();
  } catch (const std::exception& e) {
    throw std::runtime_error("router.http_port " + options_.http.host + ":" + std::to_string(options_.http.port)
                             + ": " + e.what());
  }
}

router_endpoint::~router_endpoint() { stop(); }

void router_endpoint::set_router(const router_actor& router) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    router_ = router;
  }
  completions_->set_target(target_of(router));
}

std::string router_endpoint::url() const {
  const auto& host = options_.http.host;
  return "http://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port_);
}

void router_endpoint::stop() {
  if (server_)
    server_->stop();
}

} // namespace rlsync
