// The M:N pull: engine workers pulling from several trainer ranks, each
// behind its own local transfer, receive exactly the single-rank bytes;
// replicas of a layer range split the workers as the holder rule says and
// pack each sub-plan once per version; a failing holder is retried on
// another, a pull the engine let go is not; with none left the error names
// what was tried.
#include "runtime/engine/loader.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/plan/holders.hpp"
#include "runtime/transfer/holder_pull.hpp"
#include "runtime/transfer/store_in_place.hpp"
#include "runtime/transfer/local/local_transfer.hpp"
#include "runtime/transfer/ucx/ucx_transfer.hpp"

#include "tests/support/engine_fixtures.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include <doctest/doctest.h>

#include <condition_variable>

#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

using namespace rlsync;
using namespace rlsync::transfer;
using namespace std::chrono_literals;
using rlsync::test::in;

namespace {

std::shared_ptr<synthetic_source> source_holding(const model_config& c, std::optional<std::vector<std::int64_t>> layers,
                                                 std::optional<std::vector<std::int64_t>> experts = std::nullopt) {
  synthetic_options o;
  o.config = c;
  o.type = dtype::bf16;
  o.model_seed = 3;
  o.trainer_seed = 11;
  o.perturb = 0.05;
  o.keep_versions = 2;
  o.threads = 2;
  o.held_layers = std::move(layers);
  o.held_experts = std::move(experts);
  return std::make_shared<synthetic_source>(std::move(o));
}

producer_holding holding_of(std::uint32_t rank, const weight_source& s) {
  producer_holding h{rank, 1, {}};
  for (const auto& spec : s.parameters())
    h.held.push_back(spec.name);
  std::sort(h.held.begin(), h.held.end());
  return h;
}

/// Records, per (engine, worker, group), which puller sent bytes: a spy
/// between the M:N pull and a backend.
class spying_puller final : public test::forwarding_puller {
public:
  using forwarding_puller::forwarding_puller;
  pull_report pull(const pull_request& req, const group_sink& sink) override {
    group_sink spy = sink;
    spy.on_group = [&](int w, std::uint32_t g, const std::uint8_t* bytes, std::size_t size) {
      if (size > 0) {
        std::lock_guard<std::mutex> lock(mutex);
        sent.insert({req.engine, w, g});
      }
      sink.on_group(w, g, bytes, size);
    };
    return inner->pull(req, spy);
  }
  std::mutex mutex;
  std::set<std::tuple<std::string, int, std::uint32_t>> sent;
};

/// One engine pulling through the M:N pull: weights, plans, links.
struct mn_engine {
  std::string name;
  model_config config;
  std::shared_ptr<engine::weight_set> weights;
  std::vector<std::shared_ptr<const plan::worker_plan>> plans;
  std::vector<plan::grouped_plan> grouped;
  std::vector<std::shared_ptr<producer_link>> links;
  std::mutex mutex;
  std::map<int, std::set<std::uint32_t>> received; // worker -> groups the sink saw
  std::map<int, std::uint64_t> received_bytes;      // worker -> packed bytes the sink saw
  bool twice = false;                               // a group reached the sink twice for one worker

  mn_engine(std::string n, const model_config& c, int tp,
            const std::vector<std::pair<producer_holding, std::shared_ptr<weight_puller>>>& producers,
            bool expert_parallel = false)
      : name(std::move(n)), config(c), weights(engine::weight_set::make(c, tp, dtype::bf16, expert_parallel)) {
    for (int w = 0; w < tp; ++w) {
      plans.push_back(
        std::make_shared<const plan::worker_plan>(engine::make_plan(c, tp, w, dtype::bf16, expert_parallel)));
      grouped.emplace_back(c, plans.back());
    }
    for (const auto& [h, p] : producers)
      links.push_back(std::make_shared<producer_link>(h, p));
  }

  group_sink sink() {
    group_sink s;
    s.on_group = [this](int w, std::uint32_t g, const std::uint8_t* bytes, std::size_t size) {
      engine::apply_group(grouped[static_cast<std::size_t>(w)], g, bytes, size, weights->workers[static_cast<std::size_t>(w)]);
      note(w, g, size);
    };
    s.on_full_group = [this](int w, std::uint32_t g, const std::vector<tensor_view>& tensors) {
      auto& dst = weights->workers[static_cast<std::size_t>(w)];
      for (const auto& t : tensors)
        if (!ignored_weight(config, t.name))
          engine::load_weight(*engine::real_weight(t.name, t.type, t.shape, t.data), dst);
      std::lock_guard<std::mutex> lock(mutex);
      received[w].insert(g);
    };
    return s;
  }

  void note(int w, std::uint32_t g, std::size_t size) {
    std::lock_guard<std::mutex> lock(mutex);
    twice = twice || !received[w].insert(g).second;
    received_bytes[w] += size;
  }

  transfer_report pull(std::uint64_t v, transfer_mode mode = transfer_mode::sharded,
                       std::chrono::milliseconds deadline = 10s) {
    received.clear();
    received_bytes.clear();
    return pull_from_holders(config, {name, v, mode, in(deadline)}, plans, links, sink());
  }
};

/// Pulls `v` on every engine at once.
void pull_all(std::vector<std::unique_ptr<mn_engine>>& engines, std::uint64_t v,
              transfer_mode mode = transfer_mode::sharded, std::chrono::milliseconds deadline = 10s) {
  std::vector<std::future<transfer_report>> runs;
  for (auto& e : engines)
    runs.push_back(std::async(std::launch::async, [&e, v, mode, deadline] { return e->pull(v, mode, deadline); }));
  for (auto& r : runs)
    r.get();
}

} // namespace

TEST_CASE("a source holding half the layers has exactly the all-holding source's bytes, version by version") {
  const model_config c = test::small_model(4);
  auto full = source_holding(c, std::nullopt);
  auto first = source_holding(c, std::vector<std::int64_t>{0, 1});
  auto second = source_holding(c, std::vector<std::int64_t>{2, 3});
  for (std::uint64_t v = 1; v <= 3; ++v) {
    auto f = full->produce_next();
    auto a = first->produce_next();
    auto b = second->produce_next();
    CHECK(a->tensors().size() + b->tensors().size() == f->tensors().size());
    for (const auto& half : {a, b})
      for (const auto& t : half->tensors()) {
        INFO("version " << v << " tensor " << t.name);
        const auto* want = f->find(t.name);
        REQUIRE(want != nullptr);
        CHECK(test::bytes_of(t) == test::bytes_of(*want));
      }
  }
  CHECK(first->held_groups() == std::vector<std::uint32_t>{0, 1});
  CHECK(second->held_groups() == std::vector<std::uint32_t>{2, 3});
}

TEST_CASE("M:N pull from two pipeline halves gives every worker the single-rank bytes") {
  const model_config c = test::small_model(4);
  auto full = source_holding(c, std::nullopt);
  auto first = source_holding(c, std::vector<std::int64_t>{0, 1});
  auto second = source_holding(c, std::vector<std::int64_t>{2, 3});
  auto t0 = std::make_shared<local_transfer>(first);
  auto t1 = std::make_shared<local_transfer>(second);
  const std::vector<std::pair<producer_holding, std::shared_ptr<weight_puller>>> producers = {
    {holding_of(0, *first), t0}, {holding_of(1, *second), t1}};
  for (int tp : {1, 2, 4})
    for (std::size_t replicas : {std::size_t{1}, std::size_t{3}}) {
      INFO("tp " << tp << ", " << replicas << " replicas");
      std::vector<std::unique_ptr<mn_engine>> engines;
      for (std::size_t r = 0; r < replicas; ++r)
        engines.push_back(std::make_unique<mn_engine>("rollout-" + std::to_string(r), c, tp, producers));
      for (std::uint64_t v = 1; v <= 2; ++v) {
        INFO("version " << v);
        if (full->find(v) == nullptr) {
          full->produce_next();
          first->produce_next();
          second->produce_next();
        }
        pull_all(engines, v);
        const auto want = test::loaded(*full->find(v), tp);
        for (auto& e : engines) {
          test::check_identical(*e->weights, *want);
          CHECK_FALSE(e->twice);
          for (int w = 0; w < tp; ++w)
            CHECK(e->received[w].size() == 4);
        }
      }
      // The report: the single-rank bytes, every group.
      auto report = engines.front()->pull(2);
      std::uint64_t want_bytes = 0;
      for (const auto& p : engines.front()->plans)
        want_bytes += plan::bytes_per_worker(*p);
      CHECK(report.bytes == want_bytes);
      CHECK(report.groups == 4);
      CHECK(report.engine == "rollout-0");
      CHECK(report.version == 2);
    }
}

namespace {

/// A backend that says each pull took `took`, of which it waited `waited`
/// and stored for `stored`.
class timed_puller final : public test::forwarding_puller {
public:
  timed_puller(std::shared_ptr<weight_puller> inner, std::chrono::milliseconds took, std::chrono::milliseconds waited,
               std::chrono::milliseconds stored)
      : forwarding_puller(std::move(inner)), took(took), waited(waited), stored(stored) {}
  pull_report pull(const pull_request& req, const group_sink& sink) override {
    auto r = inner->pull(req, sink);
    r.duration = took;
    r.waited = waited;
    r.stored = stored;
    return r;
  }
  std::chrono::milliseconds took, waited, stored;
};

} // namespace

namespace {

/// Records, across the pullers that share `journal`, the order in which
/// (rank, worker) parts started and how many ran at once at most; says it
/// needs rank order in broadcast mode when `ordered`.
struct part_journal {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::pair<std::uint32_t, int>> started; // (rank, worker)
  int running = 0, most = 0;
};

class ordered_puller final : public test::forwarding_puller {
public:
  ordered_puller(std::shared_ptr<weight_puller> inner, std::uint32_t rank, bool ordered,
                 std::shared_ptr<part_journal> journal)
      : forwarding_puller(std::move(inner)), rank(rank), ordered(ordered), journal(std::move(journal)) {}
  bool needs_rank_order(transfer_mode mode) const override { return ordered && mode == transfer_mode::broadcast; }
  pull_report pull(const pull_request& req, const group_sink& sink) override {
    {
      std::unique_lock<std::mutex> lock(journal->mutex);
      journal->started.emplace_back(rank, req.worker);
      journal->most = std::max(journal->most, ++journal->running);
      journal->changed.notify_all();
      if (needs_rank_order(req.mode)) // one at a time: a part pulled at once would overlap this one
        journal->changed.wait_for(lock, std::chrono::milliseconds(20));
      else // at once: each waits (boundedly) for the other to have started
        journal->changed.wait_for(lock, std::chrono::seconds(5), [&] { return journal->running >= 2; });
    }
    auto r = inner->pull(req, sink);
    std::lock_guard<std::mutex> lock(journal->mutex);
    --journal->running;
    return r;
  }
  std::uint32_t rank;
  bool ordered;
  std::shared_ptr<part_journal> journal;
};

} // namespace

TEST_CASE("M:N pull: a backend of collectives takes the ranks one at a time, in rank order, in broadcast mode") {
  const model_config c = test::small_model(4);
  auto first = source_holding(c, std::vector<std::int64_t>{0, 1});
  auto second = source_holding(c, std::vector<std::int64_t>{2, 3});
  auto whole = source_holding(c, std::nullopt);
  for (auto* s : {&whole, &first, &second})
    (*s)->produce_next();
  for (auto mode : {transfer_mode::broadcast, transfer_mode::sharded}) {
    CAPTURE(to_string(mode));
    auto journal = std::make_shared<part_journal>();
    // Rank 1 listed first: the order comes from the ranks, not the list.
    const std::vector<std::pair<producer_holding, std::shared_ptr<weight_puller>>> producers = {
      {holding_of(1, *second), std::make_shared<ordered_puller>(std::make_shared<local_transfer>(second), 1, true, journal)},
      {holding_of(0, *first), std::make_shared<ordered_puller>(std::make_shared<local_transfer>(first), 0, true, journal)}};
    mn_engine e("rollout-0", c, 1, producers);
    e.pull(1, mode);
    test::check_identical(*e.weights, *test::loaded(*whole->find(1), 1));
    if (mode == transfer_mode::broadcast) {
      CHECK(journal->most == 1);
      CHECK(journal->started == std::vector<std::pair<std::uint32_t, int>>{{0, 0}, {1, 0}});
    } else {
      CHECK(journal->most == 2); // not collectives: both ranks at once
    }
  }
}

TEST_CASE("M:N pull: a worker's wait and store are its slowest part's, and the engine reports its slowest worker's") {
  using namespace std::chrono_literals;
  const model_config c = test::small_model(4);
  auto first = source_holding(c, std::vector<std::int64_t>{0, 1});
  auto second = source_holding(c, std::vector<std::int64_t>{2, 3});
  auto whole = source_holding(c, std::nullopt);
  // Rank 1's part took longer, though rank 0's waited and stored longer.
  auto t0 = std::make_shared<timed_puller>(std::make_shared<local_transfer>(first), 10ms, 6ms, 3ms);
  auto t1 = std::make_shared<timed_puller>(std::make_shared<local_transfer>(second), 20ms, 2ms, 1ms);
  auto all = std::make_shared<timed_puller>(std::make_shared<local_transfer>(whole), 10ms, 3ms, 5ms);
  for (auto* s : {&whole, &first, &second})
    (*s)->produce_next();
  for (int ranks : {1, 2}) {
    CAPTURE(ranks);
    std::vector<std::pair<producer_holding, std::shared_ptr<weight_puller>>> producers;
    if (ranks == 2)
      producers = {{holding_of(0, *first), t0}, {holding_of(1, *second), t1}};
    else
      producers = {{holding_of(0, *whole), all}};
    mn_engine e("rollout-0", c, 2, producers);
    const auto report = e.pull(1);
    CHECK(report.wait_ns == (ranks == 2 ? 2'000'000u : 3'000'000u));
    CHECK(report.store_ns == (ranks == 2 ? 1'000'000u : 5'000'000u));
  }
}

namespace {

/// A backend that holds what it sends "on a device" (host memory here): it
/// lands each group's runs through the sink's land targets, as the nccl
/// puller does from its staging, before handing the group on.
class landing_puller final : public test::forwarding_puller {
public:
  using forwarding_puller::forwarding_puller;
  bool lands_on_device() const override { return true; }
  pull_report pull(const pull_request& req, const group_sink& sink) override {
    group_sink through = sink;
    through.on_group = [&](int w, std::uint32_t g, const std::uint8_t* bytes, std::size_t size) {
      const auto* at = bytes;
      for (const auto& t : landing_targets(sink, w, g, size)) {
        sink.on_device(t, at, 0);
        at += t.bytes;
      }
      sink.on_group(w, g, bytes, size);
    };
    return inner->pull(req, through);
  }
};

} // namespace

TEST_CASE("M:N pull: what each rank's backend holds on a device lands at the engine's targets for its part") {
  const model_config c = test::small_model(4);
  auto first = source_holding(c, std::vector<std::int64_t>{0, 1});
  auto second = source_holding(c, std::vector<std::int64_t>{2, 3});
  first->produce_next();
  second->produce_next();
  const std::vector<std::pair<producer_holding, std::shared_ptr<weight_puller>>> producers = {
    {holding_of(0, *first), std::make_shared<landing_puller>(std::make_shared<local_transfer>(first))},
    {holding_of(1, *second), std::make_shared<landing_puller>(std::make_shared<local_transfer>(second))}};
  const int tp = 2;
  mn_engine e("rollout-0", c, tp, producers);
  std::mutex mutex;
  std::map<const std::uint8_t*, std::vector<std::uint8_t>> landed;
  auto sink = e.sink();
  sink.targets = [&](int w, std::uint32_t g) {
    std::vector<store_target> out;
    for (const auto& r : engine::group_destinations(e.grouped[static_cast<std::size_t>(w)], g,
                                                    e.weights->workers[static_cast<std::size_t>(w)]))
      out.push_back({r.at, r.bytes});
    return out;
  };
  sink.on_device = [&](const store_target& t, const void* bytes, int) {
    std::lock_guard<std::mutex> lock(mutex);
    const auto* b = static_cast<const std::uint8_t*>(bytes);
    landed[t.at].assign(b, b + t.bytes);
  };
  // No on_stored: the M:N pull hands packed bytes on (targets for landing only).
  pull_from_holders(c, {e.name, 1, transfer_mode::sharded, in(10s)}, e.plans, e.links, sink);
  // Every entry of every worker landed once, with the bytes the host set holds there.
  std::size_t entries = 0;
  for (int w = 0; w < tp; ++w)
    for (std::uint32_t g = 0; g < e.grouped[static_cast<std::size_t>(w)].group_count(); ++g)
      for (const auto& t : sink.targets(w, g)) {
        ++entries;
        const auto it = landed.find(t.at);
        REQUIRE(it != landed.end());
        CHECK(std::memcmp(it->second.data(), t.at, t.bytes) == 0);
      }
  CHECK(landed.size() == entries);
  // Without the engine's targets nothing is offered for landing.
  landed.clear();
  sink.targets = nullptr;
  pull_from_holders(c, {e.name, 1, transfer_mode::sharded, in(10s)}, e.plans, e.links, sink);
  CHECK(landed.empty());
}

TEST_CASE("M:N pull, EP-local: two ranks holding different experts of the same blocks") {
  // Expert parallelism in the trainer: both ranks hold every layer's dense
  // tensors, each half of every sparse layer's experts. Each engine worker
  // pulls each expert from the rank holding it and receives exactly what its
  // loader writes: with expert parallelism only its own experts, whole.
  const model_config c = test::tiny_moe_config(2); // 8 experts, layers 1-3 sparse
  auto full = source_holding(c, std::nullopt);
  auto low = source_holding(c, std::nullopt, std::vector<std::int64_t>{0, 1, 2, 3});
  auto high = source_holding(c, std::nullopt, std::vector<std::int64_t>{4, 5, 6, 7});
  for (auto& s : {full, low, high})
    s->produce_next();
  auto tl = std::make_shared<local_transfer>(low);
  auto th = std::make_shared<local_transfer>(high);
  const std::vector<std::pair<producer_holding, std::shared_ptr<weight_puller>>> producers = {
    {holding_of(0, *low), tl}, {holding_of(1, *high), th}};
  for (bool ep : {false, true})
    for (int tp : {1, 2, 4}) {
      CAPTURE(ep);
      CAPTURE(tp);
      mn_engine e("rollout-0", c, tp, producers, ep);
      auto report = e.pull(1);
      test::check_identical(*e.weights, *test::loaded(*full->find(1), tp, ep));
      CHECK_FALSE(e.twice);
      std::uint64_t total = 0;
      for (int w = 0; w < tp; ++w) {
        CHECK(e.received_bytes[w] == plan::bytes_per_worker(*e.plans[static_cast<std::size_t>(w)]));
        total += e.received_bytes[w];
      }
      CHECK(report.bytes == total);
      if (ep) // worker 0's plan names its own experts only: it never gathers another's
        for (const auto& entry : e.plans[0]->entries)
          if (auto x = plan::expert_of(entry.source))
            CHECK(*x < 8 / tp);
      auto b = e.pull(1, transfer_mode::broadcast);
      test::check_identical(*e.weights, *test::loaded(*full->find(1), tp, ep));
      CHECK(b.groups == static_cast<std::uint32_t>(c.num_hidden_layers));
    }
}

TEST_CASE("M:N pull, broadcast: each tensor from its chosen holder, the single-rank weights") {
  const model_config c = test::small_model(4);
  auto full = source_holding(c, std::nullopt);
  auto a = source_holding(c, std::nullopt);
  auto first = source_holding(c, std::vector<std::int64_t>{0, 1});
  auto second = source_holding(c, std::vector<std::int64_t>{2, 3});
  for (auto& s : {full, a, first, second})
    s->produce_next();
  // A replica of everything and two halves: three producers, overlapping.
  auto ta = std::make_shared<local_transfer>(a);
  auto t0 = std::make_shared<local_transfer>(first);
  auto t1 = std::make_shared<local_transfer>(second);
  for (int tp : {1, 2}) {
    INFO("tp " << tp);
    mn_engine e("rollout-0", c, tp, {{holding_of(0, *a), ta}, {holding_of(1, *first), t0}, {holding_of(2, *second), t1}});
    auto report = e.pull(1, transfer_mode::broadcast);
    test::check_identical(*e.weights, *test::loaded(*full->find(1), tp));
    CHECK(report.groups == 4);
  }
}

TEST_CASE("M:N pull: replicas of one layer range split workers by the rule and pack each sub-plan once") {
  const model_config c = test::small_model(4);
  auto full = source_holding(c, std::nullopt);
  auto a = source_holding(c, std::nullopt); // two ranks holding every layer: data-parallel replicas
  auto b = source_holding(c, std::nullopt);
  local_transfer_options o;
  o.join_grace = 5s; // every registered replica joins one pass, however the threads are scheduled
  auto ta = std::make_shared<local_transfer>(a, o);
  auto tb = std::make_shared<local_transfer>(b, o);
  auto spy_a = std::make_shared<spying_puller>(ta);
  auto spy_b = std::make_shared<spying_puller>(tb);
  const int tp = 2;
  std::vector<std::unique_ptr<mn_engine>> engines;
  for (int r = 0; r < 3; ++r)
    engines.push_back(std::make_unique<mn_engine>(
      "rollout-" + std::to_string(r), c, tp,
      std::vector<std::pair<producer_holding, std::shared_ptr<weight_puller>>>{{holding_of(0, *a), spy_a},
                                                                              {holding_of(1, *b), spy_b}}));
  for (std::uint64_t v = 1; v <= 3; ++v) {
    INFO("version " << v);
    for (auto& s : {full, a, b})
      s->produce_next();
    const auto before_a = ta->stats();
    const auto before_b = tb->stats();
    pull_all(engines, v);
    for (auto& e : engines)
      test::check_identical(*e->weights, *test::loaded(*full->find(v), tp));
    if (v == 1)
      continue; // the first pull registers the sub-plans as it goes: replicas may start apart
    // Each producer has two streams (workers 0 and 1, their sub-plans) of the
    // 4 groups it holds: 8 packs per version, however many replicas pull.
    CHECK(ta->stats().passes - before_a.passes == 2);
    CHECK(tb->stats().passes - before_b.passes == 2);
    CHECK(ta->stats().packs - before_a.packs == 8);
    CHECK(tb->stats().packs - before_b.packs == 8);
  }
  // Worker w takes group g from rank (w + g) % 2, in every replica.
  for (auto& e : engines)
    for (int w = 0; w < tp; ++w)
      for (std::uint32_t g = 0; g < 4; ++g) {
        INFO(e->name << " worker " << w << " group " << g);
        const bool from_a = (static_cast<std::uint32_t>(w) + g) % 2 == 0;
        CHECK(spy_a->sent.count({e->name, w, g}) == (from_a ? 1u : 0u));
        CHECK(spy_b->sent.count({e->name, w, g}) == (from_a ? 0u : 1u));
      }
}

TEST_CASE("M:N pull: a holder failing mid-pull is retried on the other holder, bytes unchanged") {
  const model_config c = test::small_model(4);
  auto full = source_holding(c, std::nullopt);
  auto a = source_holding(c, std::nullopt);
  auto b = source_holding(c, std::nullopt);
  for (auto& s : {full, a, b})
    s->produce_next();
  auto ta = std::make_shared<local_transfer>(a);
  auto tb = std::make_shared<local_transfer>(b);
  const std::vector<std::pair<producer_holding, std::shared_ptr<weight_puller>>> producers = {
    {holding_of(0, *a), ta}, {holding_of(1, *b), tb}};

  SUBCASE("a withheld group: the holder times out at half the deadline") {
    // Rank 0 serves group 2 to workers 0 and 2 (worker + 2 even): it never
    // comes; they time out and take it from rank 1 in the time left.
    ta->withhold(2, 1);
    std::vector<std::unique_ptr<mn_engine>> engines;
    for (int r = 0; r < 2; ++r)
      engines.push_back(std::make_unique<mn_engine>("rollout-" + std::to_string(r), c, 4, producers));
    const auto t = clock::now();
    pull_all(engines, 1, transfer_mode::sharded, 4000ms);
    CHECK(clock::now() - t >= 2000ms); // the first attempt's share of the deadline
    for (auto& e : engines) {
      test::check_identical(*e->weights, *test::loaded(*full->find(1), 4));
      CHECK_FALSE(e->twice);
    }
  }
  SUBCASE("a holder that lost the version: retried at once") {
    b->produce_next(); // rank 1 has version 2, rank 0 does not
    full->produce_next();
    mn_engine e("rollout-0", c, 2, producers);
    const auto t = clock::now();
    e.pull(2, transfer_mode::sharded, 10s);
    CHECK(clock::now() - t < 5s);
    test::check_identical(*e.weights, *test::loaded(*full->find(2), 2));
  }
  SUBCASE("a holder whose transfer is gone mid-pull") {
    // Rank 0's groups come through a puller that fails (as a destroyed
    // transfer does: cancelled) after its first group.
    struct failing final : test::forwarding_puller {
      using forwarding_puller::forwarding_puller;
      pull_report pull(const pull_request& req, const group_sink& sink) override {
        group_sink once = sink;
        int groups = 0;
        once.on_group = [&](int w, std::uint32_t g, const std::uint8_t* bytes, std::size_t size) {
          if (size > 0 && ++groups > 1)
            throw transfer_error(transfer_failure::cancelled, "the producer stopped");
          sink.on_group(w, g, bytes, size);
        };
        return inner->pull(req, once);
      }
    };
    auto broken = std::make_shared<failing>(ta);
    mn_engine e("rollout-0", c, 2, {{holding_of(0, *a), broken}, {holding_of(1, *b), tb}});
    e.pull(1);
    test::check_identical(*e.weights, *test::loaded(*full->find(1), 2));
    CHECK_FALSE(e.twice);
  }
}

TEST_CASE("M:N pull: a pull its engine let go stops at its next group and is not retried elsewhere") {
  const model_config c = test::small_model(4);
  auto a = source_holding(c, std::nullopt);
  auto b = source_holding(c, std::nullopt);
  for (auto& s : {a, b})
    s->produce_next();
  // Counts pulls; `let_go`: each pull fails at once as a plane that noticed
  // it was let go does.
  struct counting final : test::forwarding_puller {
    using forwarding_puller::forwarding_puller;
    std::atomic<int> pulls{0};
    bool let_go = false;
    pull_report pull(const pull_request& req, const group_sink& sink) override {
      ++pulls;
      if (let_go)
        throw transfer_error(transfer_failure::abandoned, "let go");
      return inner->pull(req, sink);
    }
  };
  auto ca = std::make_shared<counting>(std::make_shared<local_transfer>(a));
  auto cb = std::make_shared<counting>(std::make_shared<local_transfer>(b));
  mn_engine e("rollout-0", c, 2, {{holding_of(0, *a), ca}, {holding_of(1, *b), cb}});
  auto sink = e.sink();
  std::atomic<bool> let_go{false};
  SUBCASE("the local plane lets go before its next group") {
    // Let go once the first group arrived (the round went on without it).
    auto apply = sink.on_group;
    sink.on_group = [&](int w, std::uint32_t g, const std::uint8_t* bytes, std::size_t size) {
      apply(w, g, bytes, size);
      let_go = true;
    };
    sink.abandoned = [&] { return let_go.load(); };
  }
  SUBCASE("one holder's part is let go: the other holder is not asked for it") {
    ca->let_go = true;
  }
  const int first_round = 4; // each worker's entries are split over both replicas
  try {
    pull_from_holders(c, {e.name, 1, transfer_mode::sharded, in(10s)}, e.plans, e.links, sink);
    FAIL("a pull let go completed");
  } catch (const transfer_error& err) {
    CHECK(err.failure == transfer_failure::abandoned);
    CHECK(std::string(err.what()).find("let go") != std::string::npos);
  }
  CHECK(ca->pulls + cb->pulls == first_round); // no retry
  std::size_t groups = 0;
  for (auto& [w, got] : e.received)
    groups += got.size();
  CHECK(groups < 2 * plan::group_count(c));
}

TEST_CASE("M:N pull: no other holder left is an error naming the tensor and the producers tried") {
  const model_config c = test::small_model(4);
  auto first = source_holding(c, std::vector<std::int64_t>{0, 1});
  auto second = source_holding(c, std::vector<std::int64_t>{2, 3});
  first->produce_next();
  second->produce_next();
  auto t0 = std::make_shared<local_transfer>(first);
  auto t1 = std::make_shared<local_transfer>(second);
  mn_engine e("rollout-0", c, 2, {{holding_of(0, *first), t0}, {holding_of(1, *second), t1}});

  SUBCASE("the only holder times out: it had the whole deadline") {
    t1->withhold(3, 1);
    const auto t = clock::now();
    try {
      e.pull(1, transfer_mode::sharded, 400ms);
      FAIL("the pull succeeded");
    } catch (const transfer_error& err) {
      CHECK(clock::now() - t >= 400ms);
      CHECK(err.failure == transfer_failure::timeout);
      const std::string what = err.what();
      CHECK(what.find("engine 'rollout-0' worker") != std::string::npos);
      CHECK(what.find("is held by no producer left") != std::string::npos);
      CHECK(what.find("model.layers.3.") != std::string::npos);
      CHECK(what.find("tried rank 1 (incarnation 1)") != std::string::npos);
      CHECK(what.find("did not arrive before the deadline") != std::string::npos);
    }
  }
  SUBCASE("the only holder does not have the version") {
    CHECK_THROWS_AS(e.pull(2), transfer_error);
    try {
      e.pull(2);
    } catch (const transfer_error& err) {
      CHECK(err.failure == transfer_failure::version_unavailable);
      CHECK(std::string(err.what()).find("rank 0 (incarnation 1), rank 1 (incarnation 1)") != std::string::npos);
    }
  }
  SUBCASE("a checksum mismatch is not retried") {
    auto b = source_holding(c, std::vector<std::int64_t>{0, 1});
    b->produce_next();
    auto tb = std::make_shared<local_transfer>(b);
    mn_engine r("rollout-1", c, 1,
                {{holding_of(0, *first), t0}, {holding_of(1, *second), t1}, {holding_of(2, *b), tb}});
    t0->corrupt({"", -1, 1, 0, 1}); // rank 0 serves group 0 to worker 0
    try {
      r.pull(1);
      FAIL("the pull succeeded");
    } catch (const transfer_error& err) {
      CHECK(err.failure == transfer_failure::checksum_mismatch);
    }
  }
  SUBCASE("a layout leaving a tensor unheld fails before pulling") {
    auto h = holding_of(1, *second);
    h.held.erase(std::find(h.held.begin(), h.held.end(), "lm_head.weight"));
    mn_engine u("rollout-2", c, 1, {{holding_of(0, *first), t0}, {h, t1}});
    CHECK_THROWS_WITH_AS(u.pull(1), "holder choice: tensor 'lm_head.weight' is held by no producer",
                         std::invalid_argument);
  }
}

TEST_CASE("local transfer: workers of one rank with different sub-plans get their own packing") {
  // An M:N retry registers a different sub-plan for a worker rank whose
  // other replicas pull their usual one from the same producer: they must
  // not share a stream (same tp and worker, different bytes).
  const model_config c = test::small_model(4);
  auto src = source_holding(c, std::nullopt);
  src->produce_next();
  local_transfer_options o;
  o.join_grace = 5s; // with one stream per (tp, worker), the second pull would surely join the first's pass
  local_transfer xfer(src, o);
  const auto whole = engine::make_plan(c, 2, 0, dtype::bf16);
  std::vector<std::size_t> even, odd; // entries of groups 0, 2 and of 1, 3
  for (std::size_t i = 0; i < whole.entries.size(); ++i)
    (plan::group_of(c, whole.entries[i].source) % 2 == 0 ? even : odd).push_back(i);
  const auto usual = plan::sub_plan(whole, even);
  const auto retry = plan::sub_plan(whole, odd);
  xfer.register_worker("usual", usual);
  xfer.register_worker("retry", retry);
  const plan::grouped_plan usual_g(c, usual), retry_g(c, retry);

  auto pull = [&](const std::string& engine, const plan::grouped_plan& want) {
    std::map<std::uint32_t, std::size_t> sizes;
    group_sink s;
    s.on_group = [&](int, std::uint32_t g, const std::uint8_t*, std::size_t size) { sizes[g] = size; };
    xfer.pull({engine, 0, 1, transfer_mode::sharded, in(10s)}, s);
    for (std::uint32_t g = 0; g < 4; ++g) {
      INFO(engine << " group " << g);
      CHECK(sizes[g] == want.bytes(g)); // groups it serves nothing of arrive empty
    }
  };
  auto a = std::async(std::launch::async, [&] { pull("usual", usual_g); });
  auto b = std::async(std::launch::async, [&] { pull("retry", retry_g); });
  a.get();
  b.get();
  CHECK(xfer.stats().passes == 2);

  // Equal sub-plans registered by two engines share one pass.
  xfer.register_worker("usual-2", plan::sub_plan(whole, even));
  src->produce_next();
  const auto before = xfer.stats().passes;
  auto sizes_of = [&](const std::string& engine) {
    group_sink s;
    s.on_group = [](int, std::uint32_t, const std::uint8_t*, std::size_t) {};
    return xfer.pull({engine, 0, 2, transfer_mode::sharded, in(10s)}, s).bytes;
  };
  auto x = std::async(std::launch::async, [&] { return sizes_of("usual"); });
  auto y = std::async(std::launch::async, [&] { return sizes_of("usual-2"); });
  CHECK(x.get() == usual_g.total_bytes());
  CHECK(y.get() == usual_g.total_bytes());
  CHECK(xfer.stats().passes - before == 1);
}

TEST_CASE("M:N pull over UCX: two replica producers, sub-plans with empty groups, a retry, the single-rank bytes") {
  std::string why;
  if (!ucx_available(&why)) {
    MESSAGE("skipped: UCX is not usable here: " << why);
    return;
  }
  const model_config c = test::small_model(4);
  auto full = source_holding(c, std::nullopt);
  auto a = source_holding(c, std::nullopt);
  auto b = source_holding(c, std::nullopt);
  for (auto& s : {full, a, b})
    s->produce_next();
  auto loopback = [] {
    ucx_producer_options o;
    o.net_devices = "lo";
    return o;
  };
  ucx_producer pa(a, loopback()), pb(b, loopback());
  auto puller_of = [](ucx_producer& p) {
    ucx_puller_options o;
    o.net_devices = "lo";
    o.credentials = [&p](const std::string& engine, int worker, clock::time_point) { return p.issue(engine, worker); };
    return std::make_shared<ucx_puller>(o);
  };
  auto ua = puller_of(pa);
  auto ub = puller_of(pb);
  const std::vector<std::pair<producer_holding, std::shared_ptr<weight_puller>>> producers = {
    {holding_of(0, *a), ua}, {holding_of(1, *b), ub}};
  std::vector<std::unique_ptr<mn_engine>> engines;
  for (int r = 0; r < 2; ++r)
    engines.push_back(std::make_unique<mn_engine>("rollout-" + std::to_string(r), c, 2, producers));
  // Worker 0 takes groups 0 and 2 from rank 0, which holds 1 and 3 too: its
  // sub-plan has no entries there, and those groups travel empty.
  pull_all(engines, 1);
  for (auto& e : engines) {
    test::check_identical(*e->weights, *test::loaded(*full->find(1), 2));
    CHECK_FALSE(e->twice);
  }
  // Per producer: two sub-plans (workers 0 and 1) of 4 held groups, packed
  // at most once each however many replicas pull.
  CHECK(pa.stats().packs <= 8);
  CHECK(pb.stats().packs <= 8);

  // Rank 0 lacks version 2: every worker retries its part on rank 1.
  b->produce_next();
  full->produce_next();
  pull_all(engines, 2);
  for (auto& e : engines)
    test::check_identical(*e->weights, *test::loaded(*full->find(2), 2));
}

TEST_CASE("M:N links: kept per rank incarnation, replaced when it holds anew, and no half-made link is kept") {
  // A puller that records which engines it forgot.
  struct forgetting final : weight_puller {
    std::vector<std::string> forgot;
    void register_worker(const std::string&, std::shared_ptr<const plan::worker_plan>) override {}
    void unregister_engine(const std::string& engine) override { forgot.push_back(engine); }
    pull_report pull(const pull_request&, const group_sink&) override { return {}; }
  };
  producer_links links;
  std::vector<std::shared_ptr<forgetting>> made;
  auto make = [&](std::size_t) {
    made.push_back(std::make_shared<forgetting>());
    return made.back();
  };
  const producer_holding r0{0, 1, {"a"}}, r1{1, 1, {"b"}};
  auto first = links_for(links, {r0, r1}, "e", make);
  REQUIRE(first.size() == 2);
  CHECK(made.size() == 2);
  CHECK(&first[1]->puller() == made[1].get());
  // The same incarnations: the same links, no puller made.
  auto again = links_for(links, {r0, r1}, "e", make);
  CHECK((again == first));
  CHECK(made.size() == 2);
  // Rank 1 restarted: a new link; the old one forgets the engine.
  const producer_holding r1_restarted{1, 2, {"b"}};
  auto after = links_for(links, {r0, r1_restarted}, "e", make);
  CHECK(after[0].get() == first[0].get());
  CHECK(after[1].get() != first[1].get());
  CHECK(made[1]->forgot == std::vector<std::string>{"e"});
  // A rank whose puller cannot be made: an error naming it, and no entry
  // left behind for the engine's exit to trip over.
  const producer_holding r2{2, 1, {"c"}};
  for (const bool throws : {true, false}) {
    CAPTURE(throws);
    auto failing = [&](std::size_t i) -> std::shared_ptr<weight_puller> {
      if (i == 0)
        return make(i);
      if (throws)
        throw std::runtime_error("no route");
      return nullptr;
    };
    try {
      links_for(links, {r0, r2}, "e", failing);
      FAIL("a rank without a puller was linked");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()).rfind("no puller for trainer rank 2", 0) == 0);
      CHECK((std::string(e.what()).find("no route") != std::string::npos) == throws);
    }
    CHECK(links.count(2) == 0);
    for (const auto& [rank, link] : links)
      CHECK(link.get() != nullptr);
  }
}
