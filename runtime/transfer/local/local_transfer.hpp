#pragma once
// The `local` data-plane backend: engine workers in the trainer's
// process pull a version straight from its WeightSource.
//
// Streams. Packed bytes depend only on the plan, not on the replica, so
// every replica's worker w of an engine with tensor parallelism tp reads the
// same stream (same tp, worker and packing): its groups are checksummed (or
// packed) once per version and shared. An M:N pull registers sub-plans:
// equal ones share a stream, a different one (a retry re-planned here) gets
// its own. Broadcast has one stream for everybody: the full tensors.
//
// Passes. A pull joins the running pass of its stream and version, or starts
// one. A pass has one producer thread offering groups in order into a
// window: it readies group n+1 while consumers copy group n. A group leaves
// the window once every consumer of the pass has copied it. Packed groups
// hold memory, so at most groups_in_flight of them are in the window; lent
// ones hold none and do not count (a fast replica is not held back by a
// slow one for memory nothing uses). Group 0 stays until every worker
// registered for the stream that has not pulled this version yet has
// joined, or join_grace has passed; a worker that comes later gets a pass
// of its own. So replicas syncing together share one producer; one that
// syncs alone (a wave, a rejoin) waits at most join_grace for registered
// peers that do not come.
//
// Lent in place. The version's memory is this process's: a group is offered
// where it lies, as the pieces its packed order reads (packing.hpp). A
// consumer copies the pieces straight into the engine's staging and
// checksums what landed in the same pass (store_in_place.hpp): one copy
// from trainer memory to engine memory. Meanwhile the producer checksums
// the pieces, read only; the consumer compares the two before its sink
// hears of the group (offering first and checksumming after took the
// producer's pass off the consumers' path: warm sharded 46-64 ms against
// 47-61 ms, eight alternating pairs, median 49 against 52). A sink that
// takes packed bytes gets them gathered into a buffer of its worker's own
// (from the spare pool below); a broadcast sink that takes whole tensors
// reads them where they lie, verified first. Only a sharded group whose
// runs are too short to copy one by one (a transposed slice:
// lends_in_runs) is packed, once per pass, into a reused buffer.
//
// Not ahead of the stall: a pass checksums its lent groups beside its
// consumers, a read of the bytes they copy. Taking them at publish, on
// a thread of their own, measured slower on two cores (the bench syncs
// right after each step: the thread competed with the round it was to
// spare).
//
//   pull ──► join pass ──► for each group: wait (deadline) ─► copy the
//            (or start)        pieces into staging, checksum folded in ─►
//                              wait for the producer's checksum ─► verify
//                              ─► sink callback ─► release the slot
//
// Memory. A lent group costs its list of pieces (16 bytes a run, runs of at
// least 64 bytes), no copy of its bytes. Packed buffers are reused, touched
// once: at most groups_in_flight alive per running pass, and at most
// 2 x groups_in_flight kept spare. A registration touches a window's worth
// of the plan's largest packed group, so that the first sync does not
// fault them in inside its stall.
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
  /// Packed groups alive at once per stream (>= 1); lent ones take no slot.
  std::size_t groups_in_flight = 2;
  /// How long a pass keeps its first group for registered workers of its
  /// stream that have not started pulling this version yet.
  std::chrono::milliseconds join_grace{50};
};

/// Instrumentation, cumulative since construction.
struct local_transfer_stats {
  std::uint64_t passes = 0;       ///< passes started
  std::uint64_t packs = 0;        ///< groups offered (sharded and broadcast): packed, or lent with their checksum
  std::uint64_t lent = 0;         ///< of those, lent in place (nothing copied by the producer)
  std::uint64_t packed_bytes = 0; ///< bytes of the groups offered, lent or packed
  std::size_t peak_buffers = 0;   ///< most packed buffers alive at once in one pass (lent groups hold none)
  std::uint64_t peak_buffer_bytes = 0; ///< their most bytes at once in one pass
  std::uint64_t corruptions = 0;  ///< receptions the corrupt hook altered
  std::uint64_t buffers_made = 0; ///< buffers allocated for packed or gathered groups (none spare fit), not prefaulted ones
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
  /// Waits until at least `packs` groups have been offered in all (each
  /// counted once its pass offers it to consumers); false
  /// when the deadline passed first (for tests and benchmarks).
  bool wait_for_packs(std::uint64_t packs, clock::time_point deadline) const;

  /// Arms a corruption (see `corruption`).
  void corrupt(corruption c);
  /// Receptions of `engine` a corruption altered so far.
  std::uint32_t corruptions_landed(const std::string& engine) const;
  /// Makes every pass's producer that reaches `group` (of `version`, 0: any)
  /// before `until` stop before offering it: the group never arrives,
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
