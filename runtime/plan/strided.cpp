#include "runtime/plan/strided.hpp"

#include <cstring>
#include <stdexcept>

namespace rlsync::plan {

// -- geometry -------------------------------------------------------------------

strided strided::dense(const std::vector<std::int64_t>& shape) {
  strided v;
  v.shape = shape;
  v.strides.assign(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;)
    v.strides[i - 1] = v.strides[i] * shape[i];
  return v;
}

std::int64_t strided::numel() const { return rlsync::numel(shape); }

bool strided::contiguous() const {
  std::int64_t expect = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expect)
      return false;
    expect *= shape[i];
  }
  return true;
}

std::size_t run_bytes(const strided& v, std::size_t element_size) {
  const std::int64_t n = v.numel();
  if (n == 0)
    return 0;
  if (v.contiguous())
    return static_cast<std::size_t>(n) * element_size;
  return v.strides.back() == 1 ? static_cast<std::size_t>(v.shape.back()) * element_size : element_size;
}

namespace {
void check_dim(const strided& v, int dim, const char* op) {
  if (dim < 0 || static_cast<std::size_t>(dim) >= v.shape.size())
    throw std::out_of_range(std::string(op) + ": dim " + std::to_string(dim) + " out of range for shape "
                            + shape_string(v.shape));
}
} // namespace

strided narrow(const strided& v, int dim, std::int64_t start, std::int64_t length) {
  check_dim(v, dim, "narrow");
  const auto d = static_cast<std::size_t>(dim);
  if (start < 0 || length < 0 || start + length > v.shape[d])
    throw std::out_of_range("narrow(" + std::to_string(dim) + ", " + std::to_string(start) + ", "
                            + std::to_string(length) + "): outside shape " + shape_string(v.shape));
  strided out = v;
  out.offset += start * v.strides[d];
  out.shape[d] = length;
  return out;
}

strided transpose(const strided& v, int d0, int d1) {
  check_dim(v, d0, "transpose");
  check_dim(v, d1, "transpose");
  strided out = v;
  std::swap(out.shape[static_cast<std::size_t>(d0)], out.shape[static_cast<std::size_t>(d1)]);
  std::swap(out.strides[static_cast<std::size_t>(d0)], out.strides[static_cast<std::size_t>(d1)]);
  return out;
}

std::optional<strided> reshape(const strided& v, std::vector<std::int64_t> shape) {
  // Resolve one -1.
  const std::int64_t numel = v.numel();
  std::int64_t known = 1;
  int infer = -1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && infer < 0)
      infer = static_cast<int>(i);
    else if (shape[i] < 0)
      throw std::invalid_argument("view(" + shape_string(shape) + "): bad dimension");
    else
      known *= shape[i];
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      throw std::invalid_argument("view(" + shape_string(shape) + "): cannot infer -1 for "
                                  + std::to_string(numel) + " elements");
    shape[static_cast<std::size_t>(infer)] = numel / known;
    known = numel;
  }
  if (known != numel)
    throw std::invalid_argument("view(" + shape_string(shape) + "): " + std::to_string(known)
                                + " elements, the tensor has " + std::to_string(numel) + " (shape "
                                + shape_string(v.shape) + ")");

  strided out;
  out.offset = v.offset;
  out.shape = shape;
  out.strides.assign(shape.size(), 1);
  if (numel == 0 || v.shape.empty())
    return strided{v.offset, shape, strided::dense(shape).strides};

  // torch's computeStride: walk the old dims from the back in chunks whose
  // elements are evenly strided, and fit the new dims into each chunk.
  auto view_d = static_cast<std::int64_t>(shape.size()) - 1;
  std::int64_t chunk_stride = v.strides.back();
  std::int64_t tensor_numel = 1, view_numel = 1;
  for (auto tensor_d = static_cast<std::int64_t>(v.shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    const auto td = static_cast<std::size_t>(tensor_d);
    tensor_numel *= v.shape[td];
    if (tensor_d == 0
        || (v.shape[td - 1] != 1 && v.strides[td - 1] != tensor_numel * chunk_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[static_cast<std::size_t>(view_d)] == 1)) {
        out.strides[static_cast<std::size_t>(view_d)] = view_numel * chunk_stride;
        view_numel *= shape[static_cast<std::size_t>(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel)
        return std::nullopt;
      if (tensor_d > 0) {
        chunk_stride = v.strides[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1)
    return std::nullopt;
  return out;
}

void gather(const strided& v, const void* source, std::size_t element_size, void* packed) {
  const auto* src = static_cast<const unsigned char*>(source);
  auto* dst = static_cast<unsigned char*>(packed);
  for_each_run(v, element_size, [&](std::int64_t at, std::size_t bytes) {
    std::memcpy(dst, src + at, bytes);
    dst += bytes;
  });
}

} // namespace rlsync::plan
