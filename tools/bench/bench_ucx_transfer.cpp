// Measures (does not assert) the ucx backend over loopback in one process:
// bytes/s of a ~256 MiB sharded pull over shared memory and over tcp:
//   cold    the first pull: connect, receive buffers allocated and touched,
//           the producer packs into fresh buffers
//   cached  the same version again: the producer's packed groups are cached,
//           so this is the transport alone
//   repack  a producer whose cache holds 2 groups: every pull packs every
//           group again, pipelined with the transfer (the steady state of
//           a new version)
// The sink does nothing (the engine's apply is not measured). Compare with
// ucx_perftest tag_bw.
//
//   bench_ucx_transfer [repeats]
#define DOCTEST_CONFIG_IMPLEMENT // transfer_fixtures.hpp uses doctest's checks
#include "runtime/config/topology.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/transfer/ucx/ucx_transfer.hpp"

#include "tests/support/transfer_fixtures.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace rlsync;
using namespace rlsync::transfer;

namespace {

model_config bench_model() {
  model_config c = test::small_model(4);
  c.vocab_size = 36000;
  c.hidden_size = 1024;
  c.intermediate_size = 4096;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 4;
  return c;
}

double gbps(std::uint64_t bytes, clock::duration d) {
  return static_cast<double>(bytes) / static_cast<double>(std::chrono::nanoseconds(d).count());
}

std::vector<double> pulls(weight_puller& puller, int tp, std::uint64_t v, int repeats) {
  group_sink sink;
  sink.on_group = [](int, std::uint32_t, const std::uint8_t*, std::size_t) {};
  std::vector<double> out;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = clock::now();
    auto r = pull_engine(puller, "e", tp, v, transfer_mode::sharded, sink, clock::now() + std::chrono::minutes(2));
    out.push_back(gbps(r.bytes, clock::now() - t0));
  }
  std::sort(out.begin(), out.end());
  return out;
}

void run(const char* name, const std::vector<ucx_transport>& transports, int tp, int repeats,
         const std::shared_ptr<synthetic_source>& src) {
  const model_config c = src->config();
  ucx_producer_options po;
  po.net_devices = "lo";
  po.transports = transports;
  transfer_spec spec; // as a topology with these transports would: lent in shared memory, or by tag
  spec.backend = transfer_backend::ucx;
  spec.ucx_transports = transports;
  po.shared_memory = ucx_lends_shared_memory(spec);
  ucx_producer producer(src, po);
  ucx_producer* current = &producer; // what the control plane would hand out
  ucx_puller_options o;
  o.credentials = [&current](const std::string& engine, int worker, clock::time_point) {
    return current->issue(engine, worker);
  };
  o.net_devices = "lo";
  o.transports = transports;
  o.shared_memory = po.shared_memory;
  ucx_puller puller(o);
  for (int w = 0; w < tp; ++w)
    puller.register_worker("e", std::make_shared<const plan::worker_plan>(engine::make_plan(c, tp, w, dtype::bf16)));
  const std::uint64_t v = src->latest()->version();
  const auto cold = pulls(puller, tp, v, 1);
  const auto cached = pulls(puller, tp, v, repeats);

  po.default_budget_groups = 2; // less than the model: every pull repacks
  ucx_producer repacking(src, po);
  current = &repacking;
  pulls(puller, tp, v, 1); // connect, warm the producer's buffers
  const auto repack = pulls(puller, tp, v, repeats);
  std::printf("%-8s tp %d: cold %.2f GB/s; cached median %.2f (best %.2f); repack median %.2f (best %.2f) GB/s [%s]\n",
              name, tp, cold[0], cached[cached.size() / 2], cached.back(), repack[repack.size() / 2], repack.back(),
              puller.last_transports().c_str());
  std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  std::string why;
  if (!ucx_available(&why)) {
    std::printf("UCX not usable: %s\n", why.c_str());
    return 77;
  }
  synthetic_options so;
  so.config = bench_model();
  so.type = dtype::bf16;
  so.threads = 2;
  so.keep_versions = 2;
  auto src = std::make_shared<synthetic_source>(so);
  src->produce_next();
  std::printf("model: %.1f MiB bf16, %u groups; UCX transports here: %s\n",
              static_cast<double>(src->latest()->total_bytes()) / (1 << 20),
              static_cast<unsigned>(src->latest()->groups().size()), ucx_transports_here().c_str());
  for (int tp : {1, 2}) {
    run("default", {}, tp, repeats, src);
    run("shm/cma", {ucx_transport::shm, ucx_transport::cma}, tp, repeats, src);
    run("tcp", {ucx_transport::tcp}, tp, repeats, src);
  }
  return 0;
}
