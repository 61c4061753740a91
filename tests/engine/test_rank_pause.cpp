// One pause across data-parallel ranks, as a table: every mode × every
// order in which 1–4 ranks reach their pause condition × a resume tried at
// every point of that order.
#include "runtime/engine/rank_pause.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>

using namespace rlsync;
using namespace rlsync::engine;
using phase = rank_pause::phase;

TEST_CASE("rank pause: every mode, every finishing order, a resume at every point") {
  int cases = 0;
  for (auto mode : {pause_mode::abort, pause_mode::wait, pause_mode::keep})
    for (int ranks = 1; ranks <= 4; ++ranks) {
      std::vector<int> order(static_cast<std::size_t>(ranks));
      std::iota(order.begin(), order.end(), 0);
      do {
        for (int resume_at = 0; resume_at <= ranks; ++resume_at) {
          CAPTURE(ranks);
          CAPTURE(resume_at);
          rank_pause p(ranks);
          p.begin(mode);
          CHECK(p.now() == phase::pausing);
          CHECK(p.mode() == mode);
          int completions = 0;
          for (int i = 0; i < ranks; ++i) {
            if (i == resume_at) {
              // Some rank is still on its way: refused, and nothing changes.
              CHECK_FALSE(p.resume());
              CHECK(p.now() == phase::pausing);
              CHECK(p.outstanding() == ranks - i);
              for (int j = 0; j < ranks; ++j)
                CHECK(p.has_reached(order[static_cast<std::size_t>(j)]) == (j < i));
            }
            bool done = p.reached(order[static_cast<std::size_t>(i)]);
            completions += done;
            CHECK(done == (i == ranks - 1)); // the last rank completes the pause, no earlier one
            CHECK_FALSE(p.reached(order[static_cast<std::size_t>(i)])); // a repeat changes nothing
          }
          CHECK(completions == 1);
          CHECK(p.now() == phase::paused);
          CHECK(p.outstanding() == 0);
          if (resume_at == ranks) {
            CHECK(p.resume()); // every rank restarts together
            CHECK(p.now() == phase::running);
            for (int r = 0; r < ranks; ++r)
              CHECK_FALSE(p.has_reached(r));
          }
          ++cases;
        }
      } while (std::next_permutation(order.begin(), order.end()));
    }
  CHECK(cases == 3 * (1 * 2 + 2 * 3 + 6 * 4 + 24 * 5));
}

TEST_CASE("rank pause: a pause over a pause starts over, events outside a pause are ignored") {
  rank_pause p(3);
  CHECK(p.now() == phase::running);
  CHECK_FALSE(p.reached(1)); // not pausing: ignored
  CHECK(p.resume());         // resuming a running engine is accepted
  p.begin(pause_mode::wait);
  p.reached(0);
  p.reached(2);
  p.begin(pause_mode::keep); // a second pause: every rank again
  CHECK(p.outstanding() == 3);
  CHECK(p.mode() == pause_mode::keep);
  p.reached(0);
  p.reached(1);
  CHECK(p.reached(2));
  p.begin(pause_mode::abort); // pausing a paused engine again
  CHECK(p.now() == phase::pausing);
  CHECK_FALSE(p.resume());
  CHECK_THROWS_AS(p.reached(3), std::out_of_range);
  CHECK_THROWS_AS(rank_pause(0), std::invalid_argument);
}
