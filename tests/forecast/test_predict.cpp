// Predictions on a small cluster: the speed of light by hand, the parts of
// the sync time, and the direction of every knob.
#include "runtime/forecast/predict.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/forecast/report.hpp"
#include "runtime/plan/groups.hpp"
#include "tests/forecast/forecast_fixtures.hpp"

#include <doctest/doctest.h>

using namespace rlsync;
using namespace rlsync::forecast;

TEST_CASE("predict: one tp-1 worker is bound by its own NIC") {
  test::cluster_files files;
  const auto c = files.load(test::small_cluster("  - {name: e, tp: 1}\n"));
  const auto l = build_layout(c);
  const model_constants mc;
  sync_knobs k; // sharded, 2 in flight, pp serial
  const auto p = predict_sync(c, l, k, mc);
  // The worker needs the whole model; each stage's two ranks share sending it.
  CHECK(p.bytes == doctest::Approx(static_cast<double>(l.model_bytes)));
  CHECK(p.light_s == doctest::Approx(static_cast<double>(l.model_bytes) / 10e9));
  CHECK(p.bottleneck == "e0.gpu0 nic in");
  REQUIRE(p.phases.size() == 2); // pp 2, serial
  double parts = 0;
  for (const auto& ph : p.phases) {
    CHECK(ph.transfer_s == doctest::Approx(ph.light_s / mc.efficiency)); // one link bounds it
    CHECK(ph.overhead_s == doctest::Approx(mc.group_latency_s + mc.op_s * static_cast<double>(ph.ops)));
    parts += ph.seconds;
  }
  CHECK(p.seconds == doctest::Approx(parts));
  CHECK(p.seconds > p.light_s);

  k.pp = pp_order::parallel;
  const auto parallel = predict_sync(c, l, k, mc);
  REQUIRE(parallel.phases.size() == 1);
  CHECK(parallel.light_s == doctest::Approx(p.light_s)); // still the one NIC in
}

TEST_CASE("predict: each knob moves the time the way it should") {
  test::cluster_files files;
  const auto c = files.load(test::small_cluster("  - {name: e, replicas: 4, tp: 2}\n"));
  const auto l = build_layout(c);
  sync_knobs k;
  const auto base = predict_sync(c, l, k);

  auto one = k;
  one.groups_in_flight = 1;
  CHECK(predict_sync(c, l, one).seconds >= base.seconds);

  auto parallel = k;
  parallel.pp = pp_order::parallel;
  CHECK(predict_sync(c, l, parallel).light_s <= base.light_s);

  auto broadcast = k;
  broadcast.mode = plan_mode::broadcast;
  const auto b = predict_sync(c, l, broadcast);
  CHECK(b.bytes > base.bytes); // tp 2: each worker keeps half of what broadcast sends it
  CHECK(b.light_s > base.light_s); // (on a model this small, per-slice work can outweigh the bytes)

  const auto all = predict_waves(c, l, 0, k);
  const auto singles = predict_waves(c, l, 1, k);
  CHECK(all.waves == 1);
  CHECK(all.serving == 0);
  CHECK(all.total_s == doctest::Approx(base.seconds));
  CHECK(singles.waves == 4);
  CHECK(singles.serving == 3);
  CHECK(singles.max_stall_s <= all.max_stall_s);
  CHECK(singles.total_s >= all.total_s);
}

TEST_CASE("predict: the per-tensor broadcast baseline counts a call per dimension gathered") {
  test::cluster_files files;
  const auto c = files.load(test::small_cluster("  - {name: e, tp: 2}\n"));
  const auto l = build_layout(c);
  const auto b = predict_nccl_broadcast(c, l);
  CHECK(b.tensors == l.tensors);
  // Per tensor: a pp gather; an ep gather (experts) or a tp gather (split
  // dense tensors; the norms and the router are whole on every tp rank);
  // then the broadcast and the engine's load.
  std::uint64_t expected = 0;
  for (const auto& s : llama_parameter_specs(c.model, dtype::bf16)) {
    const bool expert = plan::expert_of(s.name).has_value();
    const bool whole = s.name.find("norm.weight") != std::string::npos || s.name.find("mlp.gate.weight") != std::string::npos;
    expected += 1 + (expert || !whole ? 1 : 0) + 2;
  }
  CHECK(b.operations == expected);
  CHECK(b.broadcast_s == doctest::Approx(static_cast<double>(l.model_bytes) / (0.9 * 10e9)));
  CHECK(b.seconds == doctest::Approx(b.gather_s + b.broadcast_s + b.overhead_s));
}

TEST_CASE("predict: traffic and memory per side") {
  test::cluster_files files;
  const auto c = files.load(test::small_cluster("  - {name: e, replicas: 2, tp: 2, expert_parallel: true}\n"));
  const auto l = build_layout(c);
  sync_knobs k;
  const auto t = summarize(c, l, k);
  CHECK(t.per_consumer.count == 4);
  CHECK(t.per_producer.count == 4);
  CHECK(t.per_producer.total == t.per_consumer.total); // every byte sent is received
  CHECK(t.largest_group == *std::max_element(l.group_bytes.begin(), l.group_bytes.end()));
  CHECK(t.consumer_memory > 0);
  CHECK(t.producer_memory > 0);
  // Each stage has one group here: no window holds more than one.
  k.groups_in_flight = 4;
  CHECK(summarize(c, l, k).consumer_memory == t.consumer_memory);
  k.pp = pp_order::parallel; // both groups in one phase: two in flight
  CHECK(summarize(c, l, k).consumer_memory == 2 * t.consumer_memory);

  const auto r = make_report(c, l);
  const auto text = to_text(c, l, r);
  CHECK(text.find("bottleneck") != std::string::npos);
  CHECK(text.find("speed of light") != std::string::npos);
  const auto j = to_json(c, l, r);
  CHECK(j["prediction"]["seconds"].get<double>() == doctest::Approx(r.configured.seconds));
  CHECK(j["waves"].size() == 2); // wave sizes 1 and 2
  CHECK(text.find("published") == std::string::npos); // none given
}
