#pragma once
// The trainer side of the data plane: a WeightSource gives the
// parameters' metadata (name, dtype, full shape), their bytes group by group
// (groups.hpp), and the names it holds (a trainer rank under pipeline
// parallelism holds only some layers).
//
// Versions are immutable snapshots shared by pointer: a version being
// transferred stays valid and unchanged while the trainer produces the next.
// A source keeps its newest `keep_versions` snapshots; an older one is freed
// as soon as no transfer holds a pointer to it.
//
// Two sources:
//   synthetic_source       version 1 is the seeded synthetic model (or a
//                          checkpoint); version v+1 perturbs v exactly as
//                          `rlsync checkpoint make --from DIR --perturb SCALE
//                          --seed (seed + v)` does on disk; with SCALE 0 it
//                          holds v's bytes (shared): versions that move no
//                          bytes, to measure the control plane.
//   checkpoint_dir_source  picks up step directories a trainer publishes:
//                            DIR/step-000042/config.json
//                            DIR/step-000042/model.safetensors (or shards + index)
//                            DIR/step-000042/COMPLETE   <- written last
//                          A step is complete once its COMPLETE marker exists
//                          (any contents); a writer writes and closes every
//                          other file first, then the marker, so a reader
//                          never reads a half-written step. The version is the
//                          step number (steps start at 1, at most
//                          max_step_version). Each step is read into memory
//                          the source owns, never mapped, so a step directory
//                          changed under it is a refused step, not a crash.
//                          A step that fails to load is retried with backoff
//                          for a bounded time (its files may still be
//                          arriving), then skipped for good.
//
// Both refuse to publish a version holding NaN or infinity unless told to
// allow it (--allow-nonfinite).
#include "runtime/base/dtype.hpp"
#include "runtime/base/spare_blocks.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "runtime/config/model_config.hpp"
#include "runtime/transfer/host_buffer.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace rlsync {
class checkpoint;
struct topology;
} // namespace rlsync

namespace rlsync::transfer {

/// A version's tensors already in device memory, copied there when the
/// version was pushed from the device (a PyTorch trainer publishing CUDA
/// tensors): the trainer's device path packs from this copy instead of
/// uploading the host bytes (gpu::device_snapshot adopts it).
struct device_resident {
  int device = 0;                    ///< the CUDA device holding `memory`
  std::shared_ptr<const void> memory; ///< owns every pointer below
  std::uint64_t bytes = 0;
  /// Each held tensor's device pointer, by name, at offsets laid out by
  /// device_copy_aligned.
  std::unordered_map<std::string, const void*> tensors;
};

/// A device copy of a version lays its tensors back to back, each starting
/// at `n` (the end of the one before) rounded up to 256 bytes, as cudaMalloc
/// aligns: the pack kernels read whole, aligned elements.
inline std::uint64_t device_copy_aligned(std::uint64_t n) {
  constexpr std::uint64_t alignment = 256;
  return (n + alignment - 1) / alignment * alignment;
}

/// One version of the weights a source holds: immutable, shared by pointer.
class weight_snapshot {
public:
  /// Owned bytes: `specs` laid out back to back, in order, in `storage`.
  /// Throws std::invalid_argument when the sizes disagree or a name is in
  /// no group of `c`.
  static std::shared_ptr<const weight_snapshot> from_bytes(std::uint64_t version, const model_config& c,
                                                           std::vector<tensor_spec> specs,
                                                           std::vector<std::uint8_t> storage);
  /// As from_bytes, over `size` bytes at `storage` that the snapshot keeps
  /// alive (memory that was never zero-filled: one pass fewer over the bytes),
  /// pointing to (not owning) the same bytes' device copy when there is one.
  static std::shared_ptr<const weight_snapshot> from_buffer(std::uint64_t version, const model_config& c,
                                                            std::vector<tensor_spec> specs,
                                                            std::shared_ptr<const std::uint8_t> storage,
                                                            std::uint64_t size,
                                                            std::shared_ptr<const device_resident> on_device = nullptr);
  /// As from_buffer, over the first `size` bytes of a shareable buffer's
  /// data (host_buffer: a memfd other processes of the host may map), so
  /// that a consumer on this host can be lent its groups in place, read
  /// straight from this memory. Tensor offsets count from the buffer's data.
  static std::shared_ptr<const weight_snapshot> from_shared(std::uint64_t version, const model_config& c,
                                                            std::vector<tensor_spec> specs,
                                                            std::shared_ptr<const host_buffer> buffer,
                                                            std::uint64_t size);
  /// Views into a checkpoint read into memory (kept alive by the snapshot), restricted
  /// to the tensors `held` says are held.
  static std::shared_ptr<const weight_snapshot> from_checkpoint(std::uint64_t version, checkpoint ckpt,
                                                                const std::function<bool(const std::string&)>& held);
  /// Version `version` holding `from`'s bytes, shared, not copied (a trainer
  /// step that changed nothing). Its device copy, if any, is not carried.
  static std::shared_ptr<const weight_snapshot> relabeled(const std::shared_ptr<const weight_snapshot>& from,
                                                          std::uint64_t version);

  std::uint64_t version() const { return version_; }
  const model_config& config() const { return config_; }
  /// Every tensor held, group by group (parameter order within a group).
  const std::vector<tensor_view>& tensors() const { return tensors_; }
  /// nullptr when not held.
  const tensor_view* find(const std::string& name) const;
  /// Throws std::out_of_range naming the tensor and version when not held.
  const tensor_view& at(const std::string& name) const;
  /// The groups held, ascending.
  const std::vector<std::uint32_t>& groups() const { return held_; }
  bool holds_group(std::uint32_t g) const { return g < by_group_.size() && !by_group_[g].empty(); }
  /// The tensors of group `g` (empty when not held).
  const std::vector<tensor_view>& group(std::uint32_t g) const;
  std::uint64_t group_bytes(std::uint32_t g) const;
  std::uint64_t total_bytes() const { return total_bytes_; }
  /// The same bytes in device memory, when the version was pushed from a
  /// device and its source still holds that copy (or someone adopted it);
  /// nullptr otherwise. The snapshot itself does not keep it alive.
  std::shared_ptr<const device_resident> on_device() const { return on_device_.lock(); }
  /// The shareable buffer the tensors lie in (tensor_view::offset from its
  /// data); nullptr when they lie in private memory.
  const host_buffer* shared_buffer() const { return shared_.get(); }

private:
  weight_snapshot() = default;
  void index(std::vector<tensor_view> views);

  std::uint64_t version_ = 0;
  model_config config_;
  std::vector<tensor_view> tensors_;
  std::unordered_map<std::string, std::size_t> by_name_; // into tensors_
  std::vector<std::vector<tensor_view>> by_group_;       // one per model group
  std::vector<std::uint32_t> held_;
  std::uint64_t total_bytes_ = 0;
  std::shared_ptr<const void> storage_; // owns what the views point into
  std::weak_ptr<const device_resident> on_device_; // its source bounds how many live
  std::shared_ptr<const host_buffer> shared_;      // storage_ aliases it, when shareable
};

using snapshot_ptr = std::shared_ptr<const weight_snapshot>;

/// What every backend's producer reads. advance() is the only producing
/// call; it may take long (it computes or maps a whole version) and must run
/// off any actor's mailbox, one call at a time. Everything else is thread-safe and
/// cheap, so transfers can look versions up while advance() runs.
class weight_source {
public:
  virtual ~weight_source() = default;
  weight_source(const weight_source&) = delete;
  weight_source& operator=(const weight_source&) = delete;

  const model_config& config() const { return config_; }
  /// The groups this source holds, ascending (all unless a held-layers filter).
  const std::vector<std::uint32_t>& held_groups() const { return held_; }
  /// Whether tensor `name` is among those this source holds (false for a
  /// name that is not a parameter of the model): in a held group and, for an
  /// expert's tensor, of a held expert.
  bool holds(const std::string& name) const;
  /// The experts held of every held sparse layer, ascending; nullopt: all.
  const std::optional<std::vector<std::int64_t>>& held_experts() const { return experts_; }
  /// Metadata of every parameter held (name, dtype, full shape), in
  /// parameter order.
  virtual std::vector<tensor_spec> parameters() const = 0;

  /// Makes the next version if there is one, publishes it and returns it;
  /// nullptr when there is nothing new (a checkpoint directory without a
  /// newer complete step). Throws on failure; the source stays usable.
  virtual snapshot_ptr advance() = 0;

  /// The newest version published; nullptr before the first.
  snapshot_ptr latest() const;
  /// Version `v` if it is still held; nullptr otherwise.
  snapshot_ptr find(std::uint64_t v) const;
  /// The versions held, ascending (the pinned one included).
  std::vector<std::uint64_t> versions() const;
  std::size_t keep_versions() const { return keep_; }
  /// The oldest version whose bytes equal version `v`'s with every version
  /// published between them the same too: the run of unchanged versions `v`
  /// ends (`v` itself when it changed something; 0 when `v` is not held).
  /// An engine serving a version of that run needs nothing of `v` pulled.
  std::uint64_t same_bytes_since(std::uint64_t v) const;
  /// Keeps version `v` beyond keep_versions until another pin replaces it:
  /// the coordinator pins the version of the round it starts, so that a fast
  /// trainer cannot drop it while slow consumers still pull it. False (and
  /// the earlier pin stays) when `v` is no longer held.
  bool pin(std::uint64_t v);
  /// The pinned version; 0 when none.
  std::uint64_t pinned() const;
  /// After each publish, calls `wake` (on the publishing thread) for as long
  /// as its owner keeps it alive: a producer packing ahead starts when a
  /// version appears, not at its next poll. Thread-safe.
  void on_publish(std::weak_ptr<const std::function<void()>> wake) const;
  /// The ids of the shareable buffers this source's versions lie in and
  /// those it keeps for later versions (lendable_pool::ids): a producer
  /// names them to its consumers as memory to keep mapped. None by default.
  virtual std::vector<std::uint64_t> lendable_buffer_ids() const { return {}; }
  /// A lend of shareable buffer `id` was never given back: the consumer may
  /// still read it, so it must never hold another version (lendable_pool::retire).
  virtual void retire_buffer(std::uint64_t /*id*/) const {}

protected:
  /// Throws std::invalid_argument for held experts of a model without
  /// separate expert tensors, or outside [0, num_experts).
  weight_source(model_config c, const std::optional<std::vector<std::int64_t>>& held_layers,
                std::size_t keep_versions, std::optional<std::vector<std::int64_t>> held_experts = std::nullopt);
  /// Adds `s` as the newest version, dropping the oldest beyond keep_versions.
  /// Throws std::logic_error unless its version exceeds the latest. Compares
  /// it with the version before, tensor by tensor (same_bytes_since): shared
  /// bytes at once, others until their first difference, so a version that
  /// changed its first tensors costs next to nothing to tell, one that
  /// changed nothing a read of both (which saves every engine its pull).
  void publish(snapshot_ptr s);

private:
  struct held_version {
    snapshot_ptr snapshot;
    std::uint64_t same_since = 0;
  };

  model_config config_;
  std::vector<std::uint32_t> held_;
  std::optional<std::vector<std::int64_t>> experts_;
  std::size_t keep_;
  mutable std::mutex mutex_;
  std::deque<held_version> versions_; // ascending
  held_version pinned_;               // may also be in versions_
  mutable std::vector<std::weak_ptr<const std::function<void()>>> publish_listeners_;
};

/// Memory for a source's versions that a UCX producer can lend same-host
/// engines in place, recycled. Fresh buffers are shareable and in huge pages
/// while the kernel's hugetlb pool has them (for versions of 2 MiB or more),
/// else in ordinary pages where `small_pages` allows it (tests). A
/// version's buffer, once its source and every lend of it let go, waits as
/// one of `max_spares` spares for a later version. Reused, a memfd keeps its id
/// and its pages: engines that still map it read the new version without
/// mapping and faulting it in anew (about 2.8 ms per 131 MB here), and the
/// pool is not zeroed again. A buffer with a lend that was never given back
/// (its consumer gone or past its deadline, perhaps still reading) is
/// retired: freed, never reused. Thread-safe; spares of a pool that is gone
/// are freed.
class lendable_pool {
public:
  explicit lendable_pool(bool small_pages, std::size_t max_spares = 2);
  /// A buffer of at least `bytes`: a spare that large, else fresh memory;
  /// nullptr when none can be had (the version then takes private memory).
  std::shared_ptr<host_buffer> take(const std::string& what, std::uint64_t bytes);
  /// The memfd ids of every buffer of the pool still alive, spares and
  /// those holding versions: memory engines may keep mapped.
  std::vector<std::uint64_t> ids() const;
  /// Buffer `id` is freed once its version goes, not kept as a spare.
  void retire(std::uint64_t id) const;

private:
  struct spares;
  bool small_pages_;
  std::shared_ptr<spares> spares_;
};

struct synthetic_options {
  model_config config;
  dtype type = dtype::bf16;      ///< ignored with initial_checkpoint (its dtype wins)
  std::uint64_t model_seed = 1;  ///< version 1: synthetic_values() with this seed
  /// When set, version 1 is this checkpoint directory's tensors instead.
  std::string initial_checkpoint;
  std::uint64_t trainer_seed = 7; ///< version v+1 uses perturbation_noise(seed trainer_seed + v)
  double perturb = 0.01; ///< 0: every version holds version 1's bytes
  /// Pipeline layers this rank holds; nullopt holds every layer.
  std::optional<std::vector<std::int64_t>> held_layers;
  /// Experts this rank holds of every held sparse layer; nullopt holds all.
  std::optional<std::vector<std::int64_t>> held_experts;
  std::size_t keep_versions = 2;
  bool allow_nonfinite = false; ///< for an initial checkpoint holding NaN or infinity
  unsigned threads = 0; ///< generating threads; 0: min(hardware threads, 8)
  /// Versions in shareable memory in huge pages (weight_snapshot::from_shared)
  /// while the kernel's hugetlb pool has them, so that a UCX producer lends
  /// same-host engines their groups in place; else (and for versions under
  /// 2 MiB) private memory. Dropped versions' memory is reused (lendable_pool).
  bool shared_memory = false;
  /// ... and in ordinary pages when no huge page is to be had, at any size
  /// (tests of lending in place where the machine reserves none).
  bool shared_small_pages = false;
};

/// A trainer that "trains" by perturbing: deterministic in its options.
class synthetic_source final : public weight_source {
public:
  /// Throws std::invalid_argument for an invalid config or perturbation,
  /// checkpoint_error for an initial checkpoint that does not fit.
  explicit synthetic_source(synthetic_options o);

  std::vector<tensor_spec> parameters() const override { return specs_; }
  snapshot_ptr advance() override { return produce_next(); }
  /// Version 1 on the first call, then latest + 1.
  snapshot_ptr produce_next();
  std::vector<std::uint64_t> lendable_buffer_ids() const override { return lendable_.ids(); }
  void retire_buffer(std::uint64_t id) const override { lendable_.retire(id); }

private:
  snapshot_ptr make_initial() const;
  snapshot_ptr perturbed(const weight_snapshot& from) const;
  /// A version's bytes as generated: a shareable buffer (shared_memory) or a vector.
  struct version_memory {
    std::vector<std::uint8_t> bytes;
    std::shared_ptr<host_buffer> shared;
    std::uint8_t* data() { return shared ? shared->data() : bytes.data(); }
  };
  version_memory new_version_memory(std::uint64_t version, std::uint64_t total) const;
  snapshot_ptr snapshot_of(std::uint64_t version, std::vector<tensor_spec> specs, version_memory m,
                           std::uint64_t total) const;

  synthetic_options options_;
  std::vector<tensor_spec> specs_; // held, parameter order
  mutable lendable_pool lendable_; // versions' memory with shared_memory
};

inline constexpr const char* step_complete_marker = "COMPLETE";

/// The largest step a directory name may carry: versions are added to
/// (staleness, every_versions) and compared across the cluster, so they stay
/// far below 2^64.
inline constexpr std::uint64_t max_step_version = std::uint64_t(1) << 62;

/// "" when every element of `t` is finite, else a message naming the tensor
/// and the first NaN or infinity in it ("tensor 'x' element 12 is NaN").
std::string nonfinite_problem(const tensor_view& t);

/// The first NaN or infinity among `count` elements of `type` at `data`.
struct nonfinite_element {
  std::size_t index = 0;
  bool nan = false; ///< else infinite
};
std::optional<nonfinite_element> first_nonfinite_element(dtype type, const std::byte* data, std::size_t count);
/// nonfinite_problem's message for element `e` of tensor `tensor`.
std::string nonfinite_message(const std::string& tensor, const nonfinite_element& e);

/// "step-000042" (six digits at least).
std::string step_dir_name(std::uint64_t step);
/// The step of a directory called "step-<digits>"; nullopt for other names
/// and for steps beyond max_step_version (see step_name_problem).
std::optional<std::uint64_t> parse_step_dir_name(const std::string& name);
/// For a name "step-<digits>" whose step is 0 or beyond max_step_version,
/// why it is refused; "" for every other name.
std::string step_name_problem(const std::string& name);
/// Writer side: publishes `step_dir` by writing its COMPLETE marker (and
/// syncing it). Call once every other file of the step is written and closed.
void mark_step_complete(const std::string& step_dir);

/// Memory a checkpoint_dir source reads its steps' files into, recycled: a
/// file's memory, once its step is dropped, waits as a spare (at most
/// keep_at_most bytes of them) for a later step's file that fits (best fit,
/// at most twice the file). Fresh pages cost a fault each at first touch, and
/// where pages are faulted in by the hypervisor the first read of one the
/// kernel filled can cost as much again; reused ones cost neither (figures in
/// the README). Thread-safe (a step may be dropped on any thread); memory
/// given back after the pool is gone is freed. Memory given back when the
/// spares are at the bound frees the oldest spares first, so that one that
/// fits no later file does not hold its place for good.
class step_read_memory {
public:
  step_read_memory();
  /// What checkpoint::open takes: the best-fitting spare, else fresh memory.
  file_memory memory() const;
  /// Spares kept at most, in bytes (it only grows: the largest accepted step's files).
  void keep_at_most(std::uint64_t bytes);
  std::uint64_t spare_bytes() const;

private:
  spare_blocks<std::byte[]> spares_; // no count limit, bytes as keep_at_most says
};

struct checkpoint_dir_options {
  model_config config; ///< the model every step must match
  std::string dir;     ///< where step-NNNNNN/ directories appear
  /// The dtype every step must have; nullopt accepts the first step's.
  std::optional<dtype> type;
  std::optional<std::vector<std::int64_t>> held_layers;
  /// Experts this rank holds of every held sparse layer; nullopt holds all.
  std::optional<std::vector<std::int64_t>> held_experts;
  std::size_t keep_versions = 2;
  /// A step that fails to load is retried after retry_initial, doubling up
  /// to retry_max, until retry_for has passed since its first failure.
  std::chrono::milliseconds retry_initial{100};
  std::chrono::milliseconds retry_max{5000};
  std::chrono::milliseconds retry_for{60000};
  bool allow_nonfinite = false;
  /// Each step, once read and checked, is copied into shareable memory in
  /// huge pages (as synthetic_options::shared_memory), so that a UCX producer
  /// lends same-host engines their groups in place instead of packing them
  /// inside the round. The copy is made by poll(), ahead of the round; while
  /// it is made, the step is in memory twice. Without a huge page to be had,
  /// the step stays in the memory it was read into.
  bool shared_memory = false;
  /// ... and in ordinary pages when no huge page is to be had (tests).
  bool shared_small_pages = false;
};

/// Watches a directory for published steps (see the top of this file).
class checkpoint_dir_source final : public weight_source {
public:
  explicit checkpoint_dir_source(checkpoint_dir_options o);

  /// From the newest version's tensors; before the first, from the config
  /// in the expected dtype (bf16 when not known yet).
  std::vector<tensor_spec> parameters() const override;
  snapshot_ptr advance() override { return poll(); }
  /// Reads the newest complete step newer than the latest version and
  /// publishes it; nullptr when there is none (incomplete steps are
  /// ignored). A step that does not fit the model (or holds NaN or infinity)
  /// throws checkpoint_error naming the file at fault (its config.json, for
  /// a model that disagrees); later polls retry it with backoff until
  /// retry_for has passed, then skip it for good. A directory named beyond
  /// the version range, and a complete step older than the latest version
  /// (out of order), throw checkpoint_error once each and are skipped.
  snapshot_ptr poll();
  const checkpoint_dir_options& options() const { return options_; }
  /// Bytes of dropped steps' files kept for reading later steps into.
  std::uint64_t spare_read_bytes() const { return read_memory_.spare_bytes(); }
  std::vector<std::uint64_t> lendable_buffer_ids() const override { return lendable_.ids(); }
  void retire_buffer(std::uint64_t id) const override { lendable_.retire(id); }

private:
  /// `read`'s tensors copied back to back into a buffer of the lendable
  /// pool; `read` itself when the pool has none to give.
  snapshot_ptr lendable_copy(snapshot_ptr read) const;

  struct failed_step {
    std::chrono::steady_clock::time_point first_failure, next_try;
    std::chrono::milliseconds backoff{0};
  };

  checkpoint_dir_options options_;
  std::set<std::uint64_t> rejected_;              // skipped for good
  std::unordered_map<std::uint64_t, failed_step> retrying_;
  std::set<std::string> reported_names_;          // said once: out of range or out of order
  std::set<std::uint64_t> complete_last_scan_;    // to tell a superseded step from a late one
  mutable std::mutex type_mutex_;
  std::optional<dtype> seen_type_;
  mutable lendable_pool lendable_; // steps' memory with shared_memory
  step_read_memory read_memory_;   // the files' memory, recycled
};

/// The source of trainer rank `rank` of a topology: synthetic (from the
/// model's seed or checkpoint, perturbed with the trainer's seed) or a
/// checkpoint directory, holding that rank's layers. Throws
/// std::invalid_argument for an external rank (make_external_source).
std::shared_ptr<weight_source> make_weight_source(const topology& t, std::size_t rank = 0);

} // namespace rlsync::transfer
