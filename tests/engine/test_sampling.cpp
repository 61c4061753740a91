// Sampling, the tokenizer and the worker pool.
#include "runtime/config/model_config.hpp"
#include "runtime/engine/sampling.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "runtime/engine/worker_pool.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <set>
#include <stdexcept>
#include <vector>

using namespace rlsync;
using namespace rlsync::engine;

namespace {
std::vector<float> spread_logits() {
  std::vector<float> l(300);
  for (std::size_t i = 0; i < l.size(); ++i)
    l[i] = static_cast<float>((i * 37) % 101) / 25.0f; // many close candidates
  return l;
}
} // namespace

TEST_CASE("sampling: greedy, seeded, nucleus") {
  auto logits = spread_logits();
  const auto best = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  sampling_params greedy;
  CHECK(sample(logits.data(), 300, greedy, 0) == best);

  sampling_params hot;
  hot.temperature = 1.5f;
  hot.seed = 1234;
  std::vector<std::int32_t> a, b, other;
  for (std::uint64_t i = 0; i < 64; ++i) {
    a.push_back(sample(logits.data(), 300, hot, i));
    b.push_back(sample(logits.data(), 300, hot, i));
  }
  CHECK(a == b); // reproducible from (seed, index) alone
  CHECK(std::set<std::int32_t>(a.begin(), a.end()).size() > 8);
  hot.seed = 99;
  for (std::uint64_t i = 0; i < 64; ++i)
    other.push_back(sample(logits.data(), 300, hot, i));
  CHECK(other != a);

  // A tiny nucleus keeps only the most probable token.
  hot.top_p = 1e-6f;
  for (std::uint64_t i = 0; i < 32; ++i)
    CHECK(sample(logits.data(), 300, hot, i) == best);
  // A partial nucleus only ever picks from the top tokens.
  hot.top_p = 0.3f;
  for (std::uint64_t i = 0; i < 64; ++i)
    CHECK(logits[static_cast<std::size_t>(sample(logits.data(), 300, hot, i))] >= logits[best] - 1.0f);

  CHECK(sample_uniform(1, 2) == sample_uniform(1, 2));
  CHECK(sample_uniform(1, 2) != sample_uniform(1, 3));
  CHECK(sample_uniform(1, 2) >= 0.0);
  CHECK(sample_uniform(1, 2) < 1.0);
}

TEST_CASE("tokenizer: bytes round-trip, specials skipped") {
  auto t = encode("hé\n");
  CHECK(t.front() == token_bos);
  CHECK(decode(t) == "hé\n");
  std::string binary(256, '\0');
  for (int i = 0; i < 256; ++i)
    binary[static_cast<std::size_t>(i)] = static_cast<char>(i);
  auto all = encode(binary);
  CHECK(all.size() == 257);
  CHECK(decode(all) == binary);
  CHECK(decode({static_cast<std::int32_t>(token_bos), 'o', 'k', static_cast<std::int32_t>(token_eos), 299}) == "ok");
}

TEST_CASE("worker pool: barriers hold every round, a failure reaches the caller without a hang") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    worker_pool pool(n);
    std::vector<int> slots(static_cast<std::size_t>(n));
    for (int round = 0; round < 200; ++round) {
      std::atomic<int> bad{0};
      pool.run([&](int w) {
        slots[static_cast<std::size_t>(w)] = round;
        pool.barrier();
        for (int v : slots) // everyone wrote before anyone passed
          if (v != round)
            ++bad;
        pool.barrier();
      });
      REQUIRE(bad == 0);
    }
    CHECK_THROWS_WITH_AS(pool.run([&](int w) {
      if (w == n - 1)
        throw std::runtime_error("worker failed");
      pool.barrier();
      pool.barrier();
    }),
                         "worker failed", std::runtime_error);
    int ran = 0;
    pool.run([&](int w) {
      if (w == 0)
        ran = 1;
    });
    CHECK(ran == 1); // usable after a failure
  }
}

TEST_CASE("worker pool: a killed worker's thread ends and every later run fails at once, never hangs") {
  for (int n : {1, 2, 4})
    for (int victim = 0; victim < n; ++victim) {
      CAPTURE(n);
      CAPTURE(victim);
      worker_pool pool(n);
      pool.run([&](int) { pool.barrier(); });
      CHECK(pool.dead() == -1);
      pool.kill(victim);
      pool.kill(victim); // again: nothing more
      CHECK(pool.dead() == victim);
      for (int i = 0; i < 3; ++i)
        CHECK_THROWS_WITH_AS(pool.run([&](int) { pool.barrier(); }),
                             ("engine worker " + std::to_string(victim) + " died").c_str(), worker_died);
      if (n > 1) {
        pool.kill((victim + 1) % n); // a second death: the first stays the one reported
        CHECK(pool.dead() == victim);
      }
    } // the destructor joins the threads that remain, and the dead ones
  CHECK_THROWS_AS(worker_pool(2).kill(2), std::out_of_range);
}

TEST_CASE("to_valid_utf8 keeps valid text and replaces each invalid byte with U+FFFD") {
  using rlsync::engine::to_valid_utf8;
  CHECK(to_valid_utf8("plain ascii") == "plain ascii");
  CHECK(to_valid_utf8("gr\xC3\xBC\xC3\x9F" "e \xE2\x82\xAC \xF0\x9F\x98\x80") == "gr\xC3\xBC\xC3\x9F" "e \xE2\x82\xAC \xF0\x9F\x98\x80");
  CHECK(to_valid_utf8("a\xFFz") == "a\xEF\xBF\xBDz");
  CHECK(to_valid_utf8("\xC3") == "\xEF\xBF\xBD");                 // truncated
  CHECK(to_valid_utf8("\xC0\xAF") == "\xEF\xBF\xBD\xEF\xBF\xBD"); // overlong
  CHECK(to_valid_utf8("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"); // surrogate
}

TEST_CASE("logprobs_of: log_softmax of the raw logits, top-k most probable first") {
  struct row {
    std::vector<float> logits;
    std::int32_t token;
    std::uint32_t k;
    float logprob;
    std::vector<std::int32_t> top;
  };
  const float ln2 = std::log(2.0f), ln3 = std::log(3.0f), ln4 = std::log(4.0f);
  const std::vector<row> rows = {
    {{0, 0}, 0, 0, -ln2, {}},                 // two equal: each log(1/2)
    {{0, 0, 0, 0}, 3, 2, -ln4, {0, 1}},       // ties: lower id first
    {{1000, 1000, 1000}, 1, 1, -ln3, {0}},    // large logits: no overflow
    {{0, std::log(3.0f)}, 1, 5, -std::log(4.0f / 3.0f), {1, 0}}, // k capped at vocab
    {{-5, 7, 2}, 1, 3, -std::log(1.0f + std::exp(-12.0f) + std::exp(-5.0f)), {1, 2, 0}},
  };
  for (const auto& r : rows) {
    CAPTURE(r.token);
    auto lp = logprobs_of(r.logits.data(), static_cast<std::int64_t>(r.logits.size()), r.token, r.k);
    CHECK(lp.logprob == doctest::Approx(r.logprob).epsilon(1e-5));
    CHECK(lp.top_tokens == r.top);
    REQUIRE(lp.top_logprobs.size() == r.top.size());
    for (std::size_t i = 0; i < r.top.size(); ++i) {
      auto direct = logprobs_of(r.logits.data(), static_cast<std::int64_t>(r.logits.size()), r.top[i], 0);
      CHECK(lp.top_logprobs[i] == direct.logprob);
      if (i > 0)
        CHECK(lp.top_logprobs[i] <= lp.top_logprobs[i - 1]);
    }
  }
  // Probabilities sum to one over the whole vocabulary.
  auto logits = spread_logits();
  double total = 0;
  for (std::int32_t t = 0; t < 300; ++t)
    total += std::exp(static_cast<double>(logprobs_of(logits.data(), 300, t, 0).logprob));
  CHECK(total == doctest::Approx(1.0).epsilon(1e-5));
}
