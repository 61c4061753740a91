#include "gpu/engine_device.hpp"

#include "gpu/kernels.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace rlsync::gpu {
namespace {

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw gpu_error("engine device: " + what + ": " + cudaGetErrorString(e));
}

void check(cublasStatus_t s, const std::string& what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw gpu_error("engine device: " + what + ": " + cublasGetStatusString(s));
}

// One engine worker thread's cuBLAS handle and activation buffers: a
// handle is not to be shared between threads, and the tp workers multiply
// at once.
struct thread_context {
  cublasHandle_t handle = nullptr;
  device_buffer a, c;
  ~thread_context() {
    if (handle)
      cublasDestroy(handle);
  }
};

class contexts {
public:
  explicit contexts(int device) : device_(device) {}
  int device() const { return device_; }
  thread_context& mine() {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = by_thread_[std::this_thread::get_id()];
    if (!slot) {
      auto made = std::make_unique<thread_context>();
      check(cublasCreate(&made->handle), "cublasCreate");
      check(cublasSetMathMode(made->handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"); // no TF32
      slot = std::move(made);
    }
    return *slot;
  }

private:
  int device_;
  std::mutex mutex_;
  std::map<std::thread::id, std::unique_ptr<thread_context>> by_thread_;
};

void ensure(device_buffer& b, std::size_t bytes) {
  if (b.size() < bytes)
    b = device_buffer(bytes);
}

std::size_t elements(const engine::matrix_ref& m) {
  return static_cast<std::size_t>(m.rows) * static_cast<std::size_t>(m.cols);
}

// A staging set's fp32 copy on the device, filled as the session's runs
// arrive (from the nccl link's staging, or a group packed from an IPC
// mapping): each run widened (or copied) where mirror() would have put it
// after an upload.
class cuda_landing final : public engine::device_landing {
public:
  // Every copy made now, on the engine's thread before the pull: a
  // cudaMalloc in the middle of a collective could wait on its kernels.
  cuda_landing(std::shared_ptr<contexts> ctx, const engine::weight_set& w) : device_landing(w), ctx_(std::move(ctx)) {
    device_guard on(ctx_->device());
    copies_.reserve(matrices().size());
    for (const auto& m : matrices())
      copies_.emplace_back(elements(m) * sizeof(float));
  }
  ~cuda_landing() override { close(); } // frees the copies on their device
  const contexts* owner() const { return ctx_.get(); }
  /// Matrix m's copy, moved out: the mirror takes it once (empty after,
  /// and after close()).
  device_buffer take(std::size_t m) {
    std::lock_guard<std::mutex> hold(lock());
    return m < copies_.size() ? std::move(copies_[m]) : device_buffer();
  }

protected:
  // Another GPU's staging: those runs go up from the host at finish.
  bool reads(int device) const override { return device == ctx_->device(); }
  void release() override {
    device_guard on(ctx_->device(), std::nothrow); // freed on their device where it can be made current
    copies_.clear();
  }
  bool copy_run(std::size_t m, std::int64_t element, std::int64_t count, const void* source, int device) override {
    device_guard on(device);
    const auto& matrix = matrices()[m];
    auto& f32 = copies_[m];
    if (!f32.data()) // taken already: nothing to land in
      return false;
    auto* at = static_cast<float*>(f32.data()) + element;
    const auto n = static_cast<std::size_t>(count);
    if (matrix.ref.type == dtype::f32)
      copy(at, source, n * sizeof(float), copy_kind::device_to_device);
    else
      convert(matrix.ref.type, source, dtype::f32, at, n); // exact, as the upload's widening
    return true;
  }

private:
  std::shared_ptr<contexts> ctx_;
  std::vector<device_buffer> copies_;
};

class cuda_weights final : public engine::device_weights {
public:
  cuda_weights(std::shared_ptr<contexts> ctx, const engine::weight_set& w)
    : ctx_(std::move(ctx)), matrices_(engine::matrices_of(w)), index_(matrices_) {
    device_guard on(ctx_->device());
    copies_.reserve(matrices_.size());
    auto* landing = dynamic_cast<cuda_landing*>(w.landed.get());
    if (landing && landing->owner() != ctx_.get())
      landing = nullptr; // another backend's
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const auto& m = matrices_[i];
      const std::size_t count = elements(m);
      const bool whole = landing && engine::matrix_landed(w, matrices_, i);
      // Landed in part, its buffer is the upload's: written whole below, and not held twice meanwhile.
      device_buffer f32 = landing ? landing->take(i) : device_buffer();
      if (f32.size() != count * sizeof(float))
        f32 = device_buffer(); // not this matrix's size: never reused
      if (whole && f32.data()) {
        bytes_ += count * sizeof(float);
        copies_.push_back(std::move(f32));
        ++landed_;
        continue;
      }
      if (!f32.data())
        f32 = device_buffer(count * sizeof(float));
      if (m.ref.int8()) { // scale * q, on the host: the process step's values as the CPU kernel weighs them
        std::vector<float> host(count);
        const auto* q = static_cast<const std::int8_t*>(m.ref.data);
        for (std::int64_t j = 0; j < m.rows; ++j)
          for (std::int64_t k = 0; k < m.cols; ++k)
            host[static_cast<std::size_t>(j * m.cols + k)] = m.ref.row_scales[j] * static_cast<float>(q[j * m.cols + k]);
        copy(f32.data(), host.data(), count * sizeof(float), copy_kind::host_to_device);
      } else if (m.ref.type == dtype::f32) {
        copy(f32.data(), m.ref.data, count * sizeof(float), copy_kind::host_to_device);
      } else { // the received 16-bit bytes, widened on the device (exact)
        device_buffer raw(m.bytes());
        copy(raw.data(), m.ref.data, m.bytes(), copy_kind::host_to_device);
        convert(m.ref.type, raw.data(), dtype::f32, f32.data(), count);
      }
      bytes_ += count * sizeof(float);
      copies_.push_back(std::move(f32));
    }
  }

  void matmul_nt(const float* a, std::int64_t lda, engine::kernels::typed_ptr w, std::int64_t ldw, float* out,
                 std::int64_t ldo, std::int64_t rows, std::int64_t n, std::int64_t depth) const override {
    if (rows <= 0 || n <= 0)
      return;
    const auto at = index_.locate(w.data);
    const auto* weights = static_cast<const float*>(copies_[at.matrix].data()) + at.element;
    device_guard on(ctx_->device());
    thread_context& t = ctx_->mine();
    const auto row_bytes = static_cast<std::size_t>(depth) * sizeof(float);
    const auto out_row_bytes = static_cast<std::size_t>(n) * sizeof(float);
    ensure(t.a, row_bytes * static_cast<std::size_t>(rows));
    ensure(t.c, out_row_bytes * static_cast<std::size_t>(rows));
    check(cudaMemcpy2D(t.a.data(), row_bytes, a, static_cast<std::size_t>(lda) * sizeof(float), row_bytes,
                       static_cast<std::size_t>(rows), cudaMemcpyHostToDevice),
          "activations in");
    // Row-major out[rows, n] = a[rows, depth] w[n, depth]^T is, column-major,
    // out^T[n, rows] = w^T a^T: w read transposed with its row stride.
    const float one = 1.0f, zero = 0.0f;
    check(cublasSgemm(t.handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(rows),
                      static_cast<int>(depth), &one, weights, static_cast<int>(ldw),
                      static_cast<const float*>(t.a.data()), static_cast<int>(depth), &zero,
                      static_cast<float*>(t.c.data()), static_cast<int>(n)),
          "cublasSgemm");
    check(cudaMemcpy2D(out, static_cast<std::size_t>(ldo) * sizeof(float), t.c.data(), out_row_bytes, out_row_bytes,
                       static_cast<std::size_t>(rows), cudaMemcpyDeviceToHost),
          "products out");
  }

  std::uint64_t bytes() const override { return bytes_; }

private:
  std::shared_ptr<contexts> ctx_;
  std::vector<engine::matrix_ref> matrices_;
  engine::matrix_index index_;
  std::vector<device_buffer> copies_;
  std::uint64_t bytes_ = 0;
  std::size_t landed_ = 0;
};

class cuda_backend final : public engine::device_backend {
public:
  explicit cuda_backend(int device) : ctx_(std::make_shared<contexts>(device)) {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "device " + std::to_string(device));
    name_ = "cuda:" + std::to_string(device) + " (" + prop.name + ")";
  }
  std::shared_ptr<const engine::device_weights> mirror(const engine::weight_set& w) override {
    return std::make_shared<cuda_weights>(ctx_, w);
  }
  std::shared_ptr<engine::device_landing> landing(const engine::weight_set& w) const override {
    return std::make_shared<cuda_landing>(ctx_, w);
  }
  std::string name() const override { return name_; }

private:
  std::shared_ptr<contexts> ctx_;
  std::string name_;
};

} // namespace

std::shared_ptr<engine::device_backend> make_engine_device(int device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || device < 0 || device >= count)
    throw gpu_error("engine device: no CUDA device " + std::to_string(device) + " ("
                    + (e != cudaSuccess ? std::string(cudaGetErrorString(e))
                                        : std::to_string(count) + " visible)"));
  return std::make_shared<cuda_backend>(device);
}

} // namespace rlsync::gpu
