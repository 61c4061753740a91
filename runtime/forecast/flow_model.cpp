#include "runtime/forecast/flow_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace rlsync::forecast {

namespace {

void check(const std::vector<link>& links, const std::vector<flow>& flows) {
  for (const auto& l : links)
    if (!(l.bytes_per_s > 0) || !std::isfinite(l.bytes_per_s))
      throw std::invalid_argument("flow model: link '" + l.name + "' has capacity " + std::to_string(l.bytes_per_s)
                                  + " bytes/s; it must be positive and finite");
  for (std::size_t f = 0; f < flows.size(); ++f) {
    if (!(flows[f].bytes >= 0) || !std::isfinite(flows[f].bytes))
      throw std::invalid_argument("flow model: flow " + std::to_string(f) + " has " + std::to_string(flows[f].bytes)
                                  + " bytes");
    for (auto l : flows[f].links)
      if (l >= links.size())
        throw std::invalid_argument("flow model: flow " + std::to_string(f) + " crosses link " + std::to_string(l)
                                    + " of " + std::to_string(links.size()));
  }
}

// Each flow's links without repeats.
std::vector<std::size_t> distinct(std::vector<std::size_t> ls) {
  std::sort(ls.begin(), ls.end());
  ls.erase(std::unique(ls.begin(), ls.end()), ls.end());
  return ls;
}

} // namespace

std::vector<double> link_bytes(const std::vector<link>& links, const std::vector<flow>& flows) {
  check(links, flows);
  std::vector<double> out(links.size(), 0.0);
  for (const auto& f : flows)
    for (auto l : distinct(f.links))
      out[l] += f.bytes;
  return out;
}

flow_result simulate(const std::vector<link>& links, const std::vector<flow>& flows) {
  flow_result out;
  out.finish.assign(flows.size(), 0.0);
  out.bottleneck = links.size();

  out.link_bytes = link_bytes(links, flows); // checks the input
  // Each flow's links without repeats, and each link's flows.
  std::vector<std::vector<std::size_t>> crosses(flows.size());
  std::vector<std::vector<std::size_t>> carried(links.size());
  std::vector<double> remaining(flows.size());
  std::vector<std::size_t> active;
  for (std::size_t f = 0; f < flows.size(); ++f) {
    crosses[f] = distinct(flows[f].links);
    for (auto l : crosses[f])
      carried[l].push_back(f);
    remaining[f] = flows[f].bytes;
    if (flows[f].bytes > 0 && !crosses[f].empty())
      active.push_back(f);
  }
  for (std::size_t l = 0; l < links.size(); ++l) {
    const double load = out.link_bytes[l] / links[l].bytes_per_s;
    if (out.link_bytes[l] > 0 && (out.bottleneck == links.size() || load > out.light_seconds)) {
      out.bottleneck = l;
      out.light_seconds = load;
    }
  }

  std::vector<char> running(flows.size(), 0), fixed(flows.size(), 0);
  for (auto f : active)
    running[f] = 1;
  std::vector<double> rate(flows.size(), 0.0), capacity(links.size());
  std::vector<std::size_t> unfixed(links.size());
  double now = 0;
  while (!active.empty()) {
    // Water-filling: fix the flows of the most contended link, repeat.
    for (std::size_t l = 0; l < links.size(); ++l) {
      capacity[l] = links[l].bytes_per_s;
      unfixed[l] = 0;
    }
    for (auto f : active) {
      fixed[f] = 0;
      for (auto l : crosses[f])
        ++unfixed[l];
    }
    std::size_t left = active.size();
    while (left > 0) {
      std::size_t tightest = links.size();
      double share = std::numeric_limits<double>::infinity();
      for (std::size_t l = 0; l < links.size(); ++l)
        if (unfixed[l] > 0 && capacity[l] / static_cast<double>(unfixed[l]) < share) {
          share = capacity[l] / static_cast<double>(unfixed[l]);
          tightest = l;
        }
      for (auto f : carried[tightest]) {
        if (!running[f] || fixed[f])
          continue;
        fixed[f] = 1;
        rate[f] = share;
        --left;
        for (auto l : crosses[f]) {
          capacity[l] = std::max(0.0, capacity[l] - share);
          --unfixed[l];
        }
      }
    }
    // Advance to the next finish.
    double step = std::numeric_limits<double>::infinity();
    for (auto f : active)
      step = std::min(step, remaining[f] / rate[f]);
    if (!(step > 0) || !std::isfinite(step)) // cannot happen with positive capacities; never loop on it
      throw std::logic_error("flow model: no flow can advance (step " + std::to_string(step) + " s)");
    now += step;
    std::vector<std::size_t> still;
    still.reserve(active.size());
    for (auto f : active) {
      remaining[f] -= rate[f] * step;
      // Relative tolerance: flows finishing together finish in one step.
      if (remaining[f] <= flows[f].bytes * 1e-9) {
        running[f] = 0;
        out.finish[f] = now;
      } else {
        still.push_back(f);
      }
    }
    active.swap(still);
  }
  out.seconds = now;
  return out;
}

} // namespace rlsync::forecast
