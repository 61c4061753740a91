// The coordinator following trainer ranks, on the deterministic scheduler,
// with scripted ranks (scripted_trainer.hpp) and scripted engines: the
// version barrier across ranks, orders naming every rank as a producer, a
// rank killed mid-transfer aborting the round and the retry after it
// re-registers, layout errors, incarnation rules, and a restored counter
// that never goes backwards.
#include "tests/support/coordinator_fixture.hpp"

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace rlsync;
using namespace rlsync::test;
using namespace std::chrono_literals;

namespace {

/// The model's parameters in these tests: a, b, c. Rank 0 holds a and b,
/// rank 1 b and c (b twice, as replicas of one layer range).
const std::vector<std::string> model_names = {"a", "b", "c"};
const std::vector<std::string> held_0 = {"a", "b"};
const std::vector<std::string> held_1 = {"b", "c"};

struct rank_handle {
  scripted_trainer_actor actor;
  std::shared_ptr<trainer_script> script;
};

struct ranks_fixture : coordinator_fixture {
  std::map<std::uint32_t, rank_handle> ranks;

  coordinator_config rank_config() {
    auto c = config();
    c.trainer_ranks = 2;
    c.parameter_names = model_names;
    return c;
  }

  /// transfer.backend nccl, every engine in a process of its own; with
  /// `collective`, mode broadcast and the collective baseline.
  coordinator_config nccl_rank_config(bool collective) {
    auto c = rank_config();
    c.transfer.backend = transfer_backend::nccl;
    if (collective) {
      c.transfer.mode = transfer_mode::broadcast;
      c.transfer.collective = true;
    }
    c.shares_process = [](const caf::actor_addr&, const caf::actor_addr&) { return false; };
    return c;
  }

  /// Registers ranks 0 and 1 (their halves of the model), each joining
  /// every rendezvous and making ids of r + 1 in every byte.
  void register_nccl_ranks() {
    for (std::uint32_t r : {0u, 1u}) {
      REQUIRE(register_rank(r, r == 0 ? held_0 : held_1));
      ranks[r].script->nccl_joins_ok = true;
      ranks[r].script->nccl_id = [r]() -> caf::result<std::vector<std::uint8_t>> {
        return std::vector<std::uint8_t>(128, static_cast<std::uint8_t>(r + 1));
      };
    }
  }

  /// Spawns a scripted rank at version `current` and registers it.
  caf::expected<registration> register_rank(std::uint32_t r, std::vector<std::string> held,
                                            std::uint64_t incarnation = 1, version_info current = {2, 4, 4096}) {
    auto script = std::make_shared<trainer_script>();
    script->current = current;
    auto actor = spawn(scripted_trainer, script);
    ranks[r] = rank_handle{actor, script};
    return register_as(r, std::move(held), incarnation);
  }

  /// Registers the fixture's rank `r` (its current actor) as `incarnation`.
  caf::expected<registration> register_as(std::uint32_t r, std::vector<std::string> held, std::uint64_t incarnation) {
    auto reg = request<registration>(coord, register_atom::value, rank_info{r, "node", incarnation, std::move(held)},
                                     caf::actor_cast<trainer_actor>(ranks.at(r).actor));
    run();
    REQUIRE(reg->has_value());
    return **reg;
  }

  /// Rank `r` publishes `vi` to its subscribers (the coordinator).
  void rank_publish(std::uint32_t r, version_info vi) {
    tell(ranks.at(r).actor, caf::publish_atom::value, vi);
    run();
  }

  void kill_rank(std::uint32_t r) {
    caf::anon_send_exit(ranks.at(r).actor, caf::exit_reason::kill);
    run();
  }

  std::size_t lines_with(const std::string& text) const {
    return std::count_if(log_lines.begin(), log_lines.end(),
                         [&](const std::string& l) { return l.find(text) != std::string::npos; });
  }
};

std::vector<std::uint32_t> ranks_of(const transfer_order& o) {
  std::vector<std::uint32_t> out;
  for (auto& p : o.producers)
    out.push_back(p.rank);
  return out;
}

} // namespace

TEST_CASE_FIXTURE(ranks_fixture, "no round until every rank registered, orders name both producers, the barrier waits for the slower rank") {
  start(rank_config());
  REQUIRE(register_rank(0, held_0));
  add_engine("a");
  CHECK(count(sync_phase::pause) == 0); // rank 1 missing: nothing to pull its tensors from
  CHECK(!routable("a"));
  auto reg = register_rank(1, held_1);
  REQUIRE(reg);
  CHECK(reg->current_version == 2);
  CHECK(routable("a"));
  CHECK(status().version == 2);
  auto& order = engines["a"].script->orders.back();
  CHECK(order.version == 2);
  REQUIRE(ranks_of(order) == std::vector<std::uint32_t>{0, 1});
  CHECK(order.producers[0].incarnation == 1);
  CHECK(order.producers[0].held == held_0);
  CHECK(order.producers[1].held == held_1);
  CHECK(ranks[0].script->pins == std::vector<std::uint64_t>{2}); // pinned on every rank
  CHECK(ranks[1].script->pins == std::vector<std::uint64_t>{2});
  forget_history();
  // Rank 0 publishes v3 and v4 first: rank 1 has not, no round.
  rank_publish(0, {3, 4, 4096});
  rank_publish(0, {4, 4, 4096});
  CHECK(count(sync_phase::pause) == 0);
  // Rank 1 reaches v3: the newest both hold.
  rank_publish(1, {3, 4, 4096});
  CHECK(status().version == 3);
  CHECK(engines["a"].script->starts.back() == 3);
  CHECK(ranks[1].script->pins.back() == 3);
  rank_publish(1, {4, 4, 4096});
  CHECK(status().version == 4);
  CHECK(ranks_of(engines["a"].script->orders.back()) == std::vector<std::uint32_t>{0, 1});
}

TEST_CASE_FIXTURE(ranks_fixture, "a rank killed mid-transfer aborts the round, the round after it re-registers completes") {
  start(rank_config());
  REQUIRE(register_rank(0, held_0));
  REQUIRE(register_rank(1, held_1));
  add_engine("a");
  add_engine("b");
  REQUIRE(routable("a"));
  REQUIRE(routable("b"));
  forget_history();
  for (auto name : {"a", "b"}) {
    engines[name].on(sync_phase::transfer, act::hold); // the transfer is under way
    engines[name].script->fail_held_on_resume = true;  // as the real engine does
  }
  engines["b"].script->dirty_on_resume = true; // b received part of v3, a nothing
  rank_publish(0, {3, 4, 4096});
  rank_publish(1, {3, 4, 4096});
  CHECK(count(sync_phase::transfer) == 2);
  kill_rank(1);
  CHECK(seen_by("a") == aborted_phases);
  CHECK(seen_by("b") == aborted_phases);
  REQUIRE(reports.size() == 1);
  CHECK(reports.back().aborted);
  CHECK(reports.back().version == 3);
  CHECK(logged("trainer rank 1 is down"));
  CHECK(routable("a"));  // clean: serves v2 again
  CHECK(!routable("b")); // dirty: out until a complete update
  CHECK(member_info("b").dirty);
  // No round while rank 1 is gone, however much rank 0 publishes.
  engines["a"].on(sync_phase::transfer, act::answer);
  engines["b"].on(sync_phase::transfer, act::answer);
  forget_history();
  rank_publish(0, {4, 4, 4096});
  CHECK(count(sync_phase::pause) == 0);
  // The same incarnation from a new process is refused: a restart counts up.
  auto again = spawn(scripted_trainer, std::make_shared<trainer_script>());
  auto refused = request<registration>(coord, register_atom::value, rank_info{1, "node", 1, held_1},
                                       caf::actor_cast<trainer_actor>(again));
  run();
  REQUIRE(refused->has_value());
  CHECK(!**refused);
  caf::anon_send_exit(again, caf::exit_reason::kill);
  // Rank 1 restarts at v1: told to catch up to v4, the cluster's newest.
  auto reg = register_rank(1, held_1, 2, {1, 4, 4096});
  REQUIRE(reg);
  CHECK(reg->current_version == 4);
  CHECK(count(sync_phase::pause) == 0); // it holds v1 only
  CHECK(lines_with("ranks publish different versions") == 0); // catching up is no error
  rank_publish(1, {4, 4, 4096});
  CHECK(status().version == 4);
  CHECK(routable("a"));
  CHECK(routable("b"));
  CHECK(!member_info("b").dirty);
  auto order = engines["b"].script->orders.back();
  CHECK(order.version == 4);
  REQUIRE(ranks_of(order) == std::vector<std::uint32_t>{0, 1});
  CHECK(order.producers[1].incarnation == 2);
  CHECK(!reports.back().aborted);
}

TEST_CASE_FIXTURE(ranks_fixture, "a rank whose link was lost reconnects as the same incarnation and is followed again") {
  start(rank_config());
  REQUIRE(register_rank(0, held_0));
  REQUIRE(register_rank(1, held_1));
  add_engine("a");
  REQUIRE(routable("a"));
  forget_history();
  // A partition long enough for the connection to drop: the process lives on.
  caf::anon_send(caf::actor_cast<caf::actor>(coord),
                 caf::down_msg{ranks.at(1).actor.address(), caf::exit_reason::remote_link_unreachable});
  run();
  CHECK(logged("trainer rank 1 is down"));
  rank_publish(0, {3, 4, 4096});
  rank_publish(1, {3, 4, 4096}); // no round while rank 1 is down
  CHECK(count(sync_phase::pause) == 0);
  // The link is back: the same actor registers again with the same incarnation.
  auto reg = register_as(1, held_1, 1);
  REQUIRE(reg);
  CHECK(lines_with("trainer rank 1 (incarnation 1,") == 1); // registered again (the log since forget_history)
  rank_publish(1, {3, 4, 4096});
  CHECK(status().version == 3);
  CHECK(routable("a"));
  REQUIRE(!reports.empty());
  CHECK(!reports.back().aborted);
  // A retry while it is followed changes nothing.
  REQUIRE(register_as(1, held_1, 1));
  CHECK(lines_with("trainer rank 1 (incarnation 1,") == 1);
}

TEST_CASE_FIXTURE(ranks_fixture, "a rank silent past the heartbeat timeout mid-round aborts it, no round until it answers") {
  auto c = heartbeat_config();
  c.trainer_ranks = 2;
  c.parameter_names = model_names;
  start(c);
  REQUIRE(register_rank(0, held_0));
  REQUIRE(register_rank(1, held_1));
  add_engine("a");
  REQUIRE(routable("a"));
  forget_history();
  engines["a"].on(sync_phase::transfer, act::hold);
  engines["a"].script->fail_held_on_resume = true;
  rank_publish(0, {3, 4, 4096});
  rank_publish(1, {3, 4, 4096});
  CHECK(count(sync_phase::transfer) == 1);
  ranks[1].script->silent = true; // partitioned: its heartbeats go unanswered
  ticks(5);
  CHECK(logged("trainer rank 1 silent for"));
  REQUIRE(reports.size() == 1);
  CHECK(reports.back().aborted);
  CHECK(seen_by("a") == aborted_phases);
  CHECK(routable("a")); // received nothing: serves v2 again
  engines["a"].on(sync_phase::transfer, act::answer);
  forget_history();
  ticks(3);
  CHECK(count(sync_phase::pause) == 0); // still silent: no round
  ranks[1].script->silent = false; // healed
  ticks(2);
  CHECK(logged("trainer rank 1 answers again"));
  CHECK(status().version == 3); // the round retried
  CHECK(routable("a"));
}

TEST_CASE_FIXTURE(coordinator_fixture, "a coordinator without trainer ranks refuses a rank") {
  start();
  auto rank = spawn(scripted_trainer, std::make_shared<trainer_script>());
  auto reg = request<registration>(coord, register_atom::value, rank_info{0, "node", 1, {"a"}},
                                   caf::actor_cast<trainer_actor>(rank));
  run();
  REQUIRE(reg->has_value());
  REQUIRE(!**reg);
  CHECK(caf::to_string((*reg)->error()).find("trainer rank 0: this coordinator follows no trainer ranks")
        != std::string::npos);
  caf::anon_send_exit(rank, caf::exit_reason::kill);
  run();
}

TEST_CASE_FIXTURE(ranks_fixture, "a tensor no rank holds: named, no round") {
  start(rank_config());
  REQUIRE(register_rank(0, {"a"}));
  REQUIRE(register_rank(1, {"b"}));
  add_engine("a");
  CHECK(count(sync_phase::pause) == 0);
  CHECK(logged("trainer ranks: 1 tensors held by no rank (ranks 0, 1 registered): c; no round on it"));
  rank_publish(0, {3, 4, 4096});
  rank_publish(1, {3, 4, 4096});
  CHECK(count(sync_phase::pause) == 0);
  CHECK(lines_with("held by no rank") == 1); // logged once
  // Rank 1 restarts holding what was missing: the round runs.
  REQUIRE(register_rank(1, {"b", "c"}, 2, {3, 4, 4096}));
  CHECK(status().version == 3);
  CHECK(routable("a"));
}

TEST_CASE_FIXTURE(ranks_fixture, "one tensor with different bytes on two ranks: both ranks and the tensor named, no round on that version") {
  start(rank_config());
  REQUIRE(register_rank(0, held_0, 1, {2, 4, 4096, {10, 20}}));
  REQUIRE(register_rank(1, held_1, 1, {2, 4, 4096, {20, 30}})); // b: 20 on both
  add_engine("a");
  REQUIRE(routable("a"));
  forget_history();
  rank_publish(0, {3, 4, 4096, {11, 21}});
  rank_publish(1, {3, 4, 4096, {22, 31}}); // b: 21 and 22
  CHECK(count(sync_phase::pause) == 0);
  CHECK(logged("trainer ranks: v3: rank 0 and rank 1 hold different bytes of 1 tensor: b; no round on it"));
  CHECK(status().version == 2);
  rank_publish(0, {4, 4, 4096, {12, 23}});
  rank_publish(1, {4, 4, 4096, {24, 32}});
  CHECK(count(sync_phase::pause) == 0);
  CHECK(lines_with("hold different bytes") == 1); // the same fault: logged once
  // The ranks agree again at v5: the round runs.
  rank_publish(0, {5, 4, 4096, {13, 25}});
  rank_publish(1, {5, 4, 4096, {25, 33}});
  CHECK(status().version == 5);
  // Checksums that do not match what a rank holds are refused, naming it.
  rank_publish(1, {6, 4, 4096, {1}});
  CHECK(logged("rank 1 published v6 with 1 checksums for the 2 tensors it holds"));
}

TEST_CASE_FIXTURE(ranks_fixture, "rank registrations: retries, restarts, stale incarnations, unknown ranks and tensors") {
  start(rank_config());
  auto first = register_rank(0, held_0, 3);
  REQUIRE(first);
  CHECK(!first->routable);
  auto retry = register_as(0, held_0, 3); // the same handle again: nothing changes
  REQUIRE(retry);
  CHECK(retry->current_version == 2);
  auto older = register_as(0, held_0, 2);
  REQUIRE(!older);
  CHECK(caf::to_string(older.error()).find("incarnation 2 is not newer than the registered 3") != std::string::npos);
  auto restarted = register_rank(0, held_0, 4);
  CHECK(restarted);
  auto beyond = register_rank(2, held_0);
  REQUIRE(!beyond);
  CHECK(caf::to_string(beyond.error()).find("rank 2 is not a rank of the topology, which has 2 ranks") != std::string::npos);
  auto unknown = register_rank(1, {"b", "zz"});
  REQUIRE(!unknown);
  CHECK(caf::to_string(unknown.error()).find("rank 1 holds zz, no parameter of the model") != std::string::npos);
  auto unsorted = register_rank(1, {"c", "b"});
  REQUIRE(!unsorted);
  CHECK(caf::to_string(unsorted.error()).find("not ascending") != std::string::npos);
  CHECK(logged("coordinator: refused a trainer rank")); // each refusal is logged
}

TEST_CASE_FIXTURE(ranks_fixture, "a restored counter: ranks are told to catch up, and no version goes backwards") {
  auto c = rank_config();
  persisted_coordinator p;
  p.synced_version = 5;
  p.newest_version = 5;
  p.rounds = 3;
  c.restored = p;
  start(c);
  auto reg = register_rank(0, held_0, 1, {3, 4, 4096});
  REQUIRE(reg);
  CHECK(reg->current_version == 5); // a rank restarted with the head catches up to 5
  REQUIRE(register_rank(1, held_1, 1, {3, 4, 4096}));
  add_engine("a");
  CHECK(count(sync_phase::pause) == 0); // v3 is older than the restored v5
  CHECK(logged("ignored version 3"));
  CHECK(status().version == 5);
  rank_publish(0, {6, 4, 4096});
  rank_publish(1, {6, 4, 4096});
  CHECK(status().version == 6);
  CHECK(routable("a"));
}

TEST_CASE_FIXTURE(ranks_fixture, "a rank left behind by more than a rank keeps is told to catch up, once per target") {
  start(rank_config());
  REQUIRE(register_rank(0, held_0, 1, {5, 4, 4096}));
  rank_publish(0, {6, 4, 4096});
  // Rank 1's node joined late: it starts at v1, five versions behind.
  REQUIRE(register_rank(1, held_1, 1, {1, 4, 4096}));
  add_engine("a");
  CHECK(count(sync_phase::pause) == 0); // no version both hold
  CHECK(ranks[1].script->catch_ups == std::vector<std::uint64_t>{6});
  CHECK(ranks[0].script->catch_ups.empty());
  rank_publish(1, {2, 4, 4096}); // still behind, same target: not told again
  CHECK(ranks[1].script->catch_ups == std::vector<std::uint64_t>{6});
  CHECK(lines_with("trainer rank 1 is behind: catching it up to v6") == 1);
  rank_publish(1, {6, 4, 4096}); // caught up: the round runs
  CHECK(status().version == 6);
  CHECK(routable("a"));
}

TEST_CASE_FIXTURE(ranks_fixture, "the status lists every rank: node, incarnation, latest and pinned versions, reachable") {
  auto c = heartbeat_config();
  c.trainer_ranks = 2;
  c.parameter_names = model_names;
  start(c);
  CHECK(status().ranks.empty()); // none registered yet
  REQUIRE(register_rank(0, held_0, 5));
  {
    auto st = status();
    REQUIRE(st.ranks.size() == 1);
    CHECK(st.ranks[0].rank == 0);
    CHECK(st.ranks[0].node == "node");
    CHECK(st.ranks[0].incarnation == 5);
    CHECK(st.ranks[0].latest_version == 2); // its answer to the coordinator's query
    CHECK(st.ranks[0].pinned_version == 0); // no round yet: rank 1 is missing
    CHECK(st.ranks[0].reachable);
  }
  REQUIRE(register_rank(1, held_1, 9));
  add_engine("a");
  REQUIRE(routable("a"));
  rank_publish(0, {3, 4, 4096});
  rank_publish(0, {4, 4, 4096});
  rank_publish(1, {3, 4, 4096});
  {
    auto st = status();
    REQUIRE(st.ranks.size() == 2);
    CHECK(st.ranks[0].latest_version == 4);
    CHECK(st.ranks[1].latest_version == 3);
    CHECK(st.ranks[0].pinned_version == 3); // the round pins the newest version both hold
    CHECK(st.ranks[1].pinned_version == 3);
    CHECK(st.ranks[1].incarnation == 9);
  }
  ranks[1].script->silent = true; // partitioned
  ticks(5);
  REQUIRE(logged("trainer rank 1 silent for"));
  {
    auto st = status();
    CHECK(st.ranks[0].reachable);
    CHECK_FALSE(st.ranks[1].reachable);
  }
  ranks[1].script->silent = false;
  ticks(2);
  CHECK(status().ranks[1].reachable);
  kill_rank(0);
  {
    auto st = status();
    REQUIRE(st.ranks.size() == 2); // still listed: down until a new incarnation registers
    CHECK_FALSE(st.ranks[0].reachable);
  }
}

TEST_CASE_FIXTURE(ranks_fixture, "one rank of another process: no round before it registers, then the cold sync") {
  auto c = config();
  c.trainer_ranks = 1; // a lone rank on a member node, or an external one (a PyTorch trainer)
  c.await_ranks = true;
  c.parameter_names = model_names;
  start(c);
  add_engine("a");
  CHECK(count(sync_phase::pause) == 0); // no version to move, nothing to pull from
  CHECK(status().rounds == 0);
  CHECK(!routable("a"));
  REQUIRE(register_rank(0, model_names));
  CHECK(routable("a"));
  CHECK(status().version == 2);
  CHECK(engines["a"].script->starts == std::vector<std::uint64_t>{2});
}

TEST_CASE_FIXTURE(ranks_fixture, "nccl collective with two ranks: each rank makes its own communicator's id, every member gets them all") {
  start(nccl_rank_config(true));
  for (std::uint32_t r : {0u, 1u}) {
    REQUIRE(register_rank(r, r == 0 ? held_0 : held_1));
    auto& s = *ranks[r].script;
    s.nccl_joins_ok = true;
    s.nccl_id = [r, made = std::make_shared<int>(0)]() -> caf::result<std::vector<std::uint8_t>> {
      ++*made; // rank r's k-th id: every byte 10 r + k
      return std::vector<std::uint8_t>(128, static_cast<std::uint8_t>(10 * r + *made));
    };
  }
  add_engine("a");
  REQUIRE(ranks[0].script->nccl_joins.size() == 1);
  const auto& r = ranks[0].script->nccl_joins.front();
  CHECK(r.id == std::vector<std::uint8_t>(128, 1)); // the main communicator's: rank 0's first
  REQUIRE(r.root_ids.size() == 2);
  CHECK(r.root_ids[0] == std::vector<std::uint8_t>(128, 2));  // rank 0's own: its second
  CHECK(r.root_ids[1] == std::vector<std::uint8_t>(128, 11)); // rank 1's own: its first
  REQUIRE(ranks[1].script->nccl_joins.size() == 1);
  CHECK(ranks[1].script->nccl_joins.front().root_ids == r.root_ids);
  REQUIRE(engines["a"].script->nccl_joins.size() == 1);
  CHECK(engines["a"].script->nccl_joins.front().root_ids == r.root_ids);
  CHECK(routable("a"));
}

TEST_CASE_FIXTURE(ranks_fixture, "nccl collective with two ranks: a rank that makes no id of its own fails the rendezvous") {
  start(nccl_rank_config(true));
  for (std::uint32_t r : {0u, 1u}) {
    REQUIRE(register_rank(r, r == 0 ? held_0 : held_1));
    ranks[r].script->nccl_joins_ok = true;
    ranks[r].script->nccl_id = [r]() -> caf::result<std::vector<std::uint8_t>> {
      if (r == 1)
        return make_error(errc::unknown_name, "no NCCL here");
      return std::vector<std::uint8_t>(128, 5);
    };
  }
  add_engine("a");
  CHECK(ranks[0].script->nccl_joins.empty());
  CHECK(engines["a"].script->nccl_joins.empty());
  CHECK(!routable("a"));
  CHECK(lines_with("trainer rank 1 made no unique id for epoch 1") == 1);
}

TEST_CASE_FIXTURE(ranks_fixture, "nccl with two ranks, not the collective: one communicator, no root ids") {
  start(nccl_rank_config(false));
  register_nccl_ranks();
  add_engine("a");
  REQUIRE(ranks[1].script->nccl_joins.size() == 1);
  CHECK(ranks[1].script->nccl_joins.front().root_ids.empty());
  CHECK(ranks[1].script->nccl_joins.front().id == std::vector<std::uint8_t>(128, 1));
}

TEST_CASE_FIXTURE(ranks_fixture, "nccl with two ranks: a rank that dies is named to the other rank and the engines") {
  start(nccl_rank_config(false));
  register_nccl_ranks();
  add_engine("a");
  REQUIRE(routable("a"));
  const auto epoch = status().nccl_epoch;
  REQUIRE(epoch > 0);
  kill_rank(1);
  const std::vector<std::pair<std::uint64_t, std::string>> died{{epoch, "trainer rank 1"}};
  CHECK(ranks[0].script->nccl_dead == died);
  CHECK(engines["a"].script->nccl_dead == died);
  CHECK(ranks[1].script->nccl_dead.empty());
}
