#include "runtime/forecast/report.hpp"

#include "runtime/base/format.hpp"

#include <chrono>
#include <sstream>

namespace rlsync::forecast {

namespace {

std::string bytes_text(double b) {
  if (b >= 1e12)
    return format("%.2f TB", b / 1e12);
  if (b >= 1e9)
    return format("%.1f GB", b / 1e9);
  if (b >= 1e6)
    return format("%.1f MB", b / 1e6);
  return format("%.0f B", b);
}

std::string versus(double predicted, const std::optional<double>& published, bool calibration = false) {
  if (!published)
    return "";
  if (calibration)
    return format("   (published %.2f s: the model's calibration)", *published);
  return format("   (published %.2f s: %+.0f %%)", *published, 100.0 * (predicted / *published - 1.0));
}

const char* mode_name(plan_mode m) { return m == plan_mode::sharded ? "sharded" : "broadcast"; }
const char* pp_name(pp_order p) { return p == pp_order::serial ? "serial" : "parallel"; }

std::string knobs_text(const sync_knobs& k) {
  return format("%s, groups in flight %lld, pp %s", mode_name(k.mode), static_cast<long long>(k.groups_in_flight),
                pp_name(k.pp));
}

nlohmann::json prediction_json(const sync_prediction& p) {
  nlohmann::json phases = nlohmann::json::array();
  for (const auto& ph : p.phases)
    phases.push_back({{"name", ph.name},
                      {"seconds", ph.seconds},
                      {"transfer_s", ph.transfer_s},
                      {"gather_s", ph.gather_s},
                      {"overhead_s", ph.overhead_s},
                      {"operations", ph.ops},
                      {"light_s", ph.light_s},
                      {"bottleneck", ph.bottleneck},
                      {"bottleneck_bytes", ph.bottleneck_bytes}});
  return {{"mode", mode_name(p.knobs.mode)},
          {"groups_in_flight", p.knobs.groups_in_flight},
          {"pp_groups", pp_name(p.knobs.pp)},
          {"seconds", p.seconds},
          {"light_s", p.light_s},
          {"bytes", p.bytes},
          {"operations", p.ops},
          {"bottleneck", p.bottleneck},
          {"phases", phases}};
}

} // namespace

plan_report make_report(const cluster& c, const layout& l, const model_constants& mc) {
  const auto started = std::chrono::steady_clock::now();
  plan_report r;
  r.constants = mc;
  sync_knobs k;
  k.mode = c.mode;
  k.groups_in_flight = c.groups_in_flight;
  k.pp = c.pp_groups;
  r.configured = predict_sync(c, l, k, mc);

  auto serial = k, parallel = k;
  serial.pp = pp_order::serial;
  parallel.pp = pp_order::parallel;
  const auto s = k.pp == pp_order::serial ? r.configured : predict_sync(c, l, serial, mc);
  const auto p = k.pp == pp_order::parallel ? r.configured : predict_sync(c, l, parallel, mc);
  r.light_serial_s = s.light_s;
  r.light_serial_bottleneck = s.bottleneck;
  r.light_parallel_s = p.light_s;
  r.light_parallel_bottleneck = p.bottleneck;
  r.knobs.push_back({std::string("pp ") + pp_name(k.pp == pp_order::serial ? pp_order::parallel : pp_order::serial),
                     k.pp == pp_order::serial ? p : s});
  {
    // The model tells one group in flight from several (more change memory only).
    auto other = k;
    other.groups_in_flight = k.groups_in_flight == 1 ? 2 : 1;
    r.knobs.push_back({"groups in flight " + std::to_string(other.groups_in_flight), predict_sync(c, l, other, mc)});
  }
  auto other_mode = k;
  other_mode.mode = k.mode == plan_mode::sharded ? plan_mode::broadcast : plan_mode::sharded;
  r.knobs.push_back({std::string("mode ") + mode_name(other_mode.mode)
                       + (other_mode.mode == plan_mode::broadcast ? " (whole groups to every worker)" : ""),
                     predict_sync(c, l, other_mode, mc)});
  r.baseline = predict_nccl_broadcast(c, l, mc);
  r.traffic = summarize(c, l, k);

  const std::int64_t engines = c.engine_count();
  std::vector<std::int64_t> sizes;
  for (std::int64_t w = 1; w < engines && sizes.size() < 6; w *= 2)
    sizes.push_back(w);
  sizes.push_back(engines);
  if (c.wave_size > 0 && std::find(sizes.begin(), sizes.end(), c.wave_size) == sizes.end())
    sizes.push_back(c.wave_size);
  std::sort(sizes.begin(), sizes.end());
  for (auto w : sizes)
    r.waves.push_back(predict_waves(c, l, w, k, mc));
  r.predict_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return r;
}

std::string to_text(const cluster& c, const layout& l, const plan_report& r) {
  std::ostringstream o;
  const auto& m = c.model;
  const auto& T = c.trainer;
  o << "plan " << c.name << " (" << c.source << ")\n";
  o << format("  model     %s: %lld layers", to_string(m.arch),
              static_cast<long long>(m.num_hidden_layers));
  if (m.num_experts > 0)
    o << format(", %lld experts (%lld per token)", static_cast<long long>(m.num_experts),
                static_cast<long long>(m.num_experts_per_tok));
  o << format(", %llu tensors, %s in %s\n", static_cast<unsigned long long>(l.tensors),
              bytes_text(static_cast<double>(l.model_bytes)).c_str(), std::string(short_name(c.weights)).c_str());
  if (!c.model_note.empty())
    o << "            " << c.model_note << "\n";
  o << format("  fabric    %lld GPUs per node; per GPU and direction: NIC %.0f GB/s, %s %.0f GB/s\n",
              static_cast<long long>(c.fabric.gpus_per_node), c.fabric.nic_bytes_per_s / 1e9,
              c.fabric.intra_node_link.c_str(), c.fabric.intra_node_bytes_per_s / 1e9);
  o << format("  trainer   %lld GPUs on %lld nodes: tp %lld x pp %lld x dp %lld, ep %lld (etp 1); each tp group "
              "gathers its dense tensors before serving, experts are never gathered\n",
              static_cast<long long>(T.ranks()), static_cast<long long>(T.nodes), static_cast<long long>(T.tp),
              static_cast<long long>(T.pp), static_cast<long long>(T.dp), static_cast<long long>(T.ep));
  for (const auto& e : c.engines)
    o << format("  engines   %s: %lld x (tp %lld x dp %lld%s) = %lld GPUs\n", e.name.c_str(),
                static_cast<long long>(e.replicas), static_cast<long long>(e.tp), static_cast<long long>(e.dp),
                e.expert_parallel ? format(", experts over %lld workers", static_cast<long long>(e.workers())).c_str()
                                  : "",
                static_cast<long long>(e.replicas * e.workers()));
  std::uint64_t entries = 0;
  for (const auto& p : l.plans)
    entries += p.entries;
  o << format("  plans     %zu worker plans, %llu entries, recorded by the engine's loader on shape-only views in "
              "%.2f s; holders chosen by the data plane's rule\n",
              l.plans.size(), static_cast<unsigned long long>(entries), l.record_seconds);

  const auto& t = r.traffic;
  o << "\ntraffic (" << mode_name(c.mode) << ")\n";
  o << format("  per producer   min %s, max %s (%s), %zu producers, %s in all\n",
              bytes_text(static_cast<double>(t.per_producer.min)).c_str(),
              bytes_text(static_cast<double>(t.per_producer.max)).c_str(), t.per_producer.busiest.c_str(),
              t.per_producer.count, bytes_text(static_cast<double>(t.per_producer.total)).c_str());
  o << format("  per consumer   min %s, max %s (%s), %zu engine workers\n",
              bytes_text(static_cast<double>(t.per_consumer.min)).c_str(),
              bytes_text(static_cast<double>(t.per_consumer.max)).c_str(), t.per_consumer.busiest.c_str(),
              t.per_consumer.count);
  for (std::size_t i = 0; i < t.busiest_links.size(); ++i)
    o << format("  %s %s: %s (%.2f s at its bandwidth)\n", i == 0 ? "busiest links " : "              ",
                t.busiest_links[i].name.c_str(), bytes_text(t.busiest_links[i].bytes).c_str(),
                t.busiest_links[i].light_s);
  o << format("  largest group  %u: %s\n", t.largest_group_index,
              bytes_text(static_cast<double>(t.largest_group)).c_str());
  o << format("  memory         %lld groups in flight: %s per producer (gathered group + packed slices), %s per "
              "engine worker (receive slots)\n",
              static_cast<long long>(c.groups_in_flight), bytes_text(static_cast<double>(t.producer_memory)).c_str(),
              bytes_text(static_cast<double>(t.consumer_memory)).c_str());

  const auto& p = r.configured;
  o << "\nprediction (" << knobs_text(p.knobs) << ")\n";
  o << format("  sync             %.2f s%s\n", p.seconds,
              c.mode == plan_mode::sharded
                ? versus(p.seconds, c.published.sharded, c.published.sharded_is_calibration).c_str()
                : "");
  o << format("  bottleneck       %s\n", p.bottleneck.c_str());
  o << format("  speed of light   %.2f s with pp serial (%s)%s\n", r.light_serial_s, r.light_serial_bottleneck.c_str(),
              versus(r.light_serial_s, c.published.light_serial).c_str());
  o << format("                   %.2f s with pp parallel (%s)%s\n", r.light_parallel_s,
              r.light_parallel_bottleneck.c_str(), versus(r.light_parallel_s, c.published.light_parallel).c_str());
  double transfer = 0, gather = 0, overhead = 0;
  for (const auto& ph : p.phases) {
    transfer += ph.transfer_s;
    gather += ph.gather_s;
    overhead += ph.overhead_s;
  }
  o << format("  where it goes    transfer %.2f s, tp gather %.2f s, per-group work %.2f s (%llu operations) over "
              "%zu phase%s\n",
              transfer, gather, overhead, static_cast<unsigned long long>(p.ops), p.phases.size(),
              p.phases.size() == 1 ? "" : "s");

  o << "\nknobs (one changed at a time)\n";
  for (const auto& [name, k] : r.knobs)
    o << format("  %-44s %8.2f s  (%+.0f %%), light %.2f s\n", name.c_str(), k.seconds,
                100.0 * (k.seconds / p.seconds - 1.0), k.light_s);
  const auto& b = r.baseline;
  o << format("  %-44s %8.2f s  (gather %.1f s, broadcast %.1f s, %llu tensors: %llu calls %.1f s)%s\n",
              "per-tensor NCCL broadcast (SkyRL's baseline)", b.seconds, b.gather_s, b.broadcast_s,
              static_cast<unsigned long long>(b.tensors), static_cast<unsigned long long>(b.operations), b.overhead_s,
              versus(b.seconds, c.published.nccl_broadcast).c_str());

  o << "\nwaves (engines outside the syncing wave keep generating)\n";
  o << "  wave size  waves  sync total  stall per engine  engines serving during a sync\n";
  for (const auto& w : r.waves)
    o << format("  %9lld  %5lld  %8.2f s  %14.2f s  %lld of %lld%s\n", static_cast<long long>(w.wave_size),
                static_cast<long long>(w.waves), w.total_s, w.max_stall_s, static_cast<long long>(w.serving),
                static_cast<long long>(w.engines),
                (c.wave_size == 0 ? w.wave_size == w.engines : w.wave_size == c.wave_size) ? "   <- configured" : "");

  o << format("\nconstants (the same for every cluster): efficiency %.2f of datasheet bandwidth, %.0f us per group, "
              "%.0f us per operation (calibrated once, on Qwen3-235B's pipelined sharded 3.49 s)\n",
              r.constants.efficiency, r.constants.group_latency_s * 1e6, r.constants.op_s * 1e6);
  if (!c.published.source.empty())
    o << "published figures: " << c.published.source << "\n";
  return o.str();
}

nlohmann::json to_json(const cluster& c, const layout& l, const plan_report& r) {
  nlohmann::json knobs = nlohmann::json::array();
  for (const auto& [name, k] : r.knobs) {
    auto j = prediction_json(k);
    j["knob"] = name;
    knobs.push_back(j);
  }
  nlohmann::json waves = nlohmann::json::array();
  for (const auto& w : r.waves)
    waves.push_back({{"wave_size", w.wave_size},
                     {"waves", w.waves},
                     {"total_s", w.total_s},
                     {"stall_per_engine_s", w.max_stall_s},
                     {"engines_serving", w.serving},
                     {"engines", w.engines}});
  nlohmann::json links = nlohmann::json::array();
  for (const auto& x : r.traffic.busiest_links)
    links.push_back({{"link", x.name}, {"bytes", x.bytes}, {"light_s", x.light_s}});
  const auto side = [](const traffic_summary::side& s) {
    return nlohmann::json{{"min", s.min}, {"max", s.max}, {"total", s.total}, {"count", s.count}, {"busiest", s.busiest}};
  };
  nlohmann::json published = nlohmann::json::object();
  if (c.published.sharded)
    published["sharded_s"] = *c.published.sharded;
  published["sharded_is_calibration"] = c.published.sharded_is_calibration;
  if (c.published.nccl_broadcast)
    published["nccl_broadcast_s"] = *c.published.nccl_broadcast;
  if (c.published.light_serial)
    published["light_serial_s"] = *c.published.light_serial;
  if (c.published.light_parallel)
    published["light_parallel_s"] = *c.published.light_parallel;
  std::uint64_t entries = 0;
  for (const auto& p : l.plans)
    entries += p.entries;
  return {{"name", c.name},
          {"model", {{"tensors", l.tensors}, {"bytes", l.model_bytes}, {"groups", l.groups}, {"note", c.model_note}}},
          {"plans", {{"count", l.plans.size()}, {"entries", entries}, {"record_s", l.record_seconds}}},
          {"traffic",
           {{"per_producer", side(r.traffic.per_producer)},
            {"per_consumer", side(r.traffic.per_consumer)},
            {"busiest_links", links},
            {"largest_group_bytes", r.traffic.largest_group},
            {"producer_memory", r.traffic.producer_memory},
            {"consumer_memory", r.traffic.consumer_memory}}},
          {"prediction", prediction_json(r.configured)},
          {"light_serial_s", r.light_serial_s},
          {"light_serial_bottleneck", r.light_serial_bottleneck},
          {"light_parallel_s", r.light_parallel_s},
          {"light_parallel_bottleneck", r.light_parallel_bottleneck},
          {"knobs", knobs},
          {"nccl_broadcast",
           {{"seconds", r.baseline.seconds},
            {"gather_s", r.baseline.gather_s},
            {"broadcast_s", r.baseline.broadcast_s},
            {"overhead_s", r.baseline.overhead_s},
            {"tensors", r.baseline.tensors},
            {"operations", r.baseline.operations}}},
          {"waves", waves},
          {"constants",
           {{"efficiency", r.constants.efficiency},
            {"group_latency_s", r.constants.group_latency_s},
            {"op_s", r.constants.op_s}}},
          {"published", published},
          {"predict_s", r.predict_seconds}};
}

} // namespace rlsync::forecast
