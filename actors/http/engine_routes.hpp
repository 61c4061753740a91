#pragma once
// vLLM's RL control routes on an HTTP server, in front of one rollout-engine
// actor (`rlsync serve`). Every route but /v1/completions and /metrics,
// which other parts mount on the same server.
//
//   HTTP I/O thread ──► per-request actor ──request(deadline)──► serve control actor ──► engine actor
//          ▲                     │                                (one at a time: await)
//          └──── responder ◄─────┘ (answer, or 500 when the control actor misses the deadline)
//
// The control actor owns what vLLM keeps beside the engine: the weight
// update session of the disk backend, the string version labels, the sleep
// state, the weight checker's baseline. It handles one request at a time
// (each engine call is awaited), so that two clients never interleave the
// steps of a session. Ordering mistakes answer 409 (500 with strict_vllm, as
// real vLLM does), failures 500, bad bodies 400, always in vLLM's envelope
// (the flat {"error": "..."} on /pause, /resume, /is_paused, /abort_requests).
#include "actors/rollout_engine.hpp"
#include "runtime/http/server.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace rlsync::serve {

/// The weight version labels: vLLM's versions are strings ("default" until
/// a finish or update_weight_version sets one), the engine's are numbers.
/// Thread-safe; shared with the completion route (weight_versions spans).
class version_labels {
public:
  /// The label of engine version `v`: the one set for it, else the label of
  /// the newest version below it that has one, else "default".
  std::string label_of(std::uint64_t v) const;
  void set(std::uint64_t v, std::string label);
  /// Engine versions that carry `label` (labels need not be unique).
  std::vector<std::uint64_t> versions_of(const std::string& label) const;
  /// A coordinator's versions are their own labels: with this set, a version
  /// without a label reads as its number ("7"); version 0 stays "default".
  void label_by_number(bool on);

  /// Labels kept: the newest versions'.
  static constexpr std::size_t max_labels = 4096;

private:
  mutable std::mutex mu_;
  std::map<std::uint64_t, std::string> labels_;
  bool by_number_ = false;
};

/// The requests the completion route runs now, by their vLLM request id
/// ("cmpl-..."), with their engine request ids: /abort_requests aborts
/// them by name, or all of them. Thread-safe.
class request_registry {
public:
  void add(const std::string& id, std::uint64_t engine_id);
  void remove(const std::string& id);
  std::optional<std::uint64_t> find(const std::string& id) const;
  std::vector<std::uint64_t> all() const;

private:
  mutable std::mutex mu_;
  std::map<std::string, std::uint64_t> ids_;
};

struct serve_settings {
  std::string model_name;          ///< /v1/models' id (the checkpoint path, as vLLM names a model)
  /// The checkpoint the server started on (a level-2 wake reloads the
  /// published weights from it until an update replaces them); empty: none.
  std::string checkpoint_dir;
  std::int64_t max_model_len = 0;  ///< max_position_embeddings
  int tp = 1;
  int dp = 1; ///< data-parallel ranks: /get_world_size counts them unless include_dp=false, as vLLM does
  bool strict_vllm = false;        ///< answer exactly as vLLM: 500 for ordering mistakes, no extras
  /// A topology's coordinator owns the engine's weights and rounds (`rlsync
  /// serve --topology`): the weight-transfer, pause/resume, sleep and cache
  /// routes answer 409 saying so; the rest serve as usual.
  bool coordinated = false;
  std::chrono::milliseconds engine_deadline{60000};  ///< one engine call
  std::chrono::milliseconds load_deadline{600000};   ///< loading a checkpoint from disk
  std::chrono::milliseconds pause_deadline{600000};  ///< a pause (mode=wait waits for the running requests)
  std::chrono::milliseconds request_deadline{900000}; ///< a whole HTTP request (above the others)
  /// A weight-update session that no call touches for this long (a client
  /// that died between start and finish) is dropped, and a pause its start
  /// made resumed: nothing stays frozen for good.
  std::chrono::milliseconds session_idle_deadline{900000};
};

/// Whether the engine is gone (and why): what /health answers from, apart
/// from the control actor, so that a probe never waits behind a long
/// control call (a checkpoint load). Thread-safe.
class engine_liveness {
public:
  void mark_gone(std::string why);
  /// Why the engine is gone; nullopt while it runs.
  std::optional<std::string> gone() const;

private:
  mutable std::mutex mu_;
  std::optional<std::string> why_;
};

/// What the routes share.
struct serve_context {
  rollout_engine_impl engine;
  serve_settings settings;
  std::shared_ptr<version_labels> labels = std::make_shared<version_labels>();
  std::shared_ptr<request_registry> requests = std::make_shared<request_registry>();
  std::shared_ptr<engine_liveness> liveness = std::make_shared<engine_liveness>();
};

/// Spawns the control actor (it monitors the engine and marks
/// ctx.liveness when it is gone).
caf::actor spawn_serve_control(caf::actor_system& sys, serve_context ctx);

/// Mounts every control route on `srv` (call before srv.start()). GET
/// routes need no token; POST routes need it when one is configured.
/// /health answers from ctx.liveness at once, as vLLM's does: 200 while the
/// engine runs (busy or not), 503 once it is gone.
void mount_engine_routes(http::server& srv, caf::actor_system& sys, caf::actor control, const serve_context& ctx);

/// Why `path` is refused when a coordinator owns the engine (settings.coordinated),
/// or "" when the route serves anyway.
std::string coordinated_refusal(const std::string& path);

/// The routes mount_engine_routes mounts, as (method, path).
const std::vector<std::pair<std::string, std::string>>& engine_route_table();

/// Checks a disk backend update_info value: exactly {"path": dir} with dir
/// non-empty and absolute. Returns the path; throws http::bad_request naming
/// `param` (body.update_info...) otherwise. Existence is checked apart.
std::string disk_update_path(const nlohmann::json& update_info, const std::string& param);
/// "" when `dir` is a directory holding at least one *.safetensors at its
/// top level, else why not.
std::string disk_checkpoint_problem(const std::string& dir);

} // namespace rlsync::serve
