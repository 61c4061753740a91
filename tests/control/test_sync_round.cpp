// The round's bookkeeping, row by row: each script is a list of events with
// what the state machine must answer and where it must be afterwards.
#include "runtime/control/sync_round.hpp"

#include <doctest/doctest.h>

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
