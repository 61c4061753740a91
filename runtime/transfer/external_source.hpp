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
// so the buffers of versions the source dropped are kept for the next
// pushes (two spares, of the model's size); a fresh one asks for
// transparent huge pages. With shared_memory, a version pushed from host
// memory goes into shareable memory instead, which a UCX producer lends in
// place (lendable_pool: two spares of those too). Memory: the versions
// kept (keep_versions, the pinned one, the one queued) and the spares; on
// the device, `device_copies` copies (below) and those rounds still read.
//
// Tensors on a CUDA device (tensor_input::device) are copied by the
// tensor_device. When the source keeps device copies (transfer.backend nccl
// or cuda_ipc) and every tensor is on a device, they are first copied
// device to device into a copy the snapshot points to (on_device()), from
// which the trainer packs and serves without uploading the host bytes; the
// host bytes are then copied from that copy, so both hold what one read of
// the trainer's tensors saw. Otherwise they are copied device to host
// straight. The host buffer is page-locked at its first device push and
// stays so while it is reused. The source holds at most `device_copies`
// copies (at least one): before making a new one it drops those of versions
// it no longer serves, then the oldest; a version superseded before it was
// published loses its copy at once. A round that adopted a copy keeps it
// alive while it reads it. A snapshot whose copy was dropped, or failed (out
// of device memory), is served as a host push is: uploaded by the trainer at
// its first pull (or packed on the CPU for the nccl collective).
//
// Never blocks on a transfer: a round pins the version it moves (pin) and
// keeps it alive through its pointer, whatever push does meanwhile.
#include "runtime/base/spare_blocks.hpp"
#include "runtime/transfer/weight_source.hpp"

#include <cstdint>
#include <deque>
#include <memory>
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
  int device = -1;         ///< -1: `data` is host memory; else the CUDA device it is on
};

/// Copies out of device memory for push, and the device copies: CUDA's
/// (gpu::cuda_tensor_device) or host memory standing in for it in tests.
/// Each call has finished when it returns; each throws on failure.
class tensor_device {
public:
  virtual ~tensor_device() = default;
  /// Page-locks `n` bytes of host memory at `p` for to_host's copies, until
  /// the pointer returned is dropped (before the memory is freed).
  virtual std::shared_ptr<void> pin_host(void* p, std::size_t n) = 0;
  /// `n` bytes at `from` (on device `device`) into host memory at `to`.
  virtual void to_host(void* to, const void* from, std::size_t n, int device) = 0;
  /// `bytes` of memory on device `device`, freed with the pointer.
  virtual std::shared_ptr<void> allocate(std::size_t bytes, int device) = 0;
  /// `n` bytes from `from` (any device) to `to` (memory of allocate() on `to_device`).
  virtual void device_to_device(void* to, int to_device, const void* from, std::size_t n) = 0;
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
  /// Reads device tensors; nullptr: only host tensors are taken.
  std::shared_ptr<tensor_device> device;
  /// The device a version pushed from a device is also copied to (the one
  /// the trainer packs on); nullopt: no device copies.
  std::optional<int> device_copy_on;
  std::size_t device_copies = 2; ///< device copies the source holds at most (0 counts as 1)
  /// Versions pushed from host memory go into shareable memory in huge
  /// pages (lendable_pool) while the hugetlb pool has them, so
  /// that a UCX producer lends same-host engines their groups in place:
  /// the push's copy is then the only one before the engines' own.
  bool shared_memory = false;
  bool shared_small_pages = false; ///< ... and in ordinary pages when no huge page is to be had (tests)
};

class external_source final : public weight_source {
public:
  explicit external_source(external_options o);

  std::vector<tensor_spec> parameters() const override { return specs_; }
  std::vector<std::uint64_t> lendable_buffer_ids() const override { return lendable_.ids(); }
  void retire_buffer(std::uint64_t id) const override { lendable_.retire(id); }
  /// Publishes the newest version pushed and not published yet; nullptr when none.
  snapshot_ptr advance() override;

  /// Checks `tensors` (every held tensor exactly once, nothing else; the
  /// model's shapes; the configured dtype; finite unless allowed; on a
  /// device only with a tensor_device) and that
  /// `version` exceeds every version pushed before, copies them and queues
  /// the version. Throws std::invalid_argument naming the tensor (or the
  /// version) at fault, allocation_error when the copy does not fit; nothing
  /// is queued then; std::runtime_error naming the tensor when copying it
  /// from its device fails. Thread-safe; one push at a time.
  void push(std::uint64_t version, const std::vector<tensor_input>& tensors);

  /// The newest version pushed (published or queued); 0 before the first.
  std::uint64_t last_pushed() const;
  /// The fleet already serves `version` (its synced version when the rank
  /// joined): later pushes must exceed it, or a restarted trainer counting
  /// again from its checkpoint would publish numbers no round syncs. Only
  /// raises the floor.
  void raise_floor(std::uint64_t version);
  dtype type() const { return options_.type; }
  /// Whether tensors on a CUDA device are taken (a tensor_device was given).
  bool reads_device() const { return options_.device != nullptr; }
  /// Why the last push has no device copy though one was wanted; empty
  /// otherwise. For the caller to log.
  std::string device_copy_problem() const;

private:
  external_options options_;
  std::vector<tensor_spec> specs_; // held, parameter order
  std::set<std::string> parameter_names_; // every parameter of the model
  struct host_buffer;   // a version's memory, page-locked once a device push used it
  static constexpr std::size_t max_spare_buffers = 2;
  spare_blocks<host_buffer> spares_; // freed versions' buffers, for the next push
  lendable_pool lendable_; // host pushes' memory with shared_memory
  std::uint64_t held_bytes_ = 0; // every push copies exactly this much
  /// A buffer of held_bytes_: a spare, or fresh memory asking for huge pages.
  std::shared_ptr<host_buffer> buffer_for(const std::string& what);

  /// The device copy of `inputs` (in specs_ order), or nullptr (and
  /// device_copy_problem_ says why).
  std::shared_ptr<const device_resident> device_copy_of(const std::vector<const tensor_input*>& inputs);
  /// The device tensors of `inputs` into `to` at `offsets`: from `from`
  /// (their device copy) when given, else from the tensors themselves.
  /// Throws std::runtime_error naming the tensor.
  void copy_from_device(const std::vector<const tensor_input*>& inputs, const std::vector<std::uint64_t>& offsets,
                        const device_resident* from, host_buffer& to);
  /// Drops held device copies until one more fits in device_copies.
  void make_room_for_device_copy();
  /// (version, copy), oldest first; only push touches it (under push_mutex_).
  std::deque<std::pair<std::uint64_t, std::shared_ptr<const device_resident>>> device_copies_;
  std::mutex push_mutex_;          // one push at a time
  mutable std::mutex mutex_;       // guards pending_, last_pushed_, cluster_floor_
  snapshot_ptr pending_;
  std::uint64_t last_pushed_ = 0;
  std::uint64_t cluster_floor_ = 0; // guarded by mutex_
  std::string device_copy_problem_;
};

/// The dtype external ranks publish and engines record their plans in: the
/// synthetic model's, else the model checkpoint's tensors'.
dtype external_weights_dtype(const topology& t);

/// The source of external rank `rank` of `t` (its layers, the model, the
/// dtype above), reading device tensors with `device` (nullptr: host
/// tensors only), and keeping device copies on device 0 when the topology's
/// backend serves from the device (nccl, cuda_ipc: the device the rank's
/// only link packs on). Throws std::out_of_range for a rank the topology lacks.
std::shared_ptr<external_source> make_external_source(const topology& t, std::size_t rank, bool allow_nonfinite,
                                                      std::shared_ptr<tensor_device> device = nullptr);

} // namespace rlsync::transfer
