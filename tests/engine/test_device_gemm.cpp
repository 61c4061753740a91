// The engine's device path, on the CPU: which matrix a kernel address lies
// in, and a model whose products run on a device backend (a fake one that
// multiplies its own copy with the CPU kernels, so every output must match
// the CPU engine bit for bit, and a copy that goes stale would show).
#include "tests/support/engine_fixtures.hpp"
#include "tests/support/fake_engine_device.hpp"

#include "runtime/engine/device_gemm.hpp"
#include "runtime/engine/engine_core.hpp"
#include "runtime/engine/model.hpp"
#include "runtime/engine/process.hpp"
#include "runtime/engine/tokenizer.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>

using namespace rlsync;
using namespace rlsync::engine;
using rlsync::test::make_source;
using rlsync::test::tiny_config;

namespace {

// Greedy tokens and every step's logits of one prompt, `steps` steps.
struct run {
  std::vector<std::int32_t> tokens;
  std::vector<float> logits;
};

run greedy(model& m, const std::vector<std::int32_t>& prompt, int steps) {
  run r;
  auto seq = m.new_sequence();
  std::vector<forward_item> batch{{&seq, prompt, 0, false}};
  for (int s = 0; s < steps; ++s) {
    auto out = m.forward(batch);
    r.logits.insert(r.logits.end(), out.logits.begin(), out.logits.end());
    const float* row = out.last(0);
    const auto next = static_cast<std::int32_t>(std::max_element(row, row + out.vocab) - row);
    r.tokens.push_back(next);
    batch[0] = {&seq, {next}, seq.length(), false};
  }
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Six greedy tokens of one request through the whole engine.
std::vector<std::int32_t> generate(engine_core& c) {
  generate_request req;
  req.request_id = 1;
  req.prompt = encode("async RL");
  req.sampling.max_tokens = 6;
  req.sampling.stop_at_eos = false;
  std::vector<std::int32_t> tokens;
  REQUIRE(!c.add(req, {[&](const token_event& e) { tokens.push_back(e.token); }, [](generate_result) {}}));
  for (int i = 0; i < 100 && c.has_work(); ++i)
    c.step();
  return tokens;
}

} // namespace

TEST_CASE("matrix index: an address inside a matrix gives the matrix and the element, any other is refused") {
  auto set = make_source(tiny_config(), dtype::bf16, 1).load(2);
  const auto matrices = matrices_of(*set);
  // Every two-dimensional parameter of both workers, norms left out.
  std::size_t expected = 0;
  for (const auto& w : set->workers)
    for (const auto& p : w.params())
      expected += p.shape.size() == 2 ? 1 : 0;
  REQUIRE(matrices.size() == expected);
  matrix_index index(matrices);
  for (std::size_t i = 0; i < matrices.size(); ++i) {
    CAPTURE(matrices[i].name);
    const auto& m = matrices[i];
    auto at = index.locate(m.ref.data);
    CHECK(at.matrix == i);
    CHECK(at.element == 0);
    const auto last = m.rows * m.cols - 1;
    at = index.locate((m.ref + last).data);
    CHECK(at.matrix == i);
    CHECK(at.element == last);
  }
  const auto& first = matrices.front();
  // Past the end, and between two elements (half a bf16).
  const auto* end = static_cast<const unsigned char*>(first.ref.data) + first.bytes();
  bool end_is_another = false;
  for (const auto& m : matrices)
    end_is_another = end_is_another || m.ref.data == end;
  if (!end_is_another)
    CHECK_THROWS_AS(index.locate(end), std::logic_error);
  CHECK_THROWS_AS(index.locate(static_cast<const unsigned char*>(first.ref.data) + 1), std::logic_error);
  const float elsewhere = 0;
  CHECK_THROWS_AS(index.locate(&elsewhere), std::logic_error);

  // The int8 form: the kernels read q, one byte per element.
  process_weights(*set, weight_format::int8);
  const auto quantized = matrices_of(*set);
  matrix_index q_index(quantized);
  const auto& qkv = *std::find_if(quantized.begin(), quantized.end(),
                                  [](const matrix_ref& m) { return m.name.find("qkv_proj") != std::string::npos; });
  REQUIRE(qkv.ref.int8());
  CHECK(qkv.element_size() == 1);
  CHECK(q_index.locate((qkv.ref + 7).data).element == 7);
}

TEST_CASE("engine device: every product on the device copy gives the CPU engine's logits bit for bit, "
          "Llama, Qwen3 and Qwen3-MoE, tp 1 and 2, received and int8") {
  struct row {
    model_config config;
    int tp;
    bool expert_parallel;
    weight_format weights;
  };
  std::vector<row> rows;
  for (int tp : {1, 2})
    for (const auto& c : {tiny_config(), test::tiny_qwen3_config(), test::tiny_moe_config(2)})
      rows.push_back({c, tp, false, weight_format::received});
  rows.push_back({test::tiny_moe_config(2), 2, true, weight_format::received});
  rows.push_back({tiny_config(), 2, false, weight_format::int8});
  const auto prompt = encode("device products");
  for (const auto& r : rows) {
    CAPTURE(to_string(r.config.arch));
    CAPTURE(r.tp);
    CAPTURE(r.expert_parallel);
    CAPTURE(to_string(r.weights));
    auto source = make_source(r.config, dtype::bf16, 3);
    model cpu(r.config, r.tp, dtype::bf16, r.expert_parallel);
    model dev(r.config, r.tp, dtype::bf16, r.expert_parallel);
    auto device = std::make_shared<test::fake_device>();
    dev.set_device(device);
    CHECK(dev.device() == device.get());
    auto set = source.load(r.tp, r.expert_parallel);
    process_weights(*set, r.weights);
    cpu.set_weights(set);
    dev.set_weights(set);
    CHECK(device->counts->mirrors == 1);
    const auto expected = greedy(cpu, prompt, 6);
    const auto got = greedy(dev, prompt, 6);
    CHECK(got.tokens == expected.tokens);
    CHECK(same_bits(got.logits, expected.logits));
    CHECK(device->counts->products > 0);
  }
}

TEST_CASE("engine device: a step multiplies by the copy made at set_weights, never the host bytes, and the "
          "next set_weights makes the next copy") {
  const auto config = tiny_config();
  auto v1 = make_source(config, dtype::bf16, 1);
  auto v2 = make_source(config, dtype::bf16, 2);
  const auto prompt = encode("stale or not");
  model reference(config, 1, dtype::bf16);
  reference.set_weights(v1.load(1));
  const auto on_v1 = greedy(reference, prompt, 4);

  model dev(config, 1, dtype::bf16);
  auto device = std::make_shared<test::fake_device>();
  dev.set_device(device);
  auto served = v1.load(1);
  dev.set_weights(served);
  // Scribbled over after the upload: the host copy is no longer v1, the device's is.
  for (auto& w : served->workers)
    for (const auto& p : w.params())
      if (p.shape.size() == 2 && p.name != param::embed)
        std::memset(const_cast<unsigned char*>(p.bytes.data()), 0x3f, p.bytes.size());
  CHECK(same_bits(greedy(dev, prompt, 4).logits, on_v1.logits));
  // The CPU engine over the same scribbled set does see it (the check above can fail).
  model scribbled(config, 1, dtype::bf16);
  scribbled.set_weights(served);
  CHECK(!same_bits(greedy(scribbled, prompt, 4).logits, on_v1.logits));

  std::shared_ptr<const weight_set> second = v2.load(1);
  dev.set_weights(second);
  CHECK(device->counts->mirrors == 2);
  reference.set_weights(v2.load(1));
  CHECK(same_bits(greedy(dev, prompt, 4).logits, greedy(reference, prompt, 4).logits));

  // A failed upload leaves the served set (and its copy) as they were.
  device->counts->fail_next_mirror = true;
  CHECK_THROWS_WITH(dev.set_weights(v1.load(1)), "fake device: out of memory");
  CHECK(dev.weights().get() == second.get());
  CHECK(same_bits(greedy(dev, prompt, 4).logits, greedy(reference, prompt, 4).logits));
  // The device is chosen before anything is served.
  CHECK_THROWS_AS(dev.set_device(nullptr), std::logic_error);
}

TEST_CASE("engine device: an engine_core with a device option serves each loaded version from a new copy") {
  const auto config = tiny_config();
  engine_options on_device;
  auto device = std::make_shared<test::fake_device>();
  on_device.device = device;
  on_device.tp = 2;
  engine_core core(config, on_device);
  core.load(make_source(config, dtype::bf16, 1).load(2), 1);
  core.load(make_source(config, dtype::bf16, 2).load(2), 2);
  CHECK(device->counts->mirrors == 2);
  engine_options on_cpu;
  on_cpu.tp = 2;
  engine_core reference(config, on_cpu);
  reference.load(make_source(config, dtype::bf16, 2).load(2), 2);
  const long before = device->counts->products;
  const auto tokens = generate(core);
  CHECK(tokens.size() == 6);
  CHECK(tokens == generate(reference));
  CHECK(device->counts->products > before);
}

namespace {

engine_options on(std::shared_ptr<test::fake_device> device) {
  engine_options opts;
  opts.device = std::move(device);
  return opts;
}

// An engine_core on a fake device serving version 1 at tp 1, paused (keep):
// ready for a weight-update session.
struct paused_on_device {
  model_config config = tiny_config();
  std::shared_ptr<test::fake_device> device = std::make_shared<test::fake_device>();
  engine_core core{config, on(device)};
  paused_on_device() {
    core.load(make_source(config, dtype::bf16, 1).load(1), 1);
    core.pause({pause_mode::keep, false});
    REQUIRE(core.poll_pause());
  }
};

} // namespace

TEST_CASE_FIXTURE(paused_on_device, "engine device: a version the device cannot hold fails finish_update and "
                                    "leaves the engine dirty, and the next update is served") {
  auto v2 = make_source(config, dtype::bf16, 2).load(1);
  // A whole session: every entry of the plan written into staging.
  auto update = [&](std::uint64_t version) {
    REQUIRE(!core.start_update(version));
    auto staging = core.session_staging();
    for (std::size_t p = 0; p < staging->workers[0].params().size(); ++p) {
      auto& into = staging->workers[0].at(staging->workers[0].params()[p].name);
      into.bytes = v2->workers[0].params()[p].bytes;
    }
    std::set<std::string> sources;
    for (const auto& e : core.worker_plan(0).entries)
      sources.insert(e.source);
    REQUIRE(!core.mark_received(0, sources, version));
    return core.finish_update(version);
  };
  device->counts->fail_next_mirror = true;
  auto failed = update(2);
  REQUIRE(failed);
  CHECK(failed->code == errc::update_incomplete);
  CHECK(failed->what.find("version 2 could not be served: fake device: out of memory") != std::string::npos);
  CHECK(core.dirty());
  CHECK(core.version() == 1);
  CHECK(!update(3));
  CHECK(!core.dirty());
  CHECK(core.version() == 3);
  CHECK(device->counts->mirrors == 2); // the first load and version 3
}

namespace {

// One matrix's element count, and the address of element `e` of it.
std::int64_t elements_of(const matrix_ref& m) { return m.rows * m.cols; }
const std::uint8_t* element_at(const matrix_ref& m, std::int64_t e) {
  return static_cast<const std::uint8_t*>(m.ref.data) + e * static_cast<std::int64_t>(m.element_size());
}

} // namespace

TEST_CASE("device landing: runs that cover a matrix exactly once complete it, a gap or an overlap does not") {
  auto set = make_source(tiny_config(), dtype::bf16, 1).load(1);
  const auto m = matrices_of(*set).front();
  const auto n = elements_of(m);
  REQUIRE(n >= 8);
  struct row {
    const char* name;
    std::vector<std::pair<std::int64_t, std::int64_t>> runs; // (first element, count)
    bool complete;
  };
  const std::vector<row> rows{
    {"one run", {{0, n}}, true},
    {"two runs in order", {{0, 4}, {4, n - 4}}, true},
    {"two runs out of order", {{4, n - 4}, {0, 4}}, true},
    {"none", {}, false},
    {"a gap", {{0, 4}, {5, n - 5}}, false},
    {"an overlap", {{0, 5}, {4, n - 4}}, false},
    {"a run twice", {{0, n}, {0, 4}}, false},
    {"short of the end", {{0, n - 1}}, false},
  };
  std::vector<std::uint8_t> device(static_cast<std::size_t>(m.bytes())); // device 0's bytes (host memory)
  for (const auto& r : rows) {
    CAPTURE(r.name);
    test::fake_device dev;
    auto landing = dev.landing(*set);
    for (const auto& [first, count] : r.runs)
      CHECK(landing->land(element_at(m, first), device.data(), static_cast<std::size_t>(count) * m.element_size(), 0));
    CHECK(landing->complete(0) == r.complete);
    set->landed = landing;
    CHECK(matrix_landed(*set, matrices_of(*set), 0) == r.complete);
    set->landed.reset();
  }
}

TEST_CASE("device landing: a run that is not whole elements of one matrix, or lies on another device, is refused") {
  auto set = make_source(tiny_config(), dtype::bf16, 1).load(1);
  const auto matrices = matrices_of(*set);
  const auto& m = matrices.front();
  test::fake_device dev;
  auto landing = dev.landing(*set);
  std::vector<std::uint8_t> device(static_cast<std::size_t>(m.bytes()) + 2);
  const auto* norm = set->workers[0].at(layer_param_name(0, param::input_norm)).bytes.data();
  CHECK(!landing->land(norm, device.data(), 2, 0));                            // a norm: on the CPU only
  CHECK(!landing->land(element_at(m, 0) + 1, device.data(), 2, 0));            // inside an element
  CHECK(!landing->land(element_at(m, 0), device.data(), 3, 0));                // half an element
  CHECK(!landing->land(element_at(m, 0), device.data(), m.bytes() + 2, 0));    // past the matrix's end
  CHECK(!landing->land(element_at(m, 0), device.data(), 0, 0));                // nothing
  CHECK(!landing->land(element_at(m, 0), device.data(), m.bytes(), 1));        // device 1: the fake reads 0 only
  CHECK(dev.counts->refused_runs == 1);
  CHECK(!landing->complete(0));
  CHECK(landing->land(element_at(m, 0), device.data(), m.bytes(), 0));
  CHECK(landing->complete(0));
  // Made for another set's addresses, or the set processed since: not taken.
  auto other = make_source(tiny_config(), dtype::bf16, 1).load(1);
  other->landed = landing;
  CHECK(!matrix_landed(*other, matrices_of(*other), 0));
  set->landed = landing;
  CHECK(matrix_landed(*set, matrices, 0));
  set->processed = true;
  CHECK(!matrix_landed(*set, matrices, 0));
  CHECK_THROWS_AS(dev.landing(*set), std::logic_error);
}

namespace {

// A session on `core` that writes `next`'s bytes into the staging set, and
// lands every matrix's bytes from `landed` (in place of device memory) the
// way a data plane holding them on device 0 does: one run per row.
// `half` lands only the first half of matrix 0's rows.
void landed_session(engine_core& core, std::uint64_t version, const weight_set& next, const weight_set& landed,
                    bool half = false) {
  REQUIRE(!core.start_update(version));
  auto staging = core.session_staging();
  auto landing = core.open_landing();
  REQUIRE(bool(landing));
  CHECK(bool(staging->landed.get() == landing.get()));
  for (std::size_t w = 0; w < staging->workers.size(); ++w)
    for (std::size_t p = 0; p < staging->workers[w].params().size(); ++p) {
      const auto& from = next.workers[w].params()[p];
      auto& into = staging->workers[w].at(from.name);
      REQUIRE(into.bytes.size() == from.bytes.size());
      std::memcpy(into.bytes.data(), from.bytes.data(), from.bytes.size());
    }
  const auto mine = matrices_of(*staging);
  const auto theirs = matrices_of(landed);
  REQUIRE(mine.size() == theirs.size());
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const auto row_bytes = static_cast<std::size_t>(mine[i].cols) * mine[i].element_size();
    const auto rows = half && i == 0 ? mine[i].rows / 2 : mine[i].rows;
    for (std::int64_t r = 0; r < rows; ++r)
      CHECK(landing->land(element_at(mine[i], r * mine[i].cols), element_at(theirs[i], r * theirs[i].cols), row_bytes,
                          0));
  }
  for (int w = 0; w < static_cast<int>(staging->workers.size()); ++w) {
    std::set<std::string> sources;
    for (const auto& e : core.worker_plan(w).entries)
      sources.insert(e.source);
    REQUIRE(!core.mark_received(w, sources, version));
  }
  REQUIRE(!core.finish_update(version));
}

} // namespace

TEST_CASE("engine device: a session landed on the device is served from its landing, matrix by matrix, "
          "and what no run covered is copied from the host set") {
  const auto config = tiny_config();
  auto v1 = make_source(config, dtype::bf16, 1);
  auto v2 = make_source(config, dtype::bf16, 2);
  auto device = std::make_shared<test::fake_device>();
  engine_options opts;
  opts.device = device;
  opts.tp = 2;
  engine_core core(config, opts);
  core.load(v1.load(2), 1);
  const long per_set = device->counts->matrices_copied; // the first load: copied, nothing landed
  REQUIRE(per_set > 0);
  core.pause({pause_mode::keep, false});
  REQUIRE(core.poll_pause());
  engine_options on_cpu;
  on_cpu.tp = 2;
  engine_core reference(config, on_cpu);
  reference.load(v2.load(2), 2);
  const auto expected = generate(reference);

  SUBCASE("every matrix landed: none copied, the tokens the CPU engine gives") {
    landed_session(core, 2, *v2.load(2), *v2.load(2));
    CHECK(device->counts->matrices_landed == per_set);
    CHECK(device->counts->matrices_copied == per_set);
    CHECK(device->counts->landed_unlike_host == 0);
    CHECK(!core.session_staging());
    CHECK(!core.weights()->landed); // taken, and let go once served
    core.resume();
    CHECK(generate(core) == expected);
  }
  SUBCASE("landed bytes are what the device serves (so the check above can fail)") {
    landed_session(core, 2, *v2.load(2), *v1.load(2));
    CHECK(device->counts->landed_unlike_host == per_set);
    core.resume();
    CHECK(generate(core) != expected);
  }
  SUBCASE("a matrix landed in part is copied, the others are taken") {
    landed_session(core, 2, *v2.load(2), *v2.load(2), /*half=*/true);
    CHECK(device->counts->matrices_landed == per_set - 1);
    CHECK(device->counts->matrices_copied == per_set + 1);
    core.resume();
    CHECK(generate(core) == expected);
  }
  SUBCASE("a write beside the data plane drops the landing: every matrix copied") {
    REQUIRE(!core.start_update(2));
    REQUIRE(bool(core.open_landing()));
    const auto& plan = core.worker_plan(0);
    std::vector<std::uint8_t> packed;
    std::set<std::string> first{plan.entries.front().source};
    for (const auto& e : plan.entries)
      if (e.source == plan.entries.front().source)
        packed.resize(packed.size() + e.bytes());
    REQUIRE(!core.apply_packed(0, first, packed.data(), packed.size()));
    CHECK(!core.session_staging()->landed);
    core.abort_update();
  }
}

TEST_CASE_FIXTURE(paused_on_device, "engine device: an aborted, superseded or unservable session closes its "
                                    "landing: a pull still running lands nothing more, and what it held is freed") {
  auto next = make_source(config, dtype::bf16, 2).load(1);
  // One run of the first matrix of the set it was made for, as a pull thread would land it.
  auto land_one = [&](const std::shared_ptr<device_landing>& l) {
    const auto& m = l->matrices().front();
    const auto from = matrices_of(*next).front();
    return l->land(element_at(m, 0), from.ref.data, static_cast<std::size_t>(m.cols) * m.element_size(), 0);
  };
  REQUIRE(!core.start_update(2));
  auto aborted = core.open_landing();
  REQUIRE(bool(aborted));
  CHECK(land_one(aborted));
  core.abort_update();
  CHECK(device->counts->released == 1);
  CHECK(!land_one(aborted)); // closed: refused
  REQUIRE(!core.start_update(2));
  auto superseded = core.open_landing();
  REQUIRE(!core.start_update(3)); // a new start supersedes the open session
  CHECK(device->counts->released == 2);
  auto unservable = core.open_landing();
  device->counts->fail_next_mirror = true;
  const auto& plan = core.worker_plan(0);
  std::set<std::string> sources;
  for (const auto& e : plan.entries)
    sources.insert(e.source);
  REQUIRE(!core.mark_received(0, sources, 3));
  REQUIRE(core.finish_update(3));
  CHECK(device->counts->released == 3);
  CHECK(!core.weights()->landed);
  CHECK(!land_one(superseded));
  CHECK(!land_one(unservable));
}

TEST_CASE("engine device: no landing without a session, a device, or with weights served as int8") {
  const auto config = tiny_config();
  engine_options plain;
  engine_core cpu(config, plain);
  cpu.load(make_source(config, dtype::bf16, 1).load(1), 1);
  CHECK(!cpu.open_landing()); // no session
  cpu.pause({pause_mode::keep, false});
  REQUIRE(cpu.poll_pause());
  REQUIRE(!cpu.start_update(2));
  CHECK(!cpu.open_landing()); // no device
  engine_options int8;
  int8.device = std::make_shared<test::fake_device>();
  int8.weights = weight_format::int8;
  engine_core quantized(config, int8);
  quantized.load(make_source(config, dtype::bf16, 1).load(1), 1);
  quantized.pause({pause_mode::keep, false});
  REQUIRE(quantized.poll_pause());
  REQUIRE(!quantized.start_update(2));
  CHECK(!quantized.open_landing()); // the device copy is scale * q, made from the host set
}
