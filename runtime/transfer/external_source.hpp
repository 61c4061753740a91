#pragma once
// A weight source whose versions an outside program hands in: a PyTorch
// trainer (the `rlsync` Python module) publishes its state_dict each step.
//
//   push(v, tensors)  checks every tensor against the model and this rank's
//                     layers, copies them into one buffer the snapshot owns
//                     (the one copy: the caller may mutate its tensors as
//                     soon as push returns) and queues the snapshot;
//   advance()         (the trainer actor's step) publishes the newest one
//                     queued; an older queued one is superseded unpublished.
//
// Fresh memory costs a page fault per page (most of a copy's time on a VM),
// so the buffer of a version the source dropped is kept for the next push
// (one spare, of the model's size); a fresh one asks for transparent huge
// pages. Memory: the versions kept (keep_versions, the pinned one, the one
// queued) and one spare.
//
// Never blocks on a transfer: a round pins the version it moves (pin) and
// keeps it alive through its pointer, whatever push does meanwhile.
#include "runtime/transfer/weight_source.hpp"

#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace rlsync::transfer {

/// One tensor as the caller holds it: borrowed for the duration of push.
struct tensor_input {
  std::string name;
  dtype type = dtype::bf16;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
  std::uint64_t bytes = 0; ///< of the caller's buffer: must equal shape × dtype size
};

struct external_options {
  model_config config;
  dtype type = dtype::bf16; ///< every tensor pushed must have it (what engines record plans in)
  std::optional<std::vector<std::int64_t>> held_layers;
  std::optional<std::vector<std::int64_t>> held_experts; ///< nullopt: every expert of its layers
  std::size_t keep_versions = 2;
  bool allow_nonfinite = false;
  unsigned copy_threads = 2; ///< threads copying one push
  std::string who = "trainer rank 0"; ///< names the source in messages
};

class external_source final : public weight_source {
public:
  explicit external_source(external_options o);

  std::vector<tensor_spec> parameters() const override { return specs_; }
  /// Publishes the newest version pushed and not published yet; nullptr when none.
  snapshot_ptr advance() override;

  /// Checks `tensors` (every held tensor exactly once, nothing else; the
  /// model's shapes; the configured dtype; finite unless allowed) and that
  /// `version` exceeds every version pushed before, copies them and queues
  /// the version. Throws std::invalid_argument naming the tensor (or the
  /// version) at fault, allocation_error when the copy does not fit; nothing
  /// is queued then. Thread-safe; one push at a time.
  void push(std::uint64_t version, const std::vector<tensor_input>& tensors);

  /// The newest version pushed (published or queued); 0 before the first.
  std::uint64_t last_pushed() const;
  dtype type() const { return options_.type; }

private:
  external_options options_;
  std::vector<tensor_spec> specs_; // held, parameter order
  std::set<std::string> parameter_names_; // every parameter of the model
  struct spare_buffers; // freed versions' memory, for the next push
  std::shared_ptr<spare_buffers> spares_;
  std::uint64_t held_bytes_ = 0; // every push copies exactly this much
  /// A buffer of held_bytes_: a spare, or fresh memory asking for huge pages.
  std::shared_ptr<std::uint8_t> buffer_for(const std::string& what);
  std::mutex push_mutex_;          // one push at a time
  mutable std::mutex mutex_;       // guards pending_, last_pushed_
  snapshot_ptr pending_;
  std::uint64_t last_pushed_ = 0;
};

/// The dtype external ranks publish and engines record their plans in: the
/// synthetic model's, else the model checkpoint's tensors'.
dtype external_weights_dtype(const topology& t);

/// The source of external rank `rank` of `t` (its layers, the model, the
/// dtype above). Throws std::out_of_range for a rank the topology lacks.
std::shared_ptr<external_source> make_external_source(const topology& t, std::size_t rank, bool allow_nonfinite);

} // namespace rlsync::transfer
