// The rollout-engine actor's M:N pull: a transfer order naming two trainer
// ranks (each holding half the layers behind its own local transfer) makes
// the engine hold exactly the weights a single-rank pull gives. On CAF's
// threaded scheduler: the pull runs on a thread of its own.
#include "actors/rollout_engine.hpp"
#include "actors/system_config.hpp"
#include "runtime/transfer/local/local_transfer.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <map>

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

/// start, transfer, finish; the digest of the weights then served.
weight_digest sync(caf::scoped_actor& self, const rollout_engine_actor& e, const transfer_order& order,
                   const std::vector<trainer_actor>& handles, std::string* failure = nullptr) {
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
    .receive([&](const transfer_report& r) { transferred = r.version == order.version && r.bytes > 0; }, fail);
  if (!transferred)
    return out;
  self->request(e, t, finish_atom::value, order.version).receive([](const phase_ack&) {}, fail);
  self->request(e, t, digest_atom::value).receive([&](const weight_digest& d) { out = d; }, fail);
  self->request(e, t, resume_atom::value).receive([](const phase_ack&) {}, fail);
  return out;
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
