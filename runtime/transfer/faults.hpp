#pragma once
// The data plane's fault hooks, one type for every backend: what the drills
// ask a producer to do (alter the bytes of a group, never send a group) and
// what the backend asks before sending or receiving one. Thread-safe.
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace rlsync::transfer {

/// Alter the bytes a worker receives for a group, after the producer
/// computed their checksum (the "corrupted transfer bytes" drill).
struct corruption {
  std::string engine;        ///< empty: any engine
  int worker = -1;           ///< -1: any worker
  std::uint64_t version = 0; ///< 0: any version
  std::uint32_t group = 0;
  std::uint32_t times = 1;   ///< receptions to alter
};

class fault_hooks {
public:
  void corrupt(corruption c);
  /// Group `group` of `version` (0: any) is never sent.
  void withhold(std::uint32_t group, std::uint64_t version);
  void clear();
  /// Whether this reception is to be altered; uses up one of the corruption's times.
  bool take_corruption(const std::string& engine, int worker, std::uint64_t version, std::uint32_t group);
  bool is_withheld(std::uint64_t version, std::uint32_t group) const;

private:
  mutable std::mutex mutex_;
  std::vector<corruption> corruptions_;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> withheld_; // (group, version or 0)
};

} // namespace rlsync::transfer
