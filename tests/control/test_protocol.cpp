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
