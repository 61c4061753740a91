// Decode throughput of the built-in engine on random weights.
//   bench_engine [layers hidden heads kv_heads intermediate vocab] [--tp N,..] [--batch N,..] [--steps N]
// Defaults: a ~50M-parameter Llama (16 x 512, 8 heads, 4 kv heads, 1536, vocab 320).
#include "runtime/engine/kernels.hpp"
#include "runtime/engine/model.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace rlsync;
using namespace rlsync::engine;

namespace {

std::vector<int> list(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(std::atoi(p));
    while (*p && *p != ',')
      ++p;
    if (*p)
      ++p;
  }
  return out;
}

void fill(weight_set& set, std::uint64_t seed) {
  for (auto& w : set.workers)
    for (const auto& p : w.params()) {
      auto& data = w.at(p.name).data;
      const bool norm = p.shape.size() == 1;
      const float scale = 1.7f / std::sqrt(static_cast<float>(p.shape.back()));
      std::uint64_t x = seed ^ std::hash<std::string>{}(p.name);
      for (auto& v : data) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const float u = static_cast<float>(x >> 40) / float(1 << 24) * 2.0f - 1.0f;
        v = norm ? 1.0f + 0.1f * u : scale * u;
      }
    }
}

} // namespace

int main(int argc, char** argv) {
  model_config c;
  c.num_hidden_layers = 16;
  c.hidden_size = 512;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.intermediate_size = 1536;
  c.vocab_size = 320;
  c.max_position_embeddings = 4096;
  std::vector<int> tps = {1, 2}, batches = {1, 8, 32};
  int steps = 32, prompt = 16;
  std::vector<std::int64_t*> dims = {&c.num_hidden_layers, &c.hidden_size,       &c.num_attention_heads,
                                     &c.num_key_value_heads, &c.intermediate_size, &c.vocab_size};
  std::size_t next_dim = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--tp" && i + 1 < argc)
      tps = list(argv[++i]);
    else if (a == "--batch" && i + 1 < argc)
      batches = list(argv[++i]);
    else if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (a[0] != '-' && next_dim < dims.size())
      *dims[next_dim++] = std::atoll(a.c_str());
    else {
      std::fprintf(stderr, "usage: bench_engine [layers hidden heads kv intermediate vocab] [--tp 1,2] "
                           "[--batch 1,8,32] [--steps 32]\n");
      return 2;
    }
  }
  std::int64_t params = 0;
  {
    auto set = weight_set::make(c, 1);
    for (const auto& p : set->workers[0].params())
      params += p.numel();
  }
  std::printf("model: %lld layers, hidden %lld, heads %lld/%lld kv, intermediate %lld, vocab %lld: %.1fM params, "
              "kernels %s\n",
              (long long)c.num_hidden_layers, (long long)c.hidden_size, (long long)c.num_attention_heads,
              (long long)c.num_key_value_heads, (long long)c.intermediate_size, (long long)c.vocab_size,
              double(params) / 1e6, kernels::variant());
  for (int tp : tps) {
    model m(c, tp);
    auto set = m.make_weights();
    fill(*set, 42);
    m.set_weights(set);
    for (int batch : batches) {
      std::vector<kv_sequence> seqs;
      std::vector<forward_item> items;
      for (int b = 0; b < batch; ++b)
        seqs.push_back(m.new_sequence());
      for (int b = 0; b < batch; ++b)
        items.push_back({&seqs[b], std::vector<std::int32_t>(prompt, 65 + b % 26), 0, false});
      m.forward(items); // prefill, not timed
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) {
        for (int b = 0; b < batch; ++b)
          items[b] = {&seqs[b], {static_cast<std::int32_t>((s * 7 + b) % c.vocab_size)}, seqs[b].length(), false};
        m.forward(items);
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("tp %d batch %2d: %8.1f tokens/s  (%.2f ms/step, %d steps after a %d-token prefill)\n", tp, batch,
                  batch * steps / secs, secs / steps * 1e3, steps, prompt);
      std::fflush(stdout);
    }
  }
}
