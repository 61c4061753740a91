// The rollout-engine actor's pulls, on CAF's threaded scheduler (a pull
// runs on the engine's kept pulling thread): the M:N pull, where a transfer
// order naming two trainer ranks (each holding half the layers behind its
// own local transfer) makes the engine hold exactly the weights a
// single-rank pull gives; a pull an aborted round left running, which does
// not hold up the next round's and stops at its next group; and a version
// with no new bytes for an engine, which skips the data plane.
#include "actors/rollout_engine.hpp"
#include "actors/system_config.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/transfer/local/local_transfer.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

using namespace rlsync;

namespace {

std::shared_ptr<transfer::synthetic_source> source_holding(const model_config& c,
                                                           std::optional<std::vector<std::int64_t>> layers) {
  transfer::synthetic_options o;
  o.config = c;
  o.type = dtype::bf16;
  o.model_seed = 5;
  o.trainer_seed = 13;
  o.perturb = 0.05;
  o.threads = 2;
  o.held_layers = std::move(layers);
  return std::make_shared<transfer::synthetic_source>(std::move(o));
}

producer_holding holding_of(std::uint32_t rank, std::uint64_t incarnation, const transfer::weight_source& s) {
  producer_holding h{rank, incarnation, {}};
  for (const auto& spec : s.parameters())
    h.held.push_back(spec.name);
  std::sort(h.held.begin(), h.held.end());
  return h;
}

struct threaded_system {
  caf::actor_system_config cfg;
  caf::actor_system sys;
  threaded_system() : sys(init(cfg)) {}
  static caf::actor_system_config& init(caf::actor_system_config& c) {
    c.set("logger.file-verbosity", caf::atom("quiet"));
    register_rlsync_types(c);
    return c;
  }
};

rollout_engine_config engine_config(const model_config& c, const std::string& name) {
  rollout_engine_config cfg;
  cfg.model = c;
  cfg.options.name = name;
  cfg.options.tp = 2;
  cfg.self_stepping = false;
  cfg.transfer_deadline_ms = 10000;
  return cfg;
}

/// Holds the pulls of version `gated` until released (or their deadline),
/// and records which thread ran each version's worker-0 pull.
struct gated_puller : test::forwarding_puller {
  std::uint64_t gated = 0;
  std::mutex m;
  std::condition_variable cv;
  bool released = false;
  std::map<std::uint64_t, std::thread::id> thread_of;
  std::set<std::uint64_t> done;

  explicit gated_puller(std::shared_ptr<transfer::weight_puller> p, std::uint64_t v)
    : forwarding_puller(std::move(p)), gated(v) {}
  transfer::pull_report pull(const transfer::pull_request& req, const transfer::group_sink& sink) override {
    {
      std::unique_lock<std::mutex> lock(m);
      if (req.worker == 0)
        thread_of[req.version] = std::this_thread::get_id();
      if (req.version == gated && !cv.wait_until(lock, req.deadline, [&] { return released; }))
        throw transfer::transfer_error(transfer::transfer_failure::timeout, "gated");
    }
    struct on_return { // whether the pull succeeds or throws
      gated_puller* self;
      transfer::pull_request req;
      ~on_return() {
        std::lock_guard<std::mutex> lock(self->m);
        if (req.worker == 0)
          self->done.insert(req.version);
      }
    } mark{this, req};
    return inner->pull(req, sink);
  }
  bool returned(std::uint64_t v) {
    std::lock_guard<std::mutex> lock(m);
    return done.count(v) > 0;
  }
  void release() {
    std::lock_guard<std::mutex> lock(m);
    released = true;
    cv.notify_all();
  }
  std::thread::id thread_of_version(std::uint64_t v) {
    std::lock_guard<std::mutex> lock(m);
    auto it = thread_of.find(v);
    return it == thread_of.end() ? std::thread::id{} : it->second;
  }
};

/// start, transfer, finish; the digest of the weights then served.
weight_digest sync(caf::scoped_actor& self, const rollout_engine_actor& e, const transfer_order& order,
                   const std::vector<trainer_actor>& handles, std::string* failure = nullptr,
                   std::uint64_t* bytes = nullptr, bool nothing_to_pull = false) {
  const auto t = std::chrono::seconds(20);
  weight_digest out;
  auto fail = [&](const caf::error& err) {
    if (failure)
      *failure = self->system().render(err);
    else
      FAIL(self->system().render(err));
  };
  self->request(e, t, pause_atom::value, pause_request{pause_mode::keep, false}).receive([](const pause_report&) {}, fail);
  self->request(e, t, start_atom::value, order.version).receive([](const phase_ack&) {}, fail);
  bool transferred = false;
  self->request(e, t, transfer_atom::value, order, handles)
    .receive(
      [&](const transfer_report& r) {
        // Nothing moves only where the test expects the engine to hold the bytes already.
        transferred = r.version == order.version && (r.bytes > 0 || nothing_to_pull);
        if (bytes)
          *bytes = r.bytes;
      },
      fail);
  if (!transferred)
    return out;
  self->request(e, t, finish_atom::value, order.version).receive([](const phase_ack&) {}, fail);
  self->request(e, t, digest_atom::value).receive([&](const weight_digest& d) { out = d; }, fail);
  self->request(e, t, resume_atom::value).receive([](const phase_ack&) {}, fail);
  return out;
}

/// Engine "rollout-0" of model `c` over `puller`, on CAF's threaded scheduler.
struct engine_over {
  threaded_system ts;
  caf::scoped_actor self{ts.sys};
  rollout_engine_config cfg;
  rollout_engine_actor e;
  engine_over(const model_config& c, std::shared_ptr<transfer::weight_puller> puller)
    : cfg(engine_config(c, "rollout-0")) {
    cfg.puller = std::move(puller);
    e = spawn_rollout_engine(ts.sys, cfg);
  }
};

/// Pauses `e`, opens the session of version 1 and asks for its transfer
/// (sharded, local): the pull starts; its reply is the handle returned.
auto start_pull_of_v1(caf::scoped_actor& self, const rollout_engine_actor& e, std::chrono::seconds t) {
  auto fail = [&](const caf::error& err) { FAIL(self->system().render(err)); };
  self->request(e, t, pause_atom::value, pause_request{pause_mode::keep, false}).receive([](const pause_report&) {}, fail);
  self->request(e, t, start_atom::value, std::uint64_t{1}).receive([](const phase_ack&) {}, fail);
  return self->request(e, t, transfer_atom::value, transfer_order{1, transfer_mode::sharded, "local", {}},
                       std::vector<trainer_actor>{});
}

} // namespace

TEST_CASE("rollout engine: an order naming two trainer ranks gives the single-rank weights") {
  const model_config c = test::small_model(4);
  auto full = source_holding(c, std::nullopt);
  auto first = source_holding(c, std::vector<std::int64_t>{0, 1});
  auto second = source_holding(c, std::vector<std::int64_t>{2, 3});
  for (int v = 0; v < 2; ++v)
    for (auto& s : {full, first, second})
      s->produce_next();
  auto single = std::make_shared<transfer::local_transfer>(full);
  std::map<std::uint32_t, std::shared_ptr<transfer::weight_puller>> ranks = {
    {0, std::make_shared<transfer::local_transfer>(first)}, {1, std::make_shared<transfer::local_transfer>(second)}};
  std::map<std::pair<std::uint32_t, std::uint64_t>, int> made; // (rank, incarnation) -> pullers made

  threaded_system ts;
  caf::scoped_actor self{ts.sys};
  auto one_cfg = engine_config(c, "rollout-single");
  one_cfg.puller = single;
  auto one = spawn_rollout_engine(ts.sys, one_cfg);
  auto mn_cfg = engine_config(c, "rollout-mn");
  mn_cfg.producer_puller = [&](const producer_holding& h, const trainer_actor&) {
    ++made[{h.rank, h.incarnation}];
    return ranks.at(h.rank);
  };
  auto mn = spawn_rollout_engine(ts.sys, mn_cfg);

  const std::vector<trainer_actor> two_handles(2);
  for (std::uint64_t v : {1, 2}) {
    INFO("version " << v);
    auto want = sync(self, one, transfer_order{v, transfer_mode::sharded, "local", {}}, {});
    transfer_order order{v, transfer_mode::sharded, "local", {holding_of(0, 1, *first), holding_of(1, 1, *second)}};
    auto got = sync(self, mn, order, two_handles);
    REQUIRE(!want.names.empty());
    CHECK(got.version == v);
    CHECK_FALSE(got.dirty);
    CHECK(got.names == want.names);
    CHECK(got.checksums == want.checksums);
  }
  // One puller per rank incarnation, kept across rounds.
  CHECK(made == std::map<std::pair<std::uint32_t, std::uint64_t>, int>{{{0, 1}, 1}, {{1, 1}, 1}});

  // Rank 1 restarted: its new incarnation gets a puller of its own.
  for (auto& s : {full, first, second})
    s->produce_next();
  auto want = sync(self, one, transfer_order{3, transfer_mode::sharded, "local", {}}, {});
  auto got = sync(self, mn, {3, transfer_mode::sharded, "local", {holding_of(0, 1, *first), holding_of(1, 2, *second)}},
                  two_handles);
  CHECK(got.checksums == want.checksums);
  CHECK(made.at({1, 2}) == 1);

  // A layout leaving tensors unheld: the transfer fails, naming the tensor.
  for (auto& s : {full, first, second})
    s->produce_next();
  std::string failure;
  sync(self, mn, {4, transfer_mode::sharded, "local", {holding_of(0, 1, *first)}}, {trainer_actor{}}, &failure);
  CHECK(failure.find("model.layers.2.") != std::string::npos);

  // Handles that do not match the producers are refused.
  failure.clear();
  sync(self, mn, {4, transfer_mode::sharded, "local", {holding_of(0, 1, *first)}}, two_handles, &failure);
  CHECK(failure.find("names 1 producers but carries 2 handles") != std::string::npos);

  self->send_exit(one, caf::exit_reason::user_shutdown);
  self->send_exit(mn, caf::exit_reason::user_shutdown);
}

TEST_CASE("rollout engine: a pull an aborted round left running does not hold up the next round's") {
  const model_config c = test::small_model(2);
  auto full = source_holding(c, std::nullopt);
  full->produce_next();
  auto gate = std::make_shared<gated_puller>(std::make_shared<transfer::local_transfer>(full), 1);
  engine_over one(c, gate);
  auto& ts = one.ts;
  auto& self = one.self;
  const auto& e = one.e;
  const auto t = std::chrono::seconds(20);
  auto fail = [&](const caf::error& err) { FAIL(ts.sys.render(err)); };

  // Round 1: its pull blocks; the round is aborted (continue without finish).
  auto first = start_pull_of_v1(self, e, t);
  const auto until = std::chrono::steady_clock::now() + t;
  while (gate->thread_of_version(1) == std::thread::id{} && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(gate->thread_of_version(1) != std::thread::id{});
  self->request(e, t, resume_atom::value).receive([](const phase_ack&) {}, fail);
  bool aborted = false;
  first.receive([](const transfer_report&) {}, [&](const caf::error& err) { aborted = is(err, errc::round_aborted); });
  CHECK(aborted);

  // Round 2 completes while round 1's pull still blocks: on a thread of its own.
  full->produce_next();
  auto two = sync(self, e, transfer_order{2, transfer_mode::sharded, "local", {}}, {});
  CHECK(two.version == 2);
  CHECK_FALSE(two.dirty);
  CHECK(gate->thread_of_version(2) != gate->thread_of_version(1));

  // Round 1's pull ends late; its outcome is stale and changes nothing.
  gate->release();
  self->request(e, t, digest_atom::value).receive([&](const weight_digest& d) { CHECK(d.checksums == two.checksums); },
                                                  fail);

  // The kept thread is free again once the stale outcome reached the engine
  // (a message sent as the late pull returned, well before round 4's order).
  while (!gate->returned(1) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(gate->returned(1));
  for (std::uint64_t v : {3, 4}) {
    full->produce_next();
    auto d = sync(self, e, transfer_order{v, transfer_mode::sharded, "local", {}}, {});
    CHECK(d.version == v);
    CHECK_FALSE(d.dirty);
  }
  CHECK(gate->thread_of_version(4) == gate->thread_of_version(1));
  self->send_exit(e, caf::exit_reason::user_shutdown);
}

/// Passes the first group of each worker's pull straight on, then holds the
/// second at the sink until released: counts the groups stored after the
/// release and how each worker's pull ended.
struct group_gated_puller : test::forwarding_puller {
  using forwarding_puller::forwarding_puller;
  std::mutex m;
  std::condition_variable cv;
  bool released = false;
  int holding = 0; ///< workers held at their second group
  int stored_after = 0;
  std::vector<transfer::transfer_failure> failures;
  int returned = 0;
  transfer::pull_report pull(const transfer::pull_request& req, const transfer::group_sink& sink) override {
    transfer::group_sink gated = sink;
    gated.targets = [&, first = true](int w, std::uint32_t g) mutable {
      if (!first) {
        std::unique_lock<std::mutex> lock(m);
        ++holding;
        cv.notify_all();
        cv.wait_until(lock, req.deadline, [&] { return released; });
        ++stored_after;
      }
      first = false;
      return sink.targets(w, g);
    };
    struct on_return {
      group_gated_puller* self;
      ~on_return() {
        std::lock_guard<std::mutex> lock(self->m);
        ++self->returned;
        self->cv.notify_all();
      }
    } mark{this};
    try {
      return inner->pull(req, gated);
    } catch (const transfer::transfer_error& e) {
      std::lock_guard<std::mutex> lock(m);
      failures.push_back(e.failure);
      throw;
    }
  }
  bool wait_for(const std::function<bool()>& done) {
    std::unique_lock<std::mutex> lock(m);
    return cv.wait_for(lock, std::chrono::seconds(20), done);
  }
  void release() {
    std::lock_guard<std::mutex> lock(m);
    released = true;
    cv.notify_all();
  }
};

TEST_CASE("rollout engine: a pull its round abandoned stops at its next group") {
  const model_config c = test::small_model(6);
  auto full = source_holding(c, std::nullopt);
  full->produce_next();
  auto gate = std::make_shared<group_gated_puller>(std::make_shared<transfer::local_transfer>(full));
  engine_over one(c, gate);
  auto& ts = one.ts;
  auto& self = one.self;
  const auto& cfg = one.cfg;
  const auto& e = one.e;
  const auto t = std::chrono::seconds(20);
  auto fail = [&](const caf::error& err) { FAIL(ts.sys.render(err)); };

  auto pulling = start_pull_of_v1(self, e, t);
  // Both workers stored their first group and are about to store their second.
  REQUIRE(gate->wait_for([&] { return gate->holding == cfg.options.tp; }));
  self->request(e, t, resume_atom::value).receive([](const phase_ack&) {}, fail);
  pulling.receive([](const transfer_report&) { FAIL("an abandoned round's transfer succeeded"); },
                  [&](const caf::error& err) { CHECK(is(err, errc::round_aborted)); });
  gate->release();
  REQUIRE(gate->wait_for([&] { return gate->returned == cfg.options.tp; }));
  // The group each worker was storing completes; none of the four after it is pulled.
  CHECK(gate->stored_after == cfg.options.tp);
  CHECK(gate->failures
        == std::vector<transfer::transfer_failure>(static_cast<std::size_t>(cfg.options.tp),
                                                   transfer::transfer_failure::abandoned));

  // The engine stays usable: the next round completes.
  full->produce_next();
  auto two = sync(self, e, transfer_order{2, transfer_mode::sharded, "local", {}}, {});
  CHECK(two.version == 2);
  CHECK_FALSE(two.dirty);
  self->send_exit(e, caf::exit_reason::user_shutdown);
}

TEST_CASE("rollout engine: data-parallel ranks share one pull: bytes per engine for dp 1, 2, 4 are the same") {
  const model_config c = test::small_model(4);
  auto source = source_holding(c, std::nullopt);
  source->produce_next();
  threaded_system ts;
  caf::scoped_actor self{ts.sys};
  std::uint64_t plan_bytes = 0;
  for (int w = 0; w < 2; ++w)
    plan_bytes += plan::bytes_per_worker(engine::make_plan(c, 2, w, dtype::bf16));
  std::optional<weight_digest> first;
  for (int dp : {1, 2, 4}) {
    CAPTURE(dp);
    auto cfg = engine_config(c, "rollout-dp" + std::to_string(dp));
    cfg.options.dp = dp;
    cfg.puller = std::make_shared<transfer::local_transfer>(source);
    auto e = spawn_rollout_engine(ts.sys, cfg);
    std::uint64_t bytes = 0;
    auto got = sync(self, e, transfer_order{1, transfer_mode::sharded, "local", {}}, {}, nullptr, &bytes);
    MESSAGE("dp " << dp << ": " << bytes << " bytes pulled per engine (tp 2)");
    CHECK(bytes == plan_bytes); // each worker rank's shard once, not once per data-parallel rank
    CHECK(got.version == 1);
    CHECK_FALSE(got.dirty);
    if (!first)
      first = got;
    CHECK(got.checksums == first->checksums);
    self->send_exit(e, caf::exit_reason::user_shutdown);
  }
}

TEST_CASE("rollout engine: an order whose bytes the engine serves already pulls nothing") {
  const model_config c = test::small_model(2);
  transfer::synthetic_options o;
  o.config = c;
  o.perturb = 0; // every step publishes version 1's bytes
  auto source = std::make_shared<transfer::synthetic_source>(o);
  source->produce_next();
  struct counting_puller : test::forwarding_puller {
    using forwarding_puller::forwarding_puller;
    std::atomic<int> pulls{0};
    transfer::pull_report pull(const transfer::pull_request& req, const transfer::group_sink& sink) override {
      ++pulls;
      return inner->pull(req, sink);
    }
  };
  auto puller = std::make_shared<counting_puller>(std::make_shared<transfer::local_transfer>(source));
  threaded_system ts;
  caf::scoped_actor self{ts.sys};
  auto cfg = engine_config(c, "rollout-0");
  cfg.puller = puller;
  auto e = spawn_rollout_engine(ts.sys, cfg);
  auto order = [&](std::uint64_t v, std::uint64_t since) {
    transfer_order x{v, transfer_mode::sharded, "local", {}};
    x.same_bytes_since = since;
    return x;
  };

  // The cold sync: nothing served yet, so the engine pulls whatever the order says.
  std::uint64_t bytes = 0;
  auto v1 = sync(self, e, order(1, 1), {}, nullptr, &bytes);
  CHECK(bytes > 0);
  CHECK(puller->pulls == 2); // one per worker
  REQUIRE(!v1.names.empty());

  // Versions 2 and 3 hold version 1's bytes: no pull, served at once.
  for (std::uint64_t v : {2, 3}) {
    CAPTURE(v);
    source->produce_next();
    auto got = sync(self, e, order(v, 1), {}, nullptr, &bytes, true);
    CHECK(bytes == 0);
    CHECK(puller->pulls == 2);
    CHECK(got.version == v);
    CHECK_FALSE(got.dirty);
    CHECK(got.checksums == v1.checksums);
  }

  // Not known (0): the engine pulls, and serves the same weights.
  source->produce_next();
  auto four = sync(self, e, order(4, 0), {}, nullptr, &bytes);
  CHECK(bytes > 0);
  CHECK(puller->pulls == 4);
  CHECK(four.checksums == v1.checksums);

  // An order claiming bytes from a version past its own is refused.
  std::string failure;
  sync(self, e, order(5, 6), {}, &failure);
  CHECK(failure.find("same_bytes_since: 6 is past the version (5)") != std::string::npos);
  self->send_exit(e, caf::exit_reason::user_shutdown);
}
