#pragma once
// A doctest fixture on CAF's deterministic scheduler (caf-0.17.md §12):
// nothing runs until the test says so, and time moves only when the test
// moves it, so deadlines are tested without sleeping.
//
//   run()            runs every queued job; never fires a timeout
//   advance(d)       moves simulated time by d, fires what is due, runs
//   request<T>(...)  a request from a throwaway client; the answer lands in
//                    the returned slot once the test runs the scheduler
//   expect_msg<..>() asserts on the next message of one actor, then runs it
//
// Actors spawned through spawn() are killed when the fixture ends, because
// ~actor_system waits forever on a live actor; those handed to stop_first()
// are stopped before them, with user_shutdown, so that an actor that answers
// its waiting requesters when it stops (a router) does.
// Do not use caf/test/dsl.hpp's expect() here: it needs CAF's own test runner
// and crashes under doctest.
#include "actors/system_config.hpp"

#include <caf/actor.hpp>
#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/expected.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/send.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

namespace rlsync::test {

class actor_fixture {
public:
  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scheduler::test_coordinator& sched;

  actor_fixture()
    : sys(init(cfg)), sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {}

  ~actor_fixture() {
    shutdown();
  }

  /// Stops every actor the fixture knows and runs what follows. The
  /// destructor does it too; a fixture whose actors call back into its own
  /// members calls it from its destructor, while those members still live.
  void shutdown() {
    for (auto& a : std::exchange(stopped_first_, {}))
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    sched.run(teardown_job_limit);
    for (auto& a : std::exchange(tracked_, {}))
      caf::anon_send_exit(a, caf::exit_reason::kill);
    // Clients still waiting on a request finish at their timeout. Bounded
    // (messages going round forever included), so that a bug shows up as a
    // failure rather than a hang.
    for (int i = 0; i < 100 && (sched.has_job() || sched.has_pending_timeout()); ++i) {
      sched.run(teardown_job_limit);
      sched.trigger_timeouts();
    }
  }

  actor_fixture(const actor_fixture&) = delete;
  actor_fixture& operator=(const actor_fixture&) = delete;

  /// Spawns an actor that the fixture kills at the end.
  template <class... Ts>
  auto spawn(Ts&&... xs) {
    auto handle = sys.spawn(std::forward<Ts>(xs)...);
    tracked_.push_back(caf::actor_cast<caf::actor>(handle));
    return handle;
  }

  /// Stops `h` at the end with user_shutdown, before the others are killed
  /// (also one spawned elsewhere, e.g. by spawn_router).
  template <class Handle>
  void stop_first(const Handle& h) {
    stopped_first_.push_back(caf::actor_cast<caf::actor>(h));
  }

  /// Runs every queued job. Timeouts do not fire.
  std::size_t run() {
    return sched.run();
  }

  /// Moves simulated time forward by `d`, fires the timeouts now due and
  /// runs everything that follows from them.
  void advance(caf::timespan d) {
    sched.advance_time(d);
    sched.run();
  }

  /// Where the answer to request() lands: empty until it arrived.
  template <class T>
  using slot = std::shared_ptr<std::optional<caf::expected<T>>>;

  /// Sends `xs...` to `dst` as a request from a throwaway client (it quits
  /// once answered). The request's own deadline is an hour of simulated
  /// time: only the fixture's teardown ever reaches it.
  template <class T, class Handle, class... Ts>
  slot<T> request(const Handle& dst, Ts... xs) {
    auto out = std::make_shared<std::optional<caf::expected<T>>>();
    sys.spawn([=](caf::event_based_actor* self) {
      self->request(dst, std::chrono::seconds(3600), xs...) // caf::duration has no hours
        .then([=](T& x) { *out = std::move(x); }, [=](caf::error& err) { *out = std::move(err); });
    });
    return out;
  }

  /// Sends `xs...` to `dst` as a one-way message from a local client actor
  /// (enqueued at once, like anon_send): guarded actors refuse anonymous
  /// senders, as they would a peer nobody admitted.
  template <class Handle, class... Ts>
  void tell(const Handle& dst, Ts&&... xs) {
    if (!client_)
      client_ = spawn([](caf::event_based_actor* self) -> caf::behavior {
        self->set_default_handler(caf::skip); // answers to one-way messages, if any: no reply to them
        return {[](caf::exit_msg&) {}};
      });
    caf::send_as(client_, dst, std::forward<Ts>(xs)...);
  }

  /// Whether the next message in `dst`'s mailbox matches `Ts...`.
  template <class... Ts, class Handle>
  bool next_msg_is(const Handle& dst) {
    auto ptr = peek(dst);
    return ptr != nullptr && ptr->content().template match_elements<Ts...>();
  }

  /// Asserts that the next message in `dst`'s mailbox matches `Ts...`,
  /// lets `dst` handle it, and returns its content.
  template <class... Ts, class Handle>
  std::tuple<Ts...> expect_msg(const Handle& dst) {
    auto ptr = peek(dst);
    REQUIRE_MESSAGE(ptr != nullptr, "no message for the actor");
    REQUIRE_MESSAGE(ptr->content().template match_elements<Ts...>(),
                    "unexpected message: " << caf::to_string(ptr->content()));
    // A copy: get_as_tuple refers into the message, which run_once consumes.
    std::tuple<Ts...> result = ptr->content().template get_as_tuple<Ts...>();
    sched.run_once();
    return result;
  }

private:
  static caf::actor_system_config& init(caf::actor_system_config& c) {
    c.set("scheduler.policy", caf::atom("testing"));
    c.set("logger.file-verbosity", caf::atom("quiet"));
    register_rlsync_types(c);
    return c;
  }

  template <class Handle>
  caf::mailbox_element* peek(const Handle& dst) {
    if (!sched.prioritize(dst))
      return nullptr; // not scheduled: its mailbox is empty
    return sched.next_job<caf::abstract_actor>().peek_at_next_mailbox_element();
  }

  /// Jobs per pass of shutdown() (100 passes at most).
  static constexpr std::size_t teardown_job_limit = 10'000;

  caf::actor client_; ///< tell()'s sender
  std::vector<caf::actor> tracked_;
  std::vector<caf::actor> stopped_first_;
};

} // namespace rlsync::test
