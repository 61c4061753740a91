#pragma once
// transfer.backend nccl: one process's end of the coordinator's NCCL
// communicator. The process hosts some members (its trainer ranks, its
// engines' workers) and one gpu::nccl_membership joins them all: a trainer
// rank's actor joins for its rank, an engine's for its workers.
//
// Devices: NCCL refuses two members of one communicator on one GPU, so
// every member the process hosts takes a device of its own, in the
// canonical member order (trainer ranks, then engines by name and worker):
// the first hosted member device 0, the next device 1. Processes on one
// host see disjoint GPUs through CUDA_VISIBLE_DEVICES, as every
// multi-process GPU job does. A member past the devices the process sees
// fails its join, naming both.
#include "actors/nccl_puller.hpp"
#include "gpu/device.hpp"
#include "gpu/nccl_membership.hpp"
#include "runtime/config/topology.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rlsync {

/// The members a process hosts, in canonical order: the trainer ranks on
/// `node` (or `external_rank` alone: a rank's own process), then the
/// workers of the engines on `node` when some rank runs in another process
/// (as the coordinator decides: an engine whose every rank runs with it
/// takes their weights over the local plane). `node` empty: one process
/// plays every node, and no engine joins.
std::vector<gpu::comm_member> hosted_members(const topology& t, const std::string& node,
                                             std::optional<std::size_t> external_rank = std::nullopt);

/// The device a hosted member joins on: its place in `hosted`. Throws
/// std::invalid_argument when the process does not host it.
int device_of(const std::vector<gpu::comm_member>& hosted, const gpu::comm_member& m);

/// Why this process cannot host `hosted` on what `devices` shows: a member
/// per GPU. Empty when it can.
std::string nccl_device_problem(const std::vector<gpu::comm_member>& hosted, const gpu::device_info& devices);

/// The device staging of each member's link: the model's largest group as
/// f32 (what no group exceeds), and the 8-byte checksum a collective
/// broadcast sends after a group; with the collective, at least one
/// transfer.bucket_bytes bucket.
std::size_t nccl_staging_bytes(const topology& t);

/// The process's membership: links from nccl_link on each member's device,
/// with nccl_staging_bytes of staging, or
/// from `make` when given (a fake world in tests), packing with `packers`
/// (host memory standing for device 0 when none). Without `make`, throws
/// std::runtime_error (nccl_device_problem) when the process sees fewer
/// devices than it hosts members: the start-up fails, not a later join.
std::shared_ptr<gpu::nccl_membership> make_nccl_membership(const topology& t, std::vector<gpu::comm_member> hosted,
                                                           gpu::nccl_membership::link_factory make = {},
                                                           gpu::nccl_membership::packer_factory packers = {});

/// An engine's answer to the coordinator's rendezvous: joins `engine`'s
/// workers 0..tp-1 (rollout_engine_config::nccl_join).
std::function<std::string(const nccl_rendezvous_msg&)> engine_nccl_join(std::shared_ptr<gpu::nccl_membership> m,
                                                                         std::string engine, int tp);

/// What an nccl_puller receives over: the worker's link in `m`.
nccl_puller::link_of nccl_links(std::shared_ptr<gpu::nccl_membership> m);
/// Where trainer rank `rank`'s puller joins its collective (several ranks):
/// the worker's link into that rank's own communicator in `m`, if any.
nccl_puller::link_of nccl_root_links(std::shared_ptr<gpu::nccl_membership> m, int rank);
/// Where each engine worker's link's device packs a whole group it lands
/// (the membership's packers).
nccl_puller::packer_of nccl_packers(std::shared_ptr<gpu::nccl_membership> m);

/// The CUDA device a built-in engine on a device serves from: the one its
/// worker 0's link receives on (the membership's pack device for it), so
/// that what the link receives lands where it is served; 0 without a
/// membership, or when the engine's workers are no members of it.
int engine_device_ordinal(const gpu::nccl_membership* m, const std::string& engine);

} // namespace rlsync
