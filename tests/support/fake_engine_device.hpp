#pragma once
// A device_backend on the CPU: each mirror copies every matrix into memory
// of its own and multiplies there with the CPU kernels, so its products are
// bit for bit the CPU engine's while reading nothing of the weight set
// after set_weights. Its landings copy runs from its own device (host
// memory playing it, as the fake NCCL world's staging does) and refuse any
// other (counted, when a run is offered or a puller asks);
// a mirror takes each matrix landed whole instead of copying it. Counts
// what the engine asked of it.
#include "runtime/engine/device_gemm.hpp"

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace rlsync::test {

struct fake_device_counts {
  std::atomic<int> mirrors{0};
  std::atomic<int> landings{0};         ///< landings made
  std::atomic<long> landed_runs{0};     ///< runs copied into one
  std::atomic<long> refused_runs{0};    ///< runs on another device
  std::atomic<int> released{0};         ///< landings closed
  std::atomic<long> matrices_landed{0}; ///< taken by mirrors from a landing
  std::atomic<long> matrices_copied{0}; ///< copied by mirrors from the host set
  std::atomic<long> landed_unlike_host{0}; ///< matrices taken whose landed bytes differ from the host set's
  std::atomic<long> products{0};
  std::atomic<bool> fail_next_mirror{false};
};

class fake_landing final : public engine::device_landing {
public:
  fake_landing(std::shared_ptr<fake_device_counts> counts, const engine::weight_set& w, int ordinal)
    : device_landing(w), counts_(std::move(counts)), ordinal_(ordinal) {
    for (const auto& m : matrices())
      copies_.emplace_back(m.bytes());
  }
  /// Matrix m's copy, moved out (empty after, and after close()).
  std::vector<unsigned char> take(std::size_t m) {
    std::lock_guard<std::mutex> hold(lock());
    return m < copies_.size() ? std::move(copies_[m]) : std::vector<unsigned char>();
  }

protected:
  bool reads(int device) const override {
    if (device == ordinal_)
      return true;
    ++counts_->refused_runs;
    return false;
  }
  void release() override {
    copies_.clear();
    ++counts_->released;
  }
  bool copy_run(std::size_t m, std::int64_t element, std::int64_t count, const void* source, int) override {
    const auto size = matrices()[m].element_size();
    std::memcpy(copies_[m].data() + static_cast<std::size_t>(element) * size, source,
                static_cast<std::size_t>(count) * size);
    ++counts_->landed_runs;
    return true;
  }

private:
  std::shared_ptr<fake_device_counts> counts_;
  int ordinal_;
  std::vector<std::vector<unsigned char>> copies_;
};

class fake_device_weights final : public engine::device_weights {
public:
  fake_device_weights(std::shared_ptr<fake_device_counts> counts, const engine::weight_set& w)
    : counts_(std::move(counts)), matrices_(engine::matrices_of(w)), index_(matrices_) {
    auto* landing = dynamic_cast<fake_landing*>(w.landed.get());
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const auto& m = matrices_[i];
      copy c;
      if (landing && engine::matrix_landed(w, matrices_, i)) {
        c.bytes = landing->take(i); // empty when closed: then differs from the host's, counted
        if (c.bytes.size() != m.bytes() || std::memcmp(c.bytes.data(), m.ref.data, m.bytes()) != 0)
          ++counts_->landed_unlike_host;
        bytes_ += c.bytes.size();
        ++landed_;
        ++counts_->matrices_landed;
        copies_.push_back(std::move(c));
        continue;
      }
      ++counts_->matrices_copied;
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
  std::size_t landed_ = 0;
};

class fake_device final : public engine::device_backend {
public:
  /// On CUDA device `ordinal`: its landings take runs from there only.
  explicit fake_device(int ordinal = 0) : ordinal(ordinal) {}
  const int ordinal;
  std::shared_ptr<fake_device_counts> counts = std::make_shared<fake_device_counts>();
  std::shared_ptr<const engine::device_weights> mirror(const engine::weight_set& w) override {
    if (counts->fail_next_mirror.exchange(false))
      throw std::runtime_error("fake device: out of memory");
    ++counts->mirrors;
    return std::make_shared<fake_device_weights>(counts, w);
  }
  std::shared_ptr<engine::device_landing> landing(const engine::weight_set& w) const override {
    ++counts->landings;
    return std::make_shared<fake_landing>(counts, w, ordinal);
  }
  std::string name() const override { return "fake"; }
};

} // namespace rlsync::test
