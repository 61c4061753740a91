#include "runtime/engine/process.hpp"
#include "runtime/engine/int8_bits.hpp"

#include "runtime/base/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

namespace rlsync::engine {

const char* to_string(weight_format f) { return f == weight_format::int8 ? "int8" : "received"; }

std::optional<weight_format> weight_format_of(const std::string& s) {
  if (s == "received")
    return weight_format::received;
  if (s == "int8")
    return weight_format::int8;
  return std::nullopt;
}

bool quantized_parameter(const std::string& name) {
  auto ends_with = [&](const char* suffix) {
    const std::string tail(suffix);
    return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return name.compare(0, 13, "model.layers.") == 0
         && (ends_with(param::qkv) || ends_with(param::o) || ends_with(param::gate_up) || ends_with(param::down)
             || ends_with(".gate_up_proj.weight") || ends_with(".down_proj.weight"));
}

void quantize_int8(parameter& p) {
  const std::int64_t rows = p.shape.front(), cols = p.numel() / std::max<std::int64_t>(1, rows);
  std::vector<float> row(static_cast<std::size_t>(cols));
  p.q.resize(static_cast<std::size_t>(p.numel()));
  p.scales.resize(static_cast<std::size_t>(rows));
  const std::size_t es = dtype_size(p.type);
  for (std::int64_t j = 0; j < rows; ++j) {
    convert_to_f32(p.type, p.bytes.data() + static_cast<std::size_t>(j * cols) * es, row.data(), row.size());
    float amax = 0.0f;
    bool finite = true;
    for (float x : row) {
      finite = finite && std::isfinite(x);
      amax = std::max(amax, std::fabs(x));
    }
    std::int8_t* q = p.q.data() + j * cols;
    if (!finite) { // NaN or infinity (allow_nonfinite): the row's outputs are NaN, as the engine's checks expect
      p.scales[static_cast<std::size_t>(j)] = std::numeric_limits<float>::quiet_NaN();
      std::fill(q, q + cols, std::int8_t{0});
      continue;
    }
    const float scale = int8_bits::row_scale(amax);
    p.scales[static_cast<std::size_t>(j)] = scale;
    for (std::int64_t k = 0; k < cols; ++k)
      q[k] = int8_bits::quantize(row[static_cast<std::size_t>(k)], scale);
  }
}

void process_weights(weight_set& set, weight_format f) {
  // Parameters are independent: spread them over the machine's threads.
  std::vector<parameter*> all;
  for (auto& w : set.workers)
    for (const auto& ref : w.params())
      all.push_back(&w.at(ref.name));
  const unsigned threads = std::max(1u, std::min(std::thread::hardware_concurrency(), 16u));
  parallel_for(all.size(), threads, [&](std::size_t i) {
    parameter& p = *all[i];
    if (f == weight_format::int8 && quantized_parameter(p.name) && p.shape.size() == 2 && p.holds_data()) {
      quantize_int8(p);
    } else { // released, not kept: a set that is not served holds no int8 form
      std::vector<std::int8_t>().swap(p.q);
      std::vector<float>().swap(p.scales);
    }
  });
  set.processed = f == weight_format::int8;
}

} // namespace rlsync::engine
