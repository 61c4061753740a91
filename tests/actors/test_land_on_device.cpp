// A whole group landed on an engine's device (actors/land_on_device.hpp),
// over host memory standing for the device: packed by the worker's plan it
// arrives as the runs a sharded pull stores; whatever the device could not
// read safely, the sink does not take, or changed since the host copy
// verified (when rechecked), lands nothing.
#include "actors/land_on_device.hpp"

#include "runtime/engine/recording.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/transfer/packing.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <map>

using namespace rlsync;

namespace {

// Group 1 of version 1 of the small model, whole, as a puller holds it: one
// host copy with views into it, and the same bytes "on the device".
struct whole_group {
  model_config model = test::small_model(3);
  std::shared_ptr<const transfer::weight_snapshot> snapshot;
  std::uint32_t g = 1;
  std::vector<std::uint8_t> host, device;
  std::vector<tensor_view> views;
  std::shared_ptr<const plan::grouped_plan> plan;

  whole_group() {
    auto source = test::small_source(model);
    snapshot = source->advance();
    for (const auto& t : snapshot->tensors())
      if (plan::group_of(model, t.name) == g) {
        views.push_back(t);
        views.back().offset = host.size();
        host.insert(host.end(), reinterpret_cast<const std::uint8_t*>(t.data),
                    reinterpret_cast<const std::uint8_t*>(t.data) + t.size);
      }
    for (auto& v : views)
      v.data = reinterpret_cast<const std::byte*>(host.data() + v.offset);
    device = host;
    plan = std::make_shared<const plan::grouped_plan>(
      model, std::make_shared<const plan::worker_plan>(engine::make_plan(model, 2, 0, dtype::bf16)));
  }
  /// Packing on host memory standing for device 0, with a scratch of `scratch_bytes`.
  whole_group_landing landing(std::size_t scratch_bytes) const {
    return {plan, gpu::host_pack_device(), std::make_shared<landing_scratch>(scratch_bytes)};
  }
};

// A sink with one store target per plan entry, recording what lands.
struct landing_sink {
  std::vector<std::uint8_t> store;
  std::map<const std::uint8_t*, std::vector<std::uint8_t>> landed;
  bool accepts = true;
  transfer::group_sink make(const plan::grouped_plan& p, std::uint32_t g) {
    store.resize(p.bytes(g));
    transfer::group_sink s;
    s.targets = [this, &p](int, std::uint32_t group) {
      std::vector<transfer::store_target> out;
      std::size_t at = 0;
      for (const auto* e : p.entries(group)) {
        out.push_back({store.data() + at, static_cast<std::size_t>(e->bytes())});
        at += static_cast<std::size_t>(e->bytes());
      }
      return out;
    };
    s.on_stored = [](int, std::uint32_t) {};
    s.on_device = [this](const transfer::store_target& t, const void* bytes, int) {
      const auto* b = static_cast<const std::uint8_t*>(bytes);
      landed[t.at].assign(b, b + t.bytes);
    };
    s.lands_from = [this](int) { return accepts; };
    return s;
  }
  std::vector<std::uint8_t> concatenated() const {
    std::vector<std::uint8_t> out;
    for (const auto& [at, bytes] : landed) // ordered by address: the store's order
      out.insert(out.end(), bytes.begin(), bytes.end());
    return out;
  }
};

} // namespace

TEST_CASE("land on device: a whole group is packed by the worker's plan and lands as the runs a sharded pull "
          "stores") {
  whole_group w;
  landing_sink rec;
  const auto sink = rec.make(*w.plan, w.g);
  const auto to = w.landing(w.plan->bytes(w.g) + 8);
  land_whole_group(to, 0, w.g, w.views, w.host.data(), w.host.size(), w.device.data(), sink);
  std::vector<std::uint8_t> want(w.plan->bytes(w.g));
  transfer::pack_group(*w.plan, w.g, *w.snapshot, want.data());
  CHECK(rec.landed.size() == w.plan->entries(w.g).size());
  CHECK(rec.concatenated() == want);
  // From the device's bytes, not the host's.
  w.device[0] ^= 0xff;
  rec.landed.clear();
  land_whole_group(to, 0, w.g, w.views, w.host.data(), w.host.size(), w.device.data(), sink);
  CHECK(rec.concatenated() != want);
  // Unless the device bytes must still be what verified on the host (cuda_ipc).
  auto rechecked = to;
  rechecked.recheck = true;
  rec.landed.clear();
  land_whole_group(rechecked, 0, w.g, w.views, w.host.data(), w.host.size(), w.device.data(), sink);
  CHECK(rec.landed.empty());
  w.device[0] ^= 0xff;
  land_whole_group(rechecked, 0, w.g, w.views, w.host.data(), w.host.size(), w.device.data(), sink);
  CHECK(rec.concatenated() == want);
}

TEST_CASE("land on device: nothing lands from a device the sink does not take, misaligned or repeated tensors, "
          "views outside the copy, or a group larger than the scratch") {
  struct row {
    const char* name;
    std::function<void(whole_group&, landing_sink&, std::size_t& scratch_bytes)> spoil;
  };
  const std::vector<row> rows{
    {"the sink takes nothing from that device", [](whole_group&, landing_sink& s, std::size_t&) { s.accepts = false; }},
    {"an odd offset", [](whole_group& w, landing_sink&, std::size_t&) {
       w.device.insert(w.device.begin(), 0); // every source one byte off its element
     }},
    {"a name twice", [](whole_group& w, landing_sink&, std::size_t&) { w.views.back().name = w.views.front().name; }},
    {"a view outside the host copy", [](whole_group& w, landing_sink&, std::size_t&) {
       w.views.back().size = w.host.size();
     }},
    {"a small scratch", [](whole_group& w, landing_sink&, std::size_t& bytes) { bytes = w.plan->bytes(w.g); }},
  };
  for (const auto& r : rows) {
    CAPTURE(r.name);
    whole_group w;
    landing_sink rec;
    std::size_t scratch_bytes = w.plan->bytes(w.g) + 8;
    r.spoil(w, rec, scratch_bytes);
    const auto sink = rec.make(*w.plan, w.g);
    const std::uint8_t* device = w.device.data() + (w.device.size() > w.host.size() ? 1 : 0);
    land_whole_group(w.landing(scratch_bytes), 0, w.g, w.views, w.host.data(), w.host.size(), device, sink);
    CHECK(rec.landed.empty());
  }
}
