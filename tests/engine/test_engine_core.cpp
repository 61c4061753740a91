// The engine core: continuous batching, streaming, bounded queues, the
// prefix cache, pause/resume exactly as vLLM's, the weight-update session,
// and the seed documents' correctness check (pause, update, resume).
#include "tests/support/engine_fixtures.hpp"

#include "runtime/engine/apply_packed.hpp"
#include "runtime/engine/engine_core.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "runtime/engine/worker_pool.hpp"

#include <doctest/doctest.h>

#include <map>

using namespace rlsync;
using namespace rlsync::engine;
using namespace rlsync::test;

namespace {

/// What one request's requester saw.
struct transcript {
  std::vector<token_event> tokens;
  std::optional<generate_result> result;

  std::vector<std::int32_t> ids() const {
    std::vector<std::int32_t> out;
    for (auto& t : tokens)
      out.push_back(t.token);
    return out;
  }
};

struct harness {
  model_config config;
  source_weights v1;
  engine_core core;
  std::map<std::uint64_t, transcript> seen;

  explicit harness(int tp = 1, engine_options opts = {}, model_config c = tiny_config())
    : config(c), v1(make_source(c, dtype::bf16, 1)), core(c, with_tp(opts, tp)) {
    core.load(v1.load(tp, opts.expert_parallel), 1);
  }

  static engine_options with_tp(engine_options o, int tp) {
    o.tp = tp;
    return o;
  }

  request_callbacks callbacks(std::uint64_t id) {
    return {[this, id](const token_event& e) { seen[id].tokens.push_back(e); },
            [this, id](generate_result r) { seen[id].result = std::move(r); }};
  }

  std::optional<engine_error> add(std::uint64_t id, const std::string& prompt, std::uint32_t max_tokens,
                                  std::vector<std::int32_t> generated = {}) {
    generate_request r;
    r.request_id = id;
    r.prompt = encode(prompt);
    r.generated = std::move(generated);
    r.sampling.max_tokens = max_tokens;
    r.sampling.stop_at_eos = false;
    return core.add(std::move(r), callbacks(id));
  }

  /// Steps until nothing can run (bounded: a hang is a bug).
  void drain() {
    for (int i = 0; i < 10000 && core.has_work(); ++i)
      core.step();
    REQUIRE(!core.has_work());
  }

  /// Steps until request `id` has produced `n` tokens.
  void run_until(std::uint64_t id, std::size_t n) {
    for (int i = 0; i < 10000 && seen[id].tokens.size() < n; ++i)
      REQUIRE(core.step() > 0);
    REQUIRE(seen[id].tokens.size() == n);
  }

  /// Moves the engine to `w` as `version` through a full-tensor session.
  void update(const source_weights& w, std::uint64_t version) {
    REQUIRE(!core.start_update(version));
    for (auto& t : w.views())
      REQUIRE(!core.apply_tensor(t));
    REQUIRE(!core.finish_update(version));
  }

  /// The same through each worker's plan, as a sharded transfer delivers
  /// it: per source tensor the worker's plan names, the replayed bytes.
  void update_sharded(const source_weights& w, std::uint64_t version, int tp) {
    REQUIRE(!core.start_update(version));
    for (int worker = 0; worker < tp; ++worker)
      for (const auto& spec : w.specs) {
        std::vector<std::uint8_t> packed;
        bool named = false;
        for (const auto& e : core.worker_plan(worker).entries)
          if (e.source == spec.name) {
            auto bytes = replay(e, w.data(spec.name), w.type);
            packed.insert(packed.end(), bytes.begin(), bytes.end());
            named = true;
          }
        if (named)
          REQUIRE(!core.apply_packed(worker, std::set<std::string>{spec.name}, packed.data(), packed.size()));
      }
    REQUIRE(!core.finish_update(version));
  }
};

/// Greedy tokens of a fresh engine holding `w` for `prompt` followed by
/// `prefix` (the tokens generated before a pause).
std::vector<std::int32_t> fresh_greedy(const source_weights& w, int tp, const std::string& prompt,
                                       const std::vector<std::int32_t>& prefix, std::uint32_t max_tokens,
                                       bool expert_parallel = false, weight_format weights = weight_format::received) {
  engine_options o;
  o.tp = tp;
  o.expert_parallel = expert_parallel;
  o.weights = weights;
  engine_core core(w.config, o);
  core.load(w.load(tp, expert_parallel), 2);
  generate_request r;
  r.request_id = 1;
  r.prompt = encode(prompt);
  r.generated = prefix;
  r.sampling.max_tokens = max_tokens;
  r.sampling.stop_at_eos = false;
  std::vector<std::int32_t> out;
  REQUIRE(!core.add(r, {[&](const token_event& e) { out.push_back(e.token); }, {}}));
  for (int i = 0; i < 10000 && core.has_work(); ++i)
    core.step();
  return out;
}

} // namespace

TEST_CASE("requests stream their tokens one by one and finish with version spans") {
  harness h;
  REQUIRE(!h.add(1, "hello", 6));
  h.drain();
  auto& t = h.seen[1];
  REQUIRE(t.result);
  CHECK(t.result->reason == finish_reason::length);
  CHECK(t.result->tokens == t.ids());
  REQUIRE(t.tokens.size() == 6);
  for (std::uint32_t i = 0; i < 6; ++i) {
    CHECK(t.tokens[i].index == i);
    CHECK(t.tokens[i].version == 1);
    CHECK(!t.tokens[i].stale_kv);
  }
  REQUIRE(t.result->spans.size() == 1);
  CHECK(t.result->spans[0].version == 1);
  CHECK(t.result->spans[0].end == 6);
  CHECK(check(*t.result).empty());
}

TEST_CASE("continuous batching: a request's tokens do not depend on what it is batched with") {
  harness alone;
  REQUIRE(!alone.add(1, "the quick brown fox", 8));
  alone.drain();

  harness busy;
  REQUIRE(!busy.add(7, "jumps over", 12));
  busy.core.step();
  busy.core.step();
  REQUIRE(!busy.add(1, "the quick brown fox", 8)); // arrives mid-flight
  busy.core.step();
  REQUIRE(!busy.add(8, "a lazy dog", 3));
  busy.drain();
  CHECK(busy.seen[1].ids() == alone.seen[1].ids());
  CHECK(busy.seen[7].tokens.size() == 12);
  CHECK(busy.seen[8].tokens.size() == 3);
}

TEST_CASE("tensor parallelism: the engine core's greedy outputs are identical for tp 1, 2, 4") {
  std::vector<std::int32_t> ref;
  for (int tp : {1, 2, 4}) {
    harness h(tp);
    REQUIRE(!h.add(1, "bit-identical", 10));
    h.drain();
    if (tp == 1)
      ref = h.seen[1].ids();
    CAPTURE(tp);
    CHECK(h.seen[1].ids() == ref);
  }
}

TEST_CASE("bounded queue: a full waiting queue rejects with queue_full (the limit is per data-parallel rank)") {
  for (int dp : {1, 2}) {
    CAPTURE(dp);
    engine_options o;
    o.queue_limit = 2;
    o.max_batch = 1;
    o.dp = dp;
    harness h(1, o);
    const auto room = static_cast<std::uint64_t>(2 * dp);
    for (std::uint64_t id = 1; id <= room; ++id)
      CHECK(!h.add(id, "r" + std::to_string(id), 2));
    auto e = h.add(room + 1, "one more", 2);
    REQUIRE(e);
    CHECK(e->code == errc::queue_full);
    CHECK((e->what.find("on each of its 2 ranks") != std::string::npos) == (dp > 1));
    h.drain();
    for (std::uint64_t id = 1; id <= room; ++id)
      CHECK(h.seen[id].result);
    CHECK(!h.add(room + 1, "one more", 2)); // room again
  }
}

TEST_CASE("malformed requests are refused with the reason") {
  harness h;
  generate_request r;
  r.request_id = 1;
  r.prompt = {256, 9999};
  r.sampling.max_tokens = 2;
  auto e = h.core.add(r, {});
  REQUIRE(e);
  CHECK(e->code == errc::malformed);
  CHECK(e->what.find("vocabulary") != std::string::npos);
  REQUIRE(!h.add(5, "x", 2));
  auto dup = h.add(5, "y", 2);
  REQUIRE(dup);
  CHECK(dup->what.find("already exists") != std::string::npos);
  r.prompt.clear();
  CHECK(h.core.add(r, {})->code == errc::malformed);
}

TEST_CASE("prefix cache: a repeated prefix hits and changes nothing in the output") {
  engine_options o;
  o.block_tokens = 4;
  harness h(1, o);
  const std::string prompt = "a shared system prompt, then a question";
  REQUIRE(!h.add(1, prompt, 5));
  h.drain();
  auto before = h.core.status();
  REQUIRE(!h.add(2, prompt, 5));
  h.drain();
  auto after = h.core.status();
  CHECK(after.prefix_cache_queries == before.prefix_cache_queries + 1);
  CHECK(after.prefix_cache_hits == before.prefix_cache_hits + 1);
  CHECK(h.seen[2].ids() == h.seen[1].ids());
  h.core.flush();
  REQUIRE(!h.add(3, prompt, 5));
  h.drain();
  CHECK(h.core.status().prefix_cache_hits == after.prefix_cache_hits); // flushed: no hit
  CHECK(h.seen[3].ids() == h.seen[1].ids());
}

TEST_CASE("pause(abort): running and queued requests end at once with their partial output") {
  harness h;
  REQUIRE(!h.add(1, "first", 20));
  h.run_until(1, 3);
  REQUIRE(!h.add(2, "second", 20)); // waiting, not yet admitted
  h.core.pause({pause_mode::abort, false});
  auto report = h.core.poll_pause();
  REQUIRE(report);
  CHECK(report->aborted == 2);
  CHECK(report->state == scheduler_state::paused_new);
  REQUIRE(h.seen[1].result);
  CHECK(h.seen[1].result->reason == finish_reason::aborted);
  CHECK(h.seen[1].result->tokens.size() == 3);
  CHECK(h.seen[2].result->reason == finish_reason::aborted);
  CHECK(h.seen[2].result->tokens.empty());
  // Arrivals while paused are queued, never scheduled, never rejected.
  REQUIRE(!h.add(3, "third", 4));
  CHECK(!h.core.has_work());
  CHECK(h.core.step() == 0);
  CHECK(h.core.status().waiting == 1);
  REQUIRE(!h.core.resume());
  h.drain();
  CHECK(h.seen[3].result->reason == finish_reason::length);
}

TEST_CASE("pause(wait): running requests finish, the pause completes at idle, resume before that is an error") {
  harness h;
  REQUIRE(!h.add(1, "first", 6));
  h.run_until(1, 2);
  h.core.pause({pause_mode::wait, false});
  CHECK(!h.core.poll_pause());
  CHECK(h.core.pause_in_flight());
  auto early = h.core.resume();
  REQUIRE(early);
  CHECK(early->code == errc::pause_in_flight);
  REQUIRE(!h.add(2, "queued", 3));
  h.drain();
  auto report = h.core.poll_pause();
  REQUIRE(report);
  CHECK(report->waited == 1);
  CHECK(h.seen[1].result->reason == finish_reason::length);
  CHECK(h.seen[1].tokens.size() == 6);
  CHECK(!h.seen[2].result); // still queued
  REQUIRE(!h.core.resume());
  h.drain();
  CHECK(h.seen[2].result);
}

TEST_CASE("pause(wait) on a dirty engine holds its running requests as keep does, and resume works") {
  harness h;
  auto v2 = make_source(h.config, dtype::bf16, 2);
  REQUIRE(!h.add(1, "frozen through an aborted round", 8));
  h.run_until(1, 2);
  h.core.pause({pause_mode::keep, false});
  REQUIRE(!h.core.start_update(2));
  REQUIRE(!h.core.apply_tensor(v2.views().front()));
  REQUIRE(h.core.abandon_update(false)); // part arrived: dirty
  REQUIRE(!h.core.resume());
  CHECK(h.core.step() == 0); // nothing runs on dirty weights
  h.core.pause({pause_mode::wait, false});
  auto report = h.core.poll_pause(); // at once: the request could never finish
  REQUIRE(report);
  CHECK(report->frozen == 1);
  CHECK(report->waited == 0);
  CHECK(report->state == scheduler_state::paused_all);
  CHECK(!h.core.pause_in_flight());
  // The next session follows and the frozen request goes on with v2.
  h.update(v2, 2);
  REQUIRE(!h.core.resume());
  h.drain();
  REQUIRE(h.seen[1].result);
  CHECK(h.seen[1].tokens.size() == 8);
  CHECK(h.seen[1].tokens.back().version == 2);
}

TEST_CASE("pause(keep): requests freeze in place and continue unchanged on resume") {
  harness uninterrupted;
  REQUIRE(!uninterrupted.add(1, "keep me", 10));
  uninterrupted.drain();

  harness h;
  REQUIRE(!h.add(1, "keep me", 10));
  h.run_until(1, 4);
  h.core.pause({pause_mode::keep, false});
  auto report = h.core.poll_pause();
  REQUIRE(report);
  CHECK(report->frozen == 1);
  CHECK(report->state == scheduler_state::paused_all);
  CHECK(h.core.status().frozen == 1);
  CHECK(h.core.step() == 0);
  CHECK(h.seen[1].tokens.size() == 4);
  REQUIRE(!h.core.resume());
  h.drain();
  CHECK(h.seen[1].ids() == uninterrupted.seen[1].ids());
}

TEST_CASE("sleep level 2: released weights free their memory, a session of the same version brings them back") {
  harness h;
  const auto before = fresh_greedy(h.v1, 1, "the same prompt", {}, 6);
  CHECK(h.core.release_weights().index() == 1); // unpaused: refused
  REQUIRE(!h.add(1, "running", 50));
  h.core.step();
  h.core.pause({pause_mode::keep, false});
  auto busy = h.core.release_weights();
  REQUIRE(busy.index() == 1); // a frozen request still needs them
  CHECK(std::get<engine_error>(busy).code == errc::not_paused);
  h.core.resume();
  h.core.pause({pause_mode::abort, true});
  h.drain();
  auto released = h.core.release_weights();
  REQUIRE(released.index() == 0);
  CHECK(std::get<std::uint64_t>(released) > 0);
  CHECK(!h.core.weights());
  CHECK(h.core.released());
  auto refused = h.core.resume();
  REQUIRE(refused);
  CHECK(refused->code == errc::engine_dirty);
  CHECK(h.core.version() == 1);
  // Wake: version 1 again through a session (the same version is a full re-sync).
  h.update(h.v1, 1);
  CHECK_FALSE(h.core.released());
  REQUIRE(!h.core.resume());
  REQUIRE(!h.add(2, "the same prompt", 6));
  h.drain();
  CHECK(h.seen[2].ids() == before);
}

TEST_CASE("weight-update session: start needs a pause, finish needs every tensor, incomplete leaves the engine dirty") {
  harness h;
  auto v2 = make_source(h.config, dtype::bf16, 2);
  auto not_paused = h.core.start_update(2);
  REQUIRE(not_paused);
  CHECK(not_paused->code == errc::not_paused);
  h.core.pause({pause_mode::keep, false});
  CHECK(h.core.start_update(0)->code == errc::version_mismatch); // backwards
  REQUIRE(!h.core.start_update(1)); // the version it holds: a full re-sync (a rejoining replica)
  REQUIRE(!h.core.start_update(2)); // a newer start supersedes it
  CHECK(h.core.dirty());
  // Requests arriving during the session are queued, not refused.
  REQUIRE(!h.add(1, "during the session", 3));
  auto views = v2.views();
  for (std::size_t i = 0; i + 1 < views.size(); ++i) // all but the last tensor
    REQUIRE(!h.core.apply_tensor(views[i]));
  CHECK(h.core.finish_update(3)->code == errc::version_mismatch);
  auto incomplete = h.core.finish_update(2);
  REQUIRE(incomplete);
  CHECK(incomplete->code == errc::update_incomplete);
  CHECK(incomplete->what.find(views.back().name) != std::string::npos);
  CHECK(h.core.dirty());
  CHECK(h.core.version() == 1);
  REQUIRE(!h.core.resume());
  CHECK(h.core.step() == 0); // dirty: never serves
  auto refused = h.add(2, "after", 3);
  REQUIRE(refused);
  CHECK(refused->code == errc::engine_dirty);
  // A later complete update makes it serve again, with the new version.
  h.core.pause({pause_mode::keep, false});
  h.update(v2, 2);
  CHECK(!h.core.dirty());
  REQUIRE(!h.core.resume());
  h.drain();
  REQUIRE(h.seen[1].result);
  CHECK(h.seen[1].tokens.front().version == 2);
}

TEST_CASE("sharded session: plan-packed groups give the same weights as loading the checkpoint") {
  for (int tp : {1, 2, 4}) {
    CAPTURE(tp);
    harness h(tp);
    auto v2 = make_source(h.config, dtype::bf16, 2);
    h.core.pause({pause_mode::keep, false});
    REQUIRE(!h.core.start_update(2));
    // One "group" per source tensor here; the transfer layer groups by block.
    for (int w = 0; w < tp; ++w)
      for (const auto& spec : v2.specs) {
        std::vector<std::uint8_t> packed;
        for (const auto& e : h.core.worker_plan(w).entries)
          if (e.source == spec.name) {
            auto bytes = replay(e, v2.data(spec.name), v2.type);
            packed.insert(packed.end(), bytes.begin(), bytes.end());
          }
        REQUIRE(!h.core.apply_packed(w, std::set<std::string>{spec.name}, packed.data(), packed.size()));
      }
    REQUIRE(!h.core.finish_update(2));
    engine_options o;
    o.tp = tp;
    engine_core reference(h.config, o);
    reference.load(v2.load(tp), 2);
    CHECK(h.core.weight_checksums() == reference.weight_checksums());
    std::vector<std::uint8_t> short_group(3);
    h.core.pause({pause_mode::keep, false});
    REQUIRE(!h.core.start_update(3));
    auto bad = h.core.apply_packed(0, std::set<std::string>{v2.specs.front().name}, short_group.data(), short_group.size());
    REQUIRE(bad);
    CHECK(bad->code == errc::malformed);
  }
}

TEST_CASE("correctness check: pause(keep, clear_cache) + update + resume equals a fresh engine on the new weights, "
          "Llama and Qwen3-MoE, experts sliced (tp) or placed whole (tp x ep)") {
  struct row {
    model_config config;
    int tp;
    bool expert_parallel;
    weight_format weights = weight_format::received;
  };
  std::vector<row> rows;
  for (int tp : {1, 2})
    for (const auto& config : {tiny_config(), test::tiny_moe_config(2), test::tiny_moe_config(1, true, true)})
      rows.push_back({config, tp, false});
  for (int tp : {2, 4}) // whole experts, updated through each worker's plan
    for (const auto& config : {test::tiny_moe_config(2), test::tiny_moe_config_with(6, true)})
      rows.push_back({config, tp, true});
  // Served as int8 computed from the received bf16 (the process step).
  rows.push_back({tiny_config(), 2, false, weight_format::int8});
  rows.push_back({test::tiny_moe_config(2), 2, true, weight_format::int8});
  for (const auto& [config, tp, ep, weights] : rows) {
    for (std::size_t pause_after : {1u, 5u}) {
      for (const std::string prompt : {"policy version k", "async RL overlaps"}) {
        CAPTURE(to_string(config.arch));
        CAPTURE(config.fused_experts);
        CAPTURE(tp);
        CAPTURE(ep);
        CAPTURE(to_string(weights));
        CAPTURE(pause_after);
        CAPTURE(prompt);
        const std::uint32_t max_tokens = 12;
        engine_options opts;
        opts.expert_parallel = ep;
        opts.weights = weights;
        harness h(tp, opts, config);
        auto v2 = make_source(h.config, dtype::bf16, 2);
        REQUIRE(!h.add(1, prompt, max_tokens));
        h.run_until(1, pause_after);
        h.core.pause({pause_mode::keep, true});
        REQUIRE(h.core.poll_pause());
        h.core.flush();
        if (ep)
          h.update_sharded(v2, 2, tp);
        else
          h.update(v2, 2);
        REQUIRE(!h.core.resume());
        h.drain();
        auto all = h.seen[1].ids();
        REQUIRE(all.size() == max_tokens);
        std::vector<std::int32_t> before(all.begin(), all.begin() + static_cast<long>(pause_after));
        std::vector<std::int32_t> after(all.begin() + static_cast<long>(pause_after), all.end());
        CHECK(after == fresh_greedy(v2, tp, prompt, before, max_tokens, ep, weights));
        if (ep && weights == weight_format::received) // and so does tp 1 with sliced experts: EP changes no bit
          CHECK(after == fresh_greedy(v2, 1, prompt, before, max_tokens));
        if (weights == weight_format::int8) { // served from int8, the received bf16 kept beside it
          const auto& served = *h.core.weights();
          CHECK_FALSE(served.workers[0].at("model.layers.0.self_attn.qkv_proj.weight").q.empty());
          CHECK(served.workers[0].at("model.layers.0.input_layernorm.weight").q.empty());
        }
        // Every token after the pause was produced by V2 over fresh KV.
        for (std::size_t i = pause_after; i < max_tokens; ++i) {
          CHECK(h.seen[1].tokens[i].version == 2);
          CHECK(!h.seen[1].tokens[i].stale_kv);
        }
        auto& spans = h.seen[1].result->spans;
        REQUIRE(spans.size() == 2);
        CHECK(spans[0].version == 1);
        CHECK(spans[0].end == pause_after);
        CHECK(spans[1].version == 2);
        CHECK(h.seen[1].result->stale_kv_tokens == 0);
      }
    }
  }
}

TEST_CASE("partial rollout: pause(keep) without clear_cache keeps stale KV, and the output says so") {
  int differing = 0;
  for (const std::string prompt : {"policy version k", "async RL overlaps", "stale keys"}) {
    CAPTURE(prompt);
    const std::uint32_t max_tokens = 12;
    const std::size_t pause_after = 4;
    harness h;
    auto v2 = make_source(h.config, dtype::bf16, 2);
    REQUIRE(!h.add(1, prompt, max_tokens));
    h.run_until(1, pause_after);
    h.core.pause({pause_mode::keep, false});
    h.update(v2, 2);
    REQUIRE(!h.core.resume());
    h.drain();
    auto all = h.seen[1].ids();
    std::vector<std::int32_t> before(all.begin(), all.begin() + pause_after);
    std::vector<std::int32_t> after(all.begin() + pause_after, all.end());
    if (after != fresh_greedy(v2, 1, prompt, before, max_tokens))
      ++differing;
    for (std::size_t i = 0; i < max_tokens; ++i)
      CHECK(h.seen[1].tokens[i].stale_kv == (i >= pause_after));
    CHECK(h.seen[1].result->stale_kv_tokens == max_tokens - pause_after);
  }
  // Stale KV changes what is generated: not for every prompt, but it must show.
  CHECK(differing > 0);
}

TEST_CASE("an engine with no weights refuses requests") {
  auto c = tiny_config();
  engine_core core(c, {});
  CHECK(core.dirty());
  generate_request r;
  r.request_id = 1;
  r.prompt = encode("x");
  r.sampling.max_tokens = 1;
  auto e = core.add(r, {});
  REQUIRE(e);
  CHECK(e->code == errc::engine_dirty);
}

TEST_CASE("a continuation that already has max_tokens tokens ends with reason length and generates nothing") {
  harness h;
  REQUIRE(!h.add(1, "done already", 3, {65, 66, 67}));
  REQUIRE(!h.add(2, "one to go", 3, {65, 66}));
  h.drain();
  REQUIRE(h.seen[1].result);
  CHECK(h.seen[1].result->reason == finish_reason::length);
  CHECK(h.seen[1].tokens.empty());
  CHECK(h.seen[1].result->tokens.empty());
  REQUIRE(h.seen[2].result);
  CHECK(h.seen[2].tokens.size() == 1);
  CHECK(h.seen[2].tokens.front().index == 2);
}

TEST_CASE("abort(id) ends one request and leaves the others running") {
  harness h;
  REQUIRE(!h.add(1, "one", 8));
  REQUIRE(!h.add(2, "two", 8));
  h.run_until(1, 2);
  CHECK(h.core.abort(2));
  CHECK(!h.core.abort(42));
  h.drain();
  CHECK(h.seen[2].result->reason == finish_reason::aborted);
  CHECK(h.seen[1].result->reason == finish_reason::length);
  CHECK(h.seen[1].tokens.size() == 8);
}

TEST_CASE("abandon_update: after an aborted round an engine is clean only if nothing of the session arrived") {
  enum class got { nothing, tensor, pull, in_flight, restarted };
  struct row {
    const char* what;
    got arrived;
    bool dirty;
  };
  const std::vector<row> rows = {
    {"nothing arrived: serves its old version again", got::nothing, false},
    {"a tensor was applied (buckets, broadcast)", got::tensor, true},
    {"one worker's pull was recorded (data plane)", got::pull, true},
    {"a pull is still writing", got::in_flight, true},
    {"the start was repeated before anything arrived (a retried call)", got::restarted, false},
  };
  for (const auto& r : rows) {
    CAPTURE(r.what);
    harness h(2);
    auto v2 = make_source(h.config, dtype::bf16, 2);
    auto served = h.core.weight_checksums();
    h.core.pause({pause_mode::keep, false});
    REQUIRE(!h.core.start_update(2));
    if (r.arrived == got::tensor)
      REQUIRE(!h.core.apply_tensor(v2.views().front()));
    if (r.arrived == got::pull)
      REQUIRE(!h.core.mark_received(0, {v2.specs.front().name}, 2));
    if (r.arrived == got::restarted)
      REQUIRE(!h.core.start_update(2));
    CHECK(h.core.abandon_update(r.arrived == got::in_flight) == r.dirty);
    CHECK(h.core.dirty() == r.dirty);
    CHECK(!h.core.in_session());
    CHECK(h.core.version() == 1);
    CHECK(h.core.weight_checksums() == served); // the session wrote its staging set only
    REQUIRE(!h.core.resume());
    auto refused = h.add(1, "after the aborted round", 4);
    if (r.dirty) {
      REQUIRE(refused);
      CHECK(refused->code == errc::engine_dirty);
    } else {
      REQUIRE(!refused);
      h.drain();
      REQUIRE(h.seen[1].result);
      REQUIRE(h.seen[1].tokens.size() == 4);
      for (auto& t : h.seen[1].tokens)
        CHECK(t.version == 1);
    }
    // Either way, the next complete session serves the new version.
    h.core.pause({pause_mode::keep, false});
    h.update(v2, 2);
    CHECK(!h.core.dirty());
    CHECK(h.core.version() == 2);
  }
}

TEST_CASE("abandon_update: an engine dirty before the session stays dirty, without a session nothing changes") {
  SUBCASE("a fresh engine that never held weights") {
    engine_core core(tiny_config(), {});
    REQUIRE(core.dirty());
    core.pause({pause_mode::keep, false});
    REQUIRE(!core.start_update(1));
    CHECK(core.abandon_update(false));
    CHECK(core.dirty());
    CHECK(!core.in_session());
  }
  SUBCASE("an engine left dirty by an incomplete update") {
    harness h;
    auto v2 = make_source(h.config, dtype::bf16, 2);
    h.core.pause({pause_mode::keep, false});
    REQUIRE(!h.core.start_update(2));
    auto views = v2.views();
    for (std::size_t i = 0; i + 1 < views.size(); ++i)
      REQUIRE(!h.core.apply_tensor(views[i]));
    REQUIRE(h.core.finish_update(2)->code == errc::update_incomplete);
    REQUIRE(h.core.dirty());
    REQUIRE(!h.core.start_update(2)); // the next round's session, abandoned before anything arrived
    CHECK(h.core.abandon_update(false));
    CHECK(h.core.dirty());
    REQUIRE(!h.core.resume());
    auto refused = h.add(1, "still dirty", 2);
    REQUIRE(refused);
    CHECK(refused->code == errc::engine_dirty);
  }
  SUBCASE("no session open: returns dirty() and changes nothing") {
    harness h;
    CHECK(!h.core.abandon_update(true));
    CHECK(!h.core.dirty());
    CHECK(h.core.version() == 1);
  }
}

TEST_CASE("keep_served: a clean engine serving a version with the session's bytes pulls nothing") {
  enum class before { clean, dirty, released };
  struct row {
    const char* what;
    before state;
    std::uint64_t holds;      // the version served (through complete sessions from 1)
    std::uint64_t session;    // the session's version
    std::uint64_t same_since; // the order's same_bytes_since
    bool applied_first;       // a tensor arrived before the order
    bool kept;
  };
  const std::vector<row> rows = {
    {"serves the version the bytes date from", before::clean, 1, 2, 1, false, true},
    {"serves a later version of the same run", before::clean, 3, 4, 2, false, true},
    {"a re-sync of the version it serves", before::clean, 2, 2, 2, false, true},
    {"serves a version before the run began", before::clean, 1, 3, 2, false, false},
    {"not known (0)", before::clean, 1, 2, 0, false, false},
    {"dirty before the session", before::dirty, 1, 2, 1, false, false},
    {"its weights were released (sleep)", before::released, 1, 2, 1, false, false},
    {"something of the session arrived already", before::clean, 1, 2, 1, true, false},
  };
  for (const auto& r : rows) {
    CAPTURE(r.what);
    harness h;
    for (std::uint64_t v = 2; v <= r.holds; ++v) {
      h.core.pause({pause_mode::keep, false});
      h.update(h.v1, v);
    }
    h.core.pause({pause_mode::keep, false});
    if (r.state == before::dirty) {
      REQUIRE(!h.core.start_update(r.holds));
      REQUIRE(!h.core.apply_tensor(h.v1.views().front()));
      REQUIRE(h.core.finish_update(r.holds)); // incomplete: dirty
    }
    if (r.state == before::released)
      REQUIRE(std::holds_alternative<std::uint64_t>(h.core.release_weights()));
    const auto served = h.core.weight_checksums();
    const auto served_set = h.core.weights();
    REQUIRE(!h.core.start_update(r.session));
    if (r.applied_first)
      REQUIRE(!h.core.apply_tensor(h.v1.views().front()));
    CHECK(h.core.keep_served(r.same_since) == r.kept);
    if (!r.kept) {
      // Nothing changed: a session without the bytes stays incomplete.
      auto e = h.core.finish_update(r.session);
      REQUIRE(e);
      CHECK(e->code == errc::update_incomplete);
      CHECK(h.core.dirty());
      continue;
    }
    REQUIRE(!h.core.finish_update(r.session));
    CHECK(!h.core.dirty());
    CHECK(h.core.version() == r.session);
    CHECK(h.core.weights().get() == served_set.get()); // the same set, not a copy, under the new version
    CHECK(h.core.weights()->version == r.session);
    CHECK(h.core.weight_checksums() == served);
    REQUIRE(!h.core.resume());
    REQUIRE(!h.add(1, "after a zero-byte round", 3));
    h.drain();
    REQUIRE(h.seen[1].tokens.size() == 3);
    for (auto& t : h.seen[1].tokens)
      CHECK(t.version == r.session);
    // The next session with new bytes goes through staging as before.
    auto v9 = make_source(h.config, dtype::bf16, 9);
    h.core.pause({pause_mode::keep, false});
    h.update(v9, r.session + 1);
    CHECK(h.core.weight_checksums() != served);
  }
}

TEST_CASE("logprobs: only when asked, on every token event and in the result, the same tokens either way") {
  harness h;
  REQUIRE(!h.add(1, "hello", 6)); // default: no logprobs computed
  generate_request r;
  r.request_id = 2;
  r.prompt = encode("hello");
  r.sampling.max_tokens = 6;
  r.sampling.stop_at_eos = false;
  r.sampling.logprobs = true;
  r.sampling.top_logprobs = 3;
  REQUIRE(!h.core.add(r, h.callbacks(2)));
  h.drain();
  auto& plain = h.seen[1];
  auto& with = h.seen[2];
  REQUIRE(plain.result);
  REQUIRE(with.result);
  CHECK(plain.ids() == with.ids()); // asking for logprobs changes nothing in the output
  CHECK(plain.result->logprobs.empty());
  CHECK(plain.result->top_tokens.empty());
  for (auto& ev : plain.tokens) {
    CHECK(ev.logprob == 0.0f);
    CHECK(ev.top_tokens.empty());
  }
  REQUIRE(with.result->logprobs.size() == 6);
  CHECK(with.result->top_tokens.size() == 18);
  CHECK(with.result->top_logprobs.size() == 18);
  CHECK(check(*with.result).empty());
  for (std::size_t i = 0; i < with.tokens.size(); ++i) {
    auto& ev = with.tokens[i];
    CHECK(std::isfinite(ev.logprob));
    CHECK(ev.logprob <= 0.0f);
    CHECK(ev.logprob == with.result->logprobs[i]);
    REQUIRE(ev.top_tokens.size() == 3);
    // Greedy: the sampled token is the most probable one.
    CHECK(ev.top_tokens[0] == ev.token);
    CHECK(ev.top_logprobs[0] == ev.logprob);
    CHECK(ev.top_logprobs[1] <= ev.top_logprobs[0]);
  }
  // Bounded: more than max_top_logprobs is refused.
  r.request_id = 3;
  r.sampling.top_logprobs = max_top_logprobs + 1;
  auto e = h.core.add(r, {});
  REQUIRE(e);
  CHECK(e->what.find("top_logprobs") != std::string::npos);
}

TEST_CASE("stop_token_ids end a request with reason eos, ignore_eos (stop_at_eos off) runs past EOS") {
  harness h;
  REQUIRE(!h.add(1, "hello", 8));
  h.drain();
  auto free_run = h.seen[1].ids();
  REQUIRE(free_run.size() == 8);
  // Stop at the third token's id: the request ends on its first occurrence, token included.
  auto stop = free_run[2];
  auto first = static_cast<std::size_t>(std::find(free_run.begin(), free_run.end(), stop) - free_run.begin());
  generate_request r;
  r.request_id = 2;
  r.prompt = encode("hello");
  r.sampling.max_tokens = 8;
  r.sampling.stop_at_eos = false;
  r.sampling.stop_token_ids = {stop};
  REQUIRE(!h.core.add(r, h.callbacks(2)));
  h.drain();
  auto& t = h.seen[2];
  REQUIRE(t.result);
  CHECK(t.result->reason == finish_reason::eos);
  CHECK(t.ids() == std::vector<std::int32_t>(free_run.begin(), free_run.begin() + first + 1));
  // A negative stop id is malformed.
  r.request_id = 3;
  r.sampling.stop_token_ids = {-1};
  auto e = h.core.add(r, {});
  REQUIRE(e);
  CHECK(e->what.find("stop_token_ids") != std::string::npos);
}

// -- data parallelism ----------------------------------------------------------------------

namespace {
engine_options with_dp(int dp, dp_balance balance = dp_balance::least_outstanding) {
  engine_options o;
  o.dp = dp;
  o.balance = balance;
  return o;
}
} // namespace

TEST_CASE("data parallelism: requests spread least-outstanding over the ranks, outputs equal dp 1's") {
  harness one;
  harness two(1, with_dp(2));
  const std::vector<std::string> prompts{"rank zero", "rank one", "zero again", "one again", "fifth"};
  for (std::uint64_t id = 1; id <= prompts.size(); ++id) {
    REQUIRE(!one.add(id, prompts[id - 1], 5 + static_cast<std::uint32_t>(id)));
    REQUIRE(!two.add(id, prompts[id - 1], 5 + static_cast<std::uint32_t>(id)));
  }
  // Fewest outstanding first, ties to the lowest rank: 0, 1, 0, 1, 0.
  for (std::uint64_t id = 1; id <= prompts.size(); ++id)
    CHECK(two.core.rank_of(id) == static_cast<int>((id - 1) % 2));
  CHECK(two.core.rank_load(0).second == 3);
  CHECK(two.core.rank_load(1).second == 2);
  CHECK(two.core.status().waiting == 5);
  // Id 1 waits on rank 0; the least outstanding rank now is 1: still a duplicate.
  auto dup = two.add(1, "a duplicate id", 3);
  REQUIRE(dup);
  CHECK(dup->code == errc::malformed);
  CHECK(two.core.rank_of(1) == 0);
  one.drain();
  two.drain();
  for (std::uint64_t id = 1; id <= prompts.size(); ++id) {
    REQUIRE(two.seen[id].result);
    CHECK(two.seen[id].ids() == one.seen[id].ids());
  }
  CHECK(two.core.status().tokens_generated == one.core.status().tokens_generated);
}

TEST_CASE("data parallelism: prefix affinity keeps a prompt's requests on one rank until it is over max_batch ahead") {
  engine_options o = with_dp(4, dp_balance::prefix_affinity);
  o.max_batch = 2;
  harness h(1, o);
  for (std::uint64_t id = 1; id <= 3; ++id)
    REQUIRE(!h.add(id, "the same prompt of a GRPO group", 4));
  auto home = h.core.rank_of(1);
  REQUIRE(home);
  CHECK(h.core.rank_of(2) == home);
  CHECK(h.core.rank_of(3) == home); // 2 ahead of the idle ranks: still at most max_batch
  REQUIRE(!h.add(4, "the same prompt of a GRPO group", 4));
  CHECK(h.core.rank_of(4) != home); // 3 ahead: the least outstanding rank takes it
  CHECK(h.core.rank_of(4) == (*home == 0 ? 1 : 0));
  h.drain();
  for (std::uint64_t id = 2; id <= 4; ++id)
    CHECK(h.seen[id].ids() == h.seen[1].ids());
}

TEST_CASE("data parallelism: one pause(wait) for all ranks completes when the last rank is idle") {
  harness h(1, with_dp(2));
  REQUIRE(!h.add(1, "long on rank 0", 12));
  REQUIRE(!h.add(2, "short on rank 1", 3));
  REQUIRE(h.core.rank_of(2) == 1);
  h.run_until(2, 1);
  h.core.pause({pause_mode::wait, false});
  REQUIRE(!h.add(3, "queued during the pause", 2));
  for (int i = 0; i < 100 && !h.seen[2].result; ++i)
    h.core.step();
  REQUIRE(h.seen[2].result); // rank 1 reached its condition, rank 0 has not
  CHECK(h.core.rank_load(1).first == 0);
  CHECK(h.core.pause_in_flight());
  CHECK(!h.core.poll_pause());
  auto early = h.core.resume();
  REQUIRE(early);
  CHECK(early->code == errc::pause_in_flight);
  CHECK(early->what.find("1 of 2 ranks") != std::string::npos);
  CHECK(h.core.state() == scheduler_state::paused_new); // the refusal changed nothing
  h.drain();
  auto report = h.core.poll_pause();
  REQUIRE(report);
  CHECK(report->waited == 2);
  CHECK(h.seen[1].tokens.size() == 12);
  CHECK(!h.seen[3].result); // queued, never admitted while paused
  REQUIRE(!h.core.resume());
  h.drain();
  CHECK(h.seen[3].result);
}

TEST_CASE("data parallelism: pause(abort) and pause(keep) cover every rank at once") {
  harness h(1, with_dp(3));
  for (std::uint64_t id = 1; id <= 4; ++id)
    REQUIRE(!h.add(id, "r" + std::to_string(id), 10));
  h.run_until(1, 2);
  h.core.pause({pause_mode::keep, false});
  auto kept = h.core.poll_pause();
  REQUIRE(kept);
  CHECK(kept->frozen == 4); // every rank's running requests (ranks 0, 1, 2, 0)
  CHECK(h.core.step() == 0); // no rank steps while paused
  REQUIRE(!h.core.resume());
  h.core.step();
  h.core.pause({pause_mode::abort, false});
  auto aborted = h.core.poll_pause();
  REQUIRE(aborted);
  CHECK(aborted->aborted == 4);
  for (std::uint64_t id = 1; id <= 4; ++id) {
    REQUIRE(h.seen[id].result);
    CHECK(h.seen[id].result->reason == finish_reason::aborted);
  }
  CHECK(h.core.status().running + h.core.status().waiting == 0);
}

TEST_CASE("correctness check with dp 2: a request on each rank, pause(keep), update, resume: each equals a "
          "fresh engine on the new weights") {
  struct row {
    model_config config;
    int tp;
    bool expert_parallel;
  };
  for (const auto& [config, tp, ep] : {row{tiny_config(), 2, false}, row{test::tiny_moe_config(2), 2, true}}) {
    CAPTURE(tp);
    CAPTURE(ep);
    engine_options o = with_dp(2);
    o.expert_parallel = ep;
    harness h(tp, o, config);
    auto v2 = make_source(h.config, dtype::bf16, 2);
    const std::uint32_t max_tokens = 10;
    const std::vector<std::string> prompts{"policy version k", "async RL overlaps"};
    REQUIRE(!h.add(1, prompts[0], max_tokens));
    REQUIRE(!h.add(2, prompts[1], max_tokens));
    CHECK(h.core.rank_of(1) == 0);
    CHECK(h.core.rank_of(2) == 1);
    h.run_until(1, 3);
    h.core.pause({pause_mode::keep, true});
    REQUIRE(h.core.poll_pause());
    h.core.flush();
    h.update_sharded(v2, 2, tp); // received once, served by both ranks
    REQUIRE(!h.core.resume());
    h.drain();
    for (std::uint64_t id : {1, 2}) {
      auto all = h.seen[id].ids();
      REQUIRE(all.size() == max_tokens);
      std::vector<std::int32_t> before(all.begin(), all.begin() + 3), after(all.begin() + 3, all.end());
      CHECK(after == fresh_greedy(v2, tp, prompts[id - 1], before, max_tokens, ep));
      CHECK(h.seen[id].tokens[3].version == 2);
    }
  }
}

TEST_CASE("data parallelism: a full queue on the chosen rank sends the request to a rank with room") {
  engine_options o = with_dp(2, dp_balance::prefix_affinity);
  o.queue_limit = 1;
  harness h(1, o);
  REQUIRE(!h.add(1, "one prompt", 3));
  auto home = h.core.rank_of(1);
  REQUIRE(!h.add(2, "one prompt", 3)); // its rank's queue is full: the other one
  CHECK(h.core.rank_of(2) != home);
  auto full = h.add(3, "one prompt", 3);
  REQUIRE(full);
  CHECK(full->code == errc::queue_full);
  h.drain();
  CHECK(h.seen[2].ids() == h.seen[1].ids());
}

TEST_CASE("data parallelism: a rank's dead worker thread breaks the engine, and it says which") {
  harness h(2, with_dp(2));
  REQUIRE(!h.add(1, "on rank 0", 4));
  REQUIRE(!h.add(2, "on rank 1", 4));
  h.run_until(1, 1);
  CHECK_FALSE(h.core.failure());
  h.core.kill_worker(1, 1);
  REQUIRE(h.core.failure());
  CHECK(*h.core.failure() == "engine: data-parallel rank 1, tp worker 1 died");
  CHECK_THROWS_AS(h.core.step(), worker_died); // never waits for the dead thread
  CHECK_THROWS_AS(h.core.kill_worker(2, 0), std::out_of_range);
  CHECK_THROWS_AS(h.core.kill_worker(0, 2), std::out_of_range); // not rank 1's worker 0
}
