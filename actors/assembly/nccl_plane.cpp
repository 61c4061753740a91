#include "actors/assembly/nccl_plane.hpp"

#include "gpu/device.hpp"
#include "gpu/device_pack.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/plan/groups.hpp"

#include <algorithm>
#include <stdexcept>

namespace rlsync {

std::vector<gpu::comm_member> hosted_members(const topology& t, const std::string& node,
                                             std::optional<std::size_t> external_rank) {
  std::vector<gpu::comm_member> out;
  if (external_rank) {
    out.push_back(gpu::comm_member::trainer_rank(static_cast<int>(*external_rank)));
    return out;
  }
  const bool external = t.trainer.source == trainer_source::external; // every rank its own process
  bool rank_elsewhere = external;
  for (std::size_t r = 0; r < t.trainer.ranks.size(); ++r) {
    if (!external && (node.empty() || t.trainer.ranks[r].node == node))
      out.push_back(gpu::comm_member::trainer_rank(static_cast<int>(r)));
    else
      rank_elsewhere = true;
  }
  // The coordinator's rule (coordinator_nccl.cpp): an engine joins when it
  // pulls from some rank in another process; one whose every rank runs here
  // takes their weights over the local plane and needs no device.
  if (rank_elsewhere)
    for (const auto& e : t.engines)
      if (node.empty() || e.node == node)
        for (std::int64_t w = 0; w < e.tp; ++w)
          out.push_back(gpu::comm_member::worker(e.name, static_cast<int>(w)));
  std::sort(out.begin(), out.end());
  return out;
}

int device_of(const std::vector<gpu::comm_member>& hosted, const gpu::comm_member& m) {
  auto it = std::find(hosted.begin(), hosted.end(), m);
  if (it == hosted.end())
    throw std::invalid_argument(m.describe() + " does not run in this process");
  return static_cast<int>(it - hosted.begin());
}

static_assert(gpu::max_comm_members == topology_limits::max_nccl_members, "validation bounds what NCCL takes");

std::string nccl_device_problem(const std::vector<gpu::comm_member>& hosted, const gpu::device_info& devices) {
  if (hosted.size() <= static_cast<std::size_t>(std::max(devices.device_count, 0)))
    return {};
  return "transfer.backend nccl: this process hosts " + std::to_string(hosted.size()) + " communicator members ("
         + hosted.front().describe() + (hosted.size() > 1 ? " ... " + hosted.back().describe() : std::string{})
         + "), each on a GPU of its own, and sees " + std::to_string(devices.device_count) + " CUDA devices"
         + (devices.detail.empty() ? std::string{} : " (" + devices.detail + ")");
}

std::size_t nccl_staging_bytes(const topology& t) {
  const auto& c = t.model.config;
  const auto group = plan::largest_group_bytes(c, llama_parameter_specs(c, dtype::f32), dtype::f32) + 8;
  // A bucket of whole groups is at most bucket_bytes (topology-checked ≤ max_bucket_bytes).
  const auto bucket = t.transfer.collective ? static_cast<std::uint64_t>(t.transfer.bucket_bytes) : 0;
  return static_cast<std::size_t>(std::max<std::uint64_t>(group, bucket));
}

std::shared_ptr<gpu::nccl_membership> make_nccl_membership(const topology& t, std::vector<gpu::comm_member> hosted,
                                                           gpu::nccl_membership::link_factory make,
                                                           gpu::nccl_membership::packer_factory packers) {
  if (make) { // a fake world's links stage in host memory: so does its packing
    if (!packers)
      packers = [packer = gpu::host_pack_device()](const gpu::comm_member&) { return packer; };
    return std::make_shared<gpu::nccl_membership>(std::move(make), std::move(packers));
  }
  const auto visible = gpu::query_devices(); // once: what the process sees does not change under it
  if (auto why = nccl_device_problem(hosted, visible); !why.empty())
    throw std::runtime_error(why);
  const auto capacity = nccl_staging_bytes(t);
  // Each member packs on the device of its own link.
  packers = [hosted](const gpu::comm_member& m) { return gpu::cuda_pack_device(device_of(hosted, m)); };
  auto links = [hosted = std::move(hosted), capacity, devices = visible.device_count](
                 const gpu::nccl_id& id, const gpu::comm_layout& layout, int rank) {
      const auto& member = layout.members.at(static_cast<std::size_t>(rank));
      const int device = device_of(hosted, member);
      if (device >= devices)
        throw std::runtime_error(member.describe() + " takes device " + std::to_string(device) + " (member "
                                 + std::to_string(device + 1) + " of " + std::to_string(hosted.size())
                                 + " this process hosts), and it sees " + std::to_string(devices)
                                 + " CUDA devices: give it one GPU per member");
      return gpu::nccl_link(id, layout, rank, device, capacity);
    };
  return std::make_shared<gpu::nccl_membership>(std::move(links), std::move(packers));
}

std::function<std::string(const nccl_rendezvous_msg&)> engine_nccl_join(std::shared_ptr<gpu::nccl_membership> m,
                                                                         std::string engine, int tp) {
  std::vector<gpu::comm_member> workers;
  for (int w = 0; w < tp; ++w)
    workers.push_back(gpu::comm_member::worker(engine, w));
  return [m = std::move(m), workers = std::move(workers)](const nccl_rendezvous_msg& msg) -> std::string {
    try {
      return m->join(gpu::from_wire(msg), workers);
    } catch (const std::exception& e) { // a rendezvous a peer mangled
      return e.what();
    }
  };
}

nccl_puller::link_of nccl_links(std::shared_ptr<gpu::nccl_membership> m) {
  return [m = std::move(m)](const std::string& engine, int worker) {
    return m->link(gpu::comm_member::worker(engine, worker));
  };
}

nccl_puller::link_of nccl_root_links(std::shared_ptr<gpu::nccl_membership> m, int rank) {
  return [m = std::move(m), rank](const std::string& engine, int worker) {
    return m->root_link(gpu::comm_member::worker(engine, worker), rank);
  };
}

int engine_device_ordinal(const gpu::nccl_membership* m, const std::string& engine) {
  if (!m)
    return 0;
  try {
    if (auto packer = m->packer(gpu::comm_member::worker(engine, 0)))
      return packer->ordinal();
  } catch (const std::invalid_argument&) {
    // Not hosted here: its ranks run in this process, and it joins no communicator.
  }
  return 0;
}

nccl_puller::packer_of nccl_packers(std::shared_ptr<gpu::nccl_membership> m) {
  return [m = std::move(m)](const std::string& engine, int worker) {
    return m->packer(gpu::comm_member::worker(engine, worker));
  };
}

} // namespace rlsync
