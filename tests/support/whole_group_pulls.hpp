#pragma once
// What the whole-group pullers' tests share (cuda_ipc, nccl): a sink that
// records every whole tensor per worker, the tensors a version should
// deliver, a trainer step, and a pull expected to fail.
#include "actors/interfaces.hpp"
#include "actors/type_ids.hpp"
#include "runtime/transfer/puller.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace rlsync::test {

using tensors_by_name = std::map<std::string, std::vector<std::uint8_t>>;

/// Records every whole tensor the pull delivers, per worker.
struct whole_tensor_sink {
  std::mutex mutex;
  std::map<int, tensors_by_name> got;
  transfer::group_sink sink() {
    transfer::group_sink s;
    s.on_full_group = [this](int w, std::uint32_t, const std::vector<tensor_view>& tensors) {
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& t : tensors)
        got[w][t.name] = bytes_of(t);
    };
    return s;
  }
};

/// Every tensor of version `v`, as the source's snapshot holds it.
inline tensors_by_name tensors_of(const transfer::weight_source& source, std::uint64_t v) {
  tensors_by_name out;
  auto s = source.find(v);
  REQUIRE(s);
  for (const auto& t : s->tensors())
    out[t.name] = bytes_of(t);
  return out;
}

/// Steps `trainer` once; the version it published.
inline std::uint64_t step_trainer(caf::actor_system& sys, const trainer_actor& trainer) {
  caf::scoped_actor self{sys};
  std::uint64_t v = 0;
  self->request(trainer, std::chrono::seconds(10), step_atom::value)
    .receive([&](const version_info& vi) { v = vi.version; }, [](caf::error&) {});
  REQUIRE(v > 0);
  return v;
}

/// Pulls version `v` for `workers` workers of `engine`, expecting it to
/// fail: how, and (in `what`) why.
inline transfer::transfer_failure pull_failure(transfer::weight_puller& p, const std::string& engine, int workers,
                                               std::uint64_t v, std::string& what,
                                               std::chrono::milliseconds wait = std::chrono::seconds(10)) {
  whole_tensor_sink rec;
  try {
    transfer::pull_engine(p, engine, workers, v, transfer_mode::broadcast, rec.sink(), in(wait));
  } catch (const transfer::transfer_error& e) {
    what = e.what();
    return e.failure;
  }
  FAIL("the pull succeeded");
  return transfer::transfer_failure::cancelled;
}

} // namespace rlsync::test
