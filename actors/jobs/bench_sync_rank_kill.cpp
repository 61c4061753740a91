// `rlsync bench sync`'s rank-kill case: a trainer rank killed as the
// transfer phase begins; the round must abort within the transfer deadline,
// no dirty engine may serve, and a round must complete once the rank returns.
#include "actors/jobs/bench_sync.hpp"
#include "actors/jobs/bench_sync_deployment.hpp"

#include "runtime/base/format.hpp"
#include "runtime/control/round_figures.hpp"

#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>

namespace rlsync::jobs {

namespace {

using bench_detail::bench_deployment;
using bench_detail::bench_layout;
using bench_detail::clock_type;

} // namespace

bool rank_kill_result::held() const {
  return error.empty() && aborted && kill_to_abort_ms >= 0 && kill_to_abort_ms <= transfer_deadline_ms
         && dirty_routable == 0 && dirty_tokens == 0 && restart_to_complete_ms >= 0;
}

rank_kill_result run_rank_kill(bench_session& s, topology t, const model_config& model, int ranks) {
  rank_kill_result k;
  k.ranks = ranks;
  bench_layout(s, t, model, transfer_mode::sharded, ranks);
  k.transfer_deadline_ms = static_cast<double>(t.sync.deadlines.transfer.count());
  if (ranks < 2 || t.trainer.ranks.empty()) {
    k.error = "the rank-kill case needs at least two ranks sharing " + std::to_string(model.num_hidden_layers)
              + " layers";
    return k;
  }
  bench_deployment d(s, t, "rank-kill");
  if (k.error = d.start(); !k.error.empty())
    return k;
  auto& head = d.head();
  auto& sys = s.system();
  // A warm round first: every engine current and clean before the kill.
  if (k.error = d.step_all(); !k.error.empty())
    return k;
  auto warm = d.sync(k.error);
  if (!warm)
    return k;
  if (warm->aborted || !warm->evicted.empty()) {
    k.error = d.failure("the warm round before the kill did not complete");
    return k;
  }

  const std::size_t victim = head.ranks().size() - 1;
  const hosted_rank& rank = head.ranks()[victim];
  k.killed_rank = rank.rank;
  if (k.error = d.step_all(); !k.error.empty())
    return k;
  // The victim withholds its first group of this version: the transfer
  // cannot end before the kill, however small and fast the model.
  std::uint64_t version = 0;
  std::uint32_t withheld = 0;
  if (auto snapshot = rank.trainer.source->latest()) {
    version = snapshot->version();
    if (!snapshot->groups().empty())
      withheld = snapshot->groups().front();
  }
  if (rank.trainer.transfer)
    rank.trainer.transfer->withhold(withheld, version);
  if (victim < head.rank_producers().size())
    head.rank_producers()[victim]->withhold(withheld, version);
  std::mutex kill_mutex;
  std::optional<clock_type::time_point> killed_at;
  auto victim_actor = caf::actor_cast<caf::actor>(rank.trainer.actor);
  d.on_phase([&](std::uint64_t, std::uint64_t, sync_phase phase, const std::vector<std::string>&) {
    if (phase != sync_phase::transfer)
      return;
    std::lock_guard<std::mutex> lock(kill_mutex);
    if (killed_at)
      return;
    killed_at = clock_type::now();
    caf::anon_send_exit(victim_actor, caf::exit_reason::kill); // as SIGKILL: no goodbye
  });
  auto lost = d.sync(k.error);
  const auto ended = clock_type::now();
  d.on_phase({});
  if (rank.trainer.transfer)
    rank.trainer.transfer->clear_faults();
  if (victim < head.rank_producers().size())
    head.rank_producers()[victim]->clear_faults();
  if (!lost)
    return k;
  {
    std::lock_guard<std::mutex> lock(kill_mutex);
    if (!killed_at) {
      k.error = "the round reached no transfer phase: the rank was not killed";
      return k;
    }
    k.kill_to_abort_ms = std::chrono::duration<double, std::milli>(ended - *killed_at).count();
  }
  k.aborted = lost->aborted;
  if (!k.aborted)
    k.kill_to_abort_ms = -1;

  // No dirty engine serves: the coordinator routes none, and none of the
  // engines here produced a token while dirty.
  caf::scoped_actor self{sys};
  self->request(head.coordinator(), d.long_wait(), status_atom::value)
    .receive(
      [&](const coordinator_status& st) {
        for (const auto& m : st.members)
          if (m.dirty) {
            ++k.dirty_after_abort;
            if (std::find(st.routable.begin(), st.routable.end(), m.name) != st.routable.end())
              ++k.dirty_routable;
          }
      },
      [&](caf::error& err) { k.error = "coordinator status: " + sys.render(err); });
  for (const auto& e : head.local_engines())
    self->request(e, d.long_wait(), status_atom::value)
      .receive([&](const engine_status& st) { k.dirty_tokens += st.dirty_tokens; },
               [&](caf::error& err) { k.error = "engine status: " + sys.render(err); });
  if (!k.error.empty())
    return k;

  // The rank returns; the coordinator retries the lost version with it.
  const auto restart = clock_type::now();
  if (auto refused = head.restart_rank(d.topo(), victim); !refused.empty()) {
    k.error = "the restarted rank was refused: " + refused;
    return k;
  }
  k.restart_ms = std::chrono::duration<double, std::milli>(clock_type::now() - restart).count();
  // Then the ranks step together, as a job's ranks do once one is back
  // (the restarted rank, made on the same source, is a version ahead of the
  // others after it catches up): the next round syncs a version they all hold.
  const auto give_up = restart + d.round_time() * 3;
  while (clock_type::now() < give_up) {
    ++k.rounds_to_complete;
    if (k.error = d.step_all(); !k.error.empty())
      return k;
    auto rep = d.sync(k.error);
    if (!rep)
      return k;
    if (!rep->aborted && rep->evicted.empty() && rep->engines_synced > 0) {
      k.restart_to_complete_ms = std::chrono::duration<double, std::milli>(clock_type::now() - restart).count();
      k.first_complete = *rep;
      break;
    }
  }
  if (k.restart_to_complete_ms < 0)
    k.error = d.failure("no round completed after the rank returned");
  d.stop();
  return k;
}

std::vector<std::string> rank_kill_lines(const rank_kill_result& k) {
  std::vector<std::string> out;
  if (!k.error.empty()) {
    out.push_back(format("rank kill (%d ranks): failed: %s", k.ranks, k.error.c_str()));
    return out;
  }
  out.push_back(format("rank kill (%d ranks, rank %u killed as the transfer phase began): ", k.ranks, k.killed_rank)
                + (k.aborted ? format("round aborted %.1f ms after the kill (transfer deadline %.0f ms: %s)",
                                      k.kill_to_abort_ms, k.transfer_deadline_ms,
                                      k.kill_to_abort_ms <= k.transfer_deadline_ms ? "within" : "PAST IT")
                             : std::string("the round was NOT aborted")));
  out.push_back(format("rank kill: %zu engine(s) left dirty, %zu of them routed, %llu token(s) served dirty (%s)",
                       k.dirty_after_abort, k.dirty_routable, static_cast<unsigned long long>(k.dirty_tokens),
                       k.dirty_routable == 0 && k.dirty_tokens == 0 ? "no dirty engine served" : "A DIRTY ENGINE SERVED"));
  out.push_back(format("rank kill: restart %.1f ms; first complete round %.1f ms after the restart (round %d after it, "
                       "%u engines, transfer %.2f ms, stall %.2f ms)",
                       k.restart_ms, k.restart_to_complete_ms, k.rounds_to_complete, k.first_complete.engines_synced,
                       ms_of(k.first_complete.transfer_ns), ms_of(k.first_complete.stall_ns)));
  return out;
}

} // namespace rlsync::jobs
