#pragma once
// What `rlsync plan` prints: the layout's bytes and memory, the prediction
// for the configured knobs with its bottleneck and speed of light, the
// effect of each knob, the per-tensor broadcast baseline, waves, and the
// published figures beside the predictions. As text or JSON.
#include "runtime/forecast/cluster.hpp"
#include "runtime/forecast/layout.hpp"
#include "runtime/forecast/predict.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace rlsync::forecast {

struct plan_report {
  sync_prediction configured;
  double light_serial_s = 0, light_parallel_s = 0;
  std::string light_serial_bottleneck, light_parallel_bottleneck;
  std::vector<std::pair<std::string, sync_prediction>> knobs; ///< one knob changed each
  baseline_prediction baseline;
  traffic_summary traffic;
  std::vector<wave_prediction> waves; ///< wave sizes 1, 2, 4, ... and the configured one
  model_constants constants;
  double predict_seconds = 0; ///< wall time of the predictions
};

plan_report make_report(const cluster& c, const layout& l, const model_constants& mc = {});

std::string to_text(const cluster& c, const layout& l, const plan_report& r);
nlohmann::json to_json(const cluster& c, const layout& l, const plan_report& r);

} // namespace rlsync::forecast
