#pragma once
// Where the engine runs its matrix products when it serves from a device:
// a device_backend keeps a copy of every matrix of the weight set served
// (a device_weights, made once per set_weights: a weight update reaches the
// memory that serves with at most one upload per version), and every
// matmul_nt of a forward step runs there. Norms, attention, RoPE and the
// reductions stay on the CPU, in fp32, as before.
//
// runtime/ does not stand on gpu/, so the engine only knows this interface;
// gpu/engine_device.hpp builds the CUDA (cuBLAS) backend, and the tests a
// CPU one that checks the plumbing. The kernels' argument convention is
// kept (kernels.hpp): `w` is the address the CPU kernel would read, inside
// one of the set's matrices, and the backend finds its own copy from it
// (matrix_index).
#include "runtime/engine/kernels.hpp"
#include "runtime/engine/weights.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace rlsync::engine {

/// One matrix of a weight set as the CPU kernels read it: its elements
/// start at `ref.data` ([rows, cols], row-major; int8 with row scales when
/// the set is processed).
struct matrix_ref {
  kernels::typed_ptr ref;
  std::int64_t rows = 0, cols = 0;
  std::string name; ///< "worker/parameter", for errors

  std::size_t element_size() const { return ref.int8() ? 1 : dtype_size(ref.type); }
  std::size_t bytes() const {
    return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) * element_size();
  }
};

/// Every two-dimensional parameter of every worker of `w` (what the
/// forward pass multiplies by), in worker and parameter order.
std::vector<matrix_ref> matrices_of(const weight_set& w);

/// Finds which matrix a kernel address points into, and where: the
/// lookup a device copy needs to serve `L.o + c * width` and the like.
class matrix_index {
public:
  explicit matrix_index(const std::vector<matrix_ref>& matrices);
  struct location {
    std::size_t matrix;   ///< index into the vector given
    std::int64_t element; ///< elements from the matrix's start
  };
  /// Throws std::logic_error naming the address when it lies in no matrix
  /// (the engine asked for a product over something it never mirrored).
  location locate(const void* address) const;
  /// As locate, or nullopt where locate throws.
  std::optional<location> find(const void* address) const;

private:
  struct range {
    const unsigned char* begin;
    const unsigned char* end;
    std::size_t element_size;
    std::size_t matrix;
  };
  std::vector<range> ranges_; // sorted by begin
};

/// The served set's matrices, held by a device.
class device_weights {
public:
  virtual ~device_weights() = default;
  /// As kernels::matmul_nt (out[r * ldo + j] = sum_k a[r * lda + k] *
  /// w[j * ldw + k]), computed on the device over its copy of the matrix
  /// `w` points into; a, out are host memory. Only the rows x n elements
  /// of out are written.
  virtual void matmul_nt(const float* a, std::int64_t lda, kernels::typed_ptr w, std::int64_t ldw, float* out,
                         std::int64_t ldo, std::int64_t rows, std::int64_t n, std::int64_t depth) const = 0;
  /// Device bytes this copy holds.
  virtual std::uint64_t bytes() const = 0;
};

/// The device copy of a staging set, filled run by run while a session's
/// bytes arrive. The base keeps the books (which elements of which matrix
/// landed); a backend copies.
class device_landing {
public:
  /// For `w`, which must be unprocessed (its matrices as received).
  explicit device_landing(const weight_set& w);
  virtual ~device_landing() = default;
  /// Copies the `bytes` bytes at `source`, memory of CUDA device `device`,
  /// to where the set's host bytes at `host_at` are mirrored (widened as
  /// mirror() would). Returns false and copies nothing when they are not
  /// whole elements of one matrix (a norm stays on the CPU) or lie on a
  /// device the backend does not read from. Safe for concurrent calls.
  /// Throws what the copy throws (gpu_error).
  bool land(const std::uint8_t* host_at, const void* source, std::size_t bytes, int device);
  /// Ends the landing: later runs are refused, and what the backend holds
  /// for it is freed (a session aborted, a failed finish, a set served).
  /// A pull still running on another thread then lands nothing more.
  void close();
  /// Whether runs on `device` would be taken now (open, and a device the
  /// backend reads from): a puller asks before it packs anything for them.
  bool accepts(int device) const;
  /// Whether the runs landed in matrix `m` (matrices() order) cover each
  /// of its elements exactly once: a gap or an overlap leaves it to the
  /// upload.
  bool complete(std::size_t m) const;
  /// The matrices of the set it was made for, as matrices_of gave them.
  const std::vector<matrix_ref>& matrices() const { return matrices_; }

protected:
  /// Copies `count` elements from `source` (on `device`) to elements
  /// [element, element + count) of matrix `m`'s copy; false when it cannot
  /// read that device. Called under the landing's lock.
  virtual bool copy_run(std::size_t m, std::int64_t element, std::int64_t count, const void* source, int device) = 0;
  /// Whether runs on `device` can be copied at all (checked before the lock).
  virtual bool reads(int device) const = 0;
  /// Frees what the backend holds for the landing. Called once, under the lock.
  virtual void release() = 0;
  /// The landing's lock, for a backend's own use of what copy_run fills.
  std::mutex& lock() const { return mutex_; }

private:
  std::vector<matrix_ref> matrices_;
  matrix_index index_;
  mutable std::mutex mutex_;
  /// Per matrix, the (first element, count) runs landed.
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> runs_;
  bool closed_ = false;
};

/// Whether matrix `m` of `w` can be taken from its landing: the set was
/// landed (w.landed), is still as received (same addresses and types as
/// when the landing was made) and the runs cover the matrix exactly.
bool matrix_landed(const weight_set& w, const std::vector<matrix_ref>& matrices, std::size_t m);

/// Makes the device copy of each weight set the engine serves.
class device_backend {
public:
  virtual ~device_backend() = default;
  /// Copies every matrix of `w` (matrices_of) to the device. Called by
  /// model::set_weights before the set is served; throws on failure (the
  /// set is then not served).
  virtual std::shared_ptr<const device_weights> mirror(const weight_set& w) = 0;
  /// A landing for `w`, the staging set of a session whose pull begins,
  /// that mirror(w) takes from; null (the default) when it lands nothing.
  virtual std::shared_ptr<device_landing> landing(const weight_set& w) const {
    (void)w;
    return nullptr;
  }
  /// What it runs on, for logs and `rlsync generate --json`: "cuda:0 (NVIDIA H200)".
  virtual std::string name() const = 0;
};

} // namespace rlsync::engine
