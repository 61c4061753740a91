#pragma once
// `rlsync serve`: one built-in engine on a checkpoint, behind vLLM's RL HTTP
// API, so that an RL framework drives it exactly as it drives `vllm serve`.
//
//   serve_node node{sys, options};          // engine up, weights loaded, control routes mounted
//   node.http_server().route(...);          // more routes (/v1/completions, /metrics) before start
//   auto port = node.start();               // listening
//   ...
//   node.stop();
//
// The engine is version 1 once the checkpoint is loaded (label "default");
// every finished weight update is the next number, labelled as vLLM's
// clients say (context().labels). As a node of a topology, it fronts the
// engine its member node registered instead (second constructor).
#include "actors/http/completions_route.hpp"
#include "actors/http/engine_routes.hpp"
#include "actors/rollout_engine.hpp"
#include "runtime/http/server.hpp"
#include "runtime/metrics/registry.hpp"

#include <caf/actor_system.hpp>

#include <memory>
#include <string>

namespace rlsync {

struct serve_node_options {
  std::string checkpoint_dir;
  int tp = 1;
  bool expert_parallel = false; ///< experts placed whole over the tp workers
  int dp = 1;                   ///< data-parallel scheduler ranks, one pause for all
  engine::weight_format weights = engine::weight_format::received; ///< what the engine serves from
  bool on_cuda = false; ///< weights and matrix products on CUDA device 0 (gpu/engine_device.hpp)
  http::server_options http; ///< host, port, bounds, bearer token
  bool strict_vllm = false;  ///< answer exactly as vLLM does (500 for ordering mistakes, no extras)
  /// The control routes' deadlines for a pause (a wait-pause waits for the
  /// running requests) and for a weight-update session no call touches
  /// (serve::serve_settings).
  std::chrono::milliseconds pause_deadline = serve::serve_settings{}.pause_deadline;
  std::chrono::milliseconds session_idle_deadline = serve::serve_settings{}.session_idle_deadline;
  /// One call to a control route, its wait behind earlier calls included
  /// (a completion's deadline is its own).
  std::chrono::milliseconds control_deadline = serve::serve_settings{}.request_deadline;
  /// Faults armed on the engine (drills, tests); nullptr: none.
  std::shared_ptr<engine_fault_gate> faults;
  /// What GET /metrics serves: as a topology's node, the registry its member
  /// node's engine records into; nullptr: the server's own.
  std::shared_ptr<metrics::registry> metrics;
};

class serve_node {
public:
  /// Opens and checks the checkpoint, spawns the engine, loads the weights
  /// and mounts the control routes. Throws std::runtime_error naming the
  /// checkpoint when it cannot be served.
  serve_node(caf::actor_system& sys, serve_node_options options);
  /// Fronts `engine`, which a topology's coordinator drives (`rlsync serve
  /// --topology T --node N`): no checkpoint is loaded, the version labels
  /// are the coordinator's version numbers, and the routes that would fight
  /// the coordinator answer 409 (serve::coordinated_refusal). The engine is
  /// not this object's: stop() leaves it running.
  serve_node(caf::actor_system& sys, serve_node_options options, rollout_engine_impl engine,
             const model_config& model, std::string model_name);
  ~serve_node(); ///< stops
  serve_node(const serve_node&) = delete;
  serve_node& operator=(const serve_node&) = delete;

  /// Mount further routes here before start().
  http::server& http_server() { return *server_; }
  /// The engine, the labels, the running requests, the settings.
  serve::serve_context& context() { return ctx_; }
  rollout_engine_impl engine() const { return ctx_.engine; }
  /// Binds and serves; the bound port.
  std::uint16_t start();
  /// Stops the HTTP server, then the actors.
  void stop();

private:
  /// Mounts the control routes and /v1/completions in front of ctx_.engine.
  void mount(const model_config& model);

  caf::actor_system& sys_;
  serve_node_options options_;
  std::shared_ptr<metrics::registry> metrics_ = std::make_shared<metrics::registry>(); ///< GET /metrics
  serve::serve_context ctx_;
  caf::actor control_;
  std::unique_ptr<http::server> server_;
  std::unique_ptr<completions_route> completions_; ///< POST /v1/completions
  bool stopped_ = false;
  bool owns_engine_ = true;
};

} // namespace rlsync
