#pragma once
// Whether every engine serves the trainer's weights: each engine's weight
// checksums (the coordinator collects them from local and remote members
// alike) against the trainer's snapshot of the same version.
#include "actors/interfaces.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/transfer/weight_source.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace rlsync {

/// One engine's weights against the trainer's for the same version.
struct engine_verification {
  std::string engine;
  std::uint64_t version = 0;
  bool dirty = false;
  std::size_t shards = 0;     ///< parameter shards compared
  std::size_t mismatched = 0; ///< shards whose checksum differs
  std::string error;          ///< why nothing could be compared
  bool member = true;         ///< false: not a member at the end (never registered, or dead)

  bool ok() const { return error.empty() && !dirty && mismatched == 0 && shards > 0; }
};

/// Compares every engine's weight checksums, shard by shard, with the
/// trainer's snapshot of the same version run through the same loader.
/// Engines of the topology without a digest are reported unverified.
std::vector<engine_verification> verify_weights(const topology& t, const transfer::weight_source& source,
                                                const std::vector<weight_digest>& digests);

/// As above, against the trainer ranks' sources together: each tensor from
/// the first source holding it at the engine's version (null sources are
/// skipped). A version some rank no longer holds is unverified.
std::vector<engine_verification> verify_weights(const topology& t,
                                                const std::vector<const transfer::weight_source*>& sources,
                                                const std::vector<weight_digest>& digests);

} // namespace rlsync
