#include "runtime/engine/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace rlsync::engine {

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::int32_t argmax(const float* logits, std::int64_t vocab) {
  std::int64_t best = 0;
  for (std::int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best])
      best = i;
  return static_cast<std::int32_t>(best);
}

} // namespace

double sample_uniform(std::uint64_t seed, std::uint64_t token_index) {
  const std::uint64_t bits = splitmix64(seed ^ splitmix64(token_index));
  return static_cast<double>(bits >> 11) * 0x1.0p-53; // 53 random bits
}

std::int32_t sample(const float* logits, std::int64_t vocab, const sampling_params& p,
                    std::uint64_t token_index) {
  if (!(p.temperature > 0.0f) || vocab <= 1)
    return argmax(logits, vocab);

  // Softmax in double, shifted by the maximum.
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const float top = logits[argmax(logits, vocab)];
  std::vector<double> prob(static_cast<std::size_t>(vocab));
  double total = 0.0;
  for (std::int64_t i = 0; i < vocab; ++i) {
    prob[static_cast<std::size_t>(i)] = std::exp((static_cast<double>(logits[i]) - top) * inv_t);
    total += prob[static_cast<std::size_t>(i)];
  }

  // Candidates in order of decreasing probability (ties: lower id first),
  // cut at the nucleus. With top_p >= 1 every token stays, in id order.
  std::vector<std::int32_t> order(static_cast<std::size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::size_t keep = order.size();
  double mass = total;
  if (p.top_p < 1.0f) {
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
      return prob[static_cast<std::size_t>(a)] > prob[static_cast<std::size_t>(b)];
    });
    const double want = std::max(0.0, static_cast<double>(p.top_p)) * total;
    mass = 0.0;
    keep = 0;
    while (keep < order.size() && (keep == 0 || mass < want))
      mass += prob[static_cast<std::size_t>(order[keep++])];
  }

  const double u = sample_uniform(p.seed, token_index) * mass;
  double acc = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += prob[static_cast<std::size_t>(order[i])];
    if (u < acc)
      return order[i];
  }
  return order[keep - 1]; // rounding left u at the very top
}

token_logprobs logprobs_of(const float* logits, std::int64_t vocab, std::int32_t token, std::uint32_t top_k) {
  token_logprobs out;
  if (vocab <= 0 || token < 0 || token >= vocab)
    return out;
  // log_softmax in double, shifted by the maximum so that exp never overflows.
  const double top = static_cast<double>(logits[argmax(logits, vocab)]);
  double total = 0.0;
  for (std::int64_t i = 0; i < vocab; ++i)
    total += std::exp(static_cast<double>(logits[i]) - top);
  const double log_total = top + std::log(total);
  auto logprob = [&](std::int64_t i) { return static_cast<float>(static_cast<double>(logits[i]) - log_total); };
  out.logprob = logprob(token);
  auto k = static_cast<std::size_t>(std::min<std::int64_t>(top_k, vocab));
  if (k == 0)
    return out;
  std::vector<std::int32_t> order(static_cast<std::size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](std::int32_t a, std::int32_t b) {
                      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                    });
  out.top_tokens.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
  for (auto t : out.top_tokens)
    out.top_logprobs.push_back(logprob(t));
  return out;
}

} // namespace rlsync::engine
