#pragma once
// The YAML spellings of the topology's enums and the number formats, shared
// by the reader (topology.cpp) and the printer (topology_print.cpp). Internal
// to runtime/config.
#include "runtime/base/dtype.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/config/yaml_fields.hpp"

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

namespace rlsync::topology_names {

using yaml_fields::choices;

inline const choices<dtype> dtype_choices = {{"bf16", dtype::bf16}, {"f16", dtype::f16}, {"f32", dtype::f32}};
/// How a synthetic Qwen3-MoE stores its experts (model_config::fused_experts).
inline const choices<bool> expert_layout_choices = {{"separate", false}, {"fused", true}};
inline const choices<model_arch> arch_choices = {
  {"llama", model_arch::llama}, {"qwen3", model_arch::qwen3}, {"qwen3_moe", model_arch::qwen3_moe}};
inline const choices<trainer_source> trainer_source_choices = {
  {"synthetic", trainer_source::synthetic}, {"checkpoint_dir", trainer_source::checkpoint_dir},
  {"external", trainer_source::external}};
inline const choices<router_policy> router_policy_choices = {
  {"least_outstanding", router_policy::least_outstanding},
  {"round_robin", router_policy::round_robin},
  {"prefix_affinity", router_policy::prefix_affinity}};
inline const choices<transfer_backend> backend_choices = {{"local", transfer_backend::local},
                                                   {"ucx", transfer_backend::ucx},
                                                   {"nccl", transfer_backend::nccl},
                                                   {"cuda_ipc", transfer_backend::cuda_ipc}};
inline const choices<transfer_mode> mode_choices = {{"sharded", transfer_mode::sharded},
                                             {"broadcast", transfer_mode::broadcast}};
inline const choices<ucx_transport> ucx_transport_choices = {{"shm", ucx_transport::shm},
                                                      {"cma", ucx_transport::cma},
                                                      {"tcp", ucx_transport::tcp},
                                                      {"rdma", ucx_transport::rdma}};
inline const choices<pause_mode> pause_mode_choices = {
  {"keep", pause_mode::keep}, {"wait", pause_mode::wait}, {"abort", pause_mode::abort}};
inline const choices<engine_kind> engine_kind_choices = {{"builtin", engine_kind::builtin},
                                                         {"vllm", engine_kind::vllm}};
inline const choices<node_restart> node_restart_choices = {{"never", node_restart::never},
                                                           {"on-failure", node_restart::on_failure}};
inline const choices<fault_action> action_choices = {
  {"kill", fault_action::kill},           {"restart", fault_action::restart},
  {"partition", fault_action::partition}, {"heal", fault_action::heal},
  {"delay_acks", fault_action::delay_acks}, {"corrupt", fault_action::corrupt},
  {"kill_worker", fault_action::kill_worker}};
inline const choices<sync_phase> phase_choices = {
  {"pause", sync_phase::pause},       {"flush", sync_phase::flush},   {"start", sync_phase::start},
  {"transfer", sync_phase::transfer}, {"finish", sync_phase::finish}, {"continue", sync_phase::resume}};
inline const choices<fault_target> target_choices = {{"engine", fault_target::engine},
                                              {"node", fault_target::node},
                                              {"trainer", fault_target::trainer},
                                              {"router", fault_target::router},
                                              {"coordinator", fault_target::coordinator}};

template <class E>
std::string_view name_of(const choices<E>& options, E value) {
  for (auto& [name, v] : options)
    if (v == value)
      return name;
  return "?";
}

inline std::string dtype_name(dtype t) { return std::string(name_of(dtype_choices, t)); }

inline std::string format_double(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

// "64 MiB" when the size is a whole number of a binary unit, else empty.
inline std::string human_size(std::int64_t bytes) {
  static const std::pair<const char*, std::int64_t> units[] = {
    {"TiB", std::int64_t(1) << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}};
  for (auto& [name, size] : units)
    if (bytes >= size && bytes % size == 0)
      return std::to_string(bytes / size) + " " + name;
  return "";
}

} // namespace rlsync::topology_names
