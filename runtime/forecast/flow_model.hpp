#pragma once
// A fluid model of a fabric: links with a capacity (bytes per second), flows
// with a size and the links they cross. Every flow starts at time 0; at every
// moment the rates are max-min fair (water-filling: the most contended link
// splits its capacity evenly among its unfinished flows, those flows are
// fixed, the rest share what is left), and they are recomputed whenever a
// flow finishes. Pure, deterministic; the planner (forecast/predict.hpp)
// feeds it one phase of a sync at a time.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rlsync::forecast {

struct link {
  std::string name;        ///< "t3.gpu5 nic out"
  double bytes_per_s = 0;  ///< capacity, > 0
};

struct flow {
  double bytes = 0;                ///< >= 0
  std::vector<std::size_t> links;  ///< indices into the links; may be empty (never bounded)
};

struct flow_result {
  double seconds = 0;                ///< when the last flow finished (0 with no bytes)
  std::vector<double> finish;        ///< per flow
  std::vector<double> link_bytes;    ///< per link: bytes that crossed it
  /// The link whose load over its capacity is largest (the bottleneck a
  /// speed of light is set by); links.size() when no bytes moved.
  std::size_t bottleneck = 0;
  /// That load over capacity: the phase's speed of light, in seconds.
  double light_seconds = 0;
};

/// Bytes that cross each link (a link a flow names twice counts once).
/// Throws what simulate throws for bad input.
std::vector<double> link_bytes(const std::vector<link>& links, const std::vector<flow>& flows);

/// Runs the flows to completion. Throws std::invalid_argument for a
/// capacity that is not positive and finite, negative or non-finite bytes,
/// or a link index out of range; a flow with bytes and no links finishes at 0.
flow_result simulate(const std::vector<link>& links, const std::vector<flow>& flows);

} // namespace rlsync::forecast
