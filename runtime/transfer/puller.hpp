#pragma once
// The consumer side of a data-plane backend: what an engine worker calls
// to receive one version. Five backends implement it: `local`
// (local/local_transfer.hpp: engines in the trainer's process), `ucx`
// (ucx/ucx_transfer.hpp: engines in other processes or on other nodes),
// the CAF fallback (actors/caf_puller.hpp: whole groups as CAF messages,
// for remote engines when the head runs no UCX producer), cuda_ipc
// (actors/ipc_puller.hpp: whole groups through the trainer's exported
// device buffer) and nccl (actors/nccl_puller.hpp: groups whole or sharded,
// point to point or broadcast, over an NCCL communicator).
//
//   engine start:  register_worker(engine, plan)    for each of its workers,
//                                                    plans from engine::make_plan
//   registered:    connect_ahead(engine)            once the coordinator took it
//   transfer:      pull({engine, worker, v, mode, deadline}, sink)
//                                                    on one thread per worker
//                  -> sink.on_group / on_full_group once per group, in order,
//                     after the group's checksum verified; or, when the sink
//                     names targets, each group copied straight into them
//                     and checksummed as it lands (store_in_place.hpp), then
//                     sink.on_stored; for an engine on a device, a backend
//                     that holds the group on one (lands_on_device) also
//                     hands its runs to sink.on_device: a sharded group's
//                     before its checksum, a whole group's after
//   engine gone:   unregister_engine(engine)
//
// pull() blocks the calling thread until the version is in or the deadline
// passes: call it from a worker thread or a detached actor, never from an
// event-based actor's handler.
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/control/protocol.hpp"
#include "runtime/plan/plan.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace rlsync::transfer {

using clock = std::chrono::steady_clock;

/// Why a pull failed. Every failure voids the worker's update (the engine
/// stays dirty); none is ever silent.
enum class transfer_failure : std::uint8_t {
  checksum_mismatch,   ///< received bytes differ from what the producer packed
  timeout,             ///< a group did not arrive before the deadline
  version_unavailable, ///< the producer no longer (or not yet) holds the version
  not_registered,      ///< the worker never registered its plan
  producer_failed,     ///< the producer could not pack (its message says why)
  cancelled,           ///< the producer shut down
  abandoned,           ///< the engine let the pull go (its round ended without it); never retried
};

std::string to_string(transfer_failure x);

struct transfer_error : std::runtime_error {
  transfer_error(transfer_failure f, const std::string& what) : std::runtime_error(what), failure(f) {}
  transfer_failure failure;
};

/// Where a group's packed bytes land in place: `bytes` writable bytes at `at`.
struct store_target {
  std::uint8_t* at = nullptr;
  std::size_t bytes = 0;
};

/// Where received groups go. Called on the pulling thread, in group order,
/// only for verified bytes; the pointers are valid during the call only.
/// pull_engine calls it from one thread per worker at once: a sink must be
/// safe for concurrent calls with different workers. (The M:N pull,
/// holder_pull.hpp, calls it once per complete group in the order groups
/// complete, never twice at once for one worker.)
struct group_sink {
  /// Sharded: the packed bytes of group `group` for worker `worker`: its
  /// plan entries of that group in plan order (apply_group applies them).
  std::function<void(int worker, std::uint32_t group, const std::uint8_t* bytes, std::size_t size)> on_group;
  /// Broadcast: the group's full tensors; the engine slices them itself.
  std::function<void(int worker, std::uint32_t group, const std::vector<tensor_view>& tensors)> on_full_group;
  /// Optional: where worker `worker` keeps group `group`'s packed bytes
  /// unchanged, one target per plan entry in plan order (in its staging
  /// weights); empty when it converts any of them. With targets, a puller
  /// copies the group there itself in one pass, checksumming the bytes as
  /// they land, and calls on_stored once they verified instead of
  /// on_group; in broadcast it checksums the whole group and copies the
  /// pieces the worker's plan keeps into the same targets (store_kept),
  /// instead of on_full_group. A checksum failure then leaves the group partly written: the
  /// pull fails and the update is void, as for any failure.
  std::function<std::vector<store_target>(int worker, std::uint32_t group)> targets;
  std::function<void(int worker, std::uint32_t group)> on_stored;
  /// Optional, with targets: an engine serving from a device. A puller
  /// that holds a group's packed bytes on a CUDA device (the nccl link's
  /// staging, a group packed from a cuda_ipc mapping) hands each target's
  /// run here as well, where it lies on `device`: a sharded group's before
  /// it stores the host copy, a whole group's after it verified (a failed
  /// checksum voids the update, device copy included). Never required, so
  /// it must not throw: a run it cannot take is left to the host copy.
  std::function<void(const store_target& target, const void* device_bytes, int device)> on_device;
  /// Optional, with on_device, for a sink that takes packed bytes through
  /// on_group (no targets): where each run of the group would be stored,
  /// one per plan entry in plan order, for landing only (the M:N pull's
  /// per-rank sinks: a part's entries of the engine's targets).
  std::function<std::vector<store_target>(int worker, std::uint32_t group)> land_targets;
  /// Optional, with on_device: whether runs on `device` can land now; a
  /// puller asks before it does any work for them (packing a whole group).
  std::function<bool(int device)> lands_from;
  /// Optional: true once nobody wants the pull any more (its round went on
  /// without it). A puller that can leave cleanly between groups asks
  /// before each (stop_if_abandoned); one that cannot runs to its end: ucx
  /// (groups asked ahead may be lent, and are given back only once
  /// stored) and nccl (a posted receive, a collective).
  std::function<bool()> abandoned;
};

/// Throws transfer_error(abandoned) when the sink's pull was let go, naming
/// how far it got; between groups, where a puller holds nothing.
void stop_if_abandoned(const group_sink& sink, const std::string& who, std::size_t received, std::size_t groups);

struct pull_request {
  std::string engine; ///< replica name
  int worker = 0;     ///< tensor-parallel rank within the engine
  std::uint64_t version = 0;
  transfer_mode mode = transfer_mode::sharded;
  clock::time_point deadline;
};

/// What one worker received.
struct pull_report {
  std::string engine;
  int worker = 0;
  std::uint64_t version = 0;
  std::uint64_t bytes = 0;
  std::uint32_t groups = 0;
  std::chrono::nanoseconds duration{0};
  /// Of `duration`, where a puller that measures it (UCX's, the local
  /// plane's) spent it:
  /// blocked on the producer (the manifest, each group's answer, a
  /// receive: the producer packing inside the stall shows here), and
  /// storing (copying into staging, verifying the checksum, handing the
  /// group to the sink). The rest: connecting, registering the plan,
  /// mapping shared buffers, posting gets. Zero: not measured.
  std::chrono::nanoseconds waited{0};
  std::chrono::nanoseconds stored{0};
  /// Of `duration`, how long the pulling thread ran on a core and how long
  /// it waited runnable for one (thread_schedule). Zero: not measured.
  std::chrono::nanoseconds ran{0};
  std::chrono::nanoseconds queued{0};
};

class weight_puller {
public:
  virtual ~weight_puller() = default;

  /// Announces worker plan->worker of `engine` and its sharding plan.
  /// Replaces an earlier registration of the same worker.
  virtual void register_worker(const std::string& engine, std::shared_ptr<const plan::worker_plan> plan) = 0;
  /// Forgets every worker of `engine`.
  virtual void unregister_engine(const std::string& engine) = 0;
  /// The coordinator accepted `engine`, so its trainer now gives its
  /// workers credentials: a backend may connect them (and map what the
  /// producer lends) now, in the background, rather than inside their
  /// first pull. Returns at once; nothing by default.
  virtual void connect_ahead(const std::string& /*engine*/) {}
  /// Receives every group of `req.version` the producer holds, or throws
  /// transfer_error. Whatever the sink throws ends the pull and propagates.
  virtual pull_report pull(const pull_request& req, const group_sink& sink) = 0;
  /// Whether it may hold groups on a CUDA device and hand them to
  /// group_sink::on_device: an engine on a device opens a landing only then.
  virtual bool lands_on_device() const { return false; }
  /// Whether a worker pulling from several producers at once (the M:N
  /// pull) must instead pull from them one after another, in rank order,
  /// in `mode`: a collective on each producer's communicator.
  virtual bool needs_rank_order(transfer_mode) const { return false; }
};

/// Pulls a version for workers [0, tp) of `engine` in parallel, one thread
/// each, and sums their reports (duration: the whole engine's). Rethrows the
/// first failure once every worker has stopped.
transfer_report pull_engine(weight_puller& p, const std::string& engine, int tp, std::uint64_t version,
                            transfer_mode mode, const group_sink& sink, clock::time_point deadline);

/// An engine's report from its workers' (pulled at once, taking `took` in
/// all): bytes summed, the first worker's group count, and the wait and
/// store of the worker whose pull took longest.
transfer_report engine_report(const std::string& engine, std::uint64_t version, const std::vector<pull_report>& workers,
                              clock::duration took);

} // namespace rlsync::transfer
