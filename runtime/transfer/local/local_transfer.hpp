#pragma once
// The `local` data-plane backend: engine workers in the trainer's
// process pull a version straight from its WeightSource.
//
// Streams. Packed bytes depend only on the plan, not on the replica, so
// every replica's worker w of an engine with tensor parallelism tp reads the
// same stream (same tp, worker and packing): its groups are packed once per
// version and shared (refcounted buffers). An M:N pull registers sub-plans:
// equal ones share a stream, a different one (a retry re-planned here) gets
// its own. Broadcast has one stream for everybody: the full tensors.
//
// Passes. A pull joins the running pass of its stream and version, or starts
// one. A pass has one producer thread packing groups in order into a window
// of at most groups_in_flight buffers: it packs group n+1 while consumers
// copy group n, and never holds more (the memory bound). A group leaves the
// window once every consumer of the pass has copied it. Group 0 stays until
// every worker registered for the stream that has not pulled this version
// yet has joined, or join_grace has passed; a worker that comes later gets a
// pass of its own (packed again). So replicas syncing together share one
// packing; one that syncs alone (a wave, a rejoin) waits at most join_grace
// for registered peers that do not come.
//
//   pull ──► join pass ──► for each group: wait (deadline) ─► copy into the
//            (or start)        receive buffer ─► release the window slot ─►
//                              verify checksum ─► sink callback
//
// Memory. Packed buffers are reused, touched once: at most groups_in_flight
// alive per running pass, and at most 2 x groups_in_flight kept spare. A
// registration touches a window's worth of the plan's largest group, so
// that the first sync does not fault them in inside its stall.
//
// Every wait has a deadline: a consumer waiting for a group that does not
// come fails with transfer_failure::timeout; a producer whose consumers all
// left stops. Fault hooks (corrupt, withhold) rehearse drills.
#include "runtime/transfer/faults.hpp"
#include "runtime/transfer/packing.hpp"
#include "runtime/transfer/puller.hpp"
#include "runtime/transfer/weight_source.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace rlsync::transfer {

struct local_transfer_options {
  /// Packed groups alive at once per stream (>= 1).
  std::size_t groups_in_flight = 2;
  /// How long a pass keeps its first group for registered workers of its
  /// stream that have not started pulling this version yet.
  std::chrono::milliseconds join_grace{50};
  /// Fault in groups_in_flight buffers of the model's largest full group at
  /// construction, as registering a plan does for its packed groups: a
  /// topology in broadcast mode, whose first pass then packs into warm
  /// memory (a fresh page costs a fault on its first write).
  bool prefault_full_groups = false;
};

/// Instrumentation, cumulative since construction.
struct local_transfer_stats {
  std::uint64_t passes = 0;       ///< packing passes started
  std::uint64_t packs = 0;        ///< groups packed (sharded and broadcast)
  std::uint64_t packed_bytes = 0;
  std::size_t peak_buffers = 0;   ///< most packed groups alive at once in one pass
  std::uint64_t corruptions = 0;  ///< receptions the corrupt hook altered
  std::uint64_t buffers_made = 0; ///< packed buffers a pass allocated (none spare fit), not prefaulted ones
};


class local_transfer final : public weight_puller {
public:
  explicit local_transfer(std::shared_ptr<const weight_source> source, local_transfer_options options = {});
  /// Stops every pass and joins its producer. Pulls still running fail
  /// with transfer_failure::cancelled.
  ~local_transfer() override;
  local_transfer(const local_transfer&) = delete;
  local_transfer& operator=(const local_transfer&) = delete;

  /// Throws std::invalid_argument for a plan that does not fit the model.
  void register_worker(const std::string& engine, std::shared_ptr<const plan::worker_plan> plan) override;
  void unregister_engine(const std::string& engine) override;
  pull_report pull(const pull_request& req, const group_sink& sink) override;

  const weight_source& source() const { return *source_; }
  const local_transfer_options& options() const { return options_; }

  local_transfer_stats stats() const;
  /// Waits until at least `packs` groups have been packed in all (each
  /// counted once its pass offers it to consumers); false
  /// when the deadline passed first (for tests and benchmarks).
  bool wait_for_packs(std::uint64_t packs, clock::time_point deadline) const;

  /// Arms a corruption (see `corruption`).
  void corrupt(corruption c);
  /// Makes every pass's producer that reaches `group` (of `version`, 0: any)
  /// before `until` stop before packing it: the group never arrives,
  /// consumers time out.
  void withhold(std::uint32_t group, std::uint64_t version = 0,
                fault_hooks::clock::time_point until = fault_hooks::clock::time_point::max());
  void clear_faults();

  /// Ends every running pass: its pulls fail now with
  /// transfer_failure::cancelled instead of waiting for their deadlines.
  /// Later pulls start passes of their own. For a trainer restarted in the
  /// middle of a round, which the coordinator aborts.
  void end_passes();

  struct shared; // stats and fault hooks, shared with producer threads
  struct pass;

private:
  std::shared_ptr<const weight_source> source_;
  local_transfer_options options_;
  std::shared_ptr<shared> shared_;
  struct registry;
  std::unique_ptr<registry> registry_;
};

} // namespace rlsync::transfer
