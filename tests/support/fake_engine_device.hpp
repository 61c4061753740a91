#pragma once
// A device_backend on the CPU: each mirror copies every matrix into memory
// of its own and multiplies there with the CPU kernels, so its products are
// bit for bit the CPU engine's while reading nothing of the weight set
// after set_weights. Counts what the engine asked of it.
#include "runtime/engine/device_gemm.hpp"

#include <atomic>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

namespace rlsync::test {

struct fake_device_counts {
  std::atomic<int> mirrors{0};
  std::atomic<long> products{0};
  std::atomic<bool> fail_next_mirror{false};
};

class fake_device_weights final : public engine::device_weights {
public:
  fake_device_weights(std::shared_ptr<fake_device_counts> counts, const engine::weight_set& w)
    : counts_(std::move(counts)), matrices_(engine::matrices_of(w)), index_(matrices_) {
    for (const auto& m : matrices_) {
      copy c;
      c.bytes.resize(m.bytes());
      std::memcpy(c.bytes.data(), m.ref.data, m.bytes());
      if (m.ref.int8())
        c.scales.assign(m.ref.row_scales, m.ref.row_scales + m.rows);
      bytes_ += c.bytes.size() + c.scales.size() * sizeof(float);
      copies_.push_back(std::move(c));
    }
  }
  void matmul_nt(const float* a, std::int64_t lda, engine::kernels::typed_ptr w, std::int64_t ldw, float* out,
                 std::int64_t ldo, std::int64_t rows, std::int64_t n, std::int64_t depth) const override {
    const auto at = index_.locate(w.data);
    const auto& m = matrices_[at.matrix];
    const auto& c = copies_[at.matrix];
    engine::kernels::typed_ptr mine{c.bytes.data(), m.ref.type, m.ref.int8() ? c.scales.data() : nullptr};
    ++counts_->products;
    engine::kernels::matmul_nt(a, lda, mine + at.element, ldw, out, ldo, rows, n, depth);
  }
  std::uint64_t bytes() const override { return bytes_; }

private:
  struct copy {
    std::vector<unsigned char> bytes;
    std::vector<float> scales;
  };
  std::shared_ptr<fake_device_counts> counts_;
  std::vector<engine::matrix_ref> matrices_;
  engine::matrix_index index_;
  std::vector<copy> copies_;
  std::uint64_t bytes_ = 0;
};

class fake_device final : public engine::device_backend {
public:
  std::shared_ptr<fake_device_counts> counts = std::make_shared<fake_device_counts>();
  std::shared_ptr<const engine::device_weights> mirror(const engine::weight_set& w) override {
    if (counts->fail_next_mirror.exchange(false))
      throw std::runtime_error("fake device: out of memory");
    ++counts->mirrors;
    return std::make_shared<fake_device_weights>(counts, w);
  }
  std::string name() const override { return "fake"; }
};

} // namespace rlsync::test
