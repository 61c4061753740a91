#include "runtime/engine/weight_view.hpp"

#include <cstring>
#include <stdexcept>

namespace rlsync::engine {

using plan::gather;
using plan::strided;

namespace {

// Where elements [dst_offset, dst_offset + count) of `dst` lie; throws as
// store_packed says.
unsigned char* store_at(parameter& dst, std::int64_t dst_offset, std::int64_t count) {
  if (dst_offset < 0 || count < 0 || dst_offset + count > dst.numel())
    throw std::out_of_range("store into '" + dst.name + "': elements [" + std::to_string(dst_offset) + ", "
                            + std::to_string(dst_offset + count) + ") outside its " + std::to_string(dst.numel()));
  if (dst.bytes.size() != static_cast<std::size_t>(dst.numel()) * dtype_size(dst.type))
    throw std::logic_error("store into '" + dst.name + "': the parameter holds no data");
  return dst.bytes.data() + static_cast<std::size_t>(dst_offset) * dtype_size(dst.type);
}

} // namespace

void store_packed(const void* packed, dtype type, std::int64_t count, parameter& dst, std::int64_t dst_offset) {
  unsigned char* at = store_at(dst, dst_offset, count);
  if (type == dst.type) {
    if (count > 0)
      std::memcpy(at, packed, static_cast<std::size_t>(count) * dtype_size(type));
  } else if (dst.type == dtype::f32) {
    convert_to_f32(type, packed, reinterpret_cast<float*>(at), static_cast<std::size_t>(count));
  } else { // the engine never rounds a weight it was sent
    throw std::invalid_argument("store into '" + dst.name + "': " + std::string(short_name(type))
                                + " elements into a parameter stored as " + std::string(short_name(dst.type))
                                + " would round them");
  }
}

// -- real views -----------------------------------------------------------------

namespace {

class real_view final : public weight_view {
public:
  real_view(std::shared_ptr<const std::string> name, dtype type, strided geometry, const void* data,
            std::shared_ptr<const std::vector<unsigned char>> owned)
      : name_(std::move(name)), type_(type), geometry_(std::move(geometry)), data_(data),
        owned_(std::move(owned)) {}

  const std::string& name() const override { return *name_; }
  dtype type() const override { return type_; }
  const std::vector<std::int64_t>& shape() const override { return geometry_.shape; }

  weight_ptr narrow(int dim, std::int64_t start, std::int64_t length) const override {
    return derive(plan::narrow(geometry_, dim, start, length));
  }

  weight_ptr transpose(int d0, int d1) const override { return derive(plan::transpose(geometry_, d0, d1)); }

  weight_ptr view(std::vector<std::int64_t> shape) const override {
    if (auto g = plan::reshape(geometry_, shape))
      return derive(std::move(*g));
    // Not expressible as strides: materialise the elements, then view them.
    auto copy = std::make_shared<std::vector<unsigned char>>(static_cast<std::size_t>(geometry_.numel())
                                                             * dtype_size(type_));
    gather(geometry_, data_, dtype_size(type_), copy->data());
    auto g = plan::reshape(strided::dense(geometry_.shape), std::move(shape));
    return std::make_shared<real_view>(name_, type_, std::move(*g), copy->data(), copy);
  }

  void copy_into(parameter& dst, std::int64_t dst_offset) const override {
    const std::int64_t n = geometry_.numel();
    const std::size_t es = dtype_size(type_);
    if (geometry_.contiguous()) {
      // Already packed in the source: convert straight from it.
      store_packed(static_cast<const unsigned char*>(data_) + geometry_.offset * static_cast<std::int64_t>(es),
                   type_, n, dst, dst_offset);
      return;
    }
    if (type_ == dst.type) { // nothing to convert: gathered straight into place
      gather(geometry_, data_, es, store_at(dst, dst_offset, n));
      return;
    }
    // Step 5: the staging buffer, reused by this thread across copies (so
    // at most one copy of the largest parameter slice per loading thread).
    thread_local std::vector<unsigned char> staging;
    staging.resize(static_cast<std::size_t>(n) * es);
    gather(geometry_, data_, es, staging.data());
    store_packed(staging.data(), type_, n, dst, dst_offset);
  }

private:
  weight_ptr derive(strided g) const { return std::make_shared<real_view>(name_, type_, std::move(g), data_, owned_); }

  std::shared_ptr<const std::string> name_;
  dtype type_;
  strided geometry_;
  const void* data_;
  std::shared_ptr<const std::vector<unsigned char>> owned_; // a materialised copy, if any
};

} // namespace

weight_ptr real_weight(std::string name, dtype type, std::vector<std::int64_t> shape, const void* data) {
  return std::make_shared<real_view>(std::make_shared<const std::string>(std::move(name)), type,
                                     strided::dense(shape), data, nullptr);
}

} // namespace rlsync::engine
