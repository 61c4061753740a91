// The device replay's indexing (gpu/flat_view) against the CPU path
// (plan::gather): the kernels index through the same source_index(), so
// agreement here plus the gpu tests' device-vs-host check covers both.
#include "gpu/flat_view.hpp"
#include "tests/gpu/view_cases.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

using namespace rlsync;
using rlsync::plan::strided;
using rlsync::test::views_of_4x6x8;

namespace {

template <class T>
std::vector<T> iota_source(std::size_t n) {
  std::vector<T> v(n);
  std::iota(v.begin(), v.end(), T{1});
  return v;
}

} // namespace

TEST_CASE("flat views gather exactly what plan::gather packs, and scatter is its inverse") {
  const auto src32 = iota_source<std::uint32_t>(4 * 6 * 8);
  const auto src16 = iota_source<std::uint16_t>(4 * 6 * 8);
  for (const auto& c : views_of_4x6x8()) {
    CAPTURE(c.name);
    const auto flat = gpu::flatten(c.view, 4 * 6 * 8);
    CHECK(flat.numel == c.view.numel());
    const auto n = static_cast<std::size_t>(c.view.numel());

    std::vector<std::uint32_t> expect(n), got(n, 0);
    plan::gather(c.view, src32.data(), 4, expect.data());
    gpu::gather_host(flat, src32.data(), 4, got.data());
    CHECK(got == expect);

    std::vector<std::uint16_t> expect16(n), got16(n, 0);
    plan::gather(c.view, src16.data(), 2, expect16.data());
    gpu::gather_host(flat, src16.data(), 2, got16.data());
    CHECK(got16 == expect16);

    // Scatter back into zeros: the view's elements return, nothing else is written.
    std::vector<std::uint32_t> back(src32.size(), 0);
    gpu::scatter_host(flat, got.data(), 4, back.data());
    std::vector<std::uint32_t> in_view(src32.size(), 0);
    for (std::int64_t i = 0; i < flat.numel; ++i) {
      const auto at = static_cast<std::size_t>(gpu::source_index(flat, i));
      in_view[at] = src32[at];
    }
    CHECK(back == in_view);
  }
}

TEST_CASE("flatten refuses views a kernel could not replay safely, naming why") {
  auto refused = [](const strided& v, std::int64_t source_numel) {
    try {
      gpu::flatten(v, source_numel);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const strided whole = strided::dense({4, 6, 8});
  CHECK(refused(whole, 4 * 6 * 8) == "accepted");
  CHECK(refused(strided::dense(std::vector<std::int64_t>(8, 2)), 256) == "accepted");
  CHECK(refused(strided::dense(std::vector<std::int64_t>(9, 2)), 512).find("9 dims") != std::string::npos);
  // A plan from an engine that lies about the source's size.
  CHECK(refused(whole, 4 * 6 * 8 - 1).find("reaches source elements [0, 191] of a tensor of 191") != std::string::npos);
  strided shifted = whole;
  shifted.offset = -1;
  CHECK(refused(shifted, 1000).find("reaches source elements [-1,") != std::string::npos);
  strided negative = whole;
  negative.strides[1] = -8;
  CHECK(refused(negative, 1000).find("stride -8") != std::string::npos);
  strided huge;
  huge.shape = {std::int64_t{1} << 40, std::int64_t{1} << 40};
  huge.strides = {1, 1};
  CHECK(refused(huge, 1000).find("overflows") != std::string::npos);
  strided mismatched = whole;
  mismatched.strides.pop_back();
  CHECK(refused(mismatched, 1000).find("3 extents but 2 strides") != std::string::npos);
  // An empty view reaches nothing, wherever it points.
  CHECK(refused(plan::narrow(whole, 0, 4, 0), 0) == "accepted");
}

TEST_CASE("scatter takes only views whose elements are distinct source elements") {
  for (const auto& c : views_of_4x6x8()) {
    CAPTURE(c.name);
    CHECK(gpu::one_to_one(gpu::flatten(c.view, 4 * 6 * 8)));
  }
  strided broadcast_rows; // expand(): every row the same 8 elements
  broadcast_rows.shape = {4, 8};
  broadcast_rows.strides = {0, 1};
  const auto flat = gpu::flatten(broadcast_rows, 8);
  CHECK(!gpu::one_to_one(flat));
  std::vector<std::uint16_t> packed(32, 1), target(8, 0);
  gpu::gather_host(flat, target.data(), 2, packed.data()); // reading twice is fine
  CHECK_THROWS_AS(gpu::scatter_host(flat, packed.data(), 2, target.data()), std::invalid_argument);
  strided interleaved; // dims [2, 3] with strides [2, 1]: element (0, 2) and (1, 0) coincide
  interleaved.shape = {2, 3};
  interleaved.strides = {2, 1};
  CHECK(!gpu::one_to_one(gpu::flatten(interleaved, 100)));
  strided single; // extent-1 dims never overlap, whatever their stride
  single.shape = {1, 5};
  single.strides = {0, 1};
  CHECK(gpu::one_to_one(gpu::flatten(single, 5)));
}
