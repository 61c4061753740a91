#pragma once
// The rollout workload driver behind `rlsync run`: it sends a fixed set of
// prompts through the router, keeps a bounded number of them in flight while
// the trainer publishes versions and the coordinator syncs the engines, and
// adds up what came back (per weight version, stale-KV tokens, refusals).
//
// The driver is also every request's token sink, so the run doubles as a
// check of the streaming contract: each request's tokens must arrive in
// index order, without gaps or duplicates, and equal the final result's
// tokens. A run that breaks it reports stream_mismatches > 0.
//
// It never hangs: each request carries a deadline, retries are bounded, and
// stop_workload() stops new sends while the outstanding ones finish.
#include "actors/interfaces.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace rlsync {

struct workload_spec;

struct workload_options {
  std::uint32_t prompts = 64;    ///< requests to send in all (ids 1..prompts)
  std::uint32_t concurrency = 8; ///< at most this many outstanding (0 counts as 1)
  std::uint32_t max_tokens = 32;
  float temperature = 0;
  float top_p = 1;
  std::uint64_t seed = 1; ///< request i (from 0) samples with seed + i
  std::chrono::milliseconds request_deadline{120000}; ///< per request, for the router's answer once running
  /// Longest the router may hold a request while no engine can serve it
  /// (sent as generate_request::deadline_ms; 0: the router's default). The
  /// driver waits this much longer than request_deadline for an answer.
  std::chrono::milliseconds queue_deadline{0};
  /// A request refused with queue_full or not_routable is sent again after
  /// 50 ms × attempt, at most this many times; then it counts as rejected.
  std::uint32_t max_retries = 3;
  /// Called for every token the driver receives as sink, inside the driver
  /// (drills time failovers and throughput by it); may be empty.
  std::function<void(const token_event&)> on_token;
};

/// The workload section of a topology as driver options (deadline and
/// retries keep their defaults).
workload_options to_workload_options(const workload_spec& spec);

/// Running totals, passed to the progress callback after each finished request.
struct workload_progress {
  std::uint32_t sent = 0; ///< distinct requests sent (retries not counted again)
  std::uint32_t completed = 0;
  std::uint32_t failed = 0;
  std::uint32_t rejected = 0;
  std::uint64_t tokens = 0;
};

struct workload_result {
  std::uint32_t completed = 0; ///< finished with length or eos
  std::uint32_t failed = 0;    ///< finished failed/aborted, or an error other than a refusal
  std::uint32_t rejected = 0;  ///< refused (queue_full/not_routable/malformed) after retries
  std::uint32_t not_sent = 0;  ///< never sent because of stop
  std::uint64_t tokens = 0;    ///< generated tokens in the results
  std::uint64_t streamed_tokens = 0; ///< token events the driver received as sink
  std::map<std::uint64_t, std::uint64_t> tokens_by_version; ///< from the results' spans
  std::uint64_t stale_kv_tokens = 0;
  /// Results whose tokens differ from what was streamed for them (or whose
  /// stream had a gap, duplicate or reordering). Must be 0.
  std::uint32_t stream_mismatches = 0;
  std::vector<std::string> errors; ///< the first few error texts (at most 10)
  double seconds = 0;              ///< wall-clock time from spawn to the result
};

/// Prompt i of the built-in prompt set: deterministic text, different for
/// every i. Request i (from 0) sends engine::encode(workload_prompt(i)).
std::string workload_prompt(std::uint32_t i);

/// Spawns the driver. It starts sending at once, calls `on_progress` (may be
/// empty; runs inside the driver) after each finished request, and when every
/// request is answered — or, after stop, every outstanding one — sets `done`
/// and quits. Killed early, it still sets `done` with what it had, counting
/// outstanding requests as failed.
caf::actor spawn_workload(caf::actor_system& sys, router_actor router, workload_options opts,
                          std::function<void(const workload_progress&)> on_progress,
                          std::shared_ptr<std::promise<workload_result>> done);

/// Tells a running driver about a new router after its router died: the
/// requests the dead one held are sent to it, each continuing after the
/// tokens already streamed for it (one stream, no gap, no duplicate); new
/// requests go to it too. Without one within request_deadline they fail.
void set_workload_router(const caf::actor& driver, router_actor router);

/// Asks a running driver to stop sending new requests; outstanding ones are
/// still awaited (each bounded by its deadline), unsent ones count as not_sent.
void stop_workload(const caf::actor& driver);

} // namespace rlsync
