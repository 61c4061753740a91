#pragma once
// Small models, synthetic sources and weight-set comparisons for the
// data-plane tests.
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/apply_packed.hpp"
#include "runtime/engine/loader.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/engine/weights.hpp"
#include "runtime/transfer/packing.hpp"
#include "runtime/transfer/puller.hpp"
#include "runtime/transfer/weight_source.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

namespace rlsync::test {

/// A Llama small enough for quick tests; 4 heads over 2 kv heads, so that
/// tp 4 replicates kv heads (kv < tp), and a vocabulary no tp divides.
inline model_config small_model(std::int64_t layers = 3, bool tied = false) {
  model_config c;
  c.vocab_size = 301;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 256;
  c.tie_word_embeddings = tied;
  return c;
}

/// small_model shrunk until each group is a few KiB per worker at tp 2:
/// small enough for UCX to send eagerly, ahead of the receive even.
inline model_config tiny_group_model() {
  model_config c = small_model(3);
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.vocab_size = 260; // the tokenizer's least: 256 bytes, BOS, EOS
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  return c;
}

/// A puller in front of another (a spy, a gate, a fault): registrations go
/// through to `inner`, and so do pulls unless a test overrides pull().
class forwarding_puller : public transfer::weight_puller {
public:
  explicit forwarding_puller(std::shared_ptr<transfer::weight_puller> inner) : inner(std::move(inner)) {}
  void register_worker(const std::string& engine, std::shared_ptr<const plan::worker_plan> plan) override {
    inner->register_worker(engine, std::move(plan));
  }
  void unregister_engine(const std::string& engine) override { inner->unregister_engine(engine); }
  transfer::pull_report pull(const transfer::pull_request& req, const transfer::group_sink& sink) override {
    return inner->pull(req, sink);
  }

  std::shared_ptr<transfer::weight_puller> inner;
};

/// The tests' synthetic trainer: bf16, seeds 3 and 11, perturbation 0.05.
inline transfer::synthetic_options small_source_options(const model_config& c, std::size_t keep = 2) {
  transfer::synthetic_options o;
  o.config = c;
  o.type = dtype::bf16;
  o.model_seed = 3;
  o.trainer_seed = 11;
  o.perturb = 0.05;
  o.keep_versions = keep;
  o.threads = 2;
  return o;
}

/// `shared`: versions in shareable memory, in any pages (a UCX producer
/// lends same-host engines their groups in place).
inline std::shared_ptr<transfer::synthetic_source> small_source(const model_config& c, std::size_t keep = 2,
                                                                bool shared = false) {
  auto o = small_source_options(c, keep);
  o.shared_memory = shared;
  o.shared_small_pages = shared;
  return std::make_shared<transfer::synthetic_source>(std::move(o));
}

/// What engine::load_weights makes of a snapshot: the reference every
/// transfer must reproduce exactly.
inline std::shared_ptr<engine::weight_set> loaded(const transfer::weight_snapshot& s, int tp,
                                                  bool expert_parallel = false) {
  auto set = engine::weight_set::make(s.config(), tp, s.tensors().empty() ? dtype::bf16 : s.tensors().front().type,
                                      expert_parallel);
  engine::load_weights(s.tensors(), *set);
  return set;
}

/// Bit-identical parameters, worker by worker.
inline void check_identical(const engine::weight_set& got, const engine::weight_set& want) {
  REQUIRE(got.tp() == want.tp());
  for (int w = 0; w < got.tp(); ++w) {
    const auto& a = got.workers[static_cast<std::size_t>(w)].params();
    const auto& b = want.workers[static_cast<std::size_t>(w)].params();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("worker " << w << " parameter " << a[i].name);
      REQUIRE(a[i].type == b[i].type);
      REQUIRE(a[i].bytes.size() == b[i].bytes.size());
      CHECK(std::memcmp(a[i].bytes.data(), b[i].bytes.data(), a[i].bytes.size()) == 0);
    }
  }
}

inline std::vector<std::uint8_t> bytes_of(const tensor_view& t) {
  auto* p = reinterpret_cast<const std::uint8_t*>(t.data);
  return std::vector<std::uint8_t>(p, p + t.size);
}

/// A deadline `d` from now.
inline transfer::clock::time_point in(std::chrono::milliseconds d) {
  return transfer::clock::now() + d;
}

/// One engine in this process: its weights and per-worker plans, registered
/// with a puller the way the engine does at start; records what arrived.
struct test_engine {
  std::string name;
  int tp;
  std::shared_ptr<engine::weight_set> weights;
  std::vector<plan::grouped_plan> plans;
  std::mutex mutex;
  std::vector<std::pair<int, std::uint32_t>> received;
  /// Offer the data plane the groups' places in the weights, as the engine
  /// does when it keeps the dtype it is sent (store_in_place.hpp).
  bool in_place = false;
  /// Broadcast groups handed over whole (on_full_group); with targets
  /// offered, none: the data plane stores the worker's pieces itself.
  std::atomic<int> full_groups{0};

  test_engine(std::string n, const model_config& c, int tp_, transfer::weight_puller& p, dtype type = dtype::bf16)
      : name(std::move(n)), tp(tp_), weights(engine::weight_set::make(c, tp_, type)) {
    for (int w = 0; w < tp; ++w) {
      auto plan = std::make_shared<const plan::worker_plan>(engine::make_plan(c, tp, w, type));
      plans.emplace_back(c, plan);
      p.register_worker(name, plan);
    }
  }

  transfer::group_sink sink() {
    transfer::group_sink s;
    s.on_group = [this](int w, std::uint32_t g, const std::uint8_t* bytes, std::size_t size) {
      engine::apply_group(plans[static_cast<std::size_t>(w)], g, bytes, size, weights->workers[static_cast<std::size_t>(w)]);
      note(w, g);
    };
    s.on_full_group = [this](int w, std::uint32_t g, const std::vector<tensor_view>& tensors) {
      ++full_groups;
      auto& dst = weights->workers[static_cast<std::size_t>(w)];
      for (const auto& t : tensors)
        if (!ignored_weight(dst.shard().config, t.name))
          engine::load_weight(*engine::real_weight(t.name, t.type, t.shape, t.data), dst);
      note(w, g);
    };
    if (in_place) {
      s.targets = [this](int w, std::uint32_t g) {
        std::vector<transfer::store_target> out;
        for (auto r : engine::group_destinations(plans[static_cast<std::size_t>(w)], g,
                                                 weights->workers[static_cast<std::size_t>(w)]))
          out.push_back({r.at, r.bytes});
        return out;
      };
      s.on_stored = [this](int w, std::uint32_t g) { note(w, g); };
    }
    return s;
  }

  transfer_report pull(transfer::weight_puller& p, std::uint64_t v, transfer_mode mode = transfer_mode::sharded,
                       std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
    return transfer::pull_engine(p, name, tp, v, mode, sink(), in(deadline));
  }

  void note(int w, std::uint32_t g) {
    std::lock_guard<std::mutex> lock(mutex);
    received.emplace_back(w, g);
  }
};

inline std::uint64_t plan_bytes(const test_engine& e) {
  std::uint64_t n = 0;
  for (const auto& p : e.plans)
    n += plan::bytes_per_worker(p.plan());
  return n;
}


} // namespace rlsync::test
