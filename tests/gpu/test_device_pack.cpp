// Packing a worker's shard from a device copy of the version (device_pack):
// the layout over a snapshot, run by the host pack device, gives exactly
// transfer::pack_group's bytes followed by their mixsum64, for every
// worker of tp 1, 2 and 4; refusals name the tensor. (test_gpu runs the
// same layouts with the CUDA pack device against these.)
#include "gpu/device_pack.hpp"
#include "gpu/mixsum.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/transfer/bucket.hpp"
#include "runtime/transfer/packing.hpp"

#include "tests/support/fake_tensor_device.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include <doctest/doctest.h>

#include <vector>

using namespace rlsync;

TEST_CASE("device pack: a group gathered from the device copy is pack_group's bytes and their mixsum64") {
  model_config c = test::small_model(2);
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2; // kv heads replicated at tp 4
  auto s = test::small_source(c)->produce_next();
  auto device = gpu::host_pack_device();
  gpu::device_snapshot copy(*s, *device);
  CHECK(copy.version() == s->version());
  REQUIRE(copy.sources().size() == s->tensors().size());
  for (int tp : {1, 2, 4})
    for (int w = 0; w < tp; ++w) {
      CAPTURE(tp);
      CAPTURE(w);
      plan::grouped_plan p(c, std::make_shared<const plan::worker_plan>(engine::make_plan(c, tp, w, dtype::bf16)));
      for (auto g : s->groups()) {
        CAPTURE(g);
        const auto layout = gpu::layout_group(p, g, *s);
        CHECK(layout.bytes == p.bytes(g));
        std::vector<std::uint8_t> expect(p.bytes(g)), got(layout.bytes + transfer::checksum_trailer_bytes, 0xee);
        transfer::pack_group(p, g, *s, expect.data());
        device->pack(layout, copy.sources(), got.data());
        auto [bytes, sum] = transfer::split_checksum(got.data(), got.size());
        CHECK(bytes == expect);
        CHECK(sum == gpu::mixsum64(expect.data(), expect.size()));
      }
    }
}

TEST_CASE("device pack: a plan the version does not fit is refused, naming the tensor") {
  model_config c = test::small_model(2);
  auto s = test::small_source(c)->produce_next();
  const auto recorded = engine::make_plan(c, 2, 0, dtype::bf16);
  // The first entry changed; its group is the one to lay out.
  auto refusal = [&](auto change) -> std::string {
    auto p = recorded;
    change(p.entries.front());
    plan::grouped_plan grouped(c, std::make_shared<const plan::worker_plan>(p));
    for (std::uint32_t g = 0; g < grouped.group_count(); ++g)
      for (const auto* e : grouped.entries(g))
        if (e == &grouped.plan().entries.front()) {
          try {
            gpu::layout_group(grouped, g, *s);
          } catch (const std::invalid_argument& why) {
            return why.what();
          }
          return "accepted";
        }
    return "no group";
  };
  CHECK(refusal([](plan::plan_entry&) {}) == "accepted");
  CHECK(refusal([](plan::plan_entry& e) { e.source = "model.layers.0.made_up"; }).find(
          "holds no tensor 'model.layers.0.made_up'")
        != std::string::npos);
  CHECK(refusal([](plan::plan_entry& e) { e.source_type = dtype::f32; }).find("another dtype or shape")
        != std::string::npos);
  const auto outside = refusal([](plan::plan_entry& e) { e.view.offset += std::int64_t{1} << 30; });
  CHECK(outside.find("device pack of group") == 0);
  CHECK(outside.find(recorded.entries.front().source) != std::string::npos);
}

TEST_CASE("device pack: whole tensors of the copy concatenated as they lie on the host") {
  model_config c = test::small_model(2);
  auto s = test::small_source(c)->produce_next();
  auto device = gpu::host_pack_device();
  gpu::device_snapshot copy(*s, *device);
  std::vector<gpu::pack_device::piece> pieces;
  std::vector<std::uint8_t> expect;
  for (std::size_t i = 0; i < s->tensors().size(); i += 2) { // every other tensor: offsets are the copy's own
    const auto& t = s->tensors()[i];
    pieces.push_back({copy.sources()[i], t.size});
    const auto* p = reinterpret_cast<const std::uint8_t*>(t.data);
    expect.insert(expect.end(), p, p + t.size);
  }
  std::vector<std::uint8_t> got(expect.size());
  device->concat(pieces, got.data());
  CHECK(got == expect);
  // Each tensor of the copy starts aligned, whatever the sizes before it.
  for (const auto* source : copy.sources())
    CHECK((static_cast<const std::uint8_t*>(source) - static_cast<const std::uint8_t*>(copy.sources().front())) % 256 == 0);
}

TEST_CASE("device pack: a version pushed from the pack device's own device is adopted, not uploaded") {
  model_config c = test::small_model(2);
  auto reference = test::small_source(c)->produce_next();
  const auto inputs = test::state_dict_of(*reference, 0);
  auto pushed_on = [&](int copy_on) {
    transfer::external_options o;
    o.config = c;
    o.type = dtype::bf16;
    o.device = std::make_shared<test::fake_tensor_device>();
    o.device_copy_on = copy_on;
    auto source = std::make_shared<transfer::external_source>(o);
    source->push(1, inputs);
    source->advance();
    return source; // holds the device copy
  };
  auto device = gpu::host_pack_device(); // ordinal 0
  auto on_0 = pushed_on(0);
  auto same = on_0->latest();
  auto adopted_copy = gpu::device_snapshot::adopt(*same, *device);
  REQUIRE(bool(adopted_copy));
  const auto& adopted = *adopted_copy;
  CHECK(adopted.adopted());
  CHECK(adopted.bytes() == same->on_device()->bytes);
  auto on_1 = pushed_on(1); // a copy on another device than the pack's: uploaded from the host bytes
  auto other = on_1->latest();
  CHECK(!gpu::device_snapshot::adopt(*other, *device));
  gpu::device_snapshot uploaded(*other, *device);
  CHECK_FALSE(uploaded.adopted());
  REQUIRE(adopted.sources().size() == same->tensors().size());
  for (std::size_t i = 0; i < same->tensors().size(); ++i) {
    CAPTURE(same->tensors()[i].name);
    CHECK(adopted.sources()[i] == same->on_device()->tensors.at(same->tensors()[i].name));
  }
  // Adopted, the copy outlives its source's hold on it.
  on_0.reset();
  CHECK(bool(same->on_device()));
  // Both pack every worker's group to the same bytes.
  plan::grouped_plan p(c, std::make_shared<const plan::worker_plan>(engine::make_plan(c, 2, 1, dtype::bf16)));
  for (auto g : same->groups()) {
    CAPTURE(g);
    const auto layout = gpu::layout_group(p, g, *same);
    std::vector<std::uint8_t> a(layout.bytes + transfer::checksum_trailer_bytes), b(a.size());
    device->pack(layout, adopted.sources(), a.data());
    device->pack(layout, uploaded.sources(), b.data());
    CHECK(a == b);
  }
}
