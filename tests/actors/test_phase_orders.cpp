// How engines serve the coordinator's one-way phase orders
// (actors/phase_orders.hpp): the order's check, the answer carrying the
// order's token back to its sender, and the bound on orders held unanswered.
#include "actors/phase_orders.hpp"

#include "tests/support/coordinator_fixture.hpp"
#include "tests/support/phase_answer_sink.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace rlsync;
using namespace rlsync::test;

TEST_CASE("a phase order is checked before an engine acts on it") {
  auto valid = [] { return order_of(sync_phase::finish, 1); };
  struct row {
    const char* name;
    std::function<void(phase_order&)> change;
    const char* refusal; ///< a part of the reason; nullptr: accepted
  };
  const row rows[] = {
    {"as sent", [](phase_order&) {}, nullptr},
    {"the longest deadline", [](phase_order& o) { o.deadline_ms = max_phase_deadline_ms; }, nullptr},
    {"no deadline", [](phase_order& o) { o.deadline_ms = 0; }, "phase_order.deadline_ms"},
    {"a negative deadline", [](phase_order& o) { o.deadline_ms = -5; }, "phase_order.deadline_ms"},
    {"a deadline past a day", [](phase_order& o) { o.deadline_ms = max_phase_deadline_ms + 1; },
     "phase_order.deadline_ms"},
    {"the phase done", [](phase_order& o) { o.phase = sync_phase::done; }, "phase_order.phase"},
    {"a phase out of range", [](phase_order& o) { o.phase = static_cast<sync_phase>(42); }, "phase_order.phase"},
    {"a pause mode out of range", [](phase_order& o) { o.pause.mode = static_cast<pause_mode>(9); },
     "phase_order.pause_request.mode"},
    {"a transfer mode out of range", [](phase_order& o) { o.transfer.mode = static_cast<transfer_mode>(9); },
     "phase_order.transfer_order.mode"},
    {"a producer handle without its holding", [](phase_order& o) { o.producers.emplace_back(); },
     "phase_order.producers: 1 handles for 0 producers"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.name);
    auto o = valid();
    r.change(o);
    auto why = check(o);
    if (r.refusal == nullptr)
      CHECK(why.empty());
    else
      CHECK(why.find(r.refusal) != std::string::npos);
  }
}

TEST_CASE_FIXTURE(coordinator_fixture, "an engine answers a phase order to its sender with the order's token") {
  auto answers = std::make_shared<std::vector<answer>>();
  auto sink = spawn(answer_sink, answers);
  auto& e = spawn_engine("e", {{sync_phase::start, act::fail}});
  caf::send_as(sink, e.actor, phase_atom::value, order_of(sync_phase::pause, 7));
  caf::send_as(sink, e.actor, phase_atom::value, order_of(sync_phase::flush, 8));
  caf::send_as(sink, e.actor, phase_atom::value, order_of(sync_phase::start, 9));
  auto malformed = order_of(sync_phase::finish, 10);
  malformed.deadline_ms = 0;
  caf::send_as(sink, e.actor, phase_atom::value, malformed);
  run();
  REQUIRE(answers->size() == 4);
  std::map<std::uint64_t, std::string> by_token;
  for (auto& a : *answers)
    by_token[a.token] = a.what;
  CHECK(by_token[7] == "pause");
  CHECK(by_token[8] == "ack");
  CHECK(by_token[9].find("told to fail start") != std::string::npos); // the phase's own error
  CHECK(by_token[10].find("phase_order.deadline_ms") != std::string::npos);
  CHECK(e.script->starts == std::vector<std::uint64_t>{3}); // the order's version reached start
}

TEST_CASE_FIXTURE(coordinator_fixture, "an engine holds a bounded number of unanswered phase orders") {
  auto answers = std::make_shared<std::vector<answer>>();
  auto sink = spawn(answer_sink, answers);
  auto& e = spawn_engine("e", {{sync_phase::pause, act::hold}});
  for (std::uint64_t t = 1; t <= max_unanswered_phase_orders; ++t)
    caf::send_as(sink, e.actor, phase_atom::value, order_of(sync_phase::pause, t));
  run();
  CHECK(answers->empty()); // every one held
  // One more is refused at once: the engine would hold more than its bound.
  caf::send_as(sink, e.actor, phase_atom::value, order_of(sync_phase::pause, 5000));
  run();
  REQUIRE(answers->size() == 1);
  CHECK(answers->back().token == 5000);
  CHECK(answers->back().what.find("queue_full") != std::string::npos);
  // An answer frees a place: the oldest held goes out with its token, and the next order is held again.
  caf::anon_send(e.actor, release_atom::value);
  run();
  REQUIRE(answers->size() == 2);
  CHECK(answers->back().token == 1);
  CHECK(answers->back().what == "pause");
  caf::send_as(sink, e.actor, phase_atom::value, order_of(sync_phase::pause, 5001));
  run();
  CHECK(answers->size() == 2);
}
