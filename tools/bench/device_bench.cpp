// rlsync-device-bench: the GPU speed of light and the GPU planes' kernels,
// as a Markdown table (tools/device-check runs it after the gpu tests).
//
//   rlsync-device-bench [--bytes N]      figures on device 0; exit 77 without one
//   rlsync-device-bench --ipc-child HEX BYTES CHECKSUM
//                                        (internal) the second process of the IPC row
//   rlsync-device-bench --backend-child HEX BUFFER OFFSET BYTES CHECKSUM
//                                        (internal) the engine process of the cuda_ipc row
//
// Every figure is the median of 5 timed repetitions after one warm-up, on a
// steady clock around calls that return once the device is done. Exits 1
// when a checksum disagrees across processes or a call fails.
#include "gpu/cuda_ipc.hpp"
#include "gpu/device.hpp"
#include "gpu/engine_device.hpp"
#include "gpu/ipc_producer.hpp"
#include "gpu/kernels.hpp"
#include "gpu/mixsum.hpp"
#include "runtime/base/stats.hpp"
#include "runtime/engine/kernels.hpp"
#include "runtime/engine/model.hpp"
#include "runtime/plan/strided.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

extern char** environ;

using namespace rlsync;

namespace {

using seconds = std::chrono::duration<double>;

double median_seconds(const std::function<void()>& run) {
  run(); // warm-up: first-touch, module load
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    t.push_back(seconds(std::chrono::steady_clock::now() - start).count());
  }
  return median(std::move(t));
}

void row(const std::string& what, double bytes, double s, const std::string& note = "") {
  std::printf("| %s | %.1f GB/s | %.3f ms | %s |\n", what.c_str(), bytes / s / 1e9, s * 1e3, note.c_str());
}

std::string hex(const gpu::ipc_handle& h) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (auto b : h) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

bool unhex(const std::string& s, gpu::ipc_handle& h) {
  if (s.size() != 2 * h.size())
    return false;
  for (std::size_t i = 0; i < h.size(); ++i) {
    char* end = nullptr;
    const std::string pair = s.substr(2 * i, 2);
    h[i] = static_cast<std::uint8_t>(std::strtoul(pair.c_str(), &end, 16));
    if (end != pair.c_str() + 2)
      return false;
  }
  return true;
}

/// The second process: maps the parent's buffer, times device-to-device
/// copies out of it, and checks what it copied.
int ipc_child(const std::string& handle_hex, std::size_t bytes, std::uint64_t expect) {
  gpu::ipc_handle h{};
  if (!unhex(handle_hex, h)) {
    std::fprintf(stderr, "bad handle\n");
    return 2;
  }
  gpu::ipc_mapping mapped(h, bytes);
  gpu::device_buffer mine(bytes);
  const double s = median_seconds(
    [&] { gpu::copy(mine.data(), mapped.data(), bytes, gpu::copy_kind::device_to_device); });
  const bool same = gpu::mixsum64_device(mine.data(), bytes) == expect;
  row("CUDA IPC, a second process copies out of the mapped buffer", static_cast<double>(bytes), s,
      same ? "checksum equal" : "CHECKSUM DIFFERS");
  return same ? 0 : 1;
}

/// The cuda_ipc backend's engine side: maps the trainer's exported buffer as
/// ipc_puller does, times copying one slot's chunk out to host memory, and
/// checks what it copied.
int backend_child(const std::string& handle_hex, std::size_t buffer_bytes, std::size_t offset, std::size_t bytes,
                  std::uint64_t expect) {
  gpu::ipc_handle h{};
  if (!unhex(handle_hex, h)) {
    std::fprintf(stderr, "bad handle\n");
    return 2;
  }
  auto mapping = gpu::cuda_ipc_memory()->map(h, buffer_bytes);
  std::vector<std::uint8_t> out(bytes);
  const double s = median_seconds([&] { mapping->read(offset, out.data(), bytes); });
  const bool same = gpu::mixsum64(out.data(), bytes) == expect;
  row("cuda_ipc backend: the engine process copies its slot out (device to host, pageable)",
      static_cast<double>(bytes), s, same ? "checksum equal" : "CHECKSUM DIFFERS");
  return same ? 0 : 1;
}

/// Runs this binary again with `args` (after argv[0]) and returns its exit code.
int run_child(const std::vector<std::string>& child_args) {
  const char* self = "/proc/self/exe"; // argv[0] may be a bare name found on PATH
  std::vector<std::string> args{"rlsync-device-bench"};
  args.insert(args.end(), child_args.begin(), child_args.end());
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  std::fflush(stdout);
  if (posix_spawn(&pid, self, nullptr, nullptr, argv.data(), environ) != 0) {
    std::printf("| %s | - | - | could not start the second process |\n", child_args[0].c_str());
    return 1;
  }
  int status = 0;
  pid_t waited = -1;
  do
    waited = waitpid(pid, &status, 0);
  while (waited < 0 && errno == EINTR);
  if (waited != pid)
    return 1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int run_ipc(const gpu::device_buffer& buf, std::uint64_t sum) {
  return run_child({"--ipc-child", hex(gpu::export_buffer(buf)), std::to_string(buf.size()), std::to_string(sum)});
}

/// The cuda_ipc backend's own classes on the device: a producer of two
/// slots writes a chunk from pageable host memory into the second (as the
/// trainer does, synchronized), and another process maps and reads it.
int run_backend(std::size_t bytes) {
  std::vector<std::uint8_t> chunk(bytes);
  for (std::size_t i = 0; i < bytes; ++i)
    chunk[i] = static_cast<std::uint8_t>(i * 131 + 7);
  gpu::ipc_producer producer(gpu::cuda_ipc_memory(), bytes, 2);
  gpu::ipc_placement at;
  producer.place("bench/0", 0, 0, chunk.data(), bytes); // the first slot
  const double s = median_seconds([&] {
    at = producer.place("bench/1", 0, 0, chunk.data(), bytes); // each a new session of the second
  });
  row("cuda_ipc backend: the trainer writes a slot (host to device, pageable, synchronized)",
      static_cast<double>(bytes), s);
  gpu::ipc_handle h = at.handle;
  return run_child({"--backend-child", hex(h), std::to_string(at.buffer_bytes), std::to_string(at.offset),
                    std::to_string(at.bytes), std::to_string(gpu::mixsum64(chunk.data(), bytes))});
}

// The built-in engine's decode, CPU kernels against cuBLAS (gpu/engine_device.hpp):
// a Llama of 8 layers, hidden 1024, 16 heads (8 kv), intermediate 2816 and
// a 32000-token vocabulary (about 150 M parameters, bf16 as received),
// 8 sequences prefilled with 32 tokens, then 16 greedy decode steps of the
// batch. Prints tokens per second of each and how many greedy tokens agree.
void bench_engine_decode() {
  model_config c;
  c.vocab_size = 32000;
  c.hidden_size = 1024;
  c.intermediate_size = 2816;
  c.num_hidden_layers = 8;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  c.max_position_embeddings = 2048;
  const int batch = 8, prompt = 32, steps = 16;
  auto set = engine::weight_set::make(c, 1, dtype::bf16);
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  for (auto& p : set->workers[0].params()) {
    auto& param = const_cast<engine::parameter&>(p);
    std::vector<float> v(static_cast<std::size_t>(param.numel()));
    const float scale = param.shape.size() == 1 ? 0.0f : 1.7f / std::sqrt(static_cast<float>(param.shape.back()));
    for (auto& x : v) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const float u = static_cast<float>(static_cast<std::int64_t>(state >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
      x = param.shape.size() == 1 ? 1.0f : scale * u;
    }
    convert_from_f32(dtype::bf16, v.data(), param.bytes.data(), v.size());
  }
  auto decode = [&](engine::model& m, std::vector<std::int32_t>& tokens) {
    std::vector<engine::kv_sequence> seqs;
    for (int i = 0; i < batch; ++i)
      seqs.push_back(m.new_sequence());
    std::vector<engine::forward_item> items;
    for (int i = 0; i < batch; ++i) {
      std::vector<std::int32_t> ids;
      for (int t = 0; t < prompt; ++t)
        ids.push_back((i * 131 + t * 17) % 256);
      items.push_back({&seqs[static_cast<std::size_t>(i)], ids, 0, false});
    }
    auto out = m.forward(items); // the prefill, untimed
    const auto start = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) {
      for (int i = 0; i < batch; ++i) {
        const float* row = out.last(static_cast<std::size_t>(i));
        const auto next = static_cast<std::int32_t>(std::max_element(row, row + out.vocab) - row);
        tokens.push_back(next);
        items[static_cast<std::size_t>(i)] = {&seqs[static_cast<std::size_t>(i)], {next},
                                              seqs[static_cast<std::size_t>(i)].length(), false};
      }
      out = m.forward(items);
    }
    return seconds(std::chrono::steady_clock::now() - start).count();
  };
  engine::model cpu(c, 1, dtype::bf16), on_gpu(c, 1, dtype::bf16);
  on_gpu.set_device(gpu::make_engine_device(0));
  cpu.set_weights(set);
  on_gpu.set_weights(set);
  std::vector<std::int32_t> cpu_tokens, gpu_tokens;
  const double cpu_s = decode(cpu, cpu_tokens), gpu_s = decode(on_gpu, gpu_tokens);
  std::size_t agree = 0;
  for (std::size_t i = 0; i < cpu_tokens.size(); ++i)
    agree += cpu_tokens[i] == gpu_tokens[i] ? 1 : 0;
  const double tokens = static_cast<double>(batch * steps);
  std::printf("| engine decode on the CPU (%s kernels, one worker thread) | %.0f tokens/s | %.3f ms a step | "
              "batch %d, ~150M bf16 parameters |\n",
              engine::kernels::variant(), tokens / cpu_s, cpu_s / steps * 1e3, batch);
  std::printf("| engine decode on the GPU (%s, cuBLAS SGEMM over fp32 copies) | %.0f tokens/s | %.3f ms a step | "
              "%zu of %zu greedy tokens as on the CPU |\n",
              on_gpu.device()->name().c_str(), tokens / gpu_s, gpu_s / steps * 1e3, agree, cpu_tokens.size());
}

int bench(std::size_t bytes) {
  auto info = gpu::query_devices();
  if (info.device_count == 0) {
    std::printf("no CUDA device: %s\n", info.detail.c_str());
    return 77;
  }
  bytes = bytes / 4 * 4;
  std::printf("device: %s, %zu MiB per figure\n\n", info.detail.c_str(), bytes >> 20);
  std::printf("| what | rate | median time | note |\n|---|---|---|---|\n");

  gpu::pinned_buffer host(bytes);
  std::memset(host.data(), 0x5a, bytes);
  gpu::device_buffer a(bytes), b(bytes);
  row("cudaMemcpy host to device (pinned)", static_cast<double>(bytes),
      median_seconds([&] { gpu::copy(a.data(), host.data(), bytes, gpu::copy_kind::host_to_device); }), "speed of light");
  row("cudaMemcpy device to host (pinned)", static_cast<double>(bytes),
      median_seconds([&] { gpu::copy(host.data(), a.data(), bytes, gpu::copy_kind::device_to_host); }), "speed of light");
  row("cudaMemcpy device to device", 2.0 * static_cast<double>(bytes),
      median_seconds([&] { gpu::copy(b.data(), a.data(), bytes, gpu::copy_kind::device_to_device); }),
      "speed of light (read + write)");

  // A bf16 matrix [rows, 4096]: the packing a tp-2 column split and a
  // transpose need, counted as bytes read plus bytes written.
  const std::int64_t cols = 4096, rows = static_cast<std::int64_t>(bytes / 2) / cols;
  const auto whole = plan::strided::dense({rows, cols});
  const auto half_cols = gpu::flatten(plan::narrow(whole, 1, cols / 2, cols / 2), rows * cols);
  const auto transposed = gpu::flatten(plan::transpose(whole, 0, 1), rows * cols);
  row("replay gather, half the columns (tp 2 split)", 2.0 * static_cast<double>(half_cols.numel) * 2,
      median_seconds([&] { gpu::gather(half_cols, a.data(), 2, b.data()); }));
  row("replay gather, transpose", 2.0 * static_cast<double>(transposed.numel) * 2,
      median_seconds([&] { gpu::gather(transposed, a.data(), 2, b.data()); }));
  const std::size_t widen = bytes / 4; // bf16 elements whose fp32 form fits in b
  row("convert bf16 to f32", static_cast<double>(widen) * 6,
      median_seconds([&] { gpu::convert(dtype::bf16, a.data(), dtype::f32, b.data(), widen); }));
  std::uint64_t sum = 0;
  row("mixsum64 checksum", static_cast<double>(bytes), median_seconds([&] { sum = gpu::mixsum64_device(a.data(), bytes); }));
  const std::int64_t qrows = 4096, qcols = static_cast<std::int64_t>(bytes / 2) / qrows;
  gpu::device_buffer scales(static_cast<std::size_t>(qrows) * 4);
  row("int8 process step of a bf16 matrix", static_cast<double>(qrows * qcols) * 3,
      median_seconds([&] {
        gpu::quantize_int8(dtype::bf16, a.data(), qrows, qcols, static_cast<float*>(scales.data()),
                           static_cast<std::int8_t*>(b.data()));
      }));

  const int ipc = run_ipc(a, sum);
  const int backend = run_backend(std::min<std::size_t>(bytes, std::size_t{256} << 20));
  std::printf("| NCCL transfers | - | - | not measured: NCCL refuses two ranks on one GPU, and libnccl "
              "(218 MB) exceeds what the device tool carries |\n");
  bench_engine_decode();
  return ipc == 0 && backend == 0 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 5 && std::string(argv[1]) == "--ipc-child")
      return ipc_child(argv[2], std::strtoull(argv[3], nullptr, 10), std::strtoull(argv[4], nullptr, 10));
    if (argc == 7 && std::string(argv[1]) == "--backend-child")
      return backend_child(argv[2], std::strtoull(argv[3], nullptr, 10), std::strtoull(argv[4], nullptr, 10),
                           std::strtoull(argv[5], nullptr, 10), std::strtoull(argv[6], nullptr, 10));
    std::size_t bytes = std::size_t{1} << 30;
    if (argc == 3 && std::string(argv[1]) == "--bytes")
      bytes = std::strtoull(argv[2], nullptr, 10);
    else if (argc != 1) {
      std::fprintf(stderr, "usage: %s [--bytes N]\n", argv[0]);
      return 2;
    }
    if (bytes < (std::size_t{64} << 20)) {
      std::fprintf(stderr, "--bytes: at least 64 MiB, got %zu\n", bytes);
      return 2;
    }
    return bench(bytes);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
