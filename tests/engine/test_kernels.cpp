// The matmul kernels on each storage dtype: 16-bit weights widened in
// registers give bit for bit what their fp32 copy gives, for every blocking
// (rows 1-5 take the 4-, 3-, 2- and 1-row paths; n covers the 6-, 3- and
// 1-column paths; depth a lane tail), and each element equals dot().
#include "runtime/engine/kernels.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

using namespace rlsync;
using namespace rlsync::engine;

namespace {

// Random fp32 values already representable in `type` (rounded through it),
// with the 16-bit encoding next to them.
struct weights_in {
  std::vector<float> f32;
  std::vector<std::uint16_t> bits;
};

weights_in make_weights(dtype type, std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  weights_in w;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = u(g);
    const std::uint16_t b = type == dtype::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
    w.bits.push_back(b);
    w.f32.push_back(type == dtype::bf16 ? bf16_to_f32(b) : f16_to_f32(b));
  }
  return w;
}

} // namespace

TEST_CASE("16-bit weights compute exactly what their fp32 copy computes") {
  INFO("kernels: " << kernels::variant());
  for (dtype type : {dtype::bf16, dtype::f16})
    for (std::int64_t rows : {1, 2, 3, 4, 5})
      for (std::int64_t n : {1, 4, 7, 13})
        for (std::int64_t depth : {5, 16, 37}) {
          CAPTURE(short_name(type));
          CAPTURE(rows);
          CAPTURE(n);
          CAPTURE(depth);
          const std::int64_t ldw = depth + 3, lda = depth + 1, ldo = n + 2; // strides wider than the data
          auto w = make_weights(type, static_cast<std::size_t>(n * ldw), static_cast<std::uint32_t>(rows * 131 + n * 7 + depth));
          std::mt19937 g(static_cast<std::uint32_t>(depth));
          std::uniform_real_distribution<float> u(-1.0f, 1.0f);
          std::vector<float> a(static_cast<std::size_t>(rows * lda));
          for (auto& x : a)
            x = u(g);
          std::vector<float> wide(static_cast<std::size_t>(rows * ldo), -7.0f), narrow = wide;
          kernels::matmul_nt(a.data(), lda, w.f32.data(), ldw, wide.data(), ldo, rows, n, depth);
          kernels::matmul_nt(a.data(), lda, kernels::typed_ptr{w.bits.data(), type}, ldw, narrow.data(), ldo, rows,
                             n, depth);
          CHECK(std::memcmp(wide.data(), narrow.data(), wide.size() * sizeof(float)) == 0);
          // Each element is dot()'s sequence of operations; the padding is untouched.
          for (std::int64_t r = 0; r < rows; ++r) {
            for (std::int64_t j = 0; j < n; ++j) {
              const float d = kernels::dot(&a[static_cast<std::size_t>(r * lda)], &w.f32[static_cast<std::size_t>(j * ldw)], depth);
              CHECK(std::memcmp(&d, &narrow[static_cast<std::size_t>(r * ldo + j)], sizeof d) == 0);
            }
            CHECK(narrow[static_cast<std::size_t>(r * ldo + n)] == -7.0f);
          }
        }
}

TEST_CASE("int8 weights compute their fp32 copy's sums, each scaled by its row's scale") {
  INFO("kernels: " << kernels::variant());
  for (std::int64_t rows : {1, 3, 4, 5})
    for (std::int64_t n : {1, 6, 7})
      for (std::int64_t depth : {5, 16, 37}) {
        CAPTURE(rows);
        CAPTURE(n);
        CAPTURE(depth);
        const std::int64_t ldw = depth + 3, lda = depth + 1, ldo = n + 2;
        std::mt19937 g(static_cast<std::uint32_t>(rows * 131 + n * 7 + depth));
        std::uniform_int_distribution<int> qd(-127, 127);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        std::vector<std::int8_t> q(static_cast<std::size_t>(n * ldw));
        std::vector<float> q_f32(q.size()), scales(static_cast<std::size_t>(n)), a(static_cast<std::size_t>(rows * lda));
        for (std::size_t i = 0; i < q.size(); ++i)
          q_f32[i] = q[i] = static_cast<std::int8_t>(qd(g));
        for (auto& s : scales)
          s = 0.01f * (1.0f + u(g));
        for (auto& x : a)
          x = u(g);
        std::vector<float> plain(static_cast<std::size_t>(rows * ldo), -7.0f), int8 = plain;
        kernels::matmul_nt(a.data(), lda, q_f32.data(), ldw, plain.data(), ldo, rows, n, depth);
        kernels::matmul_nt(a.data(), lda, kernels::typed_ptr{q.data(), dtype::bf16, scales.data()}, ldw, int8.data(),
                           ldo, rows, n, depth);
        for (std::int64_t r = 0; r < rows; ++r) {
          for (std::int64_t j = 0; j < n; ++j) {
            const float want = plain[static_cast<std::size_t>(r * ldo + j)] * scales[static_cast<std::size_t>(j)];
            CHECK(std::memcmp(&want, &int8[static_cast<std::size_t>(r * ldo + j)], sizeof want) == 0);
          }
          CHECK(int8[static_cast<std::size_t>(r * ldo + n)] == -7.0f);
        }
        // A column offset keeps the rows' scales.
        auto shifted = kernels::typed_ptr{q.data(), dtype::bf16, scales.data()} + 2;
        CHECK(shifted.data == q.data() + 2);
        CHECK(shifted.row_scales == scales.data());
      }
  float out = 0;
  CHECK_THROWS_AS(kernels::widen(kernels::typed_ptr{nullptr, dtype::bf16, &out}, &out, 1), std::invalid_argument);
}

TEST_CASE("widen converts each stored dtype to fp32 exactly") {
  for (dtype type : {dtype::bf16, dtype::f16}) {
    CAPTURE(short_name(type));
    auto w = make_weights(type, 37, 3);
    std::vector<float> out(37);
    kernels::widen(kernels::typed_ptr{w.bits.data(), type}, out.data(), 37);
    CHECK(out == w.f32);
    // An offset pointer steps by the dtype's element size.
    kernels::widen(kernels::typed_ptr{w.bits.data(), type} + 5, out.data(), 32);
    CHECK(std::vector<float>(out.begin(), out.begin() + 32) == std::vector<float>(w.f32.begin() + 5, w.f32.end()));
  }
  std::vector<float> f{1.5f, -2.0f};
  std::vector<float> out(2);
  kernels::widen(kernels::typed_ptr{f.data(), dtype::f32}, out.data(), 2);
  CHECK(out == f);
}
