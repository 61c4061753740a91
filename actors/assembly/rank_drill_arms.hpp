#pragma once
// What `rlsync drill` asks of the trainer ranks a node process hosts, each
// by a signal the process turns into a call here (rlsync node
// --drill-events): withhold a group of one version (a rank kill or cut
// then lands while an engine waits for that group), or alter the bytes of
// the group 0 an engine receives. Thread-safe; armed only while attached
// (between the ranks' producers starting and stopping).
#include "actors/assembly/local_deployment.hpp"
#include "runtime/transfer/ucx/ucx_transfer.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace rlsync {

class rank_drill_arms {
public:
  /// `producers`: each rank's UCX producer in `ranks` order (empty for
  /// another backend); they must outlive detach().
  void attach(std::vector<hosted_rank> ranks, const std::vector<std::unique_ptr<transfer::ucx_producer>>& producers);
  void detach();

  /// Each rank here withholds the first group it holds of `version` (from
  /// its UCX producer and its local data plane) until `release_after` has
  /// passed: one line per rank, "trainer rank 1 withholds group 5 of v12
  /// (released after 10000 ms at the latest)"; none when no rank is here.
  std::vector<std::string> withhold(std::uint64_t version, std::chrono::milliseconds release_after);

  /// Each rank's UCX producer alters the next group 0 `engine` (empty: any)
  /// receives of `version` or later (0: any), once; one line per rank armed.
  std::vector<std::string> corrupt(const std::string& engine, std::uint64_t version);

private:
  std::mutex mutex_;
  std::vector<hosted_rank> ranks_;
  std::vector<transfer::ucx_producer*> producers_; ///< parallel to ranks_, or empty
};

} // namespace rlsync
