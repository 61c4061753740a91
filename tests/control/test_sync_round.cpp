// The round's bookkeeping, row by row: each script is a list of events with
// what the state machine must answer and where it must be afterwards.
#include "runtime/control/sync_round.hpp"

#include <doctest/doctest.h>

#include <algorithm>

using namespace rlsync;
using P = sync_phase;

TEST_CASE("round_due: cadence and newcomers") {
  struct row {
    std::uint64_t newest, synced;
    std::int64_t every;
    bool newcomer, due;
  };
  const row rows[] = {
    {0, 0, 1, false, false}, // nothing published
    {1, 0, 1, false, true},
    {1, 1, 1, false, false}, // already synced
    {3, 1, 2, false, true},
    {2, 1, 2, false, false}, // one version behind, cadence two
    {5, 5, 1, true, true},   // a newcomer needs its cold sync
    {0, 0, 3, true, true},
    {2, 1, 0, false, true},  // cadence below 1 means every version
    {2, 1, -4, false, true},
    {1, 2, 1, false, false}, // never a round backwards
  };
  for (auto& r : rows) {
    CAPTURE(r.newest);
    CAPTURE(r.synced);
    CAPTURE(r.every);
    CAPTURE(r.newcomer);
    CHECK(round_due(r.newest, r.synced, r.every, r.newcomer) == r.due);
  }
}

namespace {

enum class op { ack, evict, advance };

struct step {
  op what;
  const char* name; // ack, evict
  P phase;          // ack: the phase acknowledged; advance: the phase expected after
  bool accepted;    // ack, evict: whether it changed anything
  bool barrier;     // after the step
};

void run_script(const char* title, std::vector<std::string> engines, const std::vector<step>& script,
                std::vector<std::string> live_at_end, std::vector<std::string> evicted_at_end) {
  CAPTURE(title);
  sync_round r{7, 3, std::move(engines)};
  CHECK(r.id() == 7);
  CHECK(r.version() == 3);
  int line = 0;
  for (auto& s : script) {
    CAPTURE(++line);
    switch (s.what) {
      case op::ack: CHECK(r.ack(s.name, s.phase) == s.accepted); break;
      case op::evict: CHECK(r.evict(s.name) == s.accepted); break;
      case op::advance: CHECK(r.advance() == s.phase); break;
    }
    CHECK(r.barrier_reached() == s.barrier);
  }
  CHECK(r.live() == live_at_end);
  CHECK(r.evicted() == evicted_at_end);
}

} // namespace

TEST_CASE("sync_round: every engine through every phase") {
  std::vector<step> script;
  for (auto p : {P::pause, P::flush, P::start, P::transfer, P::finish, P::resume}) {
    script.push_back({op::ack, "a", p, true, false});
    script.push_back({op::ack, "b", p, true, true});
    script.push_back({op::advance, "", next(p), false, p == P::resume});
  }
  run_script("all acknowledge", {"a", "b"}, script, {"a", "b"}, {});
}

TEST_CASE("sync_round: stale, duplicate and early acknowledgements change nothing") {
  run_script("stale", {"a", "b"},
             {
               {op::advance, "", P::pause, false, false}, // before the barrier: stays
               {op::ack, "a", P::flush, false, false},    // a phase early
               {op::ack, "a", P::pause, true, false},
               {op::ack, "a", P::pause, false, false},    // twice
               {op::ack, "x", P::pause, false, false},    // not in the round
               {op::ack, "b", P::pause, true, true},
               {op::advance, "", P::flush, false, false},
               {op::ack, "b", P::pause, false, false},    // a phase late
               {op::ack, "b", P::flush, true, false},
               {op::ack, "a", P::flush, true, true},
             },
             {"a", "b"}, {});
}

TEST_CASE("sync_round: an eviction can complete the barrier and late acks of the evicted are ignored") {
  run_script("evict", {"a", "b", "c"},
             {
               {op::ack, "a", P::pause, true, false},
               {op::ack, "c", P::pause, true, false},
               {op::evict, "b", P::pause, true, true}, // b missed its deadline
               {op::evict, "b", P::pause, false, true}, // and then died: nothing more
               {op::ack, "b", P::pause, false, true},  // its late acknowledgement
               {op::advance, "", P::flush, false, false},
               {op::ack, "b", P::flush, false, false},
               {op::ack, "a", P::flush, true, false},
               {op::evict, "a", P::flush, true, false}, // evicted after its ack
               {op::ack, "c", P::flush, true, true},
               {op::advance, "", P::start, false, false},
             },
             {"c"}, {"b", "a"});
}

TEST_CASE("sync_round: when every engine is evicted the round is done") {
  run_script("all evicted", {"a", "b"},
             {
               {op::ack, "a", P::pause, true, false},
               {op::advance, "", P::pause, false, false},
               {op::evict, "b", P::pause, true, true},
               {op::advance, "", P::flush, false, false},
               {op::evict, "a", P::flush, true, true},
               {op::advance, "", P::done, false, true},
               {op::advance, "", P::done, false, true}, // done stays done
               {op::evict, "a", P::done, false, true},
             },
             {}, {"b", "a"});
}

TEST_CASE("sync_round: a round without engines is done at once") {
  sync_round r{1, 0, {}};
  CHECK(r.done());
  CHECK(r.advance() == P::done);
  CHECK(!r.ack("a", P::pause));
  CHECK(!r.evict("a"));
}

TEST_CASE("sync_phase names and order") {
  CHECK(to_string(P::pause) == "pause");
  CHECK(to_string(P::resume) == "resume");
  CHECK(next(P::finish) == P::resume);
  CHECK(next(P::resume) == P::done);
  CHECK(next(P::done) == P::done);
}

TEST_CASE("sync_round: an abort skips the update and still resumes every live engine") {
  struct row {
    P abort_in;     ///< phase the round is in when it is aborted
    bool accepted;  ///< abort() returns
    P after;        ///< phase afterwards
  };
  const row rows[] = {
    {P::pause, true, P::resume},   {P::flush, true, P::resume},  {P::start, true, P::resume},
    {P::transfer, true, P::resume}, {P::finish, false, P::finish}, {P::resume, false, P::resume},
  };
  for (auto& r : rows) {
    CAPTURE(to_string(r.abort_in));
    sync_round round{1, 5, {"a", "b", "c"}};
    while (round.phase() != r.abort_in) {
      for (auto n : {"a", "b", "c"})
        round.ack(n, round.phase());
      round.advance();
    }
    round.evict("c");
    CHECK(round.abort() == r.accepted);
    CHECK(round.aborted() == r.accepted);
    CHECK(round.phase() == r.after);
    // Both live engines are pending in resume (or still in finish); an ack
    // of an abandoned phase is stale.
    CHECK(round.waiting_on("a"));
    CHECK(round.waiting_on("b"));
    CHECK(!round.waiting_on("c"));
    if (r.accepted)
      CHECK(!round.ack("a", r.abort_in));
    while (!round.done()) {
      auto phase = round.phase();
      CHECK(round.ack("a", phase));
      CHECK(round.ack("b", phase));
      round.advance();
    }
  }
  sync_round empty_live{2, 5, {"a"}};
  empty_live.evict("a");
  CHECK(empty_live.abort()); // nobody left to resume: done
  CHECK(empty_live.done());
  CHECK(!empty_live.abort()); // done already
}

namespace {

/// Acknowledges the current phase for every engine of the current wave.
void ack_wave(sync_round& r) {
  for (auto& name : r.wave_engines())
    CHECK(r.ack(name, r.phase()));
}

/// Runs the current wave from its phase through resume; returns the phases seen.
void finish_wave(sync_round& r) {
  auto wave = r.wave();
  while (!r.done() && r.wave() == wave) {
    ack_wave(r);
    r.advance();
  }
}

} // namespace

TEST_CASE("sync_round: waves of at most N, in snapshot order, each pause to resume") {
  struct row {
    std::size_t engines, wave_size, waves, last_wave;
  };
  const row rows[] = {{5, 2, 3, 1}, {5, 0, 1, 5}, {5, 5, 1, 5}, {5, 9, 1, 5}, {4, 2, 2, 2}, {1, 1, 1, 1}, {3, 1, 3, 1}};
  for (auto& r : rows) {
    CAPTURE(r.engines);
    CAPTURE(r.wave_size);
    std::vector<std::string> names;
    for (std::size_t i = 0; i < r.engines; ++i)
      names.push_back("e" + std::to_string(i));
    sync_round round{1, 4, names, r.wave_size};
    CHECK(round.waves() == r.waves);
    std::vector<std::string> order;
    for (std::size_t w = 0; w < r.waves; ++w) {
      CAPTURE(w);
      REQUIRE(round.wave() == w);
      auto wave = round.wave_engines();
      CHECK(wave.size() == (w + 1 == r.waves ? r.last_wave : r.wave_size));
      order.insert(order.end(), wave.begin(), wave.end());
      for (auto p : {P::pause, P::flush, P::start, P::transfer, P::finish, P::resume}) {
        CHECK(round.phase() == p);
        CHECK(!round.wave_ending());
        for (auto& n : wave) {
          CHECK(round.waiting_on(n));
          CHECK(round.still_to_sync(n));
        }
        // Engines of other waves are not asked anything.
        for (auto& n : names)
          if (std::find(wave.begin(), wave.end(), n) == wave.end()) {
            CHECK(!round.waiting_on(n));
            CHECK(!round.ack(n, p));
          }
        ack_wave(round);
        CHECK(round.wave_ending() == (p == P::resume));
        round.advance();
      }
      for (auto& n : wave)
        CHECK(!round.still_to_sync(n)); // its wave ended
    }
    CHECK(round.done());
    CHECK(order == names); // every engine once, in snapshot order
    CHECK(round.live() == names);
  }
}

TEST_CASE("sync_round: evictions in one wave do not stop the next, an emptied wave is skipped") {
  sync_round r{1, 4, {"a", "b", "c", "d", "e"}, 2};
  // Wave 1: a, b complete.
  finish_wave(r);
  CHECK(r.wave() == 1);
  CHECK(r.wave_engines() == std::vector<std::string>{"c", "d"});
  CHECK(!r.evict("a")); // a's wave ended: it is done with the round
  // Wave 2: d fails in transfer.
  ack_wave(r);
  r.advance();
  ack_wave(r);
  r.advance();
  ack_wave(r);
  r.advance();
  CHECK(r.phase() == P::transfer);
  CHECK(r.ack("c", P::transfer));
  CHECK(!r.barrier_reached());
  CHECK(r.evict("d"));
  CHECK(r.barrier_reached());
  r.advance();
  finish_wave(r);
  // Wave 3 runs regardless.
  REQUIRE(!r.done());
  CHECK(r.wave() == 2);
  CHECK(r.phase() == P::pause);
  CHECK(r.wave_engines() == std::vector<std::string>{"e"});
  finish_wave(r);
  CHECK(r.done());
  CHECK(r.evicted() == std::vector<std::string>{"d"});
  CHECK(r.live() == std::vector<std::string>{"a", "b", "c", "e"});
  CHECK(!r.aborted());

  // A later wave whose engines all left before it started is skipped.
  sync_round s{2, 4, {"a", "b", "c", "d", "e"}, 2};
  CHECK(!s.in_current_wave("c"));
  CHECK(s.still_to_sync("c"));
  CHECK(s.evict("c")); // died while waiting for its wave
  CHECK(s.evict("d"));
  CHECK(s.barrier_reached() == false); // wave 1 still waits on a and b
  finish_wave(s);
  CHECK(s.wave() == 2);
  CHECK(s.wave_engines() == std::vector<std::string>{"e"});
  finish_wave(s);
  CHECK(s.done());
}

TEST_CASE("sync_round: an abort in a wave starts no later wave") {
  struct row {
    P abort_in;
    bool accepted;
    P after;
    bool wave_aborted;
  };
  // In wave 2 of 3; from finish on the wave completes, but wave 3 is dropped.
  const row rows[] = {
    {P::pause, true, P::resume, true},   {P::transfer, true, P::resume, true},
    {P::finish, true, P::finish, false}, {P::resume, true, P::resume, false},
  };
  for (auto& r : rows) {
    CAPTURE(to_string(r.abort_in));
    sync_round round{1, 5, {"a", "b", "c", "d", "e"}, 2};
    finish_wave(round);
    while (round.phase() != r.abort_in) {
      ack_wave(round);
      round.advance();
    }
    CHECK(round.abort() == r.accepted);
    CHECK(!round.abort()); // nothing more to abandon
    CHECK(round.aborted());
    CHECK(round.wave_aborted() == r.wave_aborted);
    CHECK(round.phase() == r.after);
    CHECK(round.waiting_on("c"));
    CHECK(round.waiting_on("d"));
    finish_wave(round);
    CHECK(round.done()); // wave 3 never starts
    CHECK(round.live() == std::vector<std::string>{"a", "b", "c", "d", "e"});
  }
  // In the last wave from finish on there is nothing to abandon.
  sync_round last{2, 5, {"a", "b", "c"}, 2};
  finish_wave(last);
  for (int i = 0; i < 4; ++i) {
    ack_wave(last);
    last.advance();
  }
  CHECK(last.phase() == P::finish);
  CHECK(!last.abort());
  CHECK(!last.aborted());
}

TEST_CASE("sync_round: a full round over 1000 engines costs O(engines) bookkeeping") {
  for (std::size_t wave_size : {std::size_t{0}, std::size_t{10}, std::size_t{1}}) {
    CAPTURE(wave_size);
    std::vector<std::string> names;
    for (int i = 0; i < 1000; ++i)
      names.push_back("engine-" + std::to_string(i));
    sync_round r{1, 2, names, wave_size};
    // What the coordinator does per reply: a waiting_on check, then the ack;
    // one eviction per wave of ten, as failures would.
    std::size_t evictions = 0;
    while (!r.done()) {
      auto wave = r.wave_engines();
      for (std::size_t i = 0; i < wave.size(); ++i) {
        auto& n = wave[i];
        if (r.phase() == P::transfer && i == 0 && wave.size() > 1 && evictions < 100) {
          CHECK(r.evict(n));
          ++evictions;
          continue;
        }
        CHECK(r.waiting_on(n));
        CHECK(r.ack(n, r.phase()));
        (void) r.barrier_reached();
      }
      r.advance();
    }
    // Per engine: one step to build the round, and per phase one step to
    // list the wave, one to make it pending and a lookup each for the check
    // and the ack: about 1 + 6 * 4 = 25. Linear search would cost hundreds
    // of steps per reply at this size (millions in all).
    CHECK(r.ops() < 30 * 1000);
    CHECK(r.ops() > 1000);
  }
}
