#pragma once
// The data plane's fault hooks, one type for every backend: what the drills
// ask a producer to do (alter the bytes of a group, never send a group) and
// what the backend asks before sending or receiving one. Thread-safe.
#include <chrono>
#include <cstdint>
#include <map>
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
  /// `version` is the first version to alter, not the only one. Last, so that
  /// positional initializers {engine, worker, version, group, times} keep their meaning.
  bool or_later = false;
};

class fault_hooks {
public:
  using clock = std::chrono::steady_clock;
  void corrupt(corruption c);
  /// Group `group` of `version` (0: any) is not sent before `until` (never,
  /// by default). A drill in another process bounds it, so that a fault
  /// that never comes cannot hang the version for good.
  void withhold(std::uint32_t group, std::uint64_t version, clock::time_point until = clock::time_point::max());
  void clear();
  /// Whether this reception is to be altered; uses up one of the corruption's times.
  bool take_corruption(const std::string& engine, int worker, std::uint64_t version, std::uint32_t group);
  /// Receptions of `engine` altered so far (a drill checks that its
  /// corruption landed, not only that it was armed).
  std::uint32_t corruptions_landed(const std::string& engine) const;
  bool is_withheld(std::uint64_t version, std::uint32_t group) const { return is_withheld_at(version, group, clock::now()); }
  /// is_withheld as of `now` (withholds released by then are dropped).
  bool is_withheld_at(std::uint64_t version, std::uint32_t group, clock::time_point now) const;

private:
  struct withheld_group {
    std::uint32_t group = 0;
    std::uint64_t version = 0; ///< 0: any
    clock::time_point until;
  };
  mutable std::mutex mutex_;
  std::vector<corruption> corruptions_;
  std::map<std::string, std::uint32_t> landed_; ///< per engine; one entry per engine a drill names
  mutable std::vector<withheld_group> withheld_;
};

} // namespace rlsync::transfer
