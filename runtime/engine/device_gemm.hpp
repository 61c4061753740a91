#pragma once
// Where the engine runs its matrix products when it serves from a device:
// a device_backend keeps a copy of every matrix of the weight set served
// (a device_weights, made once per set_weights, so a weight update lands
// in the memory that serves with one upload per version), and every
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

/// Makes the device copy of each weight set the engine serves.
class device_backend {
public:
  virtual ~device_backend() = default;
  /// Copies every matrix of `w` (matrices_of) to the device. Called by
  /// model::set_weights before the set is served; throws on failure (the
  /// set is then not served).
  virtual std::shared_ptr<const device_weights> mirror(const weight_set& w) = 0;
  /// What it runs on, for logs and `rlsync generate --json`: "cuda:0 (NVIDIA H200)".
  virtual std::string name() const = 0;
};

} // namespace rlsync::engine
