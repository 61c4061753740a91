#include "runtime/engine/process.hpp"

#include "runtime/base/parallel.hpp"

#include <algorithm>
#include <cmath>

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

namespace {

void quantize(parameter& p) {
  const std::int64_t rows = p.shape.front(), cols = p.numel() / std::max<std::int64_t>(1, rows);
  std::vector<float> row(static_cast<std::size_t>(cols));
  p.q.resize(static_cast<std::size_t>(p.numel()));
  p.scales.resize(static_cast<std::size_t>(rows));
  const std::size_t es = dtype_size(p.type);
  for (std::int64_t j = 0; j < rows; ++j) {
    convert_to_f32(p.type, p.bytes.data() + static_cast<std::size_t>(j * cols) * es, row.data(), row.size());
    float amax = 0.0f;
    for (float x : row)
      amax = std::max(amax, std::fabs(x));
    const float scale = amax / 127.0f;
    p.scales[static_cast<std::size_t>(j)] = scale;
    std::int8_t* q = p.q.data() + j * cols;
    for (std::int64_t k = 0; k < cols; ++k) {
      const float v = scale > 0 ? std::nearbyint(row[static_cast<std::size_t>(k)] / scale) : 0.0f;
      q[k] = static_cast<std::int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
  }
}

} // namespace

void process_weights(weight_set& set, weight_format f) {
  // Workers hold disjoint parameters: one thread each, as the loader.
  parallel_for(set.workers.size(), set.workers.size(), [&](std::size_t w) {
    for (const auto& ref : set.workers[w].params()) {
      auto& p = set.workers[w].at(ref.name);
      if (f == weight_format::int8 && quantized_parameter(p.name) && p.shape.size() == 2 && p.holds_data()) {
        quantize(p);
      } else {
        p.q.clear();
        p.scales.clear();
      }
    }
  });
}

} // namespace rlsync::engine
