// The ucx backend over loopback, producer and puller in one process (their
// UCX workers are separate, as across processes): a pull reproduces
// engine::load_weights exactly, sharded and broadcast, over shared memory
// and over tcp; corrupted bytes, a silent producer and a closed port fail by
// the deadline with errors naming what failed; malformed peers are rejected
// without disturbing the others. Skips (with a message) where UCX cannot
// create a context.
#include "runtime/base/checksum.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/loader.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/transfer/external_source.hpp"
#include "runtime/transfer/packing.hpp"
#include "runtime/transfer/host_buffer.hpp"
#include "runtime/transfer/ucx/puller_impl.hpp"
#include "runtime/transfer/ucx/shared_memory.hpp"
#include "runtime/transfer/ucx/ucx_transfer.hpp"
#include "runtime/transfer/ucx/ucx_wire.hpp"

#include "tests/support/eventually.hpp"
#include "tests/support/scratch_dir.hpp"
#include "tests/support/transfer_fixtures.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <future>
#include <set>
#include <sstream>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <utility>

using namespace rlsync;
using namespace rlsync::transfer;
using namespace std::chrono_literals;
using rlsync::test::in;
using rlsync::test::plan_bytes;
using rlsync::test::test_engine;
namespace wire = rlsync::transfer::ucx_wire;

#define SKIP_WITHOUT_UCX()                                                   \
  do {                                                                       \
    std::string why_;                                                        \
    if (!ucx_available(&why_)) {                                             \
      MESSAGE((std::string("skipped: UCX is not usable here: ") + why_));    \
      return;                                                                \
    }                                                                        \
  } while (0)

namespace {

// Log lines of both ends, for checks on what was logged.
struct log_lines {
  std::mutex mutex;
  std::vector<std::string> lines;
  ucx_log sink() {
    return [this](const std::string& l) {
      std::lock_guard<std::mutex> lock(mutex);
      lines.push_back(l);
    };
  }
  bool contains(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& l : lines)
      if (l.find(text) != std::string::npos)
        return true;
    return false;
  }
};

ucx_producer_options loopback_producer(std::vector<ucx_transport> transports = {}, ucx_log log = {}) {
  ucx_producer_options o;
  o.net_devices = "lo"; // otherwise a 127.0.0.1 connection also takes eth0 as a second rail
  o.transports = std::move(transports);
  o.log = std::move(log);
  return o;
}

// Stands for the control plane: hands out credentials of whichever
// producer is current (none: the request fails, as the trainer's would).
struct producer_link {
  std::mutex mutex;
  ucx_producer* current = nullptr;
  void set(ucx_producer* p) {
    std::lock_guard<std::mutex> lock(mutex);
    current = p;
  }
  ucx_credentials issue(const std::string& engine, int worker) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!current)
      throw std::runtime_error("no producer runs");
    return current->issue(engine, worker);
  }
};

ucx_puller_options loopback_puller(ucx_credentials_source credentials, std::vector<ucx_transport> transports = {},
                                   ucx_log log = {}) {
  ucx_puller_options o;
  o.credentials = std::move(credentials);
  o.net_devices = "lo";
  o.transports = std::move(transports);
  o.log = std::move(log);
  return o;
}

ucx_puller_options loopback_puller(ucx_producer& producer, std::vector<ucx_transport> transports = {},
                                   ucx_log log = {}) {
  return loopback_puller([&producer](const std::string& engine, int worker,
                                     clock::time_point) { return producer.issue(engine, worker); },
                         std::move(transports), std::move(log));
}

ucx_puller_options loopback_puller(const std::shared_ptr<producer_link>& link,
                                   std::vector<ucx_transport> transports = {}, ucx_log log = {}) {
  return loopback_puller([link](const std::string& engine, int worker,
                                clock::time_point) { return link->issue(engine, worker); },
                         std::move(transports), std::move(log));
}

template <class F>
transfer_error expect_failure(F&& f) {
  try {
    f();
  } catch (const transfer_error& e) {
    return e;
  }
  FAIL("no transfer_error");
  return transfer_error(transfer_failure::cancelled, "unreachable");
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// How errors and logs name a producer: by a checksum of its worker address.
std::string name_of(const ucx_producer& p) {
  const auto& a = p.worker_address();
  return "ucx-" + checksum_hex(checksum64(a.data(), a.size())).substr(0, 8);
}

// The local addresses ("127.0.0.1", "::1", ...) of every TCP socket this
// process listens on, from its descriptors and /proc/net/tcp{,6}.
std::vector<std::string> own_listening_addresses() {
  std::set<std::string> inodes;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0)
      inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line); // the header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state != "0A" || !inodes.count(inode)) // 0A: LISTEN
        continue;
      const std::string hex = local.substr(0, local.find(':'));
      char text[INET6_ADDRSTRLEN] = {};
      if (hex.size() == 8) {
        in_addr a{};
        a.s_addr = static_cast<std::uint32_t>(std::stoul(hex, nullptr, 16));
        inet_ntop(AF_INET, &a, text, sizeof text);
      } else {
        in6_addr a{};
        for (int w = 0; w < 4; ++w) {
          const auto word = static_cast<std::uint32_t>(std::stoul(hex.substr(8 * w, 8), nullptr, 16));
          std::memcpy(a.s6_addr + 4 * w, &word, 4);
        }
        inet_ntop(AF_INET6, &a, text, sizeof text);
      }
      out.push_back(text);
    }
  }
  return out;
}

using test::eventually;

// Packed bytes of every (worker, group) of `c` at `tp`, bf16.
std::vector<std::uint64_t> shard_group_bytes(const model_config& c, int tp) {
  std::vector<std::uint64_t> out;
  for (int w = 0; w < tp; ++w) {
    plan::grouped_plan p(c, std::make_shared<const plan::worker_plan>(engine::make_plan(c, tp, w, dtype::bf16)));
    for (std::uint32_t g = 0; g < p.group_count(); ++g)
      out.push_back(p.bytes(g));
  }
  return out;
}

std::uint64_t sum_of(const std::vector<std::uint64_t>& v) {
  std::uint64_t n = 0;
  for (auto x : v)
    n += x;
  return n;
}

std::uint64_t largest_of(const std::vector<std::uint64_t>& v) {
  return *std::max_element(v.begin(), v.end());
}

} // namespace

// -- the wire format ---------------------------------------------------------------------

TEST_CASE("ucx wire: a plan survives encoding, and every truncation or trailing byte is rejected") {
  const model_config c = test::small_model(2);
  const auto plan = engine::make_plan(c, 2, 1, dtype::bf16);
  const auto bytes = wire::encode_plan(plan);
  const auto back = wire::decode_plan(bytes.data(), bytes.size());
  CHECK(back.tp == 2);
  CHECK(back.worker == 1);
  REQUIRE(back.entries.size() == plan.entries.size());
  for (std::size_t i = 0; i < plan.entries.size(); ++i) {
    const auto& a = plan.entries[i];
    const auto& b = back.entries[i];
    CHECK(a.source == b.source);
    CHECK(a.source_type == b.source_type);
    CHECK(a.source_shape == b.source_shape);
    CHECK(a.ops == b.ops);
    CHECK(a.view.offset == b.view.offset);
    CHECK(a.view.shape == b.view.shape);
    CHECK(a.view.strides == b.view.strides);
    CHECK(a.param == b.param);
    CHECK(a.dst_offset == b.dst_offset);
  }
  CHECK(wire::encode_plan(back) == bytes); // deterministic: equal plans have equal digests

  for (std::size_t n = 0; n < bytes.size(); n += 7)
    CHECK_THROWS_AS(wire::decode_plan(bytes.data(), n), wire::wire_error);
  auto longer = bytes;
  longer.push_back(0);
  CHECK_THROWS_WITH_AS(wire::decode_plan(longer.data(), longer.size()), doctest::Contains("1 trailing bytes"),
                       wire::wire_error);
}

TEST_CASE("ucx wire: random damage to a plan never reads out of bounds: it decodes to a checked plan or throws") {
  const model_config c = test::small_model(1);
  const auto bytes = wire::encode_plan(engine::make_plan(c, 2, 0, dtype::bf16));
  std::mt19937 rng(5);
  int rejected = 0;
  for (int round = 0; round < 2000; ++round) {
    auto damaged = bytes;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f)
      damaged[rng() % damaged.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
    try {
      const auto p = wire::decode_plan(damaged.data(), damaged.size());
      CHECK_NOTHROW(wire::check_plan(p)); // whatever decodes is safe to replay
    } catch (const wire::wire_error&) {
      ++rejected;
    }
  }
  CHECK(rejected > 0);
}

TEST_CASE("ucx wire: views outside their source tensor, and absurd sizes, are rejected naming the entry") {
  const model_config c = test::small_model(1);
  const auto good = engine::make_plan(c, 1, 0, dtype::bf16);
  auto expect = [](plan::worker_plan p, const char* text) {
    const auto bytes = wire::encode_plan(p);
    CHECK_THROWS_WITH_AS(wire::decode_plan(bytes.data(), bytes.size()), doctest::Contains(text), wire::wire_error);
  };
  {
    auto p = good;
    p.entries[0].view.offset = p.entries[0].numel(); // one past: reads beyond the end
    expect(p, "plan entry 0 ('model.embed_tokens.weight'): view reads elements");
  }
  {
    auto p = good;
    p.entries[1].view.offset = -1;
    expect(p, "outside its source");
  }
  {
    auto p = good;
    p.entries[0].view.shape = {std::int64_t(1) << 40, std::int64_t(1) << 40};
    p.entries[0].view.strides = {0, 0};
    expect(p, "bad view shape"); // the element count overflows
  }
  {
    auto p = good;
    p.entries[0].view.shape = {1 << 20};
    p.entries[0].view.strides = {0}; // in bounds, but far larger than its source
    expect(p, "is larger than its source");
  }
  {
    auto p = good;
    p.worker = 3;
    expect(p, "worker 3 out of range for tp 1");
  }
  {
    auto p = good; // (not encodable: the encoding writes one rank for both)
    p.entries[2].view.strides.pop_back();
    CHECK_THROWS_WITH_AS(wire::check_plan(p), doctest::Contains("strides"), wire::wire_error);
  }
}

TEST_CASE("ucx wire: messages round-trip, unknown types and bad enums are rejected") {
  wire::open_msg o{7, "rollout-0", 1, 2, 42, transfer_mode::broadcast, 0x1234, 2, 100, 5000};
  auto bytes = wire::encode(o);
  auto m = wire::decode(bytes.data(), bytes.size());
  const auto* back = std::get_if<wire::open_msg>(&m);
  REQUIRE(back);
  CHECK(back->engine == "rollout-0");
  CHECK(back->worker == 1);
  CHECK(back->tp == 2);
  CHECK(back->version == 42);
  CHECK(back->mode == transfer_mode::broadcast);
  CHECK(back->plan == 0x1234);
  CHECK(back->prefetch == 2);
  CHECK(back->tag_base == 100);
  CHECK(back->timeout_ms == 5000);
  CHECK(wire::peek_seq(bytes.data(), bytes.size()) == 7);
  o.prefetch = wire::max_prefetch + 1;
  bytes = wire::encode(o);
  CHECK_THROWS_WITH_AS(wire::decode(bytes.data(), bytes.size()), doctest::Contains("prefetch of 65 groups, at most 64"),
                       wire::wire_error);

  wire::manifest_msg mf;
  mf.seq = 9;
  mf.session = 3;
  mf.groups.push_back({0, 128, {tensor_spec{"a", dtype::bf16, {8, 8}}}});
  bytes = wire::encode(mf);
  m = wire::decode(bytes.data(), bytes.size());
  REQUIRE(std::get_if<wire::manifest_msg>(&m));
  CHECK(std::get<wire::manifest_msg>(m).groups.at(0).tensors.at(0).shape == std::vector<std::int64_t>{8, 8});
  // A shared manifest names the producer's live buffers; a count past the
  // limit is refused before anything is allocated for it.
  auto shared = mf;
  shared.shared = true;
  shared.live_buffers = {11, 22, 33};
  auto sb = wire::encode(shared);
  m = wire::decode(sb.data(), sb.size());
  REQUIRE(std::get_if<wire::manifest_msg>(&m));
  CHECK(std::get<wire::manifest_msg>(m).shared);
  CHECK(std::get<wire::manifest_msg>(m).live_buffers == std::vector<std::uint64_t>{11, 22, 33});
  // Lent in place: every group places its tensors; offsets only then, one per tensor.
  auto placed = shared;
  placed.in_place = true;
  placed.groups.at(0).offsets = {4096};
  auto pb = wire::encode(placed);
  m = wire::decode(pb.data(), pb.size());
  REQUIRE(std::get_if<wire::manifest_msg>(&m));
  CHECK(std::get<wire::manifest_msg>(m).in_place);
  CHECK(std::get<wire::manifest_msg>(m).groups.at(0).offsets == std::vector<std::uint64_t>{4096});
  struct lie {
    const char* what;
    std::function<void(wire::manifest_msg&)> tell;
    const char* says;
  };
  const lie lies[] = {
      {"in place, not shared", [](auto& x) { x.shared = false; }, "not shared"},
      {"in place, a group without offsets", [](auto& x) { x.groups.at(0).offsets.clear(); }, "names no tensors and offsets"},
      {"more offsets than tensors", [](auto& x) { x.groups.at(0).offsets.push_back(0); }, "2 offsets for 1 tensors"},
      {"offsets, not in place", [](auto& x) { x.in_place = false; }, "not lent in place"},
      {"an offset past any buffer", [](auto& x) { x.groups.at(0).offsets = {wire::max_shared_bytes + 1}; }, "beyond any shared buffer"},
  };
  for (const auto& l : lies) {
    CAPTURE(l.what);
    auto x = placed;
    l.tell(x);
    auto xb = wire::encode(x);
    CHECK_THROWS_WITH_AS(wire::decode(xb.data(), xb.size()), doctest::Contains(l.says), wire::wire_error);
  }
  const std::uint32_t too_many = wire::max_live_buffers + 1;
  std::memcpy(sb.data() + sb.size() - 3 * 8 - 4, &too_many, sizeof too_many);
  CHECK_THROWS_WITH_AS(wire::decode(sb.data(), sb.size()), doctest::Contains("live buffer count"), wire::wire_error);

  auto bad_type = wire::encode(wire::hello_msg{1});
  bad_type[5] = 0x33;
  CHECK_THROWS_WITH_AS(wire::decode(bad_type.data(), bad_type.size()), doctest::Contains("unknown message type 51"),
                       wire::wire_error);
  auto bad_mode = wire::encode(o);
  bad_mode[6 + 8 + 4 + 9 + 4 + 4 + 8] = 9; // the mode byte
  CHECK_THROWS_WITH_AS(wire::decode(bad_mode.data(), bad_mode.size()), doctest::Contains("unknown transfer mode 9"),
                       wire::wire_error);
  // A huge count is refused before anything is allocated for it.
  auto huge = wire::encode(mf);
  const std::uint32_t lots = 0xfffffff0u;
  std::memcpy(huge.data() + 6 + 8 + 1 + 4 + 8, &lots, sizeof lots);
  CHECK_THROWS_WITH_AS(wire::decode(huge.data(), huge.size()), doctest::Contains("exceeds the limit"),
                       wire::wire_error);
  for (std::size_t n = 0; n < bytes.size(); ++n)
    CHECK_THROWS_AS(wire::decode(bytes.data(), n), wire::wire_error);
}

TEST_CASE("ucx wire: messages and plans of an older format version (3: open without prefetch) are refused naming both versions") {
  auto message = wire::encode(wire::hello_msg{1});
  REQUIRE(message.at(4) == 10); // the byte after the magic
  message[4] = 3;
  CHECK_THROWS_WITH_AS(wire::decode(message.data(), message.size()),
                       doctest::Contains("format version 3, expected 10"), wire::wire_error);
  auto plan = wire::encode_plan(engine::make_plan(test::small_model(1), 1, 0, dtype::bf16));
  REQUIRE(plan.at(4) == 10);
  plan[4] = 1;
  CHECK_THROWS_WITH_AS(wire::decode_plan(plan.data(), plan.size()), doctest::Contains("format version 1, expected 10"),
                       wire::wire_error);
}

// -- pulls over UCX --------------------------------------------------------------------------

TEST_CASE("ucx: a sharded pull applied with the plan equals load_weights, each worker getting only its bytes") {
  SKIP_WITHOUT_UCX();
  for (int tp : {1, 2}) {
    INFO("tp " << tp);
    const model_config c = test::small_model(3);
    auto src = test::small_source(c);
    auto v1 = src->produce_next();
    log_lines log;
    ucx_producer producer(src, loopback_producer({}, log.sink()));
    CHECK(!producer.worker_address().empty());
    ucx_puller puller(loopback_puller(producer, {}, log.sink()));
    test_engine e("rollout-0", c, tp, puller);
    // Registration made a UCX worker per engine worker, so that the first
    // connections do not make theirs inside the sync.
    CHECK(puller.stats().workers_made_ahead == static_cast<std::uint64_t>(tp));

    auto report = e.pull(puller, 1);
    CHECK(puller.stats().workers_taken_ahead == static_cast<std::uint64_t>(tp));
    // Registering a worker again (holder pulls do, at pull time) makes none:
    // its connection is kept.
    puller.register_worker(e.name, std::make_shared<const plan::worker_plan>(e.plans.front().plan()));
    CHECK(puller.stats().workers_made_ahead == static_cast<std::uint64_t>(tp));
    test::check_identical(*e.weights, *test::loaded(*v1, tp));
    CHECK(report.version == 1);
    CHECK(report.groups == 3);
    CHECK(report.bytes == plan_bytes(e));
    for (int w = 0; w < tp; ++w) {
      auto r = puller.pull({e.name, w, 1, transfer_mode::sharded, in(10s)}, e.sink());
      CHECK(r.bytes == plan::bytes_per_worker(e.plans[static_cast<std::size_t>(w)].plan()));
      CHECK(r.groups == 3);
      // Where the pull went: disjoint parts of it, each some time.
      CHECK(r.waited.count() > 0); // at least the open's round trip
      CHECK(r.stored.count() > 0);
      CHECK(r.waited + r.stored <= r.duration);
    }
    // Both ends logged the transports of their endpoints.
    CHECK(log.contains("ucx puller: engine 'rollout-0' worker 0 connected to producer " + name_of(producer)));
    CHECK(log.contains("ucx producer: connection from"));
    MESSAGE("transports: " << puller.last_transports());

    // The next version lands on top, over the connections already made.
    auto v2 = src->produce_next();
    const auto connections = puller.stats().connections;
    e.pull(puller, 2);
    test::check_identical(*e.weights, *test::loaded(*v2, tp));
    CHECK(puller.stats().connections == connections);
    CHECK(puller.stats().buffers <= static_cast<std::size_t>(tp) * 2); // groups_in_flight per concurrent pull
  }
}

TEST_CASE("ucx: UCX workers made ahead number at most the engine workers registered") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  log_lines log;
  ucx_producer producer(src, loopback_producer({}, log.sink()));
  ucx_puller puller(loopback_puller(producer, {}, log.sink()));
  auto plan_of = [&](int w) { return std::make_shared<const plan::worker_plan>(engine::make_plan(c, 2, w, dtype::bf16)); };
  puller.register_worker("a", plan_of(0));
  puller.register_worker("a", plan_of(1));
  CHECK(puller.stats().workers_made_ahead == 2);
  puller.register_worker("a", plan_of(0)); // the same worker again: nothing more
  CHECK(puller.stats().workers_made_ahead == 2);
  // Unregistering drops the workers it no longer needs: the next
  // registration makes one again (kept, it would have taken a spare).
  puller.unregister_engine("a");
  puller.register_worker("b", plan_of(0));
  CHECK(puller.stats().workers_made_ahead == 3);
  CHECK(puller.stats().workers_taken_ahead == 0);
  CHECK(puller.stats().connect_attempts == 0); // nothing connects before a pull
}

TEST_CASE("ucx: the open carries the first groups_in_flight gets, the rest are asked for one by one") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3); // 3 groups
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  for (std::size_t in_flight : {std::size_t(1), std::size_t(2), std::size_t(5)}) {
    CAPTURE(in_flight);
    ucx_producer producer(src, loopback_producer());
    auto po = loopback_puller(producer);
    po.groups_in_flight = in_flight;
    ucx_puller puller(po);
    test_engine e("rollout-0", c, 1, puller);
    auto report = e.pull(puller, 1);
    test::check_identical(*e.weights, *test::loaded(*v1, 1));
    CHECK(report.groups == 3);
    // A send counts once UCX completes it on the producer's side, a moment after the consumer has it.
    const auto until = in(10s);
    while (producer.stats().groups_sent < 3 && clock::now() < until)
      std::this_thread::sleep_for(1ms);
    const auto st = producer.stats();
    CHECK(st.groups_sent == 3);
    CHECK(st.gets_carried == std::min<std::size_t>(in_flight, 3));
    // hello, plan, open, a get for each group the open did not carry, a done
    // for each group lent in shared memory (the last done and the close may
    // still be on their way).
    CHECK(st.requests >= 3 + (3 - st.gets_carried) + st.groups_lent - 1);
    CHECK(st.requests <= 4 + (3 - st.gets_carried) + st.groups_lent);
  }
  // An open the producer refuses carries nothing.
  ucx_producer producer(src, loopback_producer());
  ucx_puller puller(loopback_puller(producer));
  test_engine e("rollout-0", c, 1, puller);
  CHECK_THROWS_AS(e.pull(puller, 9), transfer_error);
  CHECK(producer.stats().gets_carried == 0);
  CHECK(producer.stats().groups_sent == 0);
}

TEST_CASE("ucx: many groups in flight, over tcp too: every answer of a burst arrives") {
  // Under UCX_RNDV_THRESH=1 (the rendezvous variant of this suite) each
  // answer is a fetch on the consumer's side: a burst of an open's answer
  // and its groups must all be taken, and the gets that follow too.
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(10);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  for (auto transports : {std::vector<ucx_transport>{}, std::vector<ucx_transport>{ucx_transport::tcp}}) {
    CAPTURE(transports.size());
    ucx_producer producer(src, loopback_producer(transports));
    auto po = loopback_puller(producer, transports);
    po.groups_in_flight = 8;
    ucx_puller puller(po);
    test_engine e("rollout-0", c, 1, puller);
    CHECK(e.pull(puller, 1).groups == 10);
    test::check_identical(*e.weights, *test::loaded(*v1, 1));
  }
}

TEST_CASE("ucx: on one host groups are lent in shared memory and copied once, without it they come by tag") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  src->produce_next();
  struct row {
    bool producer_offers, puller_maps, lent;
  };
  const row rows[] = {{true, true, true}, {false, true, false}, {true, false, false}};
  for (const auto& r : rows) {
    CAPTURE(r.producer_offers);
    CAPTURE(r.puller_maps);
    for (auto mode : {transfer_mode::sharded, transfer_mode::broadcast}) {
      CAPTURE(mode);
      log_lines log;
      auto po = loopback_producer({}, log.sink());
      po.shared_memory = r.producer_offers;
      ucx_producer producer(src, po);
      auto qo = loopback_puller(producer, {}, log.sink());
      qo.shared_memory = r.puller_maps;
      ucx_puller puller(qo);
      test_engine e("rollout-0", c, 2, puller);
      for (int round = 0; round < 4; ++round) {
        auto v = round == 0 ? src->latest() : src->produce_next();
        auto report = e.pull(puller, v->version(), mode);
        test::check_identical(*e.weights, *test::loaded(*v, 2));
        CHECK(report.groups == 3);
        // The engine's report names its slowest worker's wait and store, lent or not.
        CHECK(report.wait_ns > 0);
        CHECK(report.store_ns > 0);
        CHECK(report.wait_ns + report.store_ns <= report.duration_ns);
      }
      const auto until = in(10s);
      while (producer.stats().groups_sent < 24 && clock::now() < until)
        std::this_thread::sleep_for(1ms);
      CHECK(producer.stats().groups_sent == 24); // 2 workers x 3 groups x 4 versions
      CHECK(producer.stats().groups_lent == (r.lent ? 24u : 0u));
      CHECK(producer.stats().groups_lent_in_place == 0); // the source's versions are in private memory
      CHECK(puller.stats().groups_mapped == (r.lent ? 24u : 0u));
      CHECK(log.contains("groups in shared memory") == r.lent);
      CHECK(log.contains("no shared memory: turned off") == !r.puller_maps);
      if (r.lent) {
        // Packed buffers are reused version after version, and each is
        // mapped once per connection (2 here) and kept while the producer
        // holds it, not mapped again by every pull.
        CHECK(producer.stats().buffers_made < producer.stats().packs);
        CHECK(puller.stats().mappings <= 2 * (producer.stats().buffers_made + producer.stats().buffers_prewarmed));
        CHECK(puller.stats().buffers == 0); // no receive buffer was needed
      }
    }
  }
}

TEST_CASE("ucx: a version in shareable memory is lent in place: nothing packed, each worker gathers its bytes") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  struct row {
    transfer_mode mode;
    bool stores_in_place; // the engine offers its staging as targets
    bool puller_maps;     // else everything comes by tag, packed
  };
  const row rows[] = {{transfer_mode::sharded, true, true},   {transfer_mode::sharded, false, true},
                      {transfer_mode::broadcast, false, true}, {transfer_mode::broadcast, true, true},
                      {transfer_mode::sharded, true, false},   {transfer_mode::broadcast, true, false}};
  for (const auto& r : rows) {
    CAPTURE(r.mode);
    CAPTURE(r.stores_in_place);
    CAPTURE(r.puller_maps);
    auto src = test::small_source(c, 2, /*shared*/ true);
    std::weak_ptr<const weight_snapshot> first = src->produce_next();
    REQUIRE(first.lock()->shared_buffer());
    ucx_producer producer(src, loopback_producer());
    auto qo = loopback_puller(producer);
    qo.shared_memory = r.puller_maps;
    ucx_puller puller(qo);
    test_engine e("rollout-0", c, 2, puller);
    e.in_place = r.stores_in_place;
    for (int round = 0; round < 4; ++round) {
      auto v = round == 0 ? src->latest() : src->produce_next();
      auto report = e.pull(puller, v->version(), r.mode);
      test::check_identical(*e.weights, *test::loaded(*v, 2));
      CHECK(report.groups == 3);
    }
    // Broadcast into targets: the whole group checksummed and the worker's
    // pieces stored in one pass, none handed over whole.
    CHECK((e.full_groups == 0) == (r.mode == transfer_mode::sharded || r.stores_in_place));
    CHECK(eventually([&] { return producer.stats().groups_sent == 24; })); // 2 workers x 3 groups x 4 versions
    CHECK(producer.stats().groups_lent_in_place == (r.puller_maps ? 24u : 0u));
    if (r.puller_maps) {
      CHECK(producer.stats().buffers_made == 0); // nothing was packed
      CHECK(puller.stats().groups_mapped == 24);
      // A version no longer held and no longer lent is freed: neither the
      // producer's checksums of it nor its consumers' mappings keep it.
      CHECK(eventually([&] { return first.expired(); }));
    }
  }
}

TEST_CASE("ucx: a plan whose runs are too short to gather one by one is packed, not lent in place") {
  // small_model at tp 4: o_proj's quarter rows are 32 bytes, under
  // min_lent_run_bytes; at tp 2 (half rows of 64 bytes) the same source
  // is lent in place.
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  for (int tp : {2, 4}) {
    CAPTURE(tp);
    auto src = test::small_source(c, 2, /*shared*/ true);
    auto v = src->produce_next();
    REQUIRE(v->shared_buffer());
    ucx_producer producer(src, loopback_producer());
    ucx_puller puller(loopback_puller(producer));
    test_engine e("rollout-0", c, tp, puller);
    e.in_place = true;
    e.pull(puller, v->version(), transfer_mode::sharded);
    test::check_identical(*e.weights, *test::loaded(*v, tp));
    const auto groups = static_cast<std::uint64_t>(3 * tp);
    CHECK(eventually([&] { return producer.stats().groups_sent == groups; }));
    CHECK(producer.stats().groups_lent_in_place == (tp == 2 ? groups : 0u));
    CHECK(producer.stats().groups_lent == groups); // in shared memory either way: packed there at tp 4
    CHECK((producer.stats().peak_packed > 0) == (tp == 4));
  }
}

TEST_CASE("ucx: a PyTorch rank's push in shareable memory is lent in place as the synthetic trainer's is") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto trainer = test::small_source(c); // makes each version's bytes; the rank pushes them
  external_options o;
  o.config = c;
  o.type = dtype::bf16;
  o.shared_memory = true;
  o.shared_small_pages = true;
  auto rank = std::make_shared<external_source>(o);
  std::set<std::uint64_t> buffers; // the memfds the rank's versions lie in
  auto push = [&] {
    auto v = trainer->produce_next();
    std::vector<tensor_input> state_dict;
    for (const auto& t : v->tensors())
      state_dict.push_back({t.name, t.type, t.shape, t.data, t.size});
    rank->push(v->version(), state_dict);
    auto pushed = rank->advance();
    REQUIRE(pushed->shared_buffer());
    buffers.insert(pushed->shared_buffer()->id());
    return v;
  };
  auto v = push();
  ucx_producer producer(rank, loopback_producer());
  ucx_puller puller(loopback_puller(producer));
  test_engine e("rollout-0", c, 2, puller);
  e.in_place = true;
  // Five versions: the rank reuses dropped versions' memory (same memfd,
  // mapped once by the engine), each pull still the version pushed.
  for (int round = 0; round < 5; ++round) {
    if (round > 0)
      v = push();
    e.pull(puller, v->version(), transfer_mode::sharded);
    test::check_identical(*e.weights, *test::loaded(*v, 2));
  }
  CHECK(eventually([&] { return producer.stats().groups_sent == 30; })); // 2 workers x 3 groups x 5 versions
  CHECK(producer.stats().groups_lent_in_place == 30);
  CHECK(producer.stats().buffers_made == 0); // nothing was packed
  // Each worker mapped each memfd once: a dropped version's memory, kept
  // as a spare and named live, stays mapped for the version reusing it.
  CHECK(buffers.size() < 5);
  CHECK(puller.stats().mappings == 2 * buffers.size());
}

TEST_CASE("ucx: a checkpoint directory's steps are lent in place, nothing packed") {
  SKIP_WITHOUT_UCX();
  test::scratch_dir tmp;
  const model_config c = test::small_model(3);
  checkpoint_dir_options o;
  o.config = c;
  o.dir = tmp.path();
  o.shared_memory = true;
  o.shared_small_pages = true; // this machine's hugetlb pool may be empty
  auto steps = std::make_shared<checkpoint_dir_source>(o);
  auto step = [&](std::uint64_t s) { return o.dir + "/" + step_dir_name(s); };
  make_synthetic_checkpoint(step(1), c, dtype::bf16, 5);
  mark_step_complete(step(1));
  auto v = steps->poll();
  REQUIRE(v->shared_buffer());
  ucx_producer producer(steps, loopback_producer());
  ucx_puller puller(loopback_puller(producer));
  test_engine e("rollout-0", c, 2, puller);
  e.in_place = true;
  for (std::uint64_t s = 1; s <= 3; ++s) {
    if (s > 1) {
      perturb_checkpoint(step(s - 1), step(s), 0.05, s);
      mark_step_complete(step(s));
      v = steps->poll();
      REQUIRE(v->version() == s);
    }
    e.pull(puller, s, transfer_mode::sharded);
    test::check_identical(*e.weights, *test::loaded(*v, 2));
  }
  CHECK(eventually([&] { return producer.stats().groups_sent == 18; })); // 2 workers x 3 groups x 3 steps
  CHECK(producer.stats().groups_lent_in_place == 18);
  CHECK(producer.stats().buffers_made == 0); // nothing was packed
}

TEST_CASE("ucx: a producer started before a checkpoint directory's first f32 step takes f32 plans") {
  SKIP_WITHOUT_UCX();
  test::scratch_dir tmp;
  const model_config c = test::small_model(3);
  checkpoint_dir_options o;
  o.config = c;
  o.dir = tmp.path(); // no dtype given: the directory's first step says it
  auto steps = std::make_shared<checkpoint_dir_source>(o);
  ucx_producer producer(steps, loopback_producer()); // before any step: the source assumes bf16
  ucx_puller puller(loopback_puller(producer));
  test_engine e("rollout-0", c, 2, puller, dtype::f32);
  const auto step = o.dir + "/" + step_dir_name(1);
  make_synthetic_checkpoint(step, c, dtype::f32, 5);
  mark_step_complete(step);
  auto v = steps->poll();
  REQUIRE(v);
  e.pull(puller, 1, transfer_mode::sharded);
  test::check_identical(*e.weights, *test::loaded(*v, 2)); // f32, as the step is
}

TEST_CASE("ucx: a version lent in place and never given back is retired: no later version reuses its memory") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c, /*keep*/ 1, /*shared*/ true);
  auto v1 = src->produce_next();
  const auto id1 = v1->shared_buffer()->id();
  std::weak_ptr<const weight_snapshot> first = v1;
  v1.reset();
  ucx_producer producer(src, loopback_producer());
  ucx_puller puller(loopback_puller(producer));
  test_engine e("rollout-0", c, 2, puller);
  e.in_place = true;
  auto crashing = e.sink(); // dies with the first group lent: it never gives it back
  crashing.on_stored = [](int, std::uint32_t) { throw std::runtime_error("the engine died storing"); };
  CHECK_THROWS(transfer::pull_engine(puller, e.name, e.tp, 1, transfer_mode::sharded, crashing, test::in(1500ms)));
  src->produce_next(); // version 1 dropped by the source: only the lent group holds it
  // The producer lets go of version 1 when the lend's deadline passes or its connection ends.
  CHECK(eventually([&] { return first.expired(); }));
  // Kept as a spare, version 1's memory would take the next version while
  // that engine might still be reading it.
  auto v3 = src->produce_next();
  REQUIRE(v3->shared_buffer());
  CHECK(v3->shared_buffer()->id() != id1);
  e.pull(puller, 3, transfer_mode::sharded);
  test::check_identical(*e.weights, *test::loaded(*v3, 2));
}

TEST_CASE("ucx: lent in place, a corrupted group still fails that worker's pull with a checksum error") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c, 2, /*shared*/ true);
  auto v1 = src->produce_next();
  ucx_producer producer(src, loopback_producer());
  ucx_puller puller(loopback_puller(producer));
  for (auto mode : {transfer_mode::sharded, transfer_mode::broadcast}) {
    CAPTURE(mode);
    test_engine bad("rollout-0", c, 2, puller);
    bad.in_place = true;
    producer.corrupt({"rollout-0", 1, 1, /*group*/ 1});
    auto err = expect_failure([&] { bad.pull(puller, 1, mode); });
    CHECK(err.failure == transfer_failure::checksum_mismatch);
    CHECK(has(err.what(), "group 1 of version 1 failed its checksum"));
    bad.pull(puller, 1, mode); // the fault fired once
    test::check_identical(*bad.weights, *test::loaded(*v1, 2));
  }
  CHECK(producer.stats().corruptions == 2);
  CHECK(producer.stats().groups_lent_in_place > 0);
}

TEST_CASE("ucx: lending in place takes none of the packed budget's buffers: a consumer by tag still finds them") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c, 2, /*shared*/ true);
  src->produce_next();
  auto po = loopback_producer();
  po.packed_budget_bytes = 7 * largest_of(shard_group_bytes(c, 1));
  ucx_producer producer(src, po);
  REQUIRE(producer.stats().buffers_prewarmed >= 6);
  ucx_puller lent(loopback_puller(producer));
  auto qo = loopback_puller(producer);
  qo.shared_memory = false; // as from another host: packed, by tag
  ucx_puller by_tag(qo);
  test_engine near("rollout-0", c, 2, lent), far("rollout-1", c, 2, by_tag);
  for (int round = 0; round < 3; ++round) {
    auto v = round == 0 ? src->latest() : src->produce_next();
    near.pull(lent, v->version(), transfer_mode::sharded); // cold and carried gets miss the cache
    far.pull(by_tag, v->version(), transfer_mode::sharded);
    test::check_identical(*near.weights, *test::loaded(*v, 2));
    test::check_identical(*far.weights, *test::loaded(*v, 2));
  }
  const auto st = producer.stats();
  CHECK(st.groups_lent_in_place == 18); // 2 workers x 3 groups x 3 versions
  CHECK(st.buffers_made == 0);          // the packed consumer's groups went into the buffers made at start
  CHECK(st.peak_packed_bytes <= po.packed_budget_bytes);
}

TEST_CASE("ucx: the producer makes and writes its budget's buffers at start, and the first version packs into them") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  src->produce_next();
  // Room for 6 or more buffers of a whole group: every pack of tp 1 or 2
  // (2 workers x 3 groups) fits one made at start.
  const std::uint64_t budget = 7 * largest_of(shard_group_bytes(c, 1));
  struct row {
    const char* name;
    bool prewarm;
    std::size_t split;
    int tp;
  };
  const row rows[] = {
    {"prewarmed for tp 2, a tp-2 engine", true, 2, 2},
    {"prewarmed for tp 1, a tp-2 engine", true, 1, 2},
    {"prewarmed for tp 1, a tp-1 engine", true, 1, 1},
    {"no prewarming: the first version packs into fresh buffers", false, 2, 2},
  };
  for (const auto& r : rows) {
    CAPTURE(r.name);
    auto po = loopback_producer();
    po.packed_budget_bytes = budget;
    po.prewarm_buffers = r.prewarm;
    po.prewarm_split = r.split;
    ucx_producer producer(src, po);
    const auto before = producer.stats();
    if (r.prewarm) // 7, or 6 where broadcast's aligned layout makes the largest group a little larger
      CHECK(before.buffers_prewarmed >= 6);
    else
      CHECK(before.buffers_prewarmed == 0);
    CHECK(before.buffers_made == 0);
    ucx_puller puller(loopback_puller(producer));
    test_engine e("rollout-0", c, r.tp, puller);
    e.pull(puller, src->latest()->version(), transfer_mode::sharded);
    test::check_identical(*e.weights, *test::loaded(*src->latest(), r.tp));
    const auto after = producer.stats();
    CHECK((after.buffers_made == 0) == r.prewarm);
    CHECK(after.peak_packed_bytes <= budget);
  }
}

TEST_CASE("ucx: buffers made at start stay within the budget and at 64, however large the budget") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  src->produce_next();
  const std::uint64_t largest = largest_of(shard_group_bytes(c, 1));
  for (std::uint64_t budget : {largest + 4096, 3 * largest + 4095, 1000 * largest}) {
    CAPTURE(budget);
    auto po = loopback_producer();
    po.packed_budget_bytes = budget;
    ucx_producer producer(src, po);
    const auto st = producer.stats();
    CHECK(st.buffers_prewarmed >= 1);
    CHECK(st.buffers_prewarmed <= 64);
    // Nothing packed yet: the peak is the buffers' capacity, within the budget.
    CHECK(st.peak_packed_bytes > 0);
    CHECK(st.peak_packed_bytes <= budget);
  }
}

TEST_CASE("ucx: workers connected ahead at registration pull over those connections, buffers already mapped") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  src->produce_next();
  auto po = loopback_producer();
  po.packed_budget_bytes = 7 * largest_of(shard_group_bytes(c, 1)); // every pack of tp 2 in a buffer made at start
  ucx_producer producer(src, po);
  auto qo = loopback_puller(producer);
  qo.connect_ahead = true;
  ucx_puller puller(qo);
  test_engine e("rollout-0", c, 2, puller);
  REQUIRE(eventually([&] { return puller.stats().connected_ahead == 2; }));
  const auto before = puller.stats();
  CHECK(before.connections == 2);
  CHECK(before.mapped_ahead == 2 * producer.stats().buffers_prewarmed); // each connection maps them all
  e.pull(puller, src->latest()->version(), transfer_mode::sharded);
  test::check_identical(*e.weights, *test::loaded(*src->latest(), 2));
  const auto after = puller.stats();
  CHECK(after.connections == 2);               // the pull took the connections made ahead
  CHECK(after.groups_mapped == 6);             // 2 workers x 3 groups, lent in shared memory
  CHECK(after.mappings == before.mappings);    // in buffers mapped ahead: none mapped inside the pull
}

TEST_CASE("ucx: connect_ahead(engine) once registered maps the version lent in place before the first pull") {
  // rlsync's nodes: the workers register at engine start (no credentials
  // yet), the node calls connect_ahead once the coordinator took the engine.
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c, 2, /*shared*/ true);
  auto v = src->produce_next();
  REQUIRE(v->shared_buffer());
  ucx_producer producer(src, loopback_producer());
  ucx_puller puller(loopback_puller(producer)); // the option connect_ahead off
  test_engine e("rollout-0", c, 2, puller);
  test_engine other("rollout-1", c, 1, puller);
  e.in_place = true;
  CHECK(puller.stats().connect_attempts == 0); // registering connects nothing
  puller.connect_ahead("rollout-0");
  REQUIRE(eventually([&] { return puller.stats().connected_ahead == 2; }));
  const auto before = puller.stats();
  CHECK(before.connections == 2); // rollout-0's workers only
  CHECK(before.mapped_ahead >= 2); // the version's memory, by each connection
  puller.connect_ahead("rollout-0"); // both connected and idle: nothing more
  e.pull(puller, v->version(), transfer_mode::sharded);
  test::check_identical(*e.weights, *test::loaded(*v, 2));
  const auto after = puller.stats();
  CHECK(after.connected_ahead == 2);
  CHECK(after.connections == 2);            // the pull took the connections made ahead
  CHECK(after.mappings == before.mappings); // the version lent in place was mapped already
  CHECK(producer.stats().groups_lent_in_place == 6);
  puller.connect_ahead("no-such-engine"); // no worker registered: nothing
  CHECK(puller.stats().connect_attempts == after.connect_attempts);
}

TEST_CASE("ucx: a producer expecting the mode packs the newest version ahead for workers connected ahead") {
  // The fleet's first round: the workers connect (and register their
  // plans) as their engine registers; the producer checksums the version
  // lent in place for them then, not inside the first pull.
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  struct row {
    std::optional<transfer_mode> expected;
    bool shared; // the version in shareable memory (lent in place), else packed into shared buffers
  };
  const row rows[] = {{std::nullopt, true},
                      {transfer_mode::sharded, true},
                      {transfer_mode::broadcast, true},
                      {transfer_mode::sharded, false}};
  for (const auto& [expected, shared] : rows) {
    CAPTURE(expected.has_value());
    CAPTURE(shared);
    auto src = test::small_source(c, 2, shared);
    auto v = src->produce_next();
    auto po = loopback_producer();
    po.expected_mode = expected;
    ucx_producer producer(src, po);
    ucx_puller puller(loopback_puller(producer));
    test_engine e("rollout-0", c, 2, puller);
    e.in_place = true;
    puller.connect_ahead("rollout-0");
    REQUIRE(eventually([&] { return puller.stats().connected_ahead == 2; }));
    // Sharded: each worker's plan, 3 groups each; broadcast: the whole
    // groups once, for both connections.
    const std::uint64_t ahead = !expected ? 0 : *expected == transfer_mode::sharded ? 6 : 3;
    CHECK(eventually([&] { return producer.stats().packs_ahead == ahead; }));
    const auto mode = expected.value_or(transfer_mode::sharded);
    e.pull(puller, v->version(), mode);
    test::check_identical(*e.weights, *test::loaded(*v, 2));
    CHECK(eventually([&] { return producer.stats().groups_sent == 6; }));
    CHECK(producer.stats().groups_lent_in_place == (shared ? 6u : 0u));
    CHECK(producer.stats().groups_lent == 6);
    // What was packed ahead served the pull: nothing packed again.
    const std::uint64_t packs = !expected ? (mode == transfer_mode::sharded ? 6 : 3) : ahead;
    CHECK(producer.stats().packs == packs);
  }
}

/// A one-layer model's one version, served over tcp only (a vanished
/// peer's socket shows as reset; shared memory has no such signal), the
/// producer's log kept, and a puller over tcp.
struct tcp_fixture {
  const model_config c = test::small_model(1);
  std::shared_ptr<synthetic_source> src = test::small_source(c);
  snapshot_ptr v1 = src->produce_next();
  log_lines log;
  ucx_producer producer{src, loopback_producer({ucx_transport::tcp}, log.sink())};
  ucx_puller puller{loopback_puller(producer, {ucx_transport::tcp})};
};

/// A two-layer model's one version, its loopback producer, and puller
/// options whose first credentials request runs `first_ask` first (which
/// may wait, or throw instead of asking the producer); `asked` counts them.
struct first_ask_fixture {
  const model_config c = test::small_model(2);
  std::shared_ptr<synthetic_source> src = test::small_source(c);
  snapshot_ptr version = src->produce_next();
  ucx_producer producer{src, loopback_producer()};
  std::atomic<int> asked{0};

  ucx_puller_options options(std::function<void()> first_ask) {
    auto qo = loopback_puller(producer);
    qo.credentials = [this, real = qo.credentials, first_ask](const std::string& engine, int worker,
                                                               clock::time_point deadline) {
      if (asked++ == 0)
        first_ask();
      return real(engine, worker, deadline);
    };
    return qo;
  }
};

TEST_CASE("ucx: connect_ahead leaves a worker whose pull is under way alone: one connection") {
  // A node that rejoins calls connect_ahead for every engine, perhaps while
  // a pull holds its worker's connection out of the idle ones.
  SKIP_WITHOUT_UCX();
  first_ask_fixture f;
  std::promise<void> in_pull, go;
  auto go_now = go.get_future().share();
  ucx_puller puller(f.options([&] { // the pull's own connection: held until connect_ahead ran
    in_pull.set_value();
    go_now.wait_for(10s);
  }));
  test_engine e("rollout-0", f.c, 1, puller);
  auto pulled = std::async(std::launch::async, [&] { e.pull(puller, f.version->version(), transfer_mode::sharded); });
  REQUIRE(in_pull.get_future().wait_for(10s) == std::future_status::ready);
  puller.connect_ahead("rollout-0");
  go.set_value();
  pulled.get();
  test::check_identical(*e.weights, *test::loaded(*f.version, 1));
  std::this_thread::sleep_for(100ms); // a connection ahead, had one started, would have asked by now
  CHECK(f.asked.load() == 1);
  CHECK(puller.stats().connections == 1);
  CHECK(puller.stats().connected_ahead == 0);
}

TEST_CASE("ucx: a pull that comes while its worker is connecting ahead waits for that connection") {
  SKIP_WITHOUT_UCX();
  first_ask_fixture f;
  auto qo = f.options([] { std::this_thread::sleep_for(300ms); }); // the connection ahead is slow to get its ticket
  qo.connect_ahead = true;
  ucx_puller puller(qo);
  test_engine e("rollout-0", f.c, 1, puller);
  REQUIRE(eventually([&] { return f.asked.load() == 1; }));
  e.pull(puller, f.version->version(), transfer_mode::sharded); // while the ticket is on its way
  test::check_identical(*e.weights, *test::loaded(*f.version, 1));
  CHECK(f.asked.load() == 1); // the pull asked for no ticket of its own
  CHECK(puller.stats().connections == 1);
  CHECK(puller.stats().connected_ahead == 1);
}

TEST_CASE("ucx: a worker that cannot connect ahead still pulls, connecting then") {
  SKIP_WITHOUT_UCX();
  first_ask_fixture f;
  auto qo = f.options([] { throw std::runtime_error("no trainer yet"); }); // the first ask (connecting ahead) fails
  qo.connect_ahead = true;
  log_lines log;
  qo.log = log.sink();
  ucx_puller puller(qo);
  test_engine e("rollout-0", f.c, 1, puller);
  REQUIRE(eventually([&] { return log.contains("not connected ahead (its first pull connects)"); }));
  CHECK(log.contains("no credentials for the producer: no trainer yet"));
  CHECK(puller.stats().connected_ahead == 0);
  e.pull(puller, f.version->version(), transfer_mode::sharded);
  test::check_identical(*e.weights, *test::loaded(*f.version, 1));
  CHECK(puller.stats().connections == 1);
}

TEST_CASE("ucx: a plan's number is SHA-256's, which no consumer can aim at another's plan") {
  // Packed groups are shared between connections whose plans have the same
  // number: it must be a cryptographic digest (the FIPS 180-2 "abc" vector).
  const std::string abc = "abc";
  CHECK(wire::plan_digest(reinterpret_cast<const std::uint8_t*>(abc.data()), abc.size()) == 0xba7816bf8f01cfeaULL);
  CHECK(wire::plan_digest(nullptr, 0) == 0xe3b0c44298fc1c14ULL);
}

TEST_CASE("ucx: a manifest's group sizes are checked before they size any buffer") {
  using groups = std::vector<wire::group_info>;
  auto g = [](std::uint32_t group, std::uint64_t bytes) { return wire::group_info{group, bytes, {}, {}}; };
  struct row {
    groups in;
    std::optional<std::uint64_t> plan_bytes; // sharded: what the worker keeps
    std::string problem;                     // "" : accepted
  };
  const std::uint64_t max = 1000;
  const std::vector<row> rows = {
    {{g(0, 400), g(1, 600)}, 1000, ""},
    {{g(0, 400), g(1, 600)}, std::nullopt, ""},
    {{g(0, 400), g(1, 600)}, 999, "its groups announce 1000 bytes by group 1, more than the 999 this worker's plan keeps"},
    {{g(0, 1001)}, std::nullopt, "group 0 of 1001 bytes exceeds max_group_bytes (1000)"},
    {{g(0, 1001)}, 5000, "group 0 of 1001 bytes exceeds max_group_bytes (1000)"},
    {{g(1, 1), g(1, 1)}, std::nullopt, "groups out of order"},
    {{g(2, 1), g(1, 1)}, std::nullopt, "groups out of order"},
    {{}, 0, ""},
  };
  for (const auto& r : rows) {
    CAPTURE(r.problem);
    CHECK(ucx_detail::manifest_size_problem(r.in, max, r.plan_bytes) == r.problem);
  }
  // Sums that would wrap are refused, not wrapped.
  const auto huge = std::numeric_limits<std::uint64_t>::max() / 2 + 1;
  CHECK(ucx_detail::manifest_size_problem({g(0, huge), g(1, huge)}, huge, std::nullopt)
        == "its groups announce more than 2^64 bytes by group 1");
}

TEST_CASE("ucx: replies a producer sends unasked are bounded in bytes as well as in count") {
  // Manifests of ~1.3 MiB each (one group of 16384 named tensors), all for
  // requests the puller made (sequence numbers up to its last), never taken.
  wire::manifest_msg big;
  big.groups.push_back(wire::group_info{0, 0, {}, {}});
  for (int i = 0; i < 16384; ++i)
    big.groups[0].tensors.push_back(tensor_spec{"model.layers.0.mlp.experts." + std::to_string(i)
                                                  + ".gate_proj.weight.padding.padding.padding",
                                                dtype::bf16, {1}});
  ucx_detail::channel ch;
  ch.seq = 1000;
  std::size_t sent = 0;
  for (std::uint64_t s = 1; s <= 100 && !ch.failed; ++s) {
    big.seq = s;
    ch.inbox.ready.push_back({wire::encode(big), nullptr, 0});
    sent += ch.inbox.ready.back().bytes.size();
    ch.pump();
  }
  INFO(ch.failure);
  CHECK(ch.failed);
  CHECK(ch.failure.find("bytes of replies waiting to be taken") != std::string::npos);
  CHECK(ch.held_reply_bytes <= ucx_detail::max_waiting_reply_bytes);
  CHECK(sent > ucx_detail::max_waiting_reply_bytes);
  // Taking a reply gives its bytes back; the same request answered twice counts once.
  ucx_detail::channel fresh;
  fresh.seq = 10;
  big.seq = 3;
  for (int twice = 0; twice < 2; ++twice)
    fresh.inbox.ready.push_back({wire::encode(big), nullptr, 0});
  fresh.pump();
  REQUIRE(!fresh.failed);
  const auto one = wire::encode(big).size();
  CHECK(fresh.held_reply_bytes == one);
  fresh.erase_reply(fresh.replies.find(3));
  CHECK(fresh.held_reply_bytes == 0);
  CHECK(fresh.reply_bytes.empty());
}

TEST_CASE("ucx: shared memory: a region that is not the producer's buffer is not mapped") {
  SKIP_WITHOUT_UCX();
  host_buffer b(100, shareable);
  REQUIRE(b.shared());
  std::string why;
  wire::shared_region r{static_cast<std::uint32_t>(::getpid()), b.fd(), b.mapped_bytes(), b.id()};
  {
    ucx_detail::shared_mapping m(r, why);
    REQUIRE(m);
    CHECK(m.data_bytes() >= 100);
    b.data()[7] = 42; // one memory: the mapping sees the writer's bytes
    CHECK(m.data()[7] == 42);
  }
  auto other = r;
  other.id += 1; // another buffer's id: the header says otherwise
  CHECK_FALSE(ucx_detail::shared_mapping(other, why));
  CHECK(why.find("is not the shared buffer named") != std::string::npos);
  auto gone = r;
  gone.fd = 100000; // no such descriptor
  CHECK_FALSE(ucx_detail::shared_mapping(gone, why));
  CHECK(why.find("cannot open /proc/") != std::string::npos);
  auto larger = r;
  larger.bytes *= 4; // more than the memfd holds
  CHECK_FALSE(ucx_detail::shared_mapping(larger, why));
  CHECK(why.find("is smaller than") != std::string::npos);

  // A FIFO (opening it must not block) and an unsealed memfd are refused.
  const std::string fifo = "/tmp/rlsync-test-fifo-" + std::to_string(::getpid());
  ::unlink(fifo.c_str());
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const int ffd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(ffd >= 0);
  CHECK_FALSE(ucx_detail::shared_mapping({r.pid, ffd, r.bytes, r.id}, why));
  CHECK(why.find("is not a memfd sealed against shrinking") != std::string::npos);
  ::close(ffd);
  ::unlink(fifo.c_str());
  const int mfd = ::memfd_create("unsealed", MFD_CLOEXEC);
  REQUIRE(mfd >= 0);
  REQUIRE(::ftruncate(mfd, static_cast<off_t>(r.bytes)) == 0);
  CHECK_FALSE(ucx_detail::shared_mapping({r.pid, mfd, r.bytes, r.id}, why));
  CHECK(why.find("is not a memfd sealed against shrinking") != std::string::npos);
  ::close(mfd);

  // A sealed memfd that is mostly holes, with the buffer's own header: mapping
  // it would populate 64 MiB at this process's cost. Refused unmapped.
  const int sparse = ::memfd_create("sparse", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(sparse >= 0);
  const std::size_t sparse_bytes = std::size_t{64} << 20;
  REQUIRE(::ftruncate(sparse, static_cast<off_t>(sparse_bytes)) == 0);
  std::vector<std::uint8_t> header(shared_header::bytes);
  REQUIRE(::pread(b.fd(), header.data(), header.size(), 0) == static_cast<ssize_t>(header.size()));
  REQUIRE(::pwrite(sparse, header.data(), header.size(), 0) == static_cast<ssize_t>(header.size()));
  REQUIRE(::fcntl(sparse, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
  CHECK_FALSE(ucx_detail::shared_mapping({r.pid, sparse, sparse_bytes, r.id}, why));
  CHECK(why.find("is not allocated in full") != std::string::npos);
  // Named as its written first page only, it is refused all the same: the
  // file must be allocated in full.
  CHECK_FALSE(ucx_detail::shared_mapping({r.pid, sparse, 4096, r.id}, why));
  ::close(sparse);
  // Enough pages in all, but beyond the region, and a hole inside it.
  const int holed = ::memfd_create("holed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(holed >= 0);
  REQUIRE(::ftruncate(holed, 32 * 4096) == 0);
  REQUIRE(::pwrite(holed, header.data(), header.size(), 0) == static_cast<ssize_t>(header.size()));
  const std::vector<std::uint8_t> tail(16 * 4096, 1);
  REQUIRE(::pwrite(holed, tail.data(), tail.size(), 16 * 4096) == static_cast<ssize_t>(tail.size()));
  REQUIRE(::fcntl(holed, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
  CHECK_FALSE(ucx_detail::shared_mapping({r.pid, holed, 16 * 4096, r.id}, why));
  CHECK(why.find("is not allocated in full") != std::string::npos);
  ::close(holed);
}

namespace {
// The 2 MiB hugetlb pool (vm.nr_hugepages): pages free and not reserved, and
// whether the kernel may add surplus ones (overcommit) beyond them.
long hugetlb_count(const char* file) {
  std::ifstream f(std::string("/sys/kernel/mm/hugepages/hugepages-2048kB/") + file);
  long n = 0;
  return f >> n ? n : 0;
}
long free_huge_pages() { return hugetlb_count("free_hugepages") - hugetlb_count("resv_hugepages"); }
} // namespace

TEST_CASE("host buffers: a shared buffer in huge pages, or a refusal when the pool has none") {
  // Whole huge pages, header page included.
  CHECK(host_buffer::capacity_for(1, true, shared_pages::huge) == huge_page_bytes - shared_header::bytes);
  CHECK(host_buffer::capacity_for(huge_page_bytes - shared_header::bytes, true, shared_pages::huge)
        == huge_page_bytes - shared_header::bytes);
  CHECK(host_buffer::capacity_for(huge_page_bytes, true, shared_pages::huge) == 2 * huge_page_bytes - shared_header::bytes);
  const std::size_t size = 3 * huge_page_bytes; // four huge pages with the header
  if (free_huge_pages() < 4) {
    if (hugetlb_count("nr_overcommit_hugepages") > 0) {
      MESSAGE("the hugetlb pool may overcommit: whether a buffer is refused depends on the kernel; not checked");
      return;
    }
    MESSAGE("the hugetlb pool has fewer than 4 free pages (vm.nr_hugepages): only the refusal is checked");
    CHECK_THROWS_AS(host_buffer(size, shareable, shared_pages::huge), std::runtime_error);
    return;
  }
  std::optional<host_buffer> made;
  try {
    made.emplace(size, shareable, shared_pages::huge);
  } catch (const std::runtime_error& e) {
    // Other tests' producers (ctest -j) may have taken the pool meanwhile.
    INFO(e.what());
    REQUIRE(free_huge_pages() < 4);
    return;
  }
  host_buffer& b = *made;
  REQUIRE(b.shared());
  CHECK(b.huge());
  CHECK(b.mapped_bytes() == 4 * huge_page_bytes);
  CHECK(b.capacity() == 4 * huge_page_bytes - shared_header::bytes);
  SKIP_WITHOUT_UCX();
  // A consumer maps it in whole huge pages and sees the writer's bytes.
  std::string why;
  wire::shared_region r{static_cast<std::uint32_t>(::getpid()), b.fd(), b.mapped_bytes(), b.id()};
  ucx_detail::shared_mapping m(r, why);
  REQUIRE_MESSAGE(m, why);
  CHECK(m.length() == 4 * huge_page_bytes);
  b.data()[size - 1] = 9;
  CHECK(m.data()[size - 1] == 9);
  // A region named shorter than the memfd maps whole huge pages, and unmaps
  // them all: afterwards the address range holds no mapping.
  auto shorter = r;
  shorter.bytes = shared_header::bytes + 100;
  ucx_detail::shared_mapping part(shorter, why);
  REQUIRE_MESSAGE(part, why);
  CHECK(part.data_bytes() == 100);
  CHECK(part.length() == huge_page_bytes);
  auto* base = const_cast<std::uint8_t*>(part.data() - shared_header::bytes);
  part = ucx_detail::shared_mapping{};
  unsigned char resident = 0;
  CHECK(::mincore(base, 4096, &resident) == -1);
  CHECK(errno == ENOMEM);
}

TEST_CASE("ucx: the producer's buffers take huge pages as asked and as the pool allows, and pulls read them") {
  SKIP_WITHOUT_UCX();
  model_config c = test::small_model(2);
  c.hidden_size = 512; // groups of several MiB: only buffers of 2 MiB and more take huge pages
  c.intermediate_size = 1024;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  auto src = test::small_source(c);
  src->produce_next();
  const std::uint64_t largest = largest_of(shard_group_bytes(c, 1));
  REQUIRE(largest >= huge_page_bytes);
  for (bool huge : {false, true}) {
    CAPTURE(huge);
    auto po = loopback_producer();
    po.huge_pages = huge;
    po.packed_budget_bytes = 4 * largest;
    const long free_before = free_huge_pages();
    ucx_producer producer(src, po);
    const auto made = producer.stats();
    REQUIRE(made.buffers_prewarmed >= 1);
    if (!huge || free_before <= 0)
      CHECK(made.huge_buffers == 0); // not asked, or no pool: 4 KiB pages, made all the same
    else if (free_before >= 64)
      CHECK(made.huge_buffers >= 1);
    else
      MESSAGE("a hugetlb pool of " << free_before << " free pages: whether it sufficed is not checked");
    ucx_puller puller(loopback_puller(producer));
    test_engine e("rollout-0", c, 1, puller);
    e.pull(puller, src->latest()->version(), transfer_mode::sharded);
    test::check_identical(*e.weights, *test::loaded(*src->latest(), 1));
    CHECK(puller.stats().groups_mapped == src->latest()->groups().size()); // every group lent in shared memory
  }
}

TEST_CASE("host buffers: a moved-from buffer is empty and names no shared memory") {
  host_buffer a(100, shareable);
  const auto id = a.id();
  const int fd = a.fd();
  host_buffer b(std::move(a));
  CHECK(b.shared());
  CHECK(b.id() == id);
  CHECK(b.fd() == fd);
  CHECK_FALSE(a.shared());
  CHECK(a.data() == nullptr);
  CHECK(a.capacity() == 0);
  CHECK(a.fd() == -1);
  CHECK(a.id() == 0);
  CHECK(a.mapped_bytes() == 0);
  host_buffer c(64);
  c = std::move(b); // the plain buffer c held is freed, the shared one moves in
  CHECK(c.shared());
  CHECK(c.id() == id);
  CHECK(b.capacity() == 0);
  CHECK(b.data() == nullptr);
  CHECK((::fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK) != 0); // still open, sealed
}

TEST_CASE("ucx wire: a shared region is named whole or not at all") {
  wire::group_msg g{3, wire::status::ok, "", 1, 100, 7};
  g.shared = {1234, 9, 8192, 77};
  auto bytes = wire::encode(g);
  auto m = wire::decode(bytes.data(), bytes.size());
  REQUIRE(std::get_if<wire::group_msg>(&m));
  CHECK(std::get<wire::group_msg>(m).shared.id == 77);
  CHECK(std::get<wire::group_msg>(m).shared.fd == 9);
  for (auto bad : {wire::shared_region{0, 9, 8192, 77}, wire::shared_region{1234, -1, 8192, 77},
                   wire::shared_region{1234, 9, 100, 77}, wire::shared_region{1234, 9, wire::max_shared_bytes + 1, 77}}) {
    g.shared = bad;
    bytes = wire::encode(g);
    CHECK_THROWS_WITH_AS(wire::decode(bytes.data(), bytes.size()), doctest::Contains("is no shared buffer"),
                         wire::wire_error);
  }
  // An ack names the producer's buffers whole, each checked as a group's region.
  wire::ack_msg a{4, wire::status::ok, 0, ""};
  a.probe = {1234, 9, 8192, 77};
  a.buffers = {{1234, 10, 8192, 78}, {1234, 11, 16384, 79}};
  bytes = wire::encode(a);
  m = wire::decode(bytes.data(), bytes.size());
  REQUIRE(std::get_if<wire::ack_msg>(&m));
  REQUIRE(std::get<wire::ack_msg>(m).buffers.size() == 2);
  CHECK(std::get<wire::ack_msg>(m).buffers[1].id == 79);
  a.buffers.push_back({1234, 12, 100, 80});
  bytes = wire::encode(a);
  CHECK_THROWS_WITH_AS(wire::decode(bytes.data(), bytes.size()), doctest::Contains("buffer: pid 1234, fd 12, 100 bytes is no shared buffer"),
                       wire::wire_error);
  bytes = wire::encode(wire::ack_msg{4, wire::status::ok, 0, ""});
  bytes.resize(bytes.size() - 4); // the buffer count cut off
  bytes.insert(bytes.end(), {0xff, 0xff, 0xff, 0xff}); // 2^32 - 1 buffers announced, none there
  CHECK_THROWS_AS(wire::decode(bytes.data(), bytes.size()), wire::wire_error);
  wire::done_msg d{5, 2, 1};
  bytes = wire::encode(d);
  m = wire::decode(bytes.data(), bytes.size());
  REQUIRE(std::get_if<wire::done_msg>(&m));
  CHECK(std::get<wire::done_msg>(m).group == 1);
  wire::hello_msg h{1, "rollout-0", 0, {1, 2}, std::string(wire::max_host_bytes + 1, 'x')};
  bytes = wire::encode(h); // encoding cuts the host to the limit
  m = wire::decode(bytes.data(), bytes.size());
  CHECK(std::get<wire::hello_msg>(m).host.size() == wire::max_host_bytes);
  h.address = {7, 8, 9};
  bytes = wire::encode(h);
  m = wire::decode(bytes.data(), bytes.size());
  CHECK(std::get<wire::hello_msg>(m).address == h.address);
  h.address.assign(wire::max_worker_address_bytes + 1, 0); // a peer's lie: refused, not trusted
  bytes = wire::encode(h);
  CHECK_THROWS_WITH_AS(wire::decode(bytes.data(), bytes.size()), doctest::Contains("address"), wire::wire_error);
}

TEST_CASE("ucx: broadcast sends every worker the whole model, which it slices with its loader") {
  SKIP_WITHOUT_UCX();
  for (int tp : {1, 2}) {
    INFO("tp " << tp);
    const model_config c = test::small_model(3, /*tied*/ tp == 2);
    auto src = test::small_source(c);
    auto v1 = src->produce_next();
    ucx_producer producer(src, loopback_producer());
    ucx_puller puller(loopback_puller(producer));
    for (bool in_place : {false, true}) {
      CAPTURE(in_place);
      test_engine e("rollout-" + std::to_string(in_place), c, tp, puller);
      e.in_place = in_place; // the whole group checksummed as the kept pieces are stored
      auto report = e.pull(puller, 1, transfer_mode::broadcast);
      test::check_identical(*e.weights, *test::loaded(*v1, tp));
      CHECK(report.bytes == v1->total_bytes() * static_cast<std::uint64_t>(tp));
      CHECK(report.groups == 3);
      CHECK((e.full_groups == 0) == in_place);
    }
  }
}

TEST_CASE("ucx: over tcp only, the pull is identical and the endpoint reports tcp") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(2);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  ucx_producer producer(src, loopback_producer({ucx_transport::tcp}));
  ucx_puller puller(loopback_puller(producer, {ucx_transport::tcp}));
  test_engine e("rollout-0", c, 2, puller);
  e.pull(puller, 1);
  test::check_identical(*e.weights, *test::loaded(*v1, 2));
  CHECK(has(puller.last_transports(), "[tcp]"));
}

TEST_CASE("ucx: replicas with the same plan share the producer's packing and memory stays bounded") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  const auto sizes = shard_group_bytes(c, 2);
  auto opts = loopback_producer();
  opts.packed_budget_bytes = sum_of(sizes); // 2 workers x 3 groups fit: the second replica packs nothing
  ucx_producer producer(src, opts);
  ucx_puller puller(loopback_puller(producer));
  test_engine a("rollout-0", c, 2, puller);
  test_engine b("rollout-1", c, 2, puller);
  a.pull(puller, 1);
  b.pull(puller, 1);
  auto ref = test::loaded(*v1, 2);
  test::check_identical(*a.weights, *ref);
  test::check_identical(*b.weights, *ref);
  CHECK(eventually([&] { return producer.stats().groups_sent == 2 * 2 * 3; }));
  auto s = producer.stats();
  CHECK(s.packs == 2 * 3);
  CHECK(s.budget_bytes == sum_of(sizes));
  CHECK(s.peak_packed_bytes <= s.budget_bytes);

  // A small budget still serves concurrent replicas, never holding more.
  auto small = loopback_producer();
  small.packed_budget_bytes = 2 * largest_of(sizes);
  ucx_producer tight(src, small);
  ucx_puller p2(loopback_puller(tight));
  test_engine x("rollout-0", c, 2, p2);
  test_engine y("rollout-1", c, 2, p2);
  auto fx = std::async(std::launch::async, [&] { return x.pull(p2, 1); });
  auto fy = std::async(std::launch::async, [&] { return y.pull(p2, 1); });
  fx.get();
  fy.get();
  test::check_identical(*x.weights, *ref);
  test::check_identical(*y.weights, *ref);
  CHECK(tight.stats().peak_packed_bytes <= 2 * largest_of(sizes));
  CHECK(tight.stats().peak_packed <= 2);
}

// Both replicas pull every version at once, as a sync round does.
static void pull_together(test_engine& a, test_engine& b, ucx_puller& p, std::uint64_t v) {
  auto fa = std::async(std::launch::async, [&] { return a.pull(p, v); });
  auto fb = std::async(std::launch::async, [&] { return b.pull(p, v); });
  fa.get();
  fb.get();
}

TEST_CASE("ucx: in the steady state each (plan, group) is packed once per version for 2 replicas x 2 workers") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  src->produce_next();
  const auto sizes = shard_group_bytes(c, 2);
  for (std::uint64_t groups : {std::uint64_t(2), std::uint64_t(1)}) {
    // Two groups: replicas of a worker take groups together; one: every
    // get waits for the one packed group to be taken by both replicas.
    CAPTURE(groups);
    auto opts = loopback_producer();
    opts.packed_budget_bytes = groups * largest_of(sizes);
    opts.soft_pin_grace = 30s; // replicas open their sessions within it, however loaded the machine
    ucx_producer producer(src, opts);
    ucx_puller puller(loopback_puller(producer));
    test_engine a("rollout-0", c, 2, puller);
    test_engine b("rollout-1", c, 2, puller);
    pull_together(a, b, puller, src->latest()->version()); // the replicas become known
    for (int round = 0; round < 2; ++round) {
      // Counted from before the publish: it wakes the producer, which may
      // pack ahead before this thread reads its stats.
      const auto before = producer.stats();
      auto v = src->produce_next();
      pull_together(a, b, puller, v->version());
      auto ref = test::loaded(*v, 2);
      test::check_identical(*a.weights, *ref);
      test::check_identical(*b.weights, *ref);
      const auto after = producer.stats();
      CHECK(after.packs - before.packs == 2 * 3); // groups x distinct plans
      CHECK(after.evictions == before.evictions);
      CHECK(after.peak_packed_bytes <= opts.packed_budget_bytes);
      CHECK(after.peak_packed <= groups);
    }
  }
}

TEST_CASE("ucx: a published version is packed ahead for the plans known, before any consumer asks") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  src->produce_next();
  ucx_producer producer(src, loopback_producer()); // the default budget holds the whole (small) version
  ucx_puller puller(loopback_puller(producer));
  test_engine a("rollout-0", c, 2, puller);
  a.pull(puller, 1);
  const auto before = producer.stats();
  auto v2 = src->produce_next();
  CHECK(eventually([&] { return producer.stats().packs == before.packs + 2 * 3; }));
  auto s = producer.stats();
  CHECK(s.packs_ahead - before.packs_ahead == 2 * 3);
  a.pull(puller, 2);
  test::check_identical(*a.weights, *test::loaded(*v2, 2));
  CHECK(producer.stats().packs == s.packs); // every group was there already
}

TEST_CASE("ucx: a replica that vanishes mid-version pins the budget only until its deadline") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  src->produce_next();
  const auto sizes = shard_group_bytes(c, 1);
  auto opts = loopback_producer();
  opts.packed_budget_bytes = largest_of(sizes); // one group at a time
  opts.soft_pin_grace = 30s;
  ucx_producer producer(src, opts);
  ucx_puller puller(loopback_puller(producer));
  auto one_at_a_time = loopback_puller(producer);
  one_at_a_time.groups_in_flight = 1;
  ucx_puller stalling(one_at_a_time);
  test_engine a("rollout-0", c, 1, puller);
  test_engine b("rollout-1", c, 1, stalling);
  a.pull(puller, 1);
  b.pull(stalling, 1); // with one group of budget, b needs group 0 again while 2 waits for it: dropped
  const auto evicted_before = producer.stats().evictions;
  auto v2 = src->produce_next();

  // b takes group 0, then hangs in its sink past its deadline, its session
  // open: the group packed next is pinned for it, until that deadline.
  std::promise<void> release;
  auto released = release.get_future().share();
  std::promise<void> hung;
  auto stalled = std::async(std::launch::async, [&] {
    auto sink = b.sink();
    auto on_group = sink.on_group;
    bool first = true;
    sink.on_group = [&](int w, std::uint32_t g, const std::uint8_t* bytes, std::size_t size) {
      on_group(w, g, bytes, size);
      if (std::exchange(first, false)) {
        hung.set_value();
        released.wait();
      }
    };
    try {
      transfer::pull_engine(stalling, b.name, 1, 2, transfer_mode::sharded, sink, test::in(1500ms));
    } catch (const transfer_error&) {
    }
  });
  hung.get_future().wait();
  a.pull(puller, 2, transfer_mode::sharded, 20s);
  test::check_identical(*a.weights, *test::loaded(*v2, 1));
  auto s = producer.stats();
  CHECK(s.evictions == evicted_before); // a got every group without dropping b's: b's pin ended at its deadline
  CHECK(s.peak_packed_bytes <= largest_of(sizes));
  release.set_value();
  stalled.get();
}

TEST_CASE("ucx: a replica that does not pull this version (a later wave) holds up the others only for the grace") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  src->produce_next();
  const auto sizes = shard_group_bytes(c, 1);
  auto opts = loopback_producer();
  opts.packed_budget_bytes = largest_of(sizes);
  opts.soft_pin_grace = 100ms;
  ucx_producer producer(src, opts);
  ucx_puller puller(loopback_puller(producer));
  test_engine a("rollout-0", c, 1, puller);
  test_engine b("rollout-1", c, 1, puller);
  a.pull(puller, 1);
  b.pull(puller, 1); // both known now
  auto v2 = src->produce_next();
  const auto before = producer.stats();
  // Only a pulls: the group packed ahead for both waits for b until the
  // grace has passed, then is dropped (counted) to make room for a's next.
  a.pull(puller, 2, transfer_mode::sharded, 20s);
  test::check_identical(*a.weights, *test::loaded(*v2, 1));
  CHECK(producer.stats().evictions > before.evictions);
  b.pull(puller, 2); // b's wave: served too, repacking what it missed
  test::check_identical(*b.weights, *test::loaded(*v2, 1));
}

TEST_CASE("ucx: a budget below a group is refused when a plan or a broadcast session needs it") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  src->produce_next();
  const auto sizes = shard_group_bytes(c, 2);
  auto opts = loopback_producer();
  opts.packed_budget_bytes = largest_of(sizes) - 1;
  ucx_producer producer(src, opts);
  ucx_puller puller(loopback_puller(producer));
  test_engine a("rollout-0", c, 2, puller);
  auto err = expect_failure([&] { a.pull(puller, 1); });
  CHECK(err.failure == transfer_failure::producer_failed);
  CHECK(has(err.what(), "more than the producer's packed budget of " + std::to_string(largest_of(sizes) - 1)));
  auto err2 = expect_failure([&] { a.pull(puller, 1, transfer_mode::broadcast); });
  CHECK(err2.failure == transfer_failure::producer_failed);
  CHECK(has(err2.what(), "bytes in broadcast, more than the producer's packed budget"));
}

TEST_CASE("ucx: a corrupted group fails that worker's pull with a checksum error, the rest goes on") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  ucx_producer producer(src, loopback_producer());
  ucx_puller puller(loopback_puller(producer));
  test_engine bad("rollout-0", c, 2, puller);
  test_engine good("rollout-1", c, 2, puller);
  producer.corrupt({"rollout-0", 1, 0, /*group*/ 1});
  auto err = expect_failure([&] { bad.pull(puller, 1); });
  CHECK(err.failure == transfer_failure::checksum_mismatch);
  CHECK(has(err.what(), "engine 'rollout-0' worker 1: group 1 of version 1 failed its checksum"));
  CHECK(has(err.what(), name_of(producer)));
  for (auto [w, g] : bad.received)
    CHECK_FALSE((w == 1 && g >= 1));
  CHECK(producer.stats().corruptions == 1);

  good.pull(puller, 1);
  test::check_identical(*good.weights, *test::loaded(*v1, 2));
  bad.pull(puller, 1); // the fault fired once
  test::check_identical(*bad.weights, *test::loaded(*v1, 2));
}

TEST_CASE("ucx: a producer that never answers a group ends in a timeout at the deadline, not a hang") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(3);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  ucx_producer producer(src, loopback_producer());
  ucx_puller puller(loopback_puller(producer));
  test_engine e("rollout-0", c, 2, puller);
  // Connected and the plans registered first, so the failing pull needs
  // only an open and a few KiB before group 2 is all it waits for: its
  // deadline leaves those seconds, so where it fails does not depend on
  // how loaded the machine is.
  e.pull(puller, 1);
  e.received.clear();
  producer.withhold(2);
  const auto deadline = 2s;
  const auto t0 = clock::now();
  auto err = expect_failure([&] { e.pull(puller, 1, transfer_mode::sharded, deadline); });
  const auto took = clock::now() - t0;
  CHECK(err.failure == transfer_failure::timeout);
  CHECK(has(err.what(), "group 2 of version 1 did not arrive from producer " + name_of(producer)));
  CHECK(has(err.what(), "2 of 3 groups received"));
  CHECK(took >= deadline);
  CHECK(took < deadline + 5s);
  CHECK(producer.stats().withheld == 2); // each worker asked for group 2, once
  CHECK(e.received.size() == 2 * 2);     // and had groups 0 and 1
  for (auto [w, g] : e.received)
    CHECK(g < 2);

  producer.clear_faults();
  e.pull(puller, 1);
  test::check_identical(*e.weights, *test::loaded(*v1, 2));
}

TEST_CASE("ucx: connecting to a producer that is gone fails by the deadline, naming it") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(1);
  auto src = test::small_source(c);
  src->produce_next();
  ucx_credentials stale;
  std::string name;
  {
    ucx_producer producer(src, loopback_producer());
    stale = producer.issue("rollout-0", 0);
    name = name_of(producer);
  }
  ucx_puller puller(loopback_puller([&](const std::string&, int, clock::time_point) { return stale; }));
  test_engine e("rollout-0", c, 1, puller);
  const auto t0 = clock::now();
  auto err = expect_failure([&] { e.pull(puller, 1, transfer_mode::sharded, 400ms); });
  const auto took = clock::now() - t0;
  MESSAGE(std::string(err.what()));
  CHECK(err.failure == transfer_failure::timeout);
  CHECK(has(err.what(), "could not connect to producer " + name + " before the deadline"));
  CHECK(took >= 400ms); // a failed attempt is retried, not the end
  CHECK(took < 5s);
}

TEST_CASE("ucx: connections to a producer that stopped answering stay closing, at most max_parked_connections") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(1);
  auto src = test::small_source(c);
  src->produce_next();
  ucx_producer producer(src, loopback_producer({ucx_transport::tcp}));
  // A producer that stopped: a UCX worker nothing ever progresses. The
  // kernel accepts each connection; UCX's handshake and the hello wait, so
  // no attempt's close completes while it lives.
  auto frozen_context = ucx_detail::make_context({ucx_transport::tcp}, "lo", "frozen producer");
  auto frozen = ucx_detail::make_worker(frozen_context->handle, "frozen producer");
  const ucx_credentials to_frozen{ucx_detail::worker_address(frozen.handle, "frozen producer"),
                                  std::vector<std::uint8_t>(ucx_token_bytes, 7)};
  std::atomic<bool> frozen_current{true};
  auto options = loopback_puller(
      [&](const std::string& engine, int worker, clock::time_point) {
        return frozen_current ? to_frozen : producer.issue(engine, worker);
      },
      {ucx_transport::tcp});
  options.connect_attempt_timeout = 100ms;
  options.backoff_initial = 10ms;
  options.backoff_max = 20ms;
  options.max_parked_connections = 2;
  ucx_puller puller(options);
  test_engine e("rollout-0", c, 1, puller);
  auto err = expect_failure([&] { e.pull(puller, 1, transfer_mode::sharded, 2500ms); });
  MESSAGE(std::string(err.what()));
  CHECK(err.failure == transfer_failure::timeout);
  CHECK(has(err.what(), "2 earlier connections to this producer are still closing"));
  auto s = puller.stats();
  CHECK(s.parked == 2);
  CHECK(s.peak_parked == 2);
  CHECK(s.attempts_held_back > 0);
  CHECK(s.connect_attempts == 2 + s.attempts_held_back); // no worker made past the bound
  // The bound is per producer: the one that replaces it is connected to at
  // once, while the stopped one's connections still close.
  frozen_current = false;
  e.pull(puller, 1, transfer_mode::sharded, 5s);
  s = puller.stats();
  CHECK(s.parked == 2);
  CHECK(s.connections == 1);
  // The stopped producer goes: its sockets close, and so do the parked
  // connections, reaped as later pulls take a connection.
  ucp_worker_destroy(frozen.handle);
  CHECK(eventually([&] {
    e.pull(puller, 1, transfer_mode::sharded, 5s);
    return puller.stats().parked == 0;
  }));
}

TEST_CASE("ucx: a pull without credentials fails at once, saying why") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(1);
  auto link = std::make_shared<producer_link>(); // no producer runs
  ucx_puller puller(loopback_puller(link));
  test_engine e("rollout-0", c, 1, puller);
  auto err = expect_failure([&] { e.pull(puller, 1, transfer_mode::sharded, 5s); });
  CHECK(err.failure == transfer_failure::producer_failed);
  CHECK(has(err.what(), "no credentials for the producer: no producer runs"));
  CHECK(puller.stats().connect_attempts == 0);
}

// -- tokens and the address exchange ---------------------------------------------------

TEST_CASE("ucx: the producer's worker address travels with each token, and no socket listens beyond loopback") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(1);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  ucx_producer producer(src, loopback_producer({ucx_transport::tcp}));
  const auto a = producer.issue("rollout-0", 0), b = producer.issue("rollout-0", 0);
  CHECK(a.producer == producer.worker_address());
  CHECK(a.token.size() == ucx_token_bytes);
  CHECK(a.token != b.token); // random, one per request
  CHECK(producer.stats().tokens_issued == 2);
  ucx_puller puller(loopback_puller(producer, {ucx_transport::tcp}));
  test_engine e("rollout-0", c, 1, puller);
  e.pull(puller, 1);
  test::check_identical(*e.weights, *test::loaded(*v1, 1));
  CHECK(has(puller.last_transports(), "[tcp]"));
  // UCX's tcp transport still listens (a port per device), on lo only.
  const auto listening = own_listening_addresses();
  MESSAGE("listening on: " << listening.size() << " socket(s)");
  for (const auto& addr : listening) {
    INFO("listening on " << addr);
    CHECK((addr.rfind("127.", 0) == 0 || addr == "::1"));
  }
}

TEST_CASE("ucx: a hello is served only with a token issued for its engine worker, unexpired and remembered") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(1);
  auto src = test::small_source(c);
  src->produce_next();
  auto options = loopback_producer();
  options.token_lifetime = 300ms;
  options.max_tokens = 3;
  options.max_tokens_per_worker = 2;
  log_lines log;
  options.log = log.sink();
  ucx_producer producer(src, options);
  std::mt19937 rng(7);
  struct row {
    const char* what;
    std::function<ucx_credentials(const std::string&, int)> credentials;
    const char* refusal; // empty: served
  };
  const std::vector<row> rows{
      {"a valid token", [&](const std::string& e, int w) { return producer.issue(e, w); }, ""},
      {"a wrong token",
       [&](const std::string&, int) {
         ucx_credentials k{producer.worker_address(), std::vector<std::uint8_t>(ucx_token_bytes)};
         for (auto& x : k.token)
           x = static_cast<std::uint8_t>(rng());
         return k;
       },
       "presented a token this producer did not issue"},
      {"a token for another worker", [&](const std::string& e, int) { return producer.issue(e, 1); },
       "presented a token issued for another engine worker"},
      {"a token for another engine", [&](const std::string&, int w) { return producer.issue("rollout-9", w); },
       "presented a token issued for another engine worker"},
      {"an expired token",
       [&](const std::string& e, int w) {
         auto k = producer.issue(e, w);
         std::this_thread::sleep_for(400ms);
         return k;
       },
       "presented an expired token"},
      {"a token pushed out of the bounded table",
       [&](const std::string& e, int w) {
         auto k = producer.issue(e, w);
         for (int i = 0; i < 3; ++i)
           producer.issue("rollout-" + std::to_string(i), 0);
         return k;
       },
       "presented a token this producer did not issue"},
      {"a flood of tokens for one engine's many worker numbers pushes out only that engine's",
       [&](const std::string& e, int w) {
         auto k = producer.issue(e, w);
         for (int i = 0; i < 10; ++i)
           producer.issue("rollout-7", i);
         return k;
       },
       ""},
      {"a flood of tokens for one engine worker pushes out only that worker's",
       [&](const std::string& e, int w) {
         auto k = producer.issue(e, w);
         for (int i = 0; i < 5; ++i)
           producer.issue("rollout-7", 0);
         return k;
       },
       ""},
  };
  for (const auto& r : rows) {
    INFO(r.what);
    const auto refused_before = producer.stats().refused_hellos;
    ucx_puller puller(loopback_puller(
        [&](const std::string& e, int w, clock::time_point) { return r.credentials(e, w); }));
    test_engine e("rollout-0", c, 1, puller);
    if (std::string(r.refusal).empty()) {
      CHECK(e.pull(puller, 1).groups == plan::group_count(c));
      CHECK(producer.stats().refused_hellos == refused_before);
      continue;
    }
    auto err = expect_failure([&] { e.pull(puller, 1, transfer_mode::sharded, 5s); });
    CHECK(err.failure == transfer_failure::producer_failed);
    CHECK(has(err.what(), "refused the connection: unauthorized: producer: engine 'rollout-0' worker 0 "));
    CHECK(has(err.what(), r.refusal));
    CHECK(puller.stats().connect_attempts == 1); // a refusal is not retried
    CHECK(producer.stats().refused_hellos == refused_before + 1);
  }
  CHECK(log.contains("ucx producer: refused an endpoint: "));
}

TEST_CASE("ucx: requests before a hello and sessions for another worker are refused and counted") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(1);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  ucx_producer producer(src, loopback_producer());
  ucx_puller puller(loopback_puller(producer));
  // No hello: a get, a plan, garbage; each endpoint is refused and closed.
  CHECK(has(puller.send_raw(wire::encode(wire::get_msg{8, 1, 0, 1, 1000}), in(5s), false),
            "unauthorized: producer: a request before hello"));
  auto plan = wire::encode_plan(engine::make_plan(c, 1, 0, dtype::bf16));
  CHECK(has(puller.send_raw(wire::encode(wire::plan_msg{9, plan}), in(5s), false), "unauthorized"));
  CHECK(has(puller.send_raw(std::vector<std::uint8_t>(16, 0xff), in(5s), false),
            "unauthorized: producer: a request before hello"));
  CHECK(producer.stats().refused_hellos == 3);
  CHECK(producer.stats().connections == 0);
  // A connection whose token is for "(raw)" worker 0 cannot open another's session.
  const auto reply = puller.send_raw(
      wire::encode(wire::open_msg{10, "rollout-0", 0, 1, 1, transfer_mode::broadcast, 0}), in(5s));
  CHECK(has(reply, "unauthorized: this connection's token is for engine '(raw)' worker 0"));
  // The producer still serves the rightful engine.
  test_engine e("rollout-0", c, 1, puller);
  e.pull(puller, 1);
  test::check_identical(*e.weights, *test::loaded(*v1, 1));
}

TEST_CASE("ucx: a first message is judged by its hello header: each lie is answered unauthorized, naming it") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(1);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  auto options = loopback_producer();
  options.max_connections = 1;
  ucx_producer producer(src, options);
  ucx_puller puller(loopback_puller(producer));
  auto hello = [&](std::vector<std::uint8_t> address) {
    return wire::encode(wire::hello_msg{5, "(raw)", 0, producer.issue("(raw)", 0).token, "", std::move(address)});
  };
  struct row {
    const char* what;
    std::vector<std::uint8_t> body;
    std::function<std::vector<std::uint8_t>()> header;
    const char* answer;
  };
  const std::vector<row> rows{
      {"no header", wire::encode(wire::get_msg{8, 1, 0, 1, 1000}), [] { return std::vector<std::uint8_t>{}; },
       "unauthorized: producer: a request before hello"},
      {"a garbage header", {}, [] { return std::vector<std::uint8_t>(16, 0xff); },
       "unauthorized: producer: a malformed hello: "},
      {"a header that is not a hello", {}, [] { return wire::encode(wire::get_msg{8, 1, 0, 1, 1000}); },
       "unauthorized: producer: a first message whose header is not a hello"},
      {"a hello with a body", {1, 2, 3}, [&] { return hello({1}); },
       "unauthorized: producer: a hello with a body of 3 bytes"},
      {"a hello without a token", {},
       [] { return wire::encode(wire::hello_msg{5, "(raw)", 0, {}, "", {1}}); },
       "presented a token of 0 bytes"},
      {"a hello without its address", {}, [&] { return hello({}); },
       "unauthorized: producer: engine '(raw)' worker 0 sent no worker address"},
      // The producer's own address: UCX makes a new endpoint, not the one
      // the hello came on; it is closed again, the hello refused.
      {"a hello naming another worker's address", {}, [&] { return hello(producer.worker_address()); },
       "unauthorized: producer: engine '(raw)' worker 0 sent a worker address that is not its own"},
  };
  for (const auto& r : rows) {
    INFO(r.what);
    CHECK(has(puller.send_raw(r.body, in(5s), false, true, r.header()), r.answer));
  }
  CHECK(producer.stats().connections == 0);
  CHECK(producer.stats().refused_hellos == rows.size());
  // The one connection allowed is served; a second is refused while it lasts.
  test_engine e("rollout-0", c, 1, puller);
  e.pull(puller, 1);
  test::check_identical(*e.weights, *test::loaded(*v1, 1));
  try {
    puller.send_raw(wire::encode(wire::get_msg{8, 1, 0, 1, 1000}), in(5s));
    FAIL("a second connection was served");
  } catch (const transfer_error& err) {
    CHECK(has(err.what(), "refused the connection: unauthorized: producer: a hello beyond the limit of 1 connections"));
  }
}

TEST_CASE("ucx: a consumer that asks and never reads is closed at max_unread_replies, the producer serves on") {
  SKIP_WITHOUT_UCX();
  tcp_fixture f;
  auto& [c, src, v1, log, producer, puller] = f;
  // Each open is answered with the version's manifest; over tcp the
  // sockets hold some of them, the rest wait in the producer.
  wire::open_msg open;
  open.seq = 9;
  open.engine = "(raw)";
  open.version = v1->version();
  open.mode = transfer_mode::broadcast;
  std::atomic<bool> done{false};
  auto flood = std::async(std::launch::async, [&] {
    return puller.flood_raw(wire::encode(open), 20000, [&] { return done.load(); }, in(20s));
  });
  if (!std::getenv("UCX_RNDV_THRESH")) {
    const bool closed = eventually([&] { return producer.stats().unread_closes == 1; }, 15s);
    CHECK(closed);
    CHECK(log.contains("256 answers unread: it asks and does not read"));
    CHECK(producer.stats().refused_hellos == 0); // what it sends after is dropped as a closing endpoint's, not judged
  } else {
    // Every message by rendezvous: the producer must fetch each open from
    // a consumer that never progresses. It fetches at most
    // max_fetches_per_sender of them and drops the rest.
    CHECK(eventually([&] { return log.contains("control messages at its inbox's bounds"); }, 15s));
  }
  // Another consumer is served all the while.
  ucx_puller other(loopback_puller(producer, {ucx_transport::tcp}));
  test_engine e("rollout-0", c, 1, other);
  e.pull(other, 1);
  test::check_identical(*e.weights, *test::loaded(*v1, 1));
  CHECK(producer.stats().unread_closes == (std::getenv("UCX_RNDV_THRESH") ? 0 : 1));
  done = true;
  const std::string flooder_failure = flood.get();
  if (std::getenv("UCX_RNDV_THRESH")) // its requests past the bound were refused, and it says so once it reads
    CHECK(has(flooder_failure, "a message to the producer failed ("));
}

TEST_CASE("ucx: an engine unregistered during its pull keeps no connection, and registered again it connects anew") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(1);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  ucx_producer producer(src, loopback_producer());
  ucx_puller puller(loopback_puller(producer));
  test_engine e("rollout-0", c, 1, puller);
  auto sink = e.sink();
  bool unregistered = false;
  const auto apply = sink.on_group;
  sink.on_group = [&](int w, std::uint32_t g, const std::uint8_t* bytes, std::size_t size) {
    if (!unregistered) { // the engine goes while its pull runs
      puller.unregister_engine("rollout-0");
      unregistered = true;
    }
    apply(w, g, bytes, size);
  };
  puller.pull({"rollout-0", 0, 1, transfer_mode::sharded, in(10s)}, sink);
  CHECK(unregistered);
  CHECK(puller.stats().connections == 1);
  // Its connection was not kept idle for an engine that no longer exists.
  test_engine again("rollout-0", c, 1, puller);
  again.pull(puller, 1);
  test::check_identical(*again.weights, *test::loaded(*v1, 1));
  CHECK(puller.stats().connections == 2);
}

TEST_CASE("ucx: a sharded group whose size does not fit the sink's places is the producer's fault, named") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(1);
  auto src = test::small_source(c);
  src->produce_next();
  ucx_producer producer(src, loopback_producer());
  ucx_puller puller(loopback_puller(producer));
  test_engine e("rollout-0", c, 1, puller);
  e.in_place = true;
  auto sink = e.sink();
  const auto places = sink.targets;
  sink.targets = [&](int w, std::uint32_t g) {
    auto out = places(w, g);
    if (!out.empty())
      out.back().bytes += 1; // places for one byte more than the group the producer sends
    return out;
  };
  auto err = expect_failure([&] { puller.pull({"rollout-0", 0, 1, transfer_mode::sharded, in(10s)}, sink); });
  CHECK(err.failure == transfer_failure::producer_failed);
  CHECK(has(err.what(), "sent group "));
}

TEST_CASE("ucx: a consumer gone without a goodbye: UCX reports its endpoint failed, the producer closes it") {
  SKIP_WITHOUT_UCX();
  tcp_fixture f;
  auto& [c, src, v1, log, producer, puller] = f;
  for (int round = 1; round <= 3; ++round) {
    INFO("round " << round);
    const auto reply = puller.send_raw(wire::encode(wire::get_msg{8, 99, 0, 1, 1000}), in(5s), true, false);
    CHECK(has(reply, "not_registered: session 99"));
    // Before the producer made the endpoint its own, UCX freed it here
    // unseen, and the producer's next use of its handle read freed memory.
    CHECK(test::eventually([&] { return producer.stats().endpoint_failures == static_cast<std::uint64_t>(round); }));
  }
  CHECK(log.contains("UCX reports its endpoint failed"));
  CHECK(log.contains("the consumer is gone"));
  CHECK(producer.stats().connections == 3);
  // A consumer that says goodbye is no failure, and the producer serves on.
  test_engine e("rollout-0", c, 1, puller);
  e.pull(puller, 1);
  test::check_identical(*e.weights, *test::loaded(*v1, 1));
  CHECK(producer.stats().endpoint_failures == 3);
}

TEST_CASE("ucx: a goodbye is answered, then the producer closes") {
  SKIP_WITHOUT_UCX();
  tcp_fixture f;
  auto& [c, src, v1, log, producer, puller] = f;
  test_engine e("rollout-0", c, 1, puller);
  e.pull(puller, 1);
  CHECK(puller.stats().goodbyes_answered == 0);
  puller.unregister_engine("rollout-0"); // its idle connection says goodbye, and is answered
  CHECK(puller.stats().goodbyes_answered == 1);
}

TEST_CASE("ucx: an idle connection is reused only for max_idle, then made anew") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(1);
  auto src = test::small_source(c);
  src->produce_next();
  ucx_producer producer(src, loopback_producer());
  using row = std::pair<std::chrono::milliseconds, std::uint64_t>; // max_idle, connections made by 3 pulls
  for (auto [max_idle, connections] : {row{60000ms, 1}, row{0ms, 3}}) {
    INFO("max_idle " << max_idle.count() << " ms");
    auto options = loopback_puller(producer);
    options.max_idle = max_idle;
    ucx_puller puller(options);
    test_engine e("rollout-0", c, 1, puller);
    for (int i = 0; i < 3; ++i)
      e.pull(puller, 1);
    CHECK(puller.stats().connections == connections);
  }
}

TEST_CASE("ucx: an address maps to the network device UCX should use") {
  struct row {
    std::string address;
    std::string device; // empty: none
    std::string why;
  };
  const std::vector<row> rows{
      {"127.0.0.1", "lo", ""},
      {"127.0.0.2", "lo", ""},
      {"localhost", "lo", ""},
      {"0.0.0.0", "", "wildcard"},
      {"", "", "wildcard"},
      {"192.0.2.77", "", "belongs to no interface of this machine"}, // TEST-NET-1
      {"no-such-host.invalid", "", "does not resolve"},
  };
  for (const auto& r : rows) {
    INFO(r.address);
    std::string why;
    CHECK(ucx_net_device_for(r.address, &why) == r.device);
    if (!r.why.empty())
      CHECK(has(why, r.why));
  }
}

TEST_CASE("ucx: malformed messages and plans are rejected with an error, the producer keeps serving") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(2);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  log_lines log;
  ucx_producer producer(src, loopback_producer({}, log.sink()));
  ucx_puller puller(loopback_puller(producer));

  auto answer = puller.send_raw({1, 2, 3, 4, 5}, in(5s));
  MESSAGE(answer);
  CHECK(has(answer, "bad_request: malformed message: message: not an rlsync ucx message (bad magic) at byte 4"));
  answer = puller.send_raw({0x52, 0x4c}, in(5s));
  CHECK(has(answer, "bad_request: malformed message: message: truncated reading magic at byte 0"));
  auto garbage = wire::encode(wire::hello_msg{77});
  garbage[5] = 0x42;
  CHECK(has(puller.send_raw(garbage, in(5s)), "unknown message type 66"));

  auto plan = wire::encode_plan(engine::make_plan(c, 1, 0, dtype::bf16));
  auto truncated = plan;
  truncated.resize(plan.size() / 2);
  CHECK(has(puller.send_raw(wire::encode(wire::plan_msg{5, truncated}), in(5s)), "bad_request: malformed plan: "));

  auto hostile = engine::make_plan(c, 1, 0, dtype::bf16);
  hostile.entries[0].view.offset = std::int64_t(1) << 40; // would read far outside the tensor
  auto reply = puller.send_raw(wire::encode(wire::plan_msg{6, wire::encode_plan(hostile)}), in(5s));
  CHECK(has(reply, "outside its source"));

  auto foreign = engine::make_plan(c, 1, 0, dtype::bf16);
  foreign.entries[0].source = "model.layers.9.mlp.up_proj.weight"; // no such layer in this model
  reply = puller.send_raw(wire::encode(wire::plan_msg{7, wire::encode_plan(foreign)}), in(5s));
  CHECK(has(reply, "producer_failed: the plan does not fit this producer's model"));

  // A get for a session that was never opened.
  reply = puller.send_raw(wire::encode(wire::get_msg{8, 99, 0, 1, 1000}), in(5s));
  CHECK(has(reply, "not_registered: session 99"));

  CHECK(producer.stats().rejected >= 6);
  CHECK(log.contains("rejected a malformed message"));

  // Meanwhile, a well-behaved engine is served as usual.
  test_engine e("rollout-0", c, 1, puller);
  e.pull(puller, 1);
  test::check_identical(*e.weights, *test::loaded(*v1, 1));
}

TEST_CASE("ucx: pull errors name the version, the worker and the producer") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(2);
  auto src = test::small_source(c);
  src->produce_next();
  src->produce_next();
  src->produce_next(); // holds 2 and 3
  ucx_producer producer(src, loopback_producer());
  ucx_puller puller(loopback_puller(producer));
  test_engine e("e", c, 1, puller);

  auto err = expect_failure([&] { puller.pull({"e", 0, 1, transfer_mode::sharded, in(5s)}, e.sink()); });
  CHECK(err.failure == transfer_failure::version_unavailable);
  CHECK(has(err.what(), "version 1 is not held (held: 2, 3)"));

  err = expect_failure([&] { puller.pull({"other", 0, 3, transfer_mode::sharded, in(5s)}, e.sink()); });
  CHECK(err.failure == transfer_failure::not_registered);

  CHECK_THROWS_AS(puller.pull({"e", 0, 3, transfer_mode::broadcast, in(5s)}, group_sink{}), std::invalid_argument);

  // A plan recorded for another dtype: the producer says why it refuses it.
  auto f32 = std::make_shared<const plan::worker_plan>(engine::make_plan(c, 1, 0, dtype::f32));
  puller.register_worker("f32", f32);
  err = expect_failure([&] { puller.pull({"f32", 0, 3, transfer_mode::sharded, in(5s)}, e.sink()); });
  CHECK(err.failure == transfer_failure::producer_failed);
  CHECK(has(err.what(), "the plan was recorded for F32"));

}

TEST_CASE("ucx: a topology naming a transport this machine lacks fails at construction, listing what there is") {
  SKIP_WITHOUT_UCX();
  const std::string here = ucx_transports_here();
  MESSAGE("UCX transports here: " << here);
  if (has(here, "rdma")) {
    MESSAGE("skipped: this machine has rdma");
    return;
  }
  const model_config c = test::small_model(1);
  auto src = test::small_source(c);
  try {
    ucx_producer p(src, loopback_producer({ucx_transport::rdma}));
    FAIL("no error");
  } catch (const ucx_error& e) {
    CHECK(has(e.what(), "transfer.ucx_transports [rdma] names rdma, but UCX offers no rdma transport"));
    CHECK(has(e.what(), "available: "));
  }
  CHECK_THROWS_AS(ucx_puller(loopback_puller(ucx_credentials_source{}, {ucx_transport::shm, ucx_transport::rdma})),
                  ucx_error);
}

TEST_CASE("ucx: a producer that shuts down fails the pulls that need it, and a new one is found again") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(2);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  auto link = std::make_shared<producer_link>();
  auto producer = std::make_unique<ucx_producer>(src, loopback_producer());
  link->set(producer.get());
  ucx_puller puller(loopback_puller(link));
  test_engine e("rollout-0", c, 1, puller);
  e.pull(puller, 1);
  link->set(nullptr);
  producer.reset(); // the idle connection now leads nowhere
  auto err = expect_failure([&] { e.pull(puller, 1, transfer_mode::sharded, 300ms); });
  CHECK((err.failure == transfer_failure::timeout || err.failure == transfer_failure::cancelled
         || err.failure == transfer_failure::producer_failed));
  MESSAGE(std::string(err.what()));

  ucx_producer again(src, loopback_producer());
  link->set(&again); // the control plane now hands out the new producer's address
  e.pull(puller, 1);
  test::check_identical(*e.weights, *test::loaded(*v1, 1));
  // A rejoining node drops its idle connections: the next pull connects anew.
  const auto connections = puller.stats().connections;
  e.pull(puller, 1);
  CHECK(puller.stats().connections == connections); // reused
  puller.reset_connections();
  e.pull(puller, 1);
  CHECK(puller.stats().connections == connections + 1);
}

TEST_CASE("ucx: named shared-memory transports are used, a connection that would fall back to tcp is refused") {
  SKIP_WITHOUT_UCX();
  const std::string here = ucx_transports_here();
  if (!has(here, "shm") || !has(here, "cma")) {
    MESSAGE("skipped: no shm/cma here (" << here << ")");
    return;
  }
  const model_config c = test::small_model(2);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  {
    const std::vector<ucx_transport> fast{ucx_transport::shm, ucx_transport::cma};
    ucx_producer producer(src, loopback_producer(fast));
    ucx_puller puller(loopback_puller(producer, fast));
    test_engine e("rollout-0", c, 1, puller);
    e.pull(puller, 1);
    test::check_identical(*e.weights, *test::loaded(*v1, 1));
    CHECK(has(puller.last_transports(), "[shm/cma]"));
  }
  {
    // The producer may use tcp only; the consumer names shm: the only
    // common ground is tcp, which the consumer's list does not name.
    ucx_producer producer(src, loopback_producer({ucx_transport::tcp}));
    log_lines log;
    ucx_puller puller(loopback_puller(producer, {ucx_transport::shm}, log.sink()));
    test_engine e("rollout-0", c, 1, puller);
    auto err = expect_failure([&] { e.pull(puller, 1, transfer_mode::sharded, 5s); });
    CHECK(err.failure == transfer_failure::producer_failed);
    CHECK(has(err.what(), "the connection would move bytes over tcp"));
    CHECK(has(err.what(), "which transfer.ucx_transports [shm] does not name"));
    CHECK(log.contains("refused"));
  }
}

TEST_CASE("ucx: plans and manifests too large for one eager message travel by rendezvous") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(24);
  const auto plan = engine::make_plan(c, 2, 0, dtype::bf16);
  CHECK(wire::encode_plan(plan).size() > 16384); // above UCX's eager limit for active messages
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  ucx_producer producer(src, loopback_producer());
  ucx_puller puller(loopback_puller(producer));
  test_engine e("rollout-0", c, 2, puller);
  e.pull(puller, 1);
  test::check_identical(*e.weights, *test::loaded(*v1, 2));
  test_engine b("rollout-1", c, 2, puller);
  auto r = b.pull(puller, 1, transfer_mode::broadcast); // a manifest listing every tensor
  CHECK(r.groups == 24);
  test::check_identical(*b.weights, *test::loaded(*v1, 2));
}

TEST_CASE("ucx: groups small enough to arrive before their receive is posted arrive whole, by tag") {
  // Groups of a few KiB go eagerly: those the open carries reach the
  // engine before it posts their receives (after the manifest). UCX 1.13
  // reports a receive it completes in place as 0 bytes, which failed
  // every such pull as damaged.
  SKIP_WITHOUT_UCX();
  const model_config c = test::tiny_group_model();
  auto src = test::small_source(c);
  using transports = std::vector<ucx_transport>;
  for (const auto& over : {transports{ucx_transport::tcp}, transports{}}) {
    CAPTURE(over.size());
    auto v = src->produce_next();
    ucx_producer producer(src, loopback_producer(over));
    auto qo = loopback_puller(producer, over);
    qo.shared_memory = false; // as from another host: by tag
    ucx_puller puller(qo);
    test_engine e("rollout-0", c, 2, puller);
    for (int i = 0; i < 5; ++i) {
      e.pull(puller, v->version());
      test::check_identical(*e.weights, *test::loaded(*v, 2));
    }
    CHECK(largest_of(shard_group_bytes(c, 2)) < 8192);
  }
}

namespace {

// A raw broadcast open of `version` for engine "(raw)", answered with
// session 1 (a connection's first), asking for its groups in shared memory.
std::vector<std::uint8_t> raw_open(std::uint64_t version) {
  wire::open_msg open;
  open.seq = 1;
  open.engine = "(raw)";
  open.version = version;
  open.mode = transfer_mode::broadcast;
  open.shared = true;
  return wire::encode(open);
}

std::size_t lines_with(log_lines& log, const std::string& text) {
  std::lock_guard<std::mutex> lock(log.mutex);
  return static_cast<std::size_t>(std::count_if(log.lines.begin(), log.lines.end(), [&](const std::string& l) {
    return l.find(text) != std::string::npos;
  }));
}

} // namespace

TEST_CASE("ucx: a puller keeps as many groups in flight as the producer's per-connection gets allow") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(20);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  for (std::size_t allowed : {std::size_t(16), std::size_t(24)}) {
    CAPTURE(allowed);
    auto po = loopback_producer();
    po.max_outstanding_per_connection = allowed;
    ucx_producer producer(src, po);
    auto o = loopback_puller(producer);
    o.groups_in_flight = 24; // the open carries 24 gets, each waiting for its group to be packed
    ucx_puller puller(o);
    test_engine e("rollout-0", c, 1, puller);
    if (allowed < o.groups_in_flight) {
      auto err = expect_failure([&] { e.pull(puller, 1); });
      CHECK(has(err.what(), "(busy): more than 16 requests outstanding on this connection"));
    } else {
      CHECK(e.pull(puller, 1).groups == 20);
      test::check_identical(*e.weights, *test::loaded(*v1, 1));
    }
  }
}

TEST_CASE("ucx: a consumer that neither takes nor gives back its groups is refused more than twice its gets") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(1);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  auto po = loopback_producer();
  po.max_outstanding_per_connection = 2;
  ucx_producer producer(src, po);
  ucx_puller raw(loopback_puller(producer));
  std::vector<std::vector<std::uint8_t>> messages{raw_open(v1->version())};
  for (std::uint64_t i = 0; i < 5; ++i)
    messages.push_back(wire::encode(wire::get_msg{2 + i, 1, 0, 100 + i, 10000}));
  const auto answers = raw.converse_raw(messages, in(10s));
  REQUIRE(answers.size() == 6);
  CHECK(answers[0] == "ok: ");
  for (std::size_t i = 1; i <= 4; ++i) // lent in shared memory, never given back
    CHECK(answers[i] == "ok: ");
  CHECK(answers[5] == "busy: 4 groups sent or lent on this connection and not yet taken or given back");
  CHECK(producer.stats().groups_lent == 4);
  // Another consumer is served all the while.
  ucx_puller other(loopback_puller(producer));
  test_engine e("rollout-0", c, 1, other);
  e.pull(other, 1);
  test::check_identical(*e.weights, *test::loaded(*v1, 1));
}

TEST_CASE("ucx: a lent group that left the cache still counts against the budget until its last lend ends") {
  SKIP_WITHOUT_UCX();
  const model_config c = test::small_model(1);
  auto src = test::small_source(c);
  auto v1 = src->produce_next();
  // The budget holds the largest group once: lent to two consumers, it
  // leaves the cache when the first one's deadline passes, and the second
  // still maps it. Nothing else may be packed until that lend ends too.
  std::uint32_t largest = 0;
  std::uint64_t largest_bytes = 0;
  for (auto g : v1->groups())
    if (const auto b = plan::full_group_layout::of(v1->group(g)).bytes; b > largest_bytes) {
      largest = g;
      largest_bytes = b;
    }
  log_lines log;
  auto po = loopback_producer({}, log.sink());
  po.packed_budget_bytes = largest_bytes;
  ucx_producer producer(src, po);
  std::atomic<bool> released{false};
  auto hold = [&](std::uint32_t timeout_ms) {
    return std::async(std::launch::async, [&, timeout_ms] {
      ucx_puller raw(loopback_puller(producer));
      return raw.converse_raw({raw_open(v1->version()), wire::encode(wire::get_msg{2, 1, largest, 7, timeout_ms})},
                              in(20s), [&] { return released.load(); });
    });
  };
  auto first = hold(2500); // long enough for the second to connect and be lent the same copy
  REQUIRE(eventually([&] { return producer.stats().groups_lent == 1; }, 10s));
  auto second = hold(6000);
  REQUIRE(eventually([&] { return producer.stats().groups_lent == 2; }, 10s));
  CHECK(producer.stats().packs == 1); // one packed copy lent to both
  const std::string not_given_back = "was not given back before the consumer's deadline";
  REQUIRE(eventually([&] { return lines_with(log, not_given_back) == 1; }, 10s)); // the first's lend
  // Any other group needs room the second's lend still holds.
  ucx_puller honest(loopback_puller(producer));
  test_engine e("rollout-0", c, 1, honest);
  e.pull(honest, 1, transfer_mode::broadcast);
  test::check_identical(*e.weights, *test::loaded(*v1, 1));
  CHECK(lines_with(log, not_given_back) == 2); // served only once the second's lend ended
  CHECK(producer.stats().peak_packed_bytes <= largest_bytes);
  released = true;
  CHECK(first.get().size() == 2);
  CHECK(second.get().size() == 2);
}
