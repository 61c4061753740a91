#pragma once
// The vLLM adapter's calls to its server, made off the actor (vllm_engine.cpp
// runs them on detached workers): one control call, the streaming
// completions worker and the health poller. Each worker reports to the
// engine by message and holds only a weak reference to it.
#include "actors/vllm_engine.hpp"
#include "runtime/http/client.hpp"

#include <caf/blocking_actor.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace rlsync::vllm_calls {

using ms = std::chrono::milliseconds;

/// How to reach the server: address and bearer token.
struct server_conn {
  std::string host;
  std::uint16_t port = 0;
  std::string token;

  /// One call under `deadline`. Throws http::client_error (no time left, the
  /// server unreachable or too slow, an answer over max_answer_bytes).
  http::client_response call(ms deadline, const std::string& method, const std::string& target,
                             const std::string& body = {}) const;
};

/// Control answers (health, pause, weight info, the weight checker's list of
/// mismatched shards) are small; a server that sends more is not believed.
inline constexpr std::uint64_t max_answer_bytes = std::uint64_t{16} << 20;
inline constexpr std::size_t max_answer_values = 1 << 18;

/// A control answer's JSON, read within those bounds (8 levels deep at
/// most); discarded when it is not JSON or exceeds them.
nlohmann::json parse_answer(const std::string& body);

inline bool ok_status(unsigned s) { return s >= 200 && s < 300; }

/// "POST /x: HTTP 500: <the envelope's message>", cut short (a server can send megabytes).
std::string http_failure(const std::string& call, const http::client_response& r);

/// A stream worker: POST /v1/completions with `body`, relaying each chunk
/// to `engine` as a vllm_stream_update, then a last one (ended, with the
/// error unless cancelled). `idle` bounds each wait for the server.
void run_stream(caf::blocking_actor* w, caf::actor_addr engine, server_conn conn, std::uint64_t stream,
                std::string body, std::shared_ptr<std::atomic<bool>> cancel,
                std::shared_ptr<std::atomic<bool>> stopped, ms idle);

/// The health poller: GET /health and GET /weight_info every `interval`,
/// each under `timeout`, until `stopped` or the engine is gone.
void run_health(caf::blocking_actor* w, caf::actor_addr engine, server_conn conn, ms interval, ms timeout,
                std::shared_ptr<std::atomic<bool>> stopped);

} // namespace rlsync::vllm_calls
