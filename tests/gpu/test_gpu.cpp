// GPU checks: every kernel against the CPU path, bit for bit. Runs on a
// machine with a CUDA device, skips (exit 77) elsewhere; prints one line per
// check and exits 1 on the first mismatch (tools/device-check shows them).
#include "gpu/device.hpp"
#include "gpu/device_pack.hpp"
#include "gpu/engine_device.hpp"
#include "gpu/kernels.hpp"
#include "gpu/mixsum.hpp"
#include "runtime/base/dtype.hpp"
#include "runtime/engine/process.hpp"
#include "runtime/engine/device_gemm.hpp"
#include "runtime/engine/engine_core.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "tests/gpu/view_cases.hpp"
#include "tests/support/engine_fixtures.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/transfer/bucket.hpp"
#include "runtime/transfer/external_source.hpp"
#include "runtime/transfer/packing.hpp"
#include "runtime/transfer/weight_source.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using namespace rlsync;

namespace {

int failures = 0;

void report(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
  failures += ok ? 0 : 1;
}

template <class T>
gpu::device_buffer to_device(const std::vector<T>& host) {
  gpu::device_buffer d(host.size() * sizeof(T));
  gpu::copy(d.data(), host.data(), d.size(), gpu::copy_kind::host_to_device);
  return d;
}

template <class T>
std::vector<T> to_host(const gpu::device_buffer& d, std::size_t count) {
  std::vector<T> host(count);
  gpu::copy(host.data(), d.data(), count * sizeof(T), gpu::copy_kind::device_to_host);
  return host;
}

void check_replay() {
  std::vector<std::uint16_t> source(4 * 6 * 8);
  for (std::size_t i = 0; i < source.size(); ++i)
    source[i] = static_cast<std::uint16_t>(i * 40503u + 7);
  auto d_source = to_device(source);
  for (const auto& c : test::views_of_4x6x8()) {
    const auto flat = gpu::flatten(c.view, static_cast<std::int64_t>(source.size()));
    const auto n = static_cast<std::size_t>(flat.numel);
    std::vector<std::uint16_t> expect(n);
    plan::gather(c.view, source.data(), 2, expect.data());
    gpu::device_buffer d_packed(n * 2);
    gpu::gather(flat, d_source.data(), 2, d_packed.data());
    report(to_host<std::uint16_t>(d_packed, n) == expect, std::string("gather ") + c.name);

    gpu::device_buffer d_back(source.size() * 2);
    {
      std::vector<std::uint16_t> zeros(source.size(), 0), expect_back(source.size(), 0);
      gpu::copy(d_back.data(), zeros.data(), d_back.size(), gpu::copy_kind::host_to_device);
      gpu::scatter_host(flat, expect.data(), 2, expect_back.data());
      gpu::scatter(flat, d_packed.data(), 2, d_back.data());
      report(to_host<std::uint16_t>(d_back, source.size()) == expect_back, std::string("scatter ") + c.name);
    }
  }
}

/// Every 16-bit pattern (normals, subnormals, infinities, NaNs) widened,
/// then fp32 values around every rounding boundary narrowed.
void check_convert() {
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i)
    all[i] = static_cast<std::uint16_t>(i);
  auto d_all = to_device(all);
  for (dtype t : {dtype::bf16, dtype::f16}) {
    std::vector<float> expect(all.size());
    convert_to_f32(t, all.data(), expect.data(), all.size());
    gpu::device_buffer d_wide(all.size() * 4);
    gpu::convert(t, d_all.data(), dtype::f32, d_wide.data(), all.size());
    auto got = to_host<float>(d_wide, all.size());
    report(std::memcmp(got.data(), expect.data(), got.size() * 4) == 0,
           std::string("convert every ") + std::string(short_name(t)) + " to f32");

    std::vector<float> narrow_in;
    for (float x : expect) {
      narrow_in.push_back(x);
      narrow_in.push_back(std::nextafter(x, std::numeric_limits<float>::infinity()));
      narrow_in.push_back(std::nextafter(x, -std::numeric_limits<float>::infinity()));
    }
    std::vector<std::uint16_t> expect_narrow(narrow_in.size());
    convert_from_f32(t, narrow_in.data(), expect_narrow.data(), narrow_in.size());
    auto d_in = to_device(narrow_in);
    gpu::device_buffer d_narrow(narrow_in.size() * 2);
    gpu::convert(dtype::f32, d_in.data(), t, d_narrow.data(), narrow_in.size());
    report(to_host<std::uint16_t>(d_narrow, narrow_in.size()) == expect_narrow,
           std::string("convert f32 to ") + std::string(short_name(t)) + " at every rounding boundary");
  }
}

void check_quantize() {
  engine::parameter p;
  p.name = "model.layers.0.mlp.down_proj.weight";
  p.shape = {37, 300};
  p.type = dtype::bf16;
  std::vector<float> values(37 * 300);
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = std::sin(static_cast<float>(i) * 0.37f) * static_cast<float>(1 + i % 11);
  for (std::size_t k = 0; k < 300; ++k)
    values[5 * 300 + k] = 0.0f; // an all-zero row
  values[9 * 300 + 17] = std::numeric_limits<float>::quiet_NaN(); // a non-finite row
  p.bytes.resize(values.size() * 2);
  convert_from_f32(dtype::bf16, values.data(), p.bytes.data(), values.size());
  engine::quantize_int8(p);

  auto d_matrix = to_device(p.bytes);
  gpu::device_buffer d_scales(37 * 4), d_q(37 * 300);
  gpu::quantize_int8(dtype::bf16, d_matrix.data(), 37, 300, static_cast<float*>(d_scales.data()),
                     static_cast<std::int8_t*>(d_q.data()));
  auto scales = to_host<float>(d_scales, 37);
  auto q = to_host<std::int8_t>(d_q, 37 * 300);
  report(std::memcmp(scales.data(), p.scales.data(), 37 * 4) == 0 && q == p.q,
         "int8 process step of a bf16 [37, 300] matrix (a zero row, a NaN row)");
}

void check_mixsum() {
  std::vector<unsigned char> bytes((1 << 22) + 13);
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<unsigned char>((i * 2654435761u) >> 11);
  auto d = to_device(bytes);
  report(gpu::mixsum64_device(d.data(), bytes.size()) == gpu::mixsum64(bytes.data(), bytes.size()),
         "mixsum64 of 4 MiB + 13 bytes");
  // An unaligned start takes the byte-wise loads.
  const auto* at = static_cast<const unsigned char*>(d.data()) + 3;
  report(gpu::mixsum64_device(at, 1000) == gpu::mixsum64(bytes.data() + 3, 1000), "mixsum64 of an unaligned piece");
}

/// A worker's group packed on the device from the device copy of the
/// version, bit for bit the host pack device's bytes and mixsum64 trailer
/// (which the CPU tests check against transfer::pack_group).
void check_device_pack() {
  const model_config c = test::tiny_config();
  const auto source = test::make_source(c, dtype::bf16, 5);
  std::vector<std::uint8_t> storage;
  for (const auto& spec : source.specs) {
    const auto& b = source.bytes.at(spec.name);
    storage.insert(storage.end(), b.begin(), b.end());
  }
  auto s = transfer::weight_snapshot::from_bytes(1, c, source.specs, std::move(storage));
  auto on_gpu = gpu::cuda_pack_device();
  auto on_host = gpu::host_pack_device();
  gpu::device_snapshot gpu_copy(*s, *on_gpu), host_copy(*s, *on_host);
  for (int tp : {1, 2}) {
    bool same = true;
    for (int w = 0; w < tp; ++w) {
      plan::grouped_plan p(c, std::make_shared<const plan::worker_plan>(engine::make_plan(c, tp, w, dtype::bf16)));
      for (auto g : s->groups()) {
        const auto layout = gpu::layout_group(p, g, *s);
        std::vector<std::uint8_t> expect(layout.bytes + 8);
        on_host->pack(layout, host_copy.sources(), expect.data());
        gpu::device_buffer out(expect.size());
        on_gpu->pack(layout, gpu_copy.sources(), out.data());
        same = same && to_host<std::uint8_t>(out, expect.size()) == expect;
      }
    }
    report(same, "every worker's groups packed on the device from its copy of the version, tp " + std::to_string(tp));
  }
}

// A PyTorch rank publishing CUDA tensors: the push reads them from device
// memory into host memory and into a device copy, which the trainer's pack
// device adopts; both give the host path's bytes.
void check_device_push() {
  const model_config c = test::tiny_config();
  const auto source = test::make_source(c, dtype::bf16, 5);
  std::vector<gpu::device_buffer> tensors;
  std::vector<transfer::tensor_input> inputs;
  for (const auto& spec : source.specs) {
    tensors.push_back(to_device(source.bytes.at(spec.name)));
    inputs.push_back({spec.name, spec.type, spec.shape, tensors.back().data(), spec.bytes(), 0});
  }
  transfer::external_options o;
  o.config = c;
  o.type = dtype::bf16;
  o.device = gpu::cuda_tensor_device();
  o.device_copy_on = 0;
  transfer::external_source pushed(o);
  pushed.push(1, inputs);
  auto s = pushed.advance();
  bool host_same = true;
  for (const auto& t : s->tensors())
    host_same = host_same && std::memcmp(t.data, source.bytes.at(t.name).data(), t.size) == 0;
  report(host_same, "CUDA tensors pushed: their host bytes");
  auto on_gpu = gpu::cuda_pack_device();
  auto adopted_copy = gpu::device_snapshot::adopt(*s, *on_gpu);
  report(adopted_copy != nullptr, "CUDA tensors pushed: the trainer's device copy is the push's, adopted");
  if (!adopted_copy)
    return;
  const auto& adopted = *adopted_copy;
  bool same = true;
  plan::grouped_plan p(c, std::make_shared<const plan::worker_plan>(engine::make_plan(c, 2, 1, dtype::bf16)));
  for (auto g : s->groups()) { // against the CPU pack of the host bytes (the host pack device would adopt the copy too)
    const auto layout = gpu::layout_group(p, g, *s);
    std::vector<std::uint8_t> expect(layout.bytes + transfer::checksum_trailer_bytes);
    transfer::pack_group(p, g, *s, expect.data());
    transfer::write_checksum_trailer(gpu::mixsum64(expect.data(), layout.bytes), expect.data() + layout.bytes);
    gpu::device_buffer out(expect.size());
    on_gpu->pack(layout, adopted.sources(), out.data());
    same = same && to_host<std::uint8_t>(out, expect.size()) == expect;
  }
  report(same, "CUDA tensors pushed: worker 1 of tp 2 packed from the adopted copy");
}

// Greedy generation on one engine_core: `before` tokens, then (when
// `next` is given) pause(keep, clear_cache), load `next`, resume, and the
// rest: the seed documents' correctness check, with the products on the GPU.
std::vector<std::int32_t> generate(engine::engine_core& core, const std::vector<std::int32_t>& prompt,
                                   std::uint32_t tokens, std::size_t pause_after = 0,
                                   std::shared_ptr<engine::weight_set> next = nullptr) {
  generate_request req;
  req.request_id = 1;
  req.prompt = prompt;
  req.sampling.max_tokens = tokens;
  req.sampling.stop_at_eos = false;
  std::vector<std::int32_t> out;
  if (auto failed = core.add(req, {[&](const token_event& e) { out.push_back(e.token); }, [](generate_result) {}}))
    throw std::runtime_error("add: " + failed->what);
  bool paused = false;
  for (int i = 0; i < 10000 && core.has_work(); ++i) {
    core.step();
    if (next && !paused && out.size() == pause_after) {
      core.pause({pause_mode::keep, true});
      core.load(next, 2);
      core.resume();
      paused = true;
    }
  }
  return out;
}

/// The engine with its products on the GPU (cuBLAS) against the CPU
/// kernels: logits equal to rounding, the correctness check bit for bit
/// between two GPU engines, and the decode speed of both.
void check_engine() {
  const auto config = test::tiny_config();
  const auto prompt = engine::encode("weights on the device");
  for (int tp : {1, 2})
    for (auto format : {engine::weight_format::received, engine::weight_format::int8}) {
      const std::string what = "engine on the GPU, tp " + std::to_string(tp) + ", " + engine::to_string(format);
      auto v1 = test::make_source(config, dtype::bf16, 1), v2 = test::make_source(config, dtype::bf16, 2);
      engine::model cpu(config, tp, dtype::bf16), gpu_model(config, tp, dtype::bf16);
      gpu_model.set_device(gpu::make_engine_device(0));
      auto set = v1.load(tp);
      engine::process_weights(*set, format);
      cpu.set_weights(set);
      gpu_model.set_weights(set);
      auto seq_cpu = cpu.new_sequence(), seq_gpu = gpu_model.new_sequence();
      auto a = cpu.forward({{&seq_cpu, prompt, 0, true}});
      auto b = gpu_model.forward({{&seq_gpu, prompt, 0, true}});
      float scale = 0, worst = 0;
      for (std::size_t i = 0; i < a.logits.size(); ++i) {
        scale = std::max(scale, std::fabs(a.logits[i]));
        worst = std::max(worst, std::fabs(a.logits[i] - b.logits[i]));
      }
      report(a.logits.size() == b.logits.size() && worst <= 1e-4f * std::max(scale, 1.0f),
             what + ": every prompt position's logits within 1e-4 of the CPU's (max diff " + std::to_string(worst)
               + " of " + std::to_string(scale) + ")");

      engine::engine_options opts;
      opts.tp = tp;
      opts.weights = format;
      opts.device = gpu::make_engine_device(0);
      engine::engine_core updated(config, opts), fresh(config, opts);
      updated.load(v1.load(tp), 1);
      fresh.load(v2.load(tp), 2);
      const std::size_t pause_after = 3;
      const std::uint32_t max_tokens = 10;
      auto all = generate(updated, prompt, max_tokens, pause_after, v2.load(tp));
      auto prefix = prompt;
      prefix.insert(prefix.end(), all.begin(), all.begin() + static_cast<long>(pause_after));
      auto expect = generate(fresh, prefix, max_tokens - static_cast<std::uint32_t>(pause_after));
      std::vector<std::int32_t> after(all.begin() + static_cast<long>(pause_after), all.end());
      report(all.size() == max_tokens && after == expect,
             what + ": pause(keep, clear_cache), update, resume equals a fresh GPU engine on the new weights");
    }
}

// A set landed from device memory (as the nccl puller lands the link's
// staging) is served from the landing: its logits are those of the bytes
// landed, bit for bit, whatever the host set holds.
void check_engine_landing() {
  const auto config = test::tiny_config();
  const auto prompt = engine::encode("landed on the device");
  auto v1 = test::make_source(config, dtype::bf16, 1), v2 = test::make_source(config, dtype::bf16, 2);
  int refused = 0;
  auto logits_of = [&](const std::shared_ptr<engine::weight_set>& host, const engine::weight_set* landed_from) {
    auto backend = gpu::make_engine_device(0);
    engine::model m(config, 1, dtype::bf16);
    m.set_device(backend);
    std::vector<gpu::device_buffer> keep;
    if (landed_from) {
      host->landed = backend->landing(*host);
      const auto mine = engine::matrices_of(*host), theirs = engine::matrices_of(*landed_from);
      for (std::size_t i = 0; i < mine.size(); ++i) {
        keep.emplace_back(theirs[i].bytes());
        gpu::copy(keep.back().data(), theirs[i].ref.data, theirs[i].bytes(), gpu::copy_kind::host_to_device);
        refused += host->landed->land(static_cast<const std::uint8_t*>(mine[i].ref.data), keep.back().data(),
                                      mine[i].bytes(), 0)
                     ? 0
                     : 1;
      }
    }
    m.set_weights(host);
    auto seq = m.new_sequence();
    return m.forward({{&seq, prompt, 0, true}}).logits;
  };
  const auto uploaded = logits_of(v2.load(1), nullptr);
  const auto landed = logits_of(v2.load(1), v2.load(1).get());
  const auto other = logits_of(v2.load(1), v1.load(1).get());
  const auto v1_uploaded = logits_of(v1.load(1), nullptr);
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  report(refused == 0 && same(landed, uploaded), "engine on the GPU: a version landed from device memory (every "
                                                 "run taken) gives the uploaded version's logits bit for bit");
  report(same(other, v1_uploaded) && !same(other, uploaded),
         "engine on the GPU: the landed bytes are what it serves (landed v1 under host v2 gives v1's logits)");
}

} // namespace

int main() {
  auto info = gpu::query_devices();
  if (!info.compiled_with_cuda || info.device_count == 0) {
    std::printf("skipping gpu tests: %s\n", info.detail.c_str());
    return 77;
  }
  std::printf("device: %s\n", info.detail.c_str());
  try {
    check_replay();
    check_convert();
    check_quantize();
    check_mixsum();
    check_device_pack();
    check_device_push();
    check_engine();
    check_engine_landing();
  } catch (const std::exception& e) {
    report(false, std::string("threw: ") + e.what());
  }
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
