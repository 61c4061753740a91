#pragma once
// The statistics every report quotes, defined once so that the same data
// give the same headline figure everywhere.
#include <algorithm>
#include <vector>

namespace rlsync {

/// The median: the middle value, or the mean of the two middle values of an
/// even count; 0 for no values.
inline double median(std::vector<double> xs) {
  if (xs.empty())
    return 0;
  std::sort(xs.begin(), xs.end());
  const auto n = xs.size();
  return n % 2 ? xs[n / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
}

} // namespace rlsync
