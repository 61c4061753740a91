#pragma once
// The trainer's internals shared by its translation units: trainer.cpp (the
// actor: steps, CAF pulls, UCX tickets, cuda_ipc) and trainer_nccl.cpp (what
// a rank serves over nccl: point-to-point sends, sharded plans, the
// collective baseline, joining a communicator). Nothing else includes it.

#include "actors/trainer.hpp"
#include "gpu/device_pack.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rlsync::trainer_detail {

using self_ptr = trainer_impl_actor::stateful_pointer<trainer_state>;

// -- defined in trainer.cpp -------------------------------------------------------

void log(self_ptr self, const std::string& line);
caf::error version_not_held(self_ptr self, std::uint64_t version);
/// Version `version` when group `group` of it is held, else why not.
caf::expected<transfer::snapshot_ptr> held_group(self_ptr self, std::uint64_t version, std::uint32_t group);
/// Group `group` of `version` as a bucket, or why the source cannot give it.
caf::expected<weight_bucket> held_bucket(self_ptr self, std::uint64_t version, std::uint32_t group);
/// Version `s`'s device copy on `device` that needs no upload, or null.
std::shared_ptr<const gpu::device_snapshot> device_copy_at_hand(self_ptr self, const transfer::weight_snapshot& s,
                                                                const gpu::pack_device& device);
/// The rank's device copy of version `s` on `device`, uploaded at the
/// version's first pull; null when the upload failed (pack on the CPU).
std::shared_ptr<const gpu::device_snapshot> device_copy(self_ptr self, const transfer::weight_snapshot& s,
                                                        gpu::pack_device& device);
/// XXH3 of group `g`'s whole tensors, read in place from the host bytes.
std::uint64_t group_checksum(const transfer::weight_snapshot& s, std::uint32_t g);
/// Group `g`'s whole tensors in the device copy `copy` of `s`, in order.
std::vector<gpu::pack_device::piece> device_pieces(const transfer::weight_snapshot& s, std::uint32_t g,
                                                    const gpu::device_snapshot& copy);
/// Group `g` of `s` as pieces of its device copy `copy`, and its bucket
/// without data: the layout, and the XXH3 of the host bytes taken in place.
std::pair<std::vector<gpu::pack_device::piece>, weight_bucket>
device_group(const transfer::weight_snapshot& s, std::uint32_t g, const gpu::device_snapshot& copy);
/// An engine worker's own credentials go only to the node that registered
/// the engine: the refusal, or nothing when the sender may.
std::optional<caf::error> engine_from_sender(self_ptr self, const std::shared_ptr<sender_guard>& data_guard,
                                             const std::string& engine, std::int32_t worker, const char* message,
                                             const std::string& what);

// -- defined in trainer_nccl.cpp: the nccl handlers ---------------------------------

/// A worker's pull of one group, point to point: queued to the rank's
/// sender; the answer says what the worker will receive.
caf::result<nccl_chunk> serve_nccl_pull(self_ptr self, const std::shared_ptr<sender_guard>& data_guard,
                                        const nccl_pull& req);
/// A worker's ask to join the collective broadcast of `req.version`.
caf::result<nccl_manifest> serve_nccl_broadcast(self_ptr self, const std::shared_ptr<sender_guard>& data_guard,
                                                const nccl_pull& req);
/// A worker's sharded plan, kept under its digest (the answer).
caf::result<std::uint64_t> register_nccl_plan(self_ptr self, const std::shared_ptr<sender_guard>& data_guard,
                                              const nccl_plan& req);
/// The coordinator's rendezvous: the rank joins that communicator.
caf::result<std::uint64_t> join_nccl(self_ptr self, const nccl_rendezvous_msg& msg);
/// A member died in `epoch`: the rank's sends to it abort.
void mark_nccl_dead(self_ptr self, std::uint64_t epoch, const std::string& who);

} // namespace rlsync::trainer_detail
