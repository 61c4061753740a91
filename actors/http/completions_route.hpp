#pragma once
// POST /v1/completions on an http::server, over an actor that generates
// (one rollout engine for `rlsync serve`; the router for the head's
// endpoint). Each HTTP request gets one actor: it sends one generate
// request per choice (prompt × n) with itself as the token sink, and
// answers with one JSON body or streams Server-Sent Events token by token.
//
//   handler (I/O thread): parse, validate ─► spawn request actor ─► returns
//   request actor: generate ×choices ─► tokens ─► SSE chunks / one body
//
// Requests sent while the engine is paused wait in its queue (it never
// rejects for a pause). An aborted request finishes with "abort". A client
// that disconnects ends its request actor (a stream finds out at its next
// write: tokens, or a keep-alive comment while it waits); the engine, which
// watches every sink, aborts the requests it was generating for it.
#include "actors/interfaces.hpp"
#include "runtime/http/server.hpp"
#include "runtime/vllm/completions.hpp"

#include <caf/actor_system.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace rlsync {

/// What the route can drive: anything that answers generate requests (the
/// rollout engine, the router).
using generator_actor =
  caf::typed_actor<caf::replies_to<generate_atom, generate_request, token_sink_actor>::with<generate_result>>;

/// Where completions go. `engine` is set when the target is one rollout
/// engine: a choice that meets a stop string is then aborted there at once
/// (otherwise it runs to its end unseen).
struct completion_target {
  generator_actor generator;
  std::optional<rollout_engine_actor> engine;
};

completion_target target_of(const rollout_engine_actor& engine);
completion_target target_of(const router_actor& router);

struct completions_route_config {
  /// The model name answered in responses; a request naming another model
  /// gets 404, as vLLM answers.
  std::string served_model = "rlsync";
  vllm::model_limits model;
  vllm::completion_limits limits;
  /// vLLM's exact answers: no weight_versions, token ids only with
  /// return_token_ids.
  bool strict = false;
  /// Labels of weight versions in weight_versions spans; called from actor
  /// threads, so it must be thread-safe. Empty: the version number.
  vllm::version_labeler label;
  /// Longest a request may wait for its answer, queueing while paused
  /// included; then its choices finish with "abort".
  std::chrono::milliseconds request_deadline{std::chrono::minutes(10)};
  /// How often a request checks whether its client is still there.
  std::chrono::milliseconds liveness_interval{200};
  /// A stream that wrote nothing for this long writes an SSE comment
  /// (ignored by clients): writing is how a closed connection shows.
  std::chrono::milliseconds stream_keepalive{std::chrono::seconds(2)};
  /// Generate request ids are taken from here up, apart from the ids other
  /// clients of the target use: an engine takes a request id it already
  /// runs for a newer attempt and ends the older one. The head's router
  /// endpoint starts at 2^56; a coordinated `rlsync serve` node, whose
  /// engine the router also reaches, at serve_node_first_request_id.
  std::uint64_t first_request_id = std::uint64_t{1} << 56;
  /// Told when a completion starts (its "cmpl-..." id and its engine
  /// request ids, choice by choice) and when it ends, however it ends: what
  /// /abort_requests needs to find it. Called from any thread; may be empty.
  using lifecycle_hook = std::function<void(const std::string& id, const std::vector<std::uint64_t>& request_ids)>;
  lifecycle_hook on_start;
  lifecycle_hook on_end;
};

/// Where a coordinated serve node's own completions route numbers its requests.
inline constexpr std::uint64_t serve_node_first_request_id = std::uint64_t{2} << 56;

class completions_route {
public:
  completions_route(caf::actor_system& sys, completions_route_config cfg, completion_target target);

  /// Mounts POST /v1/completions (it needs the bearer token when the
  /// server has one: generation costs the server's compute).
  void mount(http::server& srv);
  /// Sends new requests elsewhere from now on (requests in flight stay).
  void set_target(completion_target target);
  /// Answers one request; what the mounted handler calls.
  void handle(const http::request& rq, std::shared_ptr<http::responder> r);

private:
  caf::actor_system& sys_;
  completions_route_config cfg_;
  std::mutex mu_;
  completion_target target_;
  std::atomic<std::uint64_t> next_id_;
};

} // namespace rlsync
