// Every message type survives CAF's binary serializer field by field, the
// type-ID blocks register, and the error category renders. The comparisons
// below list each struct's fields independently of its `inspect` overload,
// so a field forgotten in `inspect` fails here.
#include "actors/interfaces.hpp"
#include "actors/system_config.hpp"

#include <caf/actor_system.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/deep_to_string.hpp>

#include <doctest/doctest.h>

using namespace rlsync;

namespace {

struct serialization_fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys;

  static caf::actor_system_config& init(caf::actor_system_config& c) {
    c.set("scheduler.policy", caf::atom("testing"));
    register_rlsync_types(c);
    return c;
  }

  serialization_fixture() : sys(init(cfg)) {}

  template <class T>
  T round_trip(const T& in) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    T copy = in;
    REQUIRE(!sink(copy));
    T out;
    caf::binary_deserializer source{sys, buf};
    REQUIRE(!source(out));
    CHECK(source.remaining() == 0);
    return out;
  }

  /// A whole message, as the middleman ships it, through the registered types.
  caf::message round_trip_message(const caf::message& in) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    auto copy = in;
    REQUIRE(!sink(copy));
    caf::message out;
    caf::binary_deserializer source{sys, buf};
    REQUIRE(!source(out));
    return out;
  }
};

engine_info sample_engine_info() {
  return {"rollout-1", "node-b", 4, 17, true, 3};
}

weight_bucket sample_bucket() {
  weight_bucket b;
  b.version = 9;
  b.group = 2;
  b.entries = {{"model.layers.0.mlp.up_proj.weight", 0, {4, 2}, 0, 16},
               {"model.norm.weight", 2, {2}, 16, 8, /*tensor_offset*/ 8}}; // a piece of a larger tensor
  b.data.resize(24);
  for (size_t i = 0; i < b.data.size(); ++i)
    b.data[i] = static_cast<std::uint8_t>(i * 7 + 1);
  b.checksum = 0xdeadbeefcafef00dull;
  return b;
}

} // namespace

TEST_CASE_FIXTURE(serialization_fixture, "pause request and report survive serialization") {
  auto r = round_trip(pause_request{pause_mode::wait, true});
  CHECK(r.mode == pause_mode::wait);
  CHECK(r.clear_cache);
  auto p = round_trip(pause_report{"e0", 5, scheduler_state::paused_all, 1, 2, 3});
  CHECK(p.engine == "e0");
  CHECK(p.version == 5);
  CHECK(p.state == scheduler_state::paused_all);
  CHECK(p.aborted == 1);
  CHECK(p.frozen == 2);
  CHECK(p.waited == 3);
}

TEST_CASE_FIXTURE(serialization_fixture, "generation messages survive serialization") {
  generate_request req;
  req.request_id = 42;
  req.prompt = {256, 72, 105};
  req.generated = {33, 34};
  req.sampling = {0.7f, 0.9f, 64, 1234, false};
  req.min_version = 3;
  auto r = round_trip(req);
  CHECK(r.request_id == 42);
  CHECK(r.prompt == req.prompt);
  CHECK(r.generated == req.generated);
  CHECK(r.sampling.temperature == doctest::Approx(0.7f));
  CHECK(r.sampling.top_p == doctest::Approx(0.9f));
  CHECK(r.sampling.max_tokens == 64);
  CHECK(r.sampling.seed == 1234);
  CHECK(!r.sampling.stop_at_eos);
  CHECK(r.min_version == 3);

  auto t = round_trip(token_event{42, 7, 101, 3, true});
  CHECK(t.request_id == 42);
  CHECK(t.index == 7);
  CHECK(t.token == 101);
  CHECK(t.version == 3);
  CHECK(t.stale_kv);

  generate_result res;
  res.request_id = 42;
  res.tokens = {1, 2, 3, 4};
  res.spans = {{3, 0, 2}, {4, 2, 4}};
  res.reason = finish_reason::eos;
  res.engine = "rollout-0";
  res.stale_kv_tokens = 1;
  auto g = round_trip(res);
  CHECK(g.request_id == 42);
  CHECK(g.tokens == res.tokens);
  REQUIRE(g.spans.size() == 2);
  CHECK(g.spans[1].version == 4);
  CHECK(g.spans[1].begin == 2);
  CHECK(g.spans[1].end == 4);
  CHECK(g.reason == finish_reason::eos);
  CHECK(g.engine == "rollout-0");
  CHECK(g.stale_kv_tokens == 1);
}

TEST_CASE_FIXTURE(serialization_fixture, "membership and status messages survive serialization") {
  auto i = round_trip(sample_engine_info());
  CHECK(i.name == "rollout-1");
  CHECK(i.node == "node-b");
  CHECK(i.tp == 4);
  CHECK(i.version == 17);
  CHECK(i.dirty);
  CHECK(i.incarnation == 3);

  auto reg = round_trip(registration{12, true});
  CHECK(reg.current_version == 12);
  CHECK(reg.routable);

  auto hb = round_trip(heartbeat{"node-a", 99});
  CHECK(hb.from == "node-a");
  CHECK(hb.seq == 99);

  engine_status st{"e", 4, true, scheduler_state::paused_new, 1, 2, 3, 400, 7, 5, 6};
  auto s = round_trip(st);
  CHECK(s.name == "e");
  CHECK(s.version == 4);
  CHECK(s.dirty);
  CHECK(s.state == scheduler_state::paused_new);
  CHECK(s.running == 1);
  CHECK(s.waiting == 2);
  CHECK(s.frozen == 3);
  CHECK(s.tokens_generated == 400);
  CHECK(s.dirty_tokens == 7);
  CHECK(s.prefix_cache_hits == 5);
  CHECK(s.prefix_cache_queries == 6);

  auto ru = round_trip(route_update{"e1", 8, true});
  CHECK(ru.engine == "e1");
  CHECK(ru.version == 8);
  CHECK(ru.routable);

  auto rs = round_trip(router_status{1, 2, 3, 4, 5, 6});
  CHECK(rs.routable == 1);
  CHECK(rs.queued == 2);
  CHECK(rs.outstanding == 3);
  CHECK(rs.completed == 4);
  CHECK(rs.rejected == 5);
  CHECK(rs.rerouted == 6);

  coordinator_status cs{7, {sample_engine_info()}, {"rollout-1"}, 11, {sync_report{}}, {"rollout-2"}, {"rollout-3"}, 1, 2};
  cs.history[0].version = 6;
  cs.history[0].evicted = {"rollout-2"};
  cs.history[0].slowest_pull_ns = 900;
  cs.history[0].slowest_wait_ns = 200;
  cs.history[0].slowest_store_ns = 600;
  cs.history[0].slowest_ran_ns = 700;
  cs.history[0].slowest_queued_ns = 80;
  cs.ranks = {rank_status{1, "trainer-node", 7, 12, 11, false}};
  auto c = round_trip(cs);
  CHECK(c.version == 7);
  REQUIRE(c.members.size() == 1);
  CHECK(c.members[0].name == "rollout-1");
  CHECK(c.routable == std::vector<std::string>{"rollout-1"});
  CHECK(c.rounds == 11);
  REQUIRE(c.history.size() == 1);
  CHECK(c.history[0].version == 6);
  CHECK(c.history[0].evicted == std::vector<std::string>{"rollout-2"});
  CHECK(c.history[0].slowest_pull_ns == 900);
  CHECK(c.history[0].slowest_wait_ns == 200);
  CHECK(c.history[0].slowest_store_ns == 600);
  CHECK(c.history[0].slowest_ran_ns == 700);
  CHECK(c.history[0].slowest_queued_ns == 80);
  CHECK(c.unreachable == std::vector<std::string>{"rollout-2"});
  CHECK(c.retired == std::vector<std::string>{"rollout-3"});
  CHECK(c.live == 1);
  CHECK(c.below_min_live_events == 2);
  REQUIRE(c.ranks.size() == 1);
  CHECK(c.ranks[0].rank == 1);
  CHECK(c.ranks[0].node == "trainer-node");
  CHECK(c.ranks[0].incarnation == 7);
  CHECK(c.ranks[0].latest_version == 12);
  CHECK(c.ranks[0].pinned_version == 11);
  CHECK_FALSE(c.ranks[0].reachable);
}

TEST_CASE_FIXTURE(serialization_fixture, "weight-update messages survive serialization") {
  auto m = round_trip(tensor_meta{"lm_head.weight", 0, {320, 64}});
  CHECK(m.name == "lm_head.weight");
  CHECK(m.dtype == 0);
  CHECK(m.shape == std::vector<std::int64_t>{320, 64});

  auto b = round_trip(sample_bucket());
  auto ref = sample_bucket();
  CHECK(b.version == 9);
  CHECK(b.group == 2);
  REQUIRE(b.entries.size() == 2);
  CHECK(b.entries[1].name == "model.norm.weight");
  CHECK(b.entries[1].dtype == 2);
  CHECK(b.entries[1].shape == std::vector<std::int64_t>{2});
  CHECK(b.entries[1].offset == 16);
  CHECK(b.entries[1].bytes == 8);
  CHECK(b.entries[1].tensor_offset == 8);
  CHECK(b.data == ref.data);
  CHECK(b.checksum == ref.checksum);

  transfer_order o;
  o.version = 6;
  o.mode = transfer_mode::broadcast;
  o.backend = "ucx";
  o.same_bytes_since = 4;
  auto t = round_trip(o);
  CHECK(t.version == 6);
  CHECK(t.mode == transfer_mode::broadcast);
  CHECK(t.backend == "ucx");
  CHECK(t.same_bytes_since == 4);

  auto tr = round_trip(transfer_report{"e", 6, 1000, 5, 777, 300, 400, 500, 60});
  CHECK(tr.engine == "e");
  CHECK(tr.version == 6);
  CHECK(tr.bytes == 1000);
  CHECK(tr.groups == 5);
  CHECK(tr.duration_ns == 777);
  CHECK(tr.wait_ns == 300);
  CHECK(tr.store_ns == 400);
  CHECK(tr.ran_ns == 500);
  CHECK(tr.queued_ns == 60);

  auto pa = round_trip(phase_ack{"e", 6});
  CHECK(pa.engine == "e");
  CHECK(pa.version == 6);

  version_info unchanged{6, 5, 123456};
  unchanged.same_bytes_since = 3;
  auto vi = round_trip(unchanged);
  CHECK(vi.version == 6);
  CHECK(vi.groups == 5);
  CHECK(vi.total_bytes == 123456);
  CHECK(vi.same_bytes_since == 3);

  sync_report sr{6, 2, {"rollout-1"}, 100, 60, 4096, 40, true};
  auto r = round_trip(sr);
  CHECK(r.version == 6);
  CHECK(r.engines_synced == 2);
  CHECK(r.evicted == std::vector<std::string>{"rollout-1"});
  CHECK(r.stall_ns == 100);
  CHECK(r.transfer_ns == 60);
  CHECK(r.bytes == 4096);
  CHECK(r.control_ns == 40);
  CHECK(r.aborted);
}

TEST_CASE_FIXTURE(serialization_fixture, "nccl pulls, plans, manifests and their answers survive serialization") {
  auto msg = round_trip_message(caf::make_message(nccl_pull_atom::value, nccl_pull{"rollout-1", 1, 6, 3, 2, 1500, 77}));
  REQUIRE(msg.match_elements<nccl_pull_atom, nccl_pull>());
  const auto& p = msg.get_as<nccl_pull>(1);
  CHECK(p.engine == "rollout-1");
  CHECK(p.worker == 1);
  CHECK(p.version == 6);
  CHECK(p.group == 3);
  CHECK(p.epoch == 2);
  CHECK(p.wait_ms == 1500);
  CHECK(p.plan == 77);

  auto plan = round_trip_message(caf::make_message(nccl_plan_atom::value, nccl_plan{"rollout-1", 1, 2, {1, 2, 3}}));
  REQUIRE(plan.match_elements<nccl_plan_atom, nccl_plan>());
  const auto& np = plan.get_as<nccl_plan>(1);
  CHECK(np.engine == "rollout-1");
  CHECK(np.worker == 1);
  CHECK(np.epoch == 2);
  CHECK(np.plan == std::vector<std::uint8_t>{1, 2, 3});

  nccl_manifest m{nccl_manifest::wait, 3, 0, {sample_bucket()}, {sample_bucket().data.size() + 8}};
  m.buckets[0].data.clear(); // the bytes travel over NCCL
  auto mo = round_trip(m);
  CHECK(mo.status == nccl_manifest::wait);
  CHECK(mo.epoch == 3);
  CHECK(mo.root == 0);
  REQUIRE(mo.buckets.size() == 1);
  CHECK(mo.buckets[0].entries.size() == sample_bucket().entries.size());
  CHECK(mo.bytes == m.bytes);

  nccl_chunk c{2, 0, 24, sample_bucket()};
  c.bucket.data.clear(); // the bytes travel over NCCL
  auto out = round_trip(c);
  CHECK(out.epoch == 2);
  CHECK(out.root == 0);
  CHECK(out.bytes == 24);
  CHECK(out.bucket.checksum == sample_bucket().checksum);
  CHECK(out.bucket.entries.size() == 2);
  CHECK(out.bucket.data.empty());
}

TEST_CASE_FIXTURE(serialization_fixture, "whole messages with atoms round-trip through the registered types") {
  auto in = caf::make_message(pause_atom::value, pause_request{pause_mode::keep, false});
  auto out = round_trip_message(in);
  REQUIRE(out.match_elements<pause_atom, pause_request>());
  CHECK(out.get_as<pause_request>(1).mode == pause_mode::keep);

  auto bucket_msg = round_trip_message(caf::make_message(update_atom::value, sample_bucket()));
  REQUIRE(bucket_msg.match_elements<update_atom, weight_bucket>());
  CHECK(bucket_msg.get_as<weight_bucket>(1).data == sample_bucket().data);

  auto reg = round_trip_message(caf::make_message(register_atom::value, sample_engine_info()));
  REQUIRE(reg.match_elements<register_atom, engine_info>());
  CHECK(reg.get_as<engine_info>(1).name == "rollout-1");
}

TEST_CASE_FIXTURE(serialization_fixture, "phase orders and their answers survive serialization") {
  phase_order in;
  in.token = 77;
  in.phase = sync_phase::transfer;
  in.deadline_ms = 60000;
  in.pause = pause_request{pause_mode::wait, true};
  in.version = 9;
  in.transfer = transfer_order{9, transfer_mode::broadcast, "ucx", {producer_holding{1, 3, {"a", "b"}}}};
  auto out = round_trip(in);
  CHECK(out.token == 77);
  CHECK(out.phase == sync_phase::transfer);
  CHECK(out.deadline_ms == 60000);
  CHECK(out.pause.mode == pause_mode::wait);
  CHECK(out.pause.clear_cache);
  CHECK(out.version == 9);
  CHECK(out.transfer.version == 9);
  CHECK(out.transfer.mode == transfer_mode::broadcast);
  CHECK(out.transfer.backend == "ucx");
  REQUIRE(out.transfer.producers.size() == 1);
  CHECK(out.transfer.producers[0].held == std::vector<std::string>{"a", "b"});
  CHECK(out.producers.empty());
  auto done = round_trip_message(caf::make_message(phase_done_atom::value, std::uint64_t{77}, phase_ack{"e", 9, true}));
  REQUIRE(done.match_elements<phase_done_atom, std::uint64_t, phase_ack>());
  CHECK(done.get_as<std::uint64_t>(1) == 77);
  CHECK(done.get_as<phase_ack>(2).dirty);
  auto failed = round_trip_message(
    caf::make_message(phase_done_atom::value, std::uint64_t{78}, make_error(errc::checksum_mismatch, "group 3")));
  REQUIRE(failed.match_elements<phase_done_atom, std::uint64_t, caf::error>());
  CHECK(is(failed.get_as<caf::error>(2), errc::checksum_mismatch));
}

TEST_CASE_FIXTURE(serialization_fixture, "a truncated buffer fails to deserialize instead of crashing") {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  auto b = sample_bucket();
  REQUIRE(!sink(b));
  for (size_t cut : {size_t{0}, size_t{3}, buf.size() / 2, buf.size() - 1}) {
    std::vector<char> part(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(cut));
    caf::binary_deserializer source{sys, part};
    weight_bucket out;
    CHECK(source(out)); // an error, not garbage
  }
}

TEST_CASE_FIXTURE(serialization_fixture, "rlsync errors carry their code and render readably") {
  auto err = make_error(errc::checksum_mismatch, "group 3 of version 7");
  CHECK(is(err, errc::checksum_mismatch));
  CHECK(!is(err, errc::malformed));
  CHECK(!is(caf::make_error(caf::sec::request_timeout), errc::checksum_mismatch));
  CHECK(sys.render(err) == "rlsync::checksum_mismatch: group 3 of version 7");
  CHECK(sys.render(make_error(errc::engine_dirty)) == "rlsync::engine_dirty");
}

TEST_CASE_FIXTURE(serialization_fixture, "deep_to_string names the type and its fields") {
  CHECK(caf::deep_to_string(pause_request{pause_mode::keep, true})
        == "pause_request(keep, true)");
}
