// The checks applied to values received from peers.
#include "runtime/control/protocol.hpp"

#include <doctest/doctest.h>

using namespace rlsync;

namespace {

generate_request good_request() {
  generate_request r;
  r.request_id = 1;
  r.prompt = {256, 65, 66};
  r.sampling.max_tokens = 4;
  return r;
}

} // namespace

TEST_CASE("generate_request checks reject each malformed field") {
  CHECK(check(good_request()).empty());
  struct row {
    const char* what;
    void (*mutate)(generate_request&);
    const char* expect;
  };
  const row rows[] = {
    {"empty prompt", [](generate_request& r) { r.prompt.clear(); }, "prompt: empty"},
    {"negative token", [](generate_request& r) { r.prompt[1] = -5; }, "prompt[1]: negative"},
    {"negative temperature", [](generate_request& r) { r.sampling.temperature = -1; }, "temperature"},
    {"top_p zero", [](generate_request& r) { r.sampling.top_p = 0; }, "top_p"},
    {"top_p above one", [](generate_request& r) { r.sampling.top_p = 1.5f; }, "top_p"},
    {"zero max_tokens", [](generate_request& r) { r.sampling.max_tokens = 0; }, "max_tokens"},
    {"generated beyond budget", [](generate_request& r) { r.generated = {1, 2, 3, 4, 5}; },
     "exceed max_tokens"},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    auto req = good_request();
    r.mutate(req);
    auto msg = check(req);
    CHECK(msg.find(r.expect) != std::string::npos);
  }
}

TEST_CASE("generate_result spans must be contiguous and cover every token") {
  generate_result r;
  r.tokens = {1, 2, 3};
  r.spans = {{1, 0, 2}, {2, 2, 3}};
  CHECK(check(r).empty());
  r.spans = {{1, 0, 2}};
  CHECK(check(r).find("cover 2 tokens") != std::string::npos);
  r.spans = {{1, 0, 1}, {2, 2, 3}};
  CHECK(check(r).find("not contiguous") != std::string::npos);
  r.spans = {{1, 0, 3}};
  r.reason = static_cast<finish_reason>(200);
  CHECK(check(r).find("reason") != std::string::npos);
}

TEST_CASE("weight_bucket entries must match their shape and lie inside the data") {
  weight_bucket b;
  b.entries = {{"w", 0, {2, 3}, 0, 12}};
  b.data.resize(12);
  CHECK(check(b).empty());
  b.entries[0].bytes = 10;
  CHECK(check(b).find("do not match its shape") != std::string::npos);
  b.entries[0].bytes = 12;
  b.entries[0].offset = 4;
  CHECK(check(b).find("outside the bucket") != std::string::npos);
  b.entries[0].offset = 0;
  // A bucket without data: its checksum is that of no bytes, so only this
  // check keeps an engine from reading where the entry points.
  auto empty = b;
  empty.data.clear();
  CHECK(check(empty).find("outside the bucket's 0 bytes") != std::string::npos);
  empty.entries = {{"w", 0, {0, 3}, 0, 0}};
  CHECK(check(empty).empty());
  b.entries[0].dtype = 9;
  CHECK(check(b).find("unknown dtype") != std::string::npos);
  b.entries[0].dtype = 0;
  b.entries[0].shape = {-1, 3};
  CHECK(check(b).find("negative") != std::string::npos);
  b.entries[0].shape = {1ll << 40, 1ll << 40};
  CHECK(check(b).find("overflows") != std::string::npos);
}

TEST_CASE("pause_request and transfer_order reject out-of-range enums") {
  CHECK(check(pause_request{pause_mode::keep, false}).empty());
  CHECK(!check(pause_request{static_cast<pause_mode>(7), false}).empty());
  transfer_order o;
  CHECK(check(o).empty());
  o.mode = static_cast<transfer_mode>(3);
  CHECK(check(o).find("mode") != std::string::npos);
}

TEST_CASE("what a peer sends is bounded: each bound is refused naming the field and the bound") {
  struct row {
    const char* what;
    std::string (*check_it)();
    const char* expect;
  };
  const std::string long_name(max_name_bytes + 1, 'n');
  static std::string name_over;
  name_over = long_name;
  const row rows[] = {
    {"engine name", [] { return check(engine_info{name_over, "node", 1, 0, false, 0}); },
     "engine_info.name: 257 bytes exceed the bound of 256"},
    {"empty engine name", [] { return check(engine_info{"", "node", 1, 0, false, 0}); }, "engine_info.name: empty"},
    {"node name", [] { return check(engine_info{"e", name_over, 1, 0, false, 0}); },
     "engine_info.node: 257 bytes exceed the bound of 256"},
    {"no workers", [] { return check(engine_info{"e", "node", 0, 0, false, 0}); },
     "engine_info.tp: 0 workers, not 1 to 1024"},
    {"workers over the bound (a communicator member each)",
     [] { return check(engine_info{"e", "node", 0xFFFFFFFFu, 0, false, 0}); },
     "engine_info.tp: 4294967295 workers, not 1 to 1024"},
    {"heartbeat sender", [] { return check(heartbeat{name_over, 1}); }, "heartbeat.from: 257 bytes"},
    {"route engine", [] { return check(route_update{name_over, 1, true}); }, "route_update.engine: 257 bytes"},
    {"prompt", [] {
       auto r = good_request();
       r.prompt.assign(max_request_tokens + 1, 1);
       return check(r);
     }, "generate_request.prompt: 1048577 tokens exceed the bound of 1048576"},
    {"bucket entries", [] {
       weight_bucket b;
       b.entries.resize(max_bucket_entries + 1);
       return check(b);
     }, "weight_bucket.entries: 65537 entries exceed the bound of 65536"},
    {"bucket entry name", [] {
       weight_bucket b;
       b.entries.push_back({name_over, 0, {1}, 0, 4, 0});
       return check(b);
     }, "weight_bucket.entries[0].name: 257 bytes"},
    {"shape rank", [] {
       weight_bucket b;
       b.entries.push_back({"w", 0, std::vector<std::int64_t>(max_shape_rank + 1, 1), 0, 4, 0});
       return check(b);
     }, "shape: 9 dimensions exceed the bound of 8"},
    {"transfer backend", [] { return check(transfer_order{1, transfer_mode::sharded, name_over}); },
     "transfer_order.backend: 257 bytes"},
    {"order's bytes from a later version", [] {
       transfer_order o{4, transfer_mode::sharded, "ucx"};
       o.same_bytes_since = 5;
       return check(o);
     }, "transfer_order.same_bytes_since: 5 is past the version (4)"},
    {"a version past the bound", [] { return check(version_info{max_version + 1, 1, 100}); },
     "version_info.version: 9007199254740993 is past the bound of 9007199254740992"},
    {"published bytes from a later version", [] {
       version_info v{4, 1, 100};
       v.same_bytes_since = 5;
       return check(v);
     }, "version_info.same_bytes_since: 5 is past the version (4)"},
  };
  for (auto& r : rows) {
    CAPTURE(r.what);
    auto msg = r.check_it();
    CHECK_MESSAGE(msg.find(r.expect) != std::string::npos, msg);
  }
  // At the bound: accepted.
  CHECK(check(engine_info{std::string(max_name_bytes, 'n'), "node", 1, 0, false, 0}).empty());
  CHECK(check(heartbeat{std::string(max_name_bytes, 'n'), 1}).empty());
  version_info same{4, 1, 100};
  same.same_bytes_since = 4; // its own version: it changed something
  CHECK(check(same).empty());
  CHECK(check(version_info{max_version, 1, 100}).empty());
}
