// The external source: what a PyTorch trainer's publish hands in is checked
// against the model and the rank's layers (each refusal names the tensor),
// copied once, and published by the trainer's next step.
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/transfer/external_source.hpp"

#include "tests/support/fake_tensor_device.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

using namespace rlsync;
using namespace rlsync::transfer;
using rlsync::test::bytes_of;
using rlsync::test::small_model;

namespace {

/// A trainer's tensors: every parameter of `c` in `type`, filled with a
/// pattern that depends on the version, owned here.
struct state_dict {
  std::vector<std::vector<std::uint8_t>> storage;
  std::vector<tensor_input> inputs;

  state_dict(const model_config& c, dtype type, std::uint8_t fill, const std::vector<std::int64_t>& layers = {}) {
    for (const auto& s : llama_parameter_specs(c, type)) {
      if (!layers.empty()) {
        auto g = static_cast<std::int64_t>(plan::group_of(c, s.name));
        if (std::find(layers.begin(), layers.end(), g) == layers.end())
          continue;
      }
      storage.emplace_back(static_cast<std::size_t>(s.bytes()), fill); // 0x3c3c: a finite bf16
      inputs.push_back({s.name, s.type, s.shape, nullptr, s.bytes()});
    }
    for (std::size_t i = 0; i < inputs.size(); ++i)
      inputs[i].data = storage[i].data();
  }
  tensor_input& at(const std::string& name) {
    for (auto& t : inputs)
      if (t.name == name)
        return t;
    throw std::out_of_range(name);
  }
  void erase(const std::string& name) {
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].name == name) {
        inputs.erase(inputs.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
  }
};

external_options options_for(const model_config& c, std::optional<std::vector<std::int64_t>> layers = std::nullopt) {
  external_options o;
  o.config = c;
  o.type = dtype::bf16;
  o.held_layers = std::move(layers);
  o.who = "trainer rank 1";
  return o;
}

std::string refusal(external_source& s, std::uint64_t version, const std::vector<tensor_input>& inputs) {
  try {
    s.push(version, inputs);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST_CASE("external source: a push is copied once and published by the next step") {
  auto c = small_model(3);
  external_source source(options_for(c));
  CHECK(!source.advance()); // nothing pushed yet
  state_dict sd(c, dtype::bf16, 0x3c);
  source.push(1, sd.inputs);
  // The caller's tensors change at once (the training loop goes on): the
  // version pushed keeps what it had.
  for (auto& b : sd.storage)
    std::memset(b.data(), 0x3d, b.size());
  auto v1 = source.advance();
  REQUIRE(bool(v1));
  CHECK(v1->version() == 1);
  CHECK(source.latest().get() == v1.get());
  REQUIRE(v1->tensors().size() == sd.inputs.size());
  for (const auto& t : v1->tensors()) {
    INFO(t.name);
    CHECK(bytes_of(t) == std::vector<std::uint8_t>(t.size, 0x3c));
  }
  CHECK(!source.advance()); // published once
}

TEST_CASE("external source: a publish that repeats the last one's bytes says since when they are the same") {
  auto c = small_model(2);
  auto o = options_for(c);
  o.keep_versions = 4;
  external_source source(o);
  state_dict frozen(c, dtype::bf16, 0x3c), trained(c, dtype::bf16, 0x3c);
  trained.storage.back().back() = 0x3d; // one byte of the last tensor changed
  const std::vector<const state_dict*> pushes = {&frozen, &frozen, &trained, &trained};
  const std::vector<std::uint64_t> since = {1, 1, 3, 3};
  for (std::uint64_t v = 1; v <= pushes.size(); ++v) {
    CAPTURE(v);
    source.push(v, pushes[v - 1]->inputs); // copied into memory of the source's own each time
    REQUIRE(source.advance()->version() == v);
    CHECK(source.same_bytes_since(v) == since[v - 1]);
  }
}

TEST_CASE("external source: a newer push supersedes one not published yet") {
  auto c = small_model(2);
  external_source source(options_for(c));
  state_dict a(c, dtype::bf16, 0x3c), b(c, dtype::bf16, 0x3d);
  source.push(1, a.inputs);
  source.push(2, b.inputs);
  CHECK(source.last_pushed() == 2);
  auto s = source.advance();
  REQUIRE(bool(s));
  CHECK(s->version() == 2);
  CHECK(source.versions() == std::vector<std::uint64_t>{2});
}

TEST_CASE("external source: a rank holding some layers publishes exactly those") {
  auto c = small_model(4);
  external_source source(options_for(c, std::vector<std::int64_t>{2, 3}));
  state_dict mine(c, dtype::bf16, 0x3c, {2, 3});
  source.push(1, mine.inputs);
  auto s = source.advance();
  REQUIRE(bool(s));
  CHECK(s->groups() == std::vector<std::uint32_t>{2, 3});
  CHECK(s->find("lm_head.weight"));
  CHECK_FALSE(s->find("model.embed_tokens.weight"));
}

TEST_CASE("external source: a tied model's state_dict may list the embedding twice") {
  auto c = small_model(2, /*tied=*/true);
  external_source source(options_for(c));
  state_dict sd(c, dtype::bf16, 0x3c);
  // A tied PyTorch module lists lm_head.weight as the embedding's storage.
  const auto& embedding = sd.at("model.embed_tokens.weight");
  sd.inputs.push_back({"lm_head.weight", dtype::bf16, embedding.shape, embedding.data, embedding.bytes});
  CHECK(refusal(source, 1, sd.inputs) == "");
  // Another tensor under that name is not the tied one.
  std::vector<std::uint8_t> other(static_cast<std::size_t>(embedding.bytes), 0x3c);
  sd.inputs.back().data = other.data();
  CHECK(refusal(source, 2, sd.inputs).find("tensor 'lm_head.weight': the model ties its embeddings") == 0);
}

TEST_CASE("external source: every refusal names the tensor or the version, and nothing is queued") {
  auto c = small_model(4);
  const std::int64_t h = c.hidden_size;
  struct row {
    const char* what;
    std::uint64_t version;
    std::function<void(state_dict&)> change;
    std::string expected; // the start of the message
  };
  const std::vector<row> rows = {
    {"version 0", 0, [](state_dict&) {}, "version 0: must be in [1, 2^62]"},
    {"not a parameter", 1, [](state_dict& s) { s.inputs.push_back({"model.layers.0.mlp.bias", dtype::bf16, {4}, s.storage[0].data(), 8}); },
     "tensor 'model.layers.0.mlp.bias': not a parameter of the topology's model"},
    {"a layer the rank does not hold", 1,
     [](state_dict& s) { s.inputs.push_back({"model.layers.0.input_layernorm.weight", dtype::bf16, {64}, s.storage[0].data(), 128}); },
     "tensor 'model.layers.0.input_layernorm.weight': layer 0 is not held by trainer rank 1 (it holds layers 2-3)"},
    {"given twice", 1, [](state_dict& s) { s.inputs.push_back(s.inputs.front()); }, "tensor 'model.layers.2.input_layernorm.weight': given twice"},
    {"missing", 1, [](state_dict& s) { s.erase("model.norm.weight"); },
     "missing tensor 'model.norm.weight' (held by trainer rank 1: layers 2-3)"},
    {"wrong shape", 1, [h](state_dict& s) { s.at("model.norm.weight").shape = {h + 1}; },
     "tensor 'model.norm.weight': shape [" + std::to_string(h + 1) + "], the model's is [" + std::to_string(h) + "]"},
    {"wrong dtype", 1, [](state_dict& s) { s.at("model.norm.weight").type = dtype::f16; },
     "tensor 'model.norm.weight': dtype F16, the topology's weights are BF16"},
    {"bytes disagree", 1, [](state_dict& s) { s.at("model.norm.weight").bytes -= 2; },
     "tensor 'model.norm.weight': " + std::to_string(2 * h - 2) + " bytes given"},
  };
  for (const auto& r : rows) {
    const std::string what = r.what;
    CAPTURE(what);
    external_source source(options_for(c, std::vector<std::int64_t>{2, 3}));
    state_dict sd(c, dtype::bf16, 0x3c, {2, 3});
    r.change(sd);
    auto message = refusal(source, r.version, sd.inputs);
    CAPTURE(message);
    CHECK(message.rfind(r.expected, 0) == 0);
    CHECK(source.last_pushed() == 0);
    CHECK(!source.advance());
  }
}

TEST_CASE("external source: a restarted trainer publishes above what the fleet already serves") {
  auto c = small_model(2);
  external_source source(options_for(c));
  state_dict sd(c, dtype::bf16, 0x3c);
  source.raise_floor(100); // as it joined: the fleet serves v100 from the earlier process
  source.raise_floor(40);  // only raises
  CHECK(refusal(source, 81, sd.inputs)
        == "version 81: the fleet already serves version 100 (a trainer restarted from a checkpoint continues "
           "above it)");
  CHECK(refusal(source, 100, sd.inputs).rfind("version 100: the fleet already serves version 100", 0) == 0);
  CHECK(source.last_pushed() == 0);
  CHECK(!source.advance());
  source.push(101, sd.inputs);
  CHECK(source.last_pushed() == 101);
}

TEST_CASE("external source: versions only grow, and NaN is refused unless allowed") {
  auto c = small_model(2);
  external_source source(options_for(c));
  state_dict sd(c, dtype::bf16, 0x3c);
  source.push(5, sd.inputs);
  CHECK(refusal(source, 5, sd.inputs) == "version 5: must exceed the last version published (5)");
  CHECK(refusal(source, 4, sd.inputs) == "version 4: must exceed the last version published (5)");
  auto& norm = sd.at("model.norm.weight");
  std::vector<std::uint16_t> values(static_cast<std::size_t>(c.hidden_size), 0x3c3c);
  values[3] = 0x7fc0; // NaN
  norm.data = values.data();
  auto message = refusal(source, 6, sd.inputs);
  CHECK(message.find("model.norm.weight") != std::string::npos);
  CHECK(message.find("NaN") != std::string::npos);
  CHECK(source.last_pushed() == 5);

  auto o = options_for(c);
  o.allow_nonfinite = true;
  external_source lenient(o);
  CHECK(refusal(lenient, 1, sd.inputs) == "");
}

namespace {

/// `sd` as tensors on CUDA device `device` (the fake's "device" memory is
/// the host's).
std::vector<tensor_input> on_device(state_dict& sd, int device) {
  auto inputs = sd.inputs;
  for (auto& t : inputs)
    t.device = device;
  return inputs;
}

external_options device_options(const model_config& c, std::shared_ptr<test::fake_tensor_device> device,
                                std::optional<int> copy_on) {
  auto o = options_for(c);
  o.device = std::move(device);
  o.device_copy_on = copy_on;
  return o;
}

} // namespace

TEST_CASE("external source: with shared memory a host push lands in lendable memory, a device push does not") {
  auto c = small_model(3);
  auto device = std::make_shared<test::fake_tensor_device>();
  auto o = options_for(c);
  o.device = device;
  o.shared_memory = true;
  o.shared_small_pages = true; // this machine's hugetlb pool may be empty
  external_source source(o);
  state_dict sd(c, dtype::bf16, 0x3c);
  for (std::uint64_t version = 1; version <= 3; ++version) {
    CAPTURE(version);
    const bool from_device = version == 2; // its page-locked buffer is private, and reused
    source.push(version, from_device ? on_device(sd, 0) : sd.inputs);
    auto v = source.advance();
    REQUIRE(bool(v));
    CHECK(bool(v->shared_buffer()) == !from_device);
    for (const auto& t : v->tensors()) {
      INFO(t.name);
      CHECK(bytes_of(t) == std::vector<std::uint8_t>(t.size, 0x3c));
      if (v->shared_buffer()) // offsets count from the buffer's data: what a manifest names
        CHECK(reinterpret_cast<const std::uint8_t*>(t.data) == v->shared_buffer()->data() + t.offset);
    }
  }
  // Without the option every version is private memory.
  external_source plain(options_for(c));
  plain.push(1, sd.inputs);
  CHECK(!plain.advance()->shared_buffer());
}

TEST_CASE("external source: a lendable buffer is reused once its version is dropped, never while held") {
  auto c = small_model(2);
  auto o = options_for(c);
  o.keep_versions = 1;
  o.shared_memory = true;
  o.shared_small_pages = true;
  external_source source(o);
  auto push = [&](std::uint64_t version, std::uint8_t fill) {
    state_dict sd(c, dtype::bf16, fill);
    source.push(version, sd.inputs);
    auto v = source.advance();
    REQUIRE(v->shared_buffer());
    return v;
  };
  auto v1 = push(1, 0x3c); // held here, as a lend or a round would
  const auto id1 = v1->shared_buffer()->id();
  const auto id2 = push(2, 0x3d)->shared_buffer()->id();
  CHECK(push(3, 0x3e)->shared_buffer()->id() != id2); // version 2 was kept until 3 was published
  auto v4 = push(4, 0x3f);
  CHECK(v4->shared_buffer()->id() == id2); // the only spare: version 1's memory is held
  for (const auto& t : v1->tensors())      // what a late reader of version 1 sees: unchanged
    CHECK(bytes_of(t) == std::vector<std::uint8_t>(t.size, 0x3c));
  v1.reset();
  auto v5 = push(5, 0x40);
  CHECK(v5->shared_buffer()->id() == id1);
  for (const auto& t : v5->tensors())
    CHECK(bytes_of(t) == std::vector<std::uint8_t>(t.size, 0x40));
}

TEST_CASE("external source: tensors pushed from a device are copied to the host, and to a device copy when kept") {
  auto c = small_model(3);
  auto device = std::make_shared<test::fake_tensor_device>();
  external_source source(device_options(c, device, 0));
  state_dict sd(c, dtype::bf16, 0x3c);
  source.push(1, on_device(sd, 1));
  for (auto& b : sd.storage) // the trainer goes on: neither copy changes
    std::memset(b.data(), 0x3d, b.size());
  auto v1 = source.advance();
  REQUIRE(bool(v1));
  // One read of the trainer's tensors: the host bytes come from the copy, on device 0.
  CHECK(device->to_host_calls == static_cast<int>(sd.inputs.size()));
  CHECK(std::all_of(device->read_from.begin(), device->read_from.end(), [](int d) { return d == 0; }));
  const auto copy = v1->on_device();
  REQUIRE(bool(copy));
  CHECK(copy->device == 0); // the device the trainer packs on, not the tensors'
  CHECK(device->allocated_on == 0);
  CHECK(device->device_copies == static_cast<int>(sd.inputs.size()));
  const auto* base = static_cast<const std::uint8_t*>(copy->memory.get());
  for (const auto& t : v1->tensors()) {
    INFO(t.name);
    CHECK(bytes_of(t) == std::vector<std::uint8_t>(t.size, 0x3c));
    const auto* on = static_cast<const std::uint8_t*>(copy->tensors.at(t.name));
    CHECK((on - base) % 256 == 0); // the pack kernels read whole, aligned elements
    CHECK(static_cast<std::uint64_t>(on - base) + t.size <= copy->bytes);
    CHECK(std::vector<std::uint8_t>(on, on + t.size) == std::vector<std::uint8_t>(t.size, 0x3c));
  }
  CHECK(source.device_copy_problem().empty());
}

TEST_CASE("external source: without a backend that serves from the device, a device push makes no device copy") {
  auto c = small_model(2);
  auto device = std::make_shared<test::fake_tensor_device>();
  external_source source(device_options(c, device, std::nullopt));
  state_dict sd(c, dtype::bf16, 0x3c);
  source.push(1, on_device(sd, 3));
  auto v1 = source.advance();
  REQUIRE(bool(v1));
  CHECK(!v1->on_device());
  CHECK(device->allocations == 0);
  CHECK(device->to_host_calls == static_cast<int>(sd.inputs.size()));
  CHECK(std::all_of(device->read_from.begin(), device->read_from.end(), [](int d) { return d == 3; }));
  for (const auto& t : v1->tensors())
    CHECK(bytes_of(t) == std::vector<std::uint8_t>(t.size, 0x3c));
}

TEST_CASE("external source: the source holds the newest device copies, and one adopted lives on") {
  auto c = small_model(2);
  auto device = std::make_shared<test::fake_tensor_device>();
  auto o = device_options(c, device, 0);
  o.keep_versions = 2;
  o.device_copies = 2;
  external_source source(o);
  state_dict sd(c, dtype::bf16, 0x3c);
  source.push(1, on_device(sd, 0));
  source.advance();
  source.push(2, on_device(sd, 0));
  source.advance();
  CHECK(device->live == 2);
  auto v1 = source.find(1);
  auto adopted = v1->on_device(); // a round's device snapshot adopted version 1's copy
  // The newest version always gets a copy; the source lets go of the oldest.
  source.push(3, on_device(sd, 0));
  CHECK(source.device_copy_problem().empty());
  auto v3 = source.advance();
  CHECK(bool(v3->on_device()));
  CHECK(device->live == 3); // version 1's copy lives while adopted
  CHECK(bool(v1->on_device()));
  adopted.reset();
  CHECK(device->live == 2);
  CHECK(!v1->on_device()); // the trainer uploads its host bytes if it is pulled again
  source.push(4, on_device(sd, 0));
  CHECK(bool(source.advance()->on_device()));
  CHECK(device->live == 2);
  CHECK(!source.find(2)); // dropped with its copy
}

TEST_CASE("external source: a device copy that fails leaves the version served from its host bytes") {
  auto c = small_model(2);
  auto device = std::make_shared<test::fake_tensor_device>();
  external_source source(device_options(c, device, 0));
  state_dict sd(c, dtype::bf16, 0x3c);
  device->fail_allocate = true;
  source.push(1, on_device(sd, 0));
  CHECK(source.device_copy_problem().find("cuda:0 could not hold a copy") != std::string::npos);
  CHECK(source.device_copy_problem().find("out of memory") != std::string::npos);
  auto v1 = source.advance();
  REQUIRE(bool(v1));
  CHECK(!v1->on_device());
  device->fail_allocate = false;
  device->fail_copy = true;
  source.push(2, on_device(sd, 0));
  CHECK(source.device_copy_problem().find("copying to cuda:0 failed: cudaMemcpy") != std::string::npos);
  CHECK(device->live == 0); // the failed copy's memory is freed at once
  CHECK(!source.advance()->on_device());
  // Neither failure took a place among the two copies held: versions 3
  // and 4 both keep theirs.
  device->fail_copy = false;
  source.push(3, on_device(sd, 0));
  CHECK(bool(source.advance()->on_device()));
  source.push(4, on_device(sd, 0));
  CHECK(bool(source.advance()->on_device()));
  CHECK(source.device_copy_problem().empty());
  CHECK(bool(source.find(3)->on_device()));
  CHECK(device->live == 2);
}

TEST_CASE("external source: a superseded version's copy goes at once, copies of versions not served before the oldest") {
  auto c = small_model(2);
  auto device = std::make_shared<test::fake_tensor_device>();
  auto o = device_options(c, device, 0);
  o.keep_versions = 1;
  o.device_copies = 3;
  external_source source(o);
  state_dict sd(c, dtype::bf16, 0x3c);
  source.push(1, on_device(sd, 0));
  source.advance();
  REQUIRE(source.pin(1)); // a slow round's version: served until the next pin
  source.push(2, on_device(sd, 0));
  source.push(3, on_device(sd, 0)); // supersedes version 2 before it was published
  CHECK(device->live == 2);
  source.advance(); // serves 1 (pinned) and 3
  source.push(4, on_device(sd, 0));
  source.advance(); // serves 1 and 4; version 3's copy is held but no longer served
  CHECK(device->live == 3);
  source.push(5, on_device(sd, 0)); // room: version 3's copy, not the oldest (1, still served)
  CHECK(device->live == 3);
  CHECK(bool(source.find(1)->on_device()));
  CHECK(bool(source.find(4)->on_device()));
  CHECK(bool(source.advance()->on_device()));
}

TEST_CASE("external source: device tensors without a device are refused, host and device mixed are copied") {
  auto c = small_model(2);
  state_dict sd(c, dtype::bf16, 0x3c);
  {
    external_source host_only(options_for(c));
    auto why = refusal(host_only, 1, on_device(sd, 0));
    CHECK(why.find("tensor 'model.embed_tokens.weight': on cuda:0, and trainer rank 1 reads host tensors only")
          != std::string::npos);
    CHECK(host_only.last_pushed() == 0);
  }
  // A state_dict with a buffer left on the CPU: each tensor from where it
  // is, and no device copy (the trainer uploads the version).
  auto device = std::make_shared<test::fake_tensor_device>();
  external_source source(device_options(c, device, 0));
  auto mixed = on_device(sd, 0);
  mixed.back().device = -1;
  source.push(1, mixed);
  CHECK(device->allocations == 0);
  CHECK(device->to_host_calls == static_cast<int>(mixed.size()) - 1);
  CHECK(source.device_copy_problem().find("some tensors are in host memory") != std::string::npos);
  auto v1 = source.advance();
  REQUIRE(bool(v1));
  CHECK(!v1->on_device());
  for (const auto& t : v1->tensors())
    CHECK(bytes_of(t) == std::vector<std::uint8_t>(t.size, 0x3c));
}

TEST_CASE("external source: NaN in a device tensor is refused, and its device copy freed") {
  auto c = small_model(2);
  auto device = std::make_shared<test::fake_tensor_device>();
  external_source source(device_options(c, device, 0));
  state_dict sd(c, dtype::bf16, 0x3c);
  auto& t = sd.at("model.norm.weight");
  std::uint16_t nan = 0x7fc0;
  std::memcpy(const_cast<void*>(t.data), &nan, sizeof nan);
  auto why = refusal(source, 1, on_device(sd, 0));
  CHECK(why.find("model.norm.weight") != std::string::npos);
  CHECK(device->live == 0);
  CHECK(!source.advance());
}

TEST_CASE("external source: a device push page-locks its host buffer once, and reuses it locked") {
  auto c = small_model(2);
  auto device = std::make_shared<test::fake_tensor_device>();
  {
    auto o = device_options(c, device, std::nullopt);
    o.keep_versions = 1;
    external_source source(o);
    state_dict sd(c, dtype::bf16, 0x3c);
    source.push(1, sd.inputs); // from the host: nothing to lock for
    source.advance();
    CHECK(device->pins == 0);
    for (std::uint64_t v = 2; v <= 8; ++v) {
      source.push(v, on_device(sd, 0));
      source.advance();
    }
    // One version held and one pushed at a time: the buffers go round
    // through the spares, each locked at its first device push.
    CHECK(device->pins >= 1);
    CHECK(device->pins <= 3);
    CHECK(device->pinned == device->pins);
  }
  CHECK(device->pinned == 0); // every lock dropped with its buffer
  device->fail_pin = true; // a memlock limit: the push still works, unlocked
  external_source fresh(device_options(c, device, std::nullopt));
  state_dict other(c, dtype::bf16, 0x3d);
  fresh.push(1, on_device(other, 0));
  for (const auto& t : fresh.advance()->tensors())
    CHECK(bytes_of(t) == std::vector<std::uint8_t>(t.size, 0x3d));
  CHECK(device->pinned == 0);
}
