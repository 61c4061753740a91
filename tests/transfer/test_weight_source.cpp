// Weight sources: synthetic versions are deterministic and equal what
// `rlsync checkpoint make` and `--perturb` write on disk; a checkpoint
// directory publishes steps only once their COMPLETE marker exists.
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/transfer/weight_source.hpp"

#include "tests/support/checkpoint_fixtures.hpp"
#include "tests/support/engine_fixtures.hpp"
#include "tests/support/scratch_dir.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include <doctest/doctest.h>

#include "runtime/base/checksum.hpp"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <thread>

using namespace rlsync;
using namespace rlsync::transfer;
using rlsync::test::bytes_of;
using rlsync::test::scratch_dir;

namespace {

// Every tensor of `s` has exactly the bytes the checkpoint at `dir` holds.
void check_equal_to_checkpoint(const weight_snapshot& s, const std::string& dir) {
  auto ck = checkpoint::open(dir);
  REQUIRE(s.tensors().size() == ck.tensors().size());
  for (const auto& t : s.tensors()) {
    INFO(t.name);
    const tensor_view& want = ck.at(t.name);
    CHECK(t.type == want.type);
    CHECK(t.shape == want.shape);
    CHECK(bytes_of(t) == bytes_of(want));
  }
}

bool snapshots_equal(const weight_snapshot& a, const weight_snapshot& b) {
  if (a.tensors().size() != b.tensors().size())
    return false;
  for (std::size_t i = 0; i < a.tensors().size(); ++i)
    if (a.tensors()[i].name != b.tensors()[i].name || bytes_of(a.tensors()[i]) != bytes_of(b.tensors()[i]))
      return false;
  return true;
}

} // namespace

TEST_CASE("synthetic source: version 1 is `checkpoint make`, v+1 is `--perturb` of v with seed + v") {
  scratch_dir tmp;
  const model_config c = test::small_model(2);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  auto v2 = src->produce_next();
  auto v3 = src->produce_next();
  CHECK(v1->version() == 1);
  CHECK(v2->version() == 2);
  CHECK(v3->version() == 3);

  make_synthetic_checkpoint(tmp / "v1", c, dtype::bf16, /*model seed*/ 3);
  check_equal_to_checkpoint(*v1, tmp / "v1");
  perturb_checkpoint(tmp / "v1", tmp / "v2", 0.05, /*trainer seed + 1*/ 11 + 1);
  check_equal_to_checkpoint(*v2, tmp / "v2");
  perturb_checkpoint(tmp / "v2", tmp / "v3", 0.05, 11 + 2);
  check_equal_to_checkpoint(*v3, tmp / "v3");
  CHECK_FALSE(snapshots_equal(*v1, *v2)); // the perturbation is large enough to survive bf16
}

TEST_CASE("synthetic source: same options, same versions, group order and metadata") {
  const model_config c = test::small_model(3);
  auto a = test::small_source(c);
  auto b = test::small_source(c);
  for (int i = 0; i < 3; ++i) {
    auto x = a->produce_next();
    auto y = b->produce_next();
    CHECK(snapshots_equal(*x, *y));
  }
  auto s = a->latest();
  CHECK(s->groups() == std::vector<std::uint32_t>{0, 1, 2});
  CHECK(s->group(0).front().name == "model.embed_tokens.weight");
  CHECK(s->group(2).back().name == "lm_head.weight");
  CHECK(s->total_bytes() == [&] {
    std::uint64_t n = 0;
    for (const auto& spec : llama_parameter_specs(c, dtype::bf16))
      n += spec.bytes();
    return n;
  }());
  auto params = a->parameters();
  CHECK(params.size() == llama_parameter_specs(c, dtype::bf16).size());
  CHECK(params.front().name == "model.embed_tokens.weight");
  CHECK(params.front().shape == std::vector<std::int64_t>{301, 64});
  CHECK(&s->at("model.norm.weight") == s->find("model.norm.weight"));
  CHECK_THROWS_AS(s->at("nope"), std::out_of_range);
}

TEST_CASE("synthetic source in shared memory: huge pages while the pool has them, else private, same bytes") {
  model_config c = test::small_model(2);
  c.vocab_size = 8192; // a version of a few MiB: big enough for huge pages
  c.hidden_size = 256;
  auto plain = test::small_source(c);
  auto shared_opts = [&](bool small_pages) {
    auto o = test::small_source_options(c);
    o.shared_memory = true;
    o.shared_small_pages = small_pages;
    return o;
  };
  transfer::synthetic_source huge_only(shared_opts(false)), any_pages(shared_opts(true));
  for (int v = 1; v <= 2; ++v) {
    auto want = plain->produce_next(), a = huge_only.produce_next(), b = any_pages.produce_next();
    REQUIRE(want->total_bytes() >= transfer::huge_page_bytes);
    CHECK(!want->shared_buffer());
    // Lending a version in place from 4 KiB pages costs a fault per page in
    // every consumer, every round: huge pages or none.
    if (a->shared_buffer())
      CHECK(a->shared_buffer()->huge());
    REQUIRE(b->shared_buffer());
    CHECK(b->shared_buffer()->shared());
    for (const auto* s : {a.get(), b.get()})
      for (std::size_t i = 0; i < want->tensors().size(); ++i) {
        const auto& x = want->tensors()[i];
        const auto& y = s->tensors()[i];
        REQUIRE(x.size == y.size);
        CHECK(std::memcmp(x.data, y.data, x.size) == 0);
        if (s->shared_buffer()) // offsets count from the buffer's data: what a manifest names
          CHECK(reinterpret_cast<const std::uint8_t*>(y.data) == s->shared_buffer()->data() + y.offset);
      }
  }
}

TEST_CASE("lendable pool: every buffer alive is named, a dropped one is reused, a retired or too small one freed") {
  transfer::lendable_pool pool(/*small_pages*/ true);
  auto sorted = [&] {
    auto ids = pool.ids();
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  auto a = pool.take("a", 8192), b = pool.take("b", 8192);
  REQUIRE(a);
  REQUIRE(b);
  const auto id_a = a->id(), id_b = b->id();
  CHECK(id_a != id_b);
  CHECK(sorted() == std::vector<std::uint64_t>{std::min(id_a, id_b), std::max(id_a, id_b)}); // in use: named too
  pool.retire(id_a); // a lend of it was never given back
  a.reset();
  CHECK(sorted() == std::vector<std::uint64_t>{id_b}); // freed, not kept
  b.reset();
  CHECK(sorted() == std::vector<std::uint64_t>{id_b}); // a spare
  auto c = pool.take("c", 8192);
  CHECK(c->id() == id_b);
  c.reset();
  auto large = pool.take("large", std::uint64_t(1) << 20); // the spare is too small: dropped
  CHECK(large->id() != id_b);
  CHECK(sorted() == std::vector<std::uint64_t>{large->id()});
}

TEST_CASE("synthetic source keeps a bounded number of versions, a held snapshot stays valid") {
  const model_config c = test::small_model(2);
  auto src = test::small_source(c, /*keep*/ 2);
  CHECK(src->latest().get() == nullptr);
  auto v1 = src->produce_next();
  const auto v1_bytes = bytes_of(v1->at("model.norm.weight"));
  src->produce_next();
  src->produce_next();
  CHECK(src->versions() == std::vector<std::uint64_t>{2, 3});
  CHECK(src->find(1).get() == nullptr);
  CHECK(src->find(3).get() == src->latest().get());
  // Whoever still holds version 1 (a transfer) reads it unchanged.
  CHECK(bytes_of(v1->at("model.norm.weight")) == v1_bytes);
  std::weak_ptr<const weight_snapshot> weak = v1;
  v1.reset();
  CHECK(weak.expired()); // released once nobody holds it
}

TEST_CASE("same bytes since: a step that changed nothing names the version its bytes date from") {
  const model_config c = test::small_model(2);
  SUBCASE("perturb 0: every version shares version 1's bytes") {
    transfer::synthetic_options o;
    o.config = c;
    o.perturb = 0;
    o.keep_versions = 2;
    synthetic_source src(o);
    auto v1 = src.produce_next();
    CHECK(src.same_bytes_since(1) == 1);
    auto v2 = src.produce_next();
    auto v3 = src.produce_next();
    CHECK(v3->version() == 3);
    CHECK(src.same_bytes_since(2) == 1);
    CHECK(src.same_bytes_since(3) == 1);
    CHECK(src.same_bytes_since(1) == 0); // dropped: not known any more
    CHECK(v3->at("model.norm.weight").data == v1->at("model.norm.weight").data); // shared, not copied
    CHECK(snapshots_equal(*v1, *v3));
  }
  SUBCASE("a perturbation changes every version") {
    auto src = test::small_source(c);
    for (std::uint64_t v = 1; v <= 3; ++v) {
      src->produce_next();
      CHECK(src->same_bytes_since(v) == v);
    }
  }
  SUBCASE("checkpoint steps: equal bytes in other memory, one element changed") {
    scratch_dir tmp;
    checkpoint_dir_options o;
    o.config = c;
    o.dir = tmp / "steps";
    o.keep_versions = 8;
    std::filesystem::create_directory(o.dir);
    auto step = [&](std::uint64_t s) { return o.dir + "/" + step_dir_name(s); };
    make_synthetic_checkpoint(step(1), c, dtype::bf16, 3);
    std::filesystem::copy(step(1), step(2)); // the same bytes, read into memory of its own
    perturb_checkpoint(step(1), step(3), 0.05, 3);
    std::filesystem::copy(step(3), step(4));
    {
      // One tensor's last element changes sign (its high byte ends the file): finite, and different.
      std::fstream f(step(4) + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(-1, std::ios::end);
      char last = 0;
      f.get(last);
      f.seekp(-1, std::ios::end);
      f.put(static_cast<char>(last ^ 0x80));
    }
    std::filesystem::copy(step(4), step(5));
    checkpoint_dir_source src(o);
    for (std::uint64_t s = 1; s <= 5; ++s) {
      mark_step_complete(step(s));
      REQUIRE(src.poll()->version() == s);
    }
    CHECK(src.same_bytes_since(1) == 1);
    CHECK(src.same_bytes_since(2) == 1);
    CHECK(src.same_bytes_since(3) == 3);
    CHECK(src.same_bytes_since(4) == 4);
    CHECK(src.same_bytes_since(5) == 4);
    CHECK(src.same_bytes_since(6) == 0); // never published
  }
}

TEST_CASE("synthetic source with a held-layers filter holds those groups only") {
  const model_config c = test::small_model(4);
  synthetic_options o;
  o.config = c;
  o.model_seed = 3;
  o.held_layers = std::vector<std::int64_t>{3, 1};
  synthetic_source rank(o);
  o.held_layers.reset();
  synthetic_source full(o);
  CHECK(rank.held_groups() == std::vector<std::uint32_t>{1, 3});
  CHECK(rank.holds("lm_head.weight"));
  CHECK(rank.holds("model.layers.1.mlp.up_proj.weight"));
  CHECK_FALSE(rank.holds("model.embed_tokens.weight"));
  CHECK_FALSE(rank.holds("model.layers.2.mlp.up_proj.weight"));
  CHECK_FALSE(rank.holds("not.a.parameter"));
  auto part = rank.produce_next();
  auto all = full.produce_next();
  CHECK(part->groups() == std::vector<std::uint32_t>{1, 3});
  CHECK(part->find("model.embed_tokens.weight") == nullptr);
  for (const auto& t : part->tensors())
    CHECK(bytes_of(t) == bytes_of(all->at(t.name)));
  for (const auto& p : rank.parameters())
    CHECK(rank.holds(p.name));
  CHECK_THROWS_AS(synthetic_source([&] {
                    auto bad = o;
                    bad.held_layers = std::vector<std::int64_t>{4};
                    return bad;
                  }()),
                  std::out_of_range);
}

TEST_CASE("synthetic source holding some experts: the layers' dense tensors and those experts only") {
  const model_config c = test::tiny_moe_config(2); // 8 experts, layer 0 dense
  synthetic_options o;
  o.config = c;
  o.held_experts = std::vector<std::int64_t>{6, 2, 3};
  synthetic_source rank(o);
  o.held_experts.reset();
  synthetic_source full(o);
  CHECK(rank.held_experts() == std::vector<std::int64_t>{2, 3, 6});
  CHECK(rank.holds("model.layers.1.mlp.experts.2.up_proj.weight"));
  CHECK(rank.holds("model.layers.1.mlp.gate.weight")); // the router: every rank of the layer
  CHECK(rank.holds("model.layers.1.self_attn.q_proj.weight"));
  CHECK(rank.holds("model.layers.0.mlp.down_proj.weight")); // a dense layer
  CHECK_FALSE(rank.holds("model.layers.1.mlp.experts.4.down_proj.weight"));
  auto part = rank.produce_next();
  auto all = full.produce_next();
  std::size_t experts = 0;
  for (const auto& t : part->tensors()) {
    CHECK(bytes_of(t) == bytes_of(all->at(t.name)));
    if (auto e = plan::expert_of(t.name)) {
      CHECK((*e == 2 || *e == 3 || *e == 6));
      ++experts;
    }
  }
  CHECK(experts == 3 * 3 * static_cast<std::size_t>(c.num_hidden_layers - 1)); // gate, up, down of each sparse layer
  CHECK(part->tensors().size() + 5 * 3 * static_cast<std::size_t>(c.num_hidden_layers - 1) == all->tensors().size());
  CHECK(plan::expert_of("model.layers.1.mlp.experts.12.gate_proj.weight") == 12);
  CHECK_FALSE(plan::expert_of("model.layers.1.mlp.experts.gate_up_proj"));
  CHECK_FALSE(plan::expert_of("model.layers.1.mlp.gate.weight"));
  auto bad = o;
  bad.held_experts = std::vector<std::int64_t>{8};
  CHECK_THROWS_WITH_AS(synthetic_source{bad}, doctest::Contains("must be in [0, 8)"), std::invalid_argument);
  bad.config = test::tiny_moe_config(2, true, /*fused=*/true);
  CHECK_THROWS_WITH_AS(synthetic_source{bad}, doctest::Contains("no separate expert tensors"), std::invalid_argument);
}

TEST_CASE("synthetic source can start from a checkpoint") {
  scratch_dir tmp;
  const model_config c = test::small_model(2);
  make_synthetic_checkpoint(tmp / "base", c, dtype::f32, 5);
  synthetic_options o;
  o.config = c;
  o.initial_checkpoint = tmp / "base";
  o.trainer_seed = 2;
  o.perturb = 0.1;
  synthetic_source src(o);
  CHECK(src.parameters().front().type == dtype::f32);
  check_equal_to_checkpoint(*src.produce_next(), tmp / "base");
  perturb_checkpoint(tmp / "base", tmp / "next", 0.1, 2 + 1);
  check_equal_to_checkpoint(*src.produce_next(), tmp / "next");

  o.config.num_hidden_layers = 3;
  CHECK_THROWS_WITH_AS(synthetic_source{o}, doctest::Contains("config.json"), checkpoint_error);
}

TEST_CASE("synthetic source takes the embedding's dtype from a checkpoint that leads with an f32 extra") {
  scratch_dir tmp;
  const model_config c = test::small_model(2);
  make_synthetic_checkpoint(tmp / "base", c, dtype::bf16, 5);
  test::write_with_leading_f32_extra(tmp / "base", tmp / "extra");
  REQUIRE(checkpoint::open(tmp / "extra").tensors().front().tensor->type == dtype::f32);

  synthetic_options o;
  o.config = c;
  o.initial_checkpoint = tmp / "extra";
  synthetic_source src(o);
  CHECK(src.parameters().front().type == dtype::bf16);
  check_equal_to_checkpoint(*src.produce_next(), tmp / "base");
}

TEST_CASE("step directory names") {
  CHECK(step_dir_name(42) == "step-000042");
  CHECK(step_dir_name(1234567) == "step-1234567");
  CHECK(parse_step_dir_name("step-000042") == 42u);
  CHECK(parse_step_dir_name("step-7") == 7u);
  CHECK_FALSE(parse_step_dir_name("step-"));
  CHECK_FALSE(parse_step_dir_name("step-12a"));
  CHECK_FALSE(parse_step_dir_name("step-000042.tmp"));
  CHECK_FALSE(parse_step_dir_name("checkpoint-3"));
}

TEST_CASE("checkpoint_dir_source: a step without its marker is ignored until the marker appears") {
  scratch_dir tmp;
  const model_config c = test::small_model(2);
  checkpoint_dir_options o;
  o.config = c;
  o.dir = tmp / "steps";
  checkpoint_dir_source src(o);
  CHECK(src.poll().get() == nullptr); // no directory yet
  std::filesystem::create_directory(o.dir);
  CHECK(src.poll().get() == nullptr);
  CHECK(src.parameters().size() == llama_parameter_specs(c, dtype::bf16).size());

  const std::string step1 = o.dir + "/" + step_dir_name(1);
  make_synthetic_checkpoint(step1, c, dtype::bf16, 3);
  CHECK(src.poll().get() == nullptr); // complete files, but not published
  mark_step_complete(step1);
  auto v1 = src.poll();
  REQUIRE(v1.get() != nullptr);
  CHECK(v1->version() == 1);
  check_equal_to_checkpoint(*v1, step1);
  CHECK(src.poll().get() == nullptr); // nothing newer
  CHECK(src.latest().get() == v1.get());

  // Two new steps: the newest complete one wins, an incomplete newer one waits.
  for (std::uint64_t s : {2, 3, 4})
    perturb_checkpoint(step1, o.dir + "/" + step_dir_name(s), 0.05, s);
  mark_step_complete(o.dir + "/" + step_dir_name(2));
  mark_step_complete(o.dir + "/" + step_dir_name(3));
  auto v3 = src.poll();
  REQUIRE(v3.get() != nullptr);
  CHECK(v3->version() == 3);
  check_equal_to_checkpoint(*v3, o.dir + "/" + step_dir_name(3));
  CHECK(src.poll().get() == nullptr);
  mark_step_complete(o.dir + "/" + step_dir_name(4));
  CHECK(src.poll()->version() == 4);
  CHECK(src.versions() == std::vector<std::uint64_t>{3, 4});
}

TEST_CASE("checkpoint_dir_source: a step's extra tensors (rotary inv_freq) stay behind") {
  // Engines drop any name ending in .self_attn.rotary_emb.inv_freq, of a
  // layer the model has or not: the source too, before it groups tensors.
  for (const std::string extra : {"model.layers.0.self_attn.rotary_emb.inv_freq",
                                  "model.layers.7.self_attn.rotary_emb.inv_freq", "foo.self_attn.rotary_emb.inv_freq"}) {
    CAPTURE(extra);
    scratch_dir tmp;
    const model_config c = test::small_model(2);
    make_synthetic_checkpoint(tmp / "base", c, dtype::bf16, 3);
    checkpoint_dir_options o;
    o.config = c;
    o.dir = tmp / "steps";
    o.retry_for = std::chrono::milliseconds(0); // a refused step is refused at once
    std::filesystem::create_directory(o.dir);
    const std::string step1 = o.dir + "/" + step_dir_name(1);
    test::write_with_leading_f32_extra(tmp / "base", step1, extra);
    mark_step_complete(step1);
    checkpoint_dir_source src(o);
    auto v1 = src.poll();
    REQUIRE(v1.get() != nullptr);
    // Exactly the parameters the source registers: what ranks, slots and budgets are sized by.
    const auto params = src.parameters();
    REQUIRE(v1->tensors().size() == params.size());
    for (std::size_t i = 0; i < params.size(); ++i)
      CHECK(v1->tensors()[i].name == params[i].name);
    check_equal_to_checkpoint(*v1, tmp / "base");
  }
}

TEST_CASE("checkpoint_dir_source: a step whose config.json disagrees is an error naming the file") {
  scratch_dir tmp;
  const model_config c = test::small_model(2);
  checkpoint_dir_options o;
  o.config = c;
  o.dir = tmp.path();
  checkpoint_dir_source src(o);

  const std::string bad = o.dir + "/" + step_dir_name(5);
  make_synthetic_checkpoint(bad, test::small_model(3), dtype::bf16, 3);
  mark_step_complete(bad);
  CHECK_THROWS_WITH_AS(src.poll(), doctest::Contains((bad + "/config.json: num_hidden_layers is 3, the model has 2").c_str()),
                       checkpoint_error);
  CHECK(src.poll().get() == nullptr); // reported once, then skipped

  // The context length the engines were built for is the model's too.
  auto longer = c;
  longer.max_position_embeddings = c.max_position_embeddings * 2;
  const std::string longer_dir = o.dir + "/" + step_dir_name(6);
  make_synthetic_checkpoint(longer_dir, longer, dtype::bf16, 3);
  mark_step_complete(longer_dir);
  CHECK_THROWS_WITH_AS(src.poll(),
                       doctest::Contains((longer_dir + "/config.json: max_position_embeddings is "
                                          + std::to_string(longer.max_position_embeddings) + ", the model has "
                                          + std::to_string(c.max_position_embeddings)).c_str()),
                       checkpoint_error);

  const std::string good = o.dir + "/" + step_dir_name(7);
  make_synthetic_checkpoint(good, c, dtype::bf16, 3);
  mark_step_complete(good);
  CHECK(src.poll()->version() == 7);

  // A later step in another dtype than the earlier ones is refused too.
  const std::string other = o.dir + "/" + step_dir_name(8);
  make_synthetic_checkpoint(other, c, dtype::f32, 3);
  mark_step_complete(other);
  CHECK_THROWS_WITH_AS(src.poll(), doctest::Contains("earlier steps BF16"), checkpoint_error);
}

TEST_CASE("checkpoint_dir_source with a held-layers filter maps every file but exposes its groups") {
  scratch_dir tmp;
  const model_config c = test::small_model(3);
  checkpoint_dir_options o;
  o.config = c;
  o.dir = tmp.path();
  o.held_layers = std::vector<std::int64_t>{0};
  checkpoint_dir_source src(o);
  const std::string step = o.dir + "/" + step_dir_name(1);
  make_synthetic_checkpoint(step, c, dtype::bf16, 3, /*shard_bytes*/ 64 << 10); // sharded, with an index
  mark_step_complete(step);
  auto s = src.poll();
  REQUIRE(s.get() != nullptr);
  CHECK(s->groups() == std::vector<std::uint32_t>{0});
  CHECK(s->find("model.embed_tokens.weight") != nullptr);
  CHECK(s->find("lm_head.weight") == nullptr);
  CHECK(s->group(0).size() == 10);
}

TEST_CASE("checkpoint_dir_source in shared memory: each step copied into the lendable pool, its memory reused") {
  scratch_dir tmp;
  const model_config c = test::small_model(3);
  checkpoint_dir_options o;
  o.config = c;
  o.dir = tmp.path();
  o.keep_versions = 1;
  o.held_layers = std::vector<std::int64_t>{0, 2};
  checkpoint_dir_source plain(o);
  o.shared_memory = true;
  o.shared_small_pages = true; // this machine's hugetlb pool may be empty
  checkpoint_dir_source lendable(o);
  auto step = [&](std::uint64_t s) { return o.dir + "/" + step_dir_name(s); };
  std::set<std::uint64_t> buffers;
  for (std::uint64_t s = 1; s <= 4; ++s) {
    if (s == 1)
      make_synthetic_checkpoint(step(1), c, dtype::bf16, 3, /*shard_bytes*/ 64 << 10); // shards, an index
    else
      perturb_checkpoint(step(s - 1), step(s), 0.05, s);
    mark_step_complete(step(s));
    auto want = plain.poll();
    auto got = lendable.poll();
    REQUIRE(want);
    REQUIRE(got);
    CHECK(got->version() == s);
    CHECK(!want->shared_buffer());
    REQUIRE(got->shared_buffer());
    buffers.insert(got->shared_buffer()->id());
    CHECK(got->groups() == want->groups());
    CHECK(got->groups() == std::vector<std::uint32_t>{0, 2});
    CHECK(snapshots_equal(*want, *got));
    std::uint64_t held = 0;
    for (const auto& t : got->tensors()) {
      held += t.size;
      // Offsets count from the buffer's data, as a manifest names them.
      CHECK(reinterpret_cast<const std::uint8_t*>(t.data) == got->shared_buffer()->data() + t.offset);
    }
    CHECK(got->total_bytes() == held); // the held tensors only, not the whole step
  }
  // A step dropped (keep_versions 1) leaves its memory to a later one.
  CHECK(buffers.size() < 4);
  CHECK(lendable.lendable_buffer_ids().size() <= 3);
}

TEST_CASE("make_weight_source: a checkpoint_dir rank copies its steps for lending only where it may lend them") {
  struct row {
    const char* name;
    std::string engines, transfer;
    bool copies;
  };
  const std::vector<row> rows = {
    {"ucx, an engine on the trainer's node", "[{name: e, node: a}]", "{backend: ucx}", true},
    {"ucx with shm named", "[{name: e, node: a}]", "{backend: ucx, ucx_transports: [shm, tcp]}", true},
    {"ucx over tcp alone: nothing lent in shared memory", "[{name: e, node: a}]",
     "{backend: ucx, ucx_transports: [tcp]}", false},
    {"ucx, engines on another address only", "[{name: e, node: b}]", "{backend: ucx}", false},
    {"the local plane lends in place without it", "[{name: e, node: a}]", "{backend: local}", false},
    {"huge_pages: false leaves the pool to others: nothing lent in place", "[{name: e, node: a}]",
     "{backend: ucx, huge_pages: false}", false},
  };
  for (const auto& r : rows) {
    CAPTURE(r.name);
    const std::string text = "name: t\n"
                             "model: {synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, "
                             "intermediate_size: 128}}\n"
                             "nodes: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}]\n"
                             "trainer: {node: a, source: checkpoint_dir, dir: steps}\n"
                             "engines: "
                             + r.engines + "\ntransfer: " + r.transfer + "\ncluster: {allow_insecure_network: true}\n";
    const auto t = parse_topology(text, "t.yaml", "/base");
    auto source = std::dynamic_pointer_cast<checkpoint_dir_source>(make_weight_source(t, 0));
    REQUIRE(source);
    CHECK(source->options().shared_memory == r.copies);
    CHECK_FALSE(source->options().shared_small_pages); // huge pages or no copy
  }
}

TEST_CASE("step read memory: a dropped file's memory is reused by one that fits, within the limit") {
  step_read_memory pool;
  auto take = pool.memory();
  take(1000).reset(); // no limit yet: freed
  CHECK(pool.spare_bytes() == 0);
  pool.keep_at_most(1500);
  pool.keep_at_most(100); // only grows
  auto b = take(1000);
  auto c = take(400);
  b.reset();
  CHECK(pool.spare_bytes() == 1000);
  c.reset(); // 1400 bytes spare: within the limit
  CHECK(pool.spare_bytes() == 1400);
  auto d = take(100); // the 400-byte block is more than twice as large: fresh memory
  CHECK(pool.spare_bytes() == 1400);
  d.reset(); // 1500: still within
  CHECK(pool.spare_bytes() == 1500);
  auto e = take(900); // best fit: the 1000-byte block
  CHECK(pool.spare_bytes() == 500);
  auto f = take(2000); // none large enough
  CHECK(pool.spare_bytes() == 500);
  f.reset(); // 2500 would pass the limit: freed
  CHECK(pool.spare_bytes() == 500);
  std::shared_ptr<std::byte> outlives;
  {
    step_read_memory gone;
    gone.keep_at_most(1 << 20);
    outlives = gone.memory()(64);
  }
  outlives.reset(); // its pool is gone: freed, not kept
}

TEST_CASE("step read memory: a file that fits in no memory lets the spares go and is refused") {
  step_read_memory pool;
  pool.keep_at_most(1 << 20);
  pool.memory()(4096).reset();
  CHECK(pool.spare_bytes() == 4096);
  // 2^62 bytes: no spare fits and no allocation succeeds, even after the
  // spares are freed (glibc throws; ASan would abort unless
  // allocator_may_return_null=1).
  CHECK_THROWS_AS(pool.memory()(std::size_t{1} << 62), std::bad_alloc);
  CHECK(pool.spare_bytes() == 0);
}

TEST_CASE("checkpoint_dir_source reads a step into the memory of the step it dropped") {
  scratch_dir tmp;
  const model_config c = test::small_model(2);
  checkpoint_dir_options o;
  o.config = c;
  o.dir = tmp.path();
  o.keep_versions = 1;
  checkpoint_dir_source src(o);
  auto step = [&](std::uint64_t s) { return o.dir + "/" + step_dir_name(s); };
  std::vector<const std::byte*> at; // where each step's embedding landed
  for (std::uint64_t s = 1; s <= 4; ++s) {
    if (s == 1)
      make_synthetic_checkpoint(step(1), c, dtype::bf16, 3);
    else
      perturb_checkpoint(step(s - 1), step(s), 0.05, s);
    mark_step_complete(step(s));
    auto v = src.poll();
    REQUIRE(v);
    // From step 2 on, the step dropped waits as a spare (the next one's).
    const auto file_bytes = std::filesystem::file_size(step(s) + "/model.safetensors");
    CHECK(src.spare_read_bytes() == (s == 1 ? 0 : file_bytes));
    at.push_back(v->at("model.embed_tokens.weight").data);
    checkpoint direct = checkpoint::open(step(s));
    const auto& want = direct.at("model.embed_tokens.weight");
    CHECK(std::memcmp(want.data, at.back(), want.size) == 0); // the step's own bytes, whatever was there
  }
  // Step 2 is read while step 1 is held; publishing it drops step 1, whose
  // memory step 3 is then read into, and so on.
  CHECK(at[2] == at[0]);
  CHECK(at[3] == at[1]);
}

TEST_CASE("step directory names beyond the version range are refused with a message") {
  CHECK(parse_step_dir_name("step-4611686018427387904") == max_step_version);
  CHECK_FALSE(parse_step_dir_name("step-4611686018427387905"));
  CHECK_FALSE(parse_step_dir_name("step-9999999999999999999"));
  CHECK_FALSE(parse_step_dir_name("step-99999999999999999999999999"));
  CHECK_FALSE(parse_step_dir_name("step-0"));
  CHECK(step_name_problem("step-000042").empty());
  CHECK(step_name_problem("checkpoint-3").empty());
  CHECK(step_name_problem("step-12a").empty());
  CHECK(step_name_problem("step-9999999999999999999")
        == "step directory 'step-9999999999999999999' is outside the version range: steps run from 1 to "
           "4611686018427387904 (2^62); it is skipped");
  CHECK(step_name_problem("step-000").find("outside the version range") != std::string::npos);
}

namespace {

checkpoint_dir_options dir_options(const std::string& dir, const model_config& c) {
  checkpoint_dir_options o;
  o.config = c;
  o.dir = dir;
  o.retry_initial = std::chrono::milliseconds(1);
  o.retry_max = std::chrono::milliseconds(1);
  return o;
}

std::string poll_error(checkpoint_dir_source& src) {
  try {
    src.poll();
  } catch (const checkpoint_error& e) {
    return e.what();
  }
  return "";
}

// Writes a bf16 NaN over the first element of `file`'s data.
void poison(const std::string& file) {
  std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
  std::uint64_t header = 0;
  f.read(reinterpret_cast<char*>(&header), 8);
  f.seekp(static_cast<std::streamoff>(8 + header));
  const unsigned char nan[2] = {0xc0, 0x7f}; // 0x7fc0, little-endian
  f.write(reinterpret_cast<const char*>(nan), 2);
}

} // namespace

TEST_CASE("checkpoint_dir_source: hostile step directories") {
  scratch_dir tmp;
  const model_config c = test::small_model(2);

  SUBCASE("a step named beyond the version range is reported once; training goes on") {
    auto o = dir_options(tmp.path(), c);
    checkpoint_dir_source src(o);
    std::filesystem::create_directories(o.dir + "/step-9999999999999999999");
    mark_step_complete(o.dir + "/step-9999999999999999999");
    CHECK(poll_error(src).find("'step-9999999999999999999' is outside the version range") != std::string::npos);
    CHECK(src.poll().get() == nullptr); // said once
    const std::string step1 = o.dir + "/" + step_dir_name(1);
    make_synthetic_checkpoint(step1, c, dtype::bf16, 3);
    mark_step_complete(step1);
    REQUIRE(src.poll().get() != nullptr);
    CHECK(src.latest()->version() == 1);
    // Gone from the directory, the name is forgotten (the source keeps what
    // it has said bounded by what the directory holds); back, it is said again.
    std::filesystem::remove_all(o.dir + "/step-9999999999999999999");
    CHECK(src.poll().get() == nullptr);
    std::filesystem::create_directories(o.dir + "/step-9999999999999999999");
    CHECK(poll_error(src).find("'step-9999999999999999999' is outside the version range") != std::string::npos);
    CHECK(src.poll().get() == nullptr);
  }

  SUBCASE("two names for one step: neither is published until one goes") {
    auto o = dir_options(tmp.path(), c);
    checkpoint_dir_source src(o);
    for (const std::string name : {step_dir_name(1), step_dir_name(2), std::string("step-2")}) {
      make_synthetic_checkpoint(o.dir + "/" + name, c, dtype::bf16, 3);
      mark_step_complete(o.dir + "/" + name);
    }
    REQUIRE(src.poll().get() != nullptr);
    CHECK(src.latest()->version() == 1); // the newest step with one name
    const auto said = poll_error(src);
    CHECK_MESSAGE(said.find("both name step 2; neither is published") != std::string::npos, said);
    CHECK(said.find("'step-000002'") != std::string::npos);
    CHECK(said.find("'step-2'") != std::string::npos);
    CHECK(src.poll().get() == nullptr); // said once
    std::filesystem::remove_all(o.dir + "/step-2");
    REQUIRE(src.poll().get() != nullptr);
    CHECK(src.latest()->version() == 2);
  }

  SUBCASE("a directory that cannot be listed is said once, not taken for an empty one") {
    auto o = dir_options(tmp.path(), c);
    o.dir = tmp / "not-a-directory";
    std::ofstream(o.dir) << "x";
    checkpoint_dir_source src(o);
    const auto said = poll_error(src);
    CHECK_MESSAGE(said.find("not-a-directory: cannot list the directory: Not a directory") != std::string::npos, said);
    CHECK(src.poll().get() == nullptr);
  }

  SUBCASE("a step that fails while its files are missing is retried, then published") {
    auto o = dir_options(tmp.path(), c);
    checkpoint_dir_source src(o);
    const std::string step = o.dir + "/" + step_dir_name(1);
    make_synthetic_checkpoint(tmp / "staged", c, dtype::bf16, 3);
    std::filesystem::create_directories(step);
    mark_step_complete(step); // the marker before the files: a misbehaving writer
    CHECK(poll_error(src).find("(retrying in 1 ms)") != std::string::npos);
    for (auto& e : std::filesystem::directory_iterator(tmp / "staged"))
      std::filesystem::copy(e.path(), step + "/" + e.path().filename().string());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto v1 = src.poll();
    REQUIRE(v1.get() != nullptr);
    CHECK(v1->version() == 1);
  }

  SUBCASE("a step failing for longer than retry_for is skipped for good") {
    auto o = dir_options(tmp.path(), c);
    o.retry_for = std::chrono::milliseconds(0);
    checkpoint_dir_source src(o);
    const std::string step = o.dir + "/" + step_dir_name(1);
    std::filesystem::create_directories(step);
    mark_step_complete(step);
    CHECK(poll_error(src).find("skipped for good") != std::string::npos);
    make_synthetic_checkpoint(tmp / "staged", c, dtype::bf16, 3);
    for (auto& e : std::filesystem::directory_iterator(tmp / "staged"))
      std::filesystem::copy(e.path(), step + "/" + e.path().filename().string());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(src.poll().get() == nullptr);
  }

  SUBCASE("a step completed after a newer one was published is logged as out of order") {
    auto o = dir_options(tmp.path(), c);
    checkpoint_dir_source src(o);
    const std::string step3 = o.dir + "/" + step_dir_name(3);
    make_synthetic_checkpoint(step3, c, dtype::bf16, 3);
    mark_step_complete(step3);
    CHECK(src.poll()->version() == 3);
    const std::string step2 = o.dir + "/" + step_dir_name(2);
    make_synthetic_checkpoint(step2, c, dtype::bf16, 3);
    mark_step_complete(step2);
    CHECK(poll_error(src).find("'step-000002' appeared out of order, after version 3 was published")
          != std::string::npos);
    CHECK(src.poll().get() == nullptr); // said once
  }

  SUBCASE("non-finite weights are refused at publish unless allowed") {
    auto o = dir_options(tmp.path(), c);
    o.retry_for = std::chrono::milliseconds(0);
    checkpoint_dir_source src(o);
    const std::string step = o.dir + "/" + step_dir_name(1);
    make_synthetic_checkpoint(step, c, dtype::bf16, 3);
    poison(step + "/model.safetensors");
    mark_step_complete(step);
    std::string error = poll_error(src);
    CHECK(error.find("is NaN (--allow-nonfinite publishes it anyway)") != std::string::npos);
    CHECK(src.latest().get() == nullptr);

    o.allow_nonfinite = true;
    checkpoint_dir_source allowing(o);
    REQUIRE(allowing.poll().get() != nullptr);
    CHECK(allowing.latest()->version() == 1);
  }

  SUBCASE("a published step truncated in place stays intact in memory") {
    auto o = dir_options(tmp.path(), c);
    checkpoint_dir_source src(o);
    const std::string step = o.dir + "/" + step_dir_name(1);
    make_synthetic_checkpoint(step, c, dtype::bf16, 3);
    mark_step_complete(step);
    auto v1 = src.poll();
    REQUIRE(v1.get() != nullptr);
    std::filesystem::resize_file(step + "/model.safetensors", 0);
    std::uint64_t sum = 0;
    for (const auto& t : v1->tensors())
      sum += checksum64(t.data, t.size); // touched every byte: a mapping would SIGBUS here
    CHECK(sum != 0);
  }
}

TEST_CASE("nonfinite_problem names the tensor and the element") {
  float values[4] = {1.0f, 2.0f, std::numeric_limits<float>::infinity(), 0.0f};
  tensor_view t;
  t.name = "w\x1b";
  t.type = dtype::f32;
  t.shape = {4};
  t.size = sizeof values;
  t.data = reinterpret_cast<const std::byte*>(values);
  CHECK(nonfinite_problem(t) == "tensor 'w\\x1b' element 2 is infinite");
  values[2] = std::numeric_limits<float>::quiet_NaN();
  CHECK(nonfinite_problem(t) == "tensor 'w\\x1b' element 2 is NaN");
  values[2] = 3.0f;
  CHECK(nonfinite_problem(t).empty());
  std::uint16_t halves[2] = {0x3c00, 0x7c00}; // f16 1.0, +inf
  t.type = dtype::f16;
  t.shape = {2};
  t.size = sizeof halves;
  t.data = reinterpret_cast<const std::byte*>(halves);
  CHECK(nonfinite_problem(t) == "tensor 'w\\x1b' element 1 is infinite");
}
