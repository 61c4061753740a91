// Printing a resolved topology as YAML (`rlsync validate`): defaults filled
// in, replicas expanded, sizes in bytes, and the model's derived dimensions.
#include "runtime/config/topology.hpp"

#include "runtime/config/topology_names.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <string>

namespace rlsync {

using namespace topology_names;

std::string to_yaml(const topology& t) {
  YAML::Emitter out;
  auto ms = [](milliseconds v) { return static_cast<long long>(v.count()); };
  auto i64 = [](std::int64_t v) { return static_cast<long long>(v); };
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << t.name;
  out << YAML::Key << "source" << YAML::Value << t.source;
  out << YAML::Key << "base_dir" << YAML::Value << t.base_dir;

  const auto& c = t.model.config;
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  if (t.model.synthetic()) {
    out << YAML::Key << "synthetic" << YAML::Value << true;
    out << YAML::Key << "seed" << YAML::Value << static_cast<unsigned long long>(t.model.seed);
  } else {
    out << YAML::Key << "checkpoint" << YAML::Value << t.model.checkpoint;
  }
  if (t.model.weights_dtype)
    out << YAML::Key << "dtype" << YAML::Value << dtype_name(*t.model.weights_dtype);
  out << YAML::Key << "arch" << YAML::Value << to_string(c.arch);
  out << YAML::Key << "layers" << YAML::Value << i64(c.num_hidden_layers);
  out << YAML::Key << "hidden_size" << YAML::Value << i64(c.hidden_size);
  out << YAML::Key << "heads" << YAML::Value << i64(c.num_attention_heads);
  out << YAML::Key << "kv_heads" << YAML::Value << i64(c.num_key_value_heads);
  out << YAML::Key << "head_dim" << YAML::Value << i64(c.head_dim());
  out << YAML::Key << "intermediate_size" << YAML::Value << i64(c.intermediate_size);
  if (c.arch == model_arch::qwen3_moe) {
    out << YAML::Key << "experts" << YAML::Value << i64(c.num_experts);
    out << YAML::Key << "experts_per_tok" << YAML::Value << i64(c.num_experts_per_tok);
    out << YAML::Key << "moe_intermediate_size" << YAML::Value << i64(c.moe_intermediate_size);
    out << YAML::Key << "norm_topk_prob" << YAML::Value << c.norm_topk_prob;
    out << YAML::Key << "decoder_sparse_step" << YAML::Value << i64(c.decoder_sparse_step);
    out << YAML::Key << "expert_layout" << YAML::Value << (c.fused_experts ? "fused" : "separate");
    out << YAML::Key << "mlp_only_layers" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (auto l : c.mlp_only_layers)
      out << i64(l);
    out << YAML::EndSeq;
  }
  out << YAML::Key << "vocab_size" << YAML::Value << i64(c.vocab_size);
  out << YAML::Key << "max_position_embeddings" << YAML::Value << i64(c.max_position_embeddings);
  out << YAML::Key << "rope_theta" << YAML::Value << format_double(c.rope_theta);
  out << YAML::Key << "rms_norm_eps" << YAML::Value << format_double(c.rms_norm_eps);
  out << YAML::Key << "tie_word_embeddings" << YAML::Value << c.tie_word_embeddings;
  // A topology that loaded passed validate(), which bounds the count.
  std::int64_t params = parameter_count(c).value_or(0);
  out << YAML::Key << "parameters" << YAML::Value << i64(params) << YAML::Comment(c.arch == model_arch::qwen3_moe ? "Qwen3-MoE layout, no biases"
                                                                              : c.qk_norm() ? "Qwen3 layout, no biases"
                                                                                            : "Llama layout, no biases");
  if (t.model.weights_dtype) {
    std::int64_t bytes = params * static_cast<std::int64_t>(dtype_size(*t.model.weights_dtype));
    out << YAML::Key << "weight_bytes" << YAML::Value << i64(bytes);
  }
  out << YAML::EndMap;

  out << YAML::Key << "nodes" << YAML::Value << YAML::BeginSeq;
  for (auto& n : t.nodes) {
    out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << n.name;
    out << YAML::Key << "address" << YAML::Value << n.address;
    out << YAML::Key << "port" << YAML::Value << n.port;
    if (n.metrics_port)
      out << YAML::Key << "metrics_port" << YAML::Value << *n.metrics_port;
    out << YAML::Key << "restart" << YAML::Value << std::string(to_string(n.restart));
    out << YAML::Key << "max_restarts" << YAML::Value << i64(n.max_restarts) << YAML::EndMap;
  }
  out << YAML::EndSeq;

  const auto& cl = t.cluster;
  out << YAML::Key << "cluster" << YAML::Value << YAML::BeginMap;
  if (!cl.secret_file.empty())
    out << YAML::Key << "secret_file" << YAML::Value << cl.secret_file;
  if (!cl.secret_env.empty())
    out << YAML::Key << "secret_env" << YAML::Value << cl.secret_env;
  if (!cl.http_api_key_file.empty())
    out << YAML::Key << "http_api_key_file" << YAML::Value << cl.http_api_key_file;
  if (cl.tls) {
    out << YAML::Key << "tls" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "ca" << YAML::Value << cl.tls->ca;
    out << YAML::Key << "cert" << YAML::Value << cl.tls->cert;
    out << YAML::Key << "key" << YAML::Value << cl.tls->key << YAML::EndMap;
  }
  if (cl.allow_insecure_network)
    out << YAML::Key << "allow_insecure_network" << YAML::Value << true;
  out << YAML::Key << "heartbeat_interval_ms" << YAML::Value << ms(cl.heartbeat_interval);
  out << YAML::Key << "heartbeat_timeout_ms" << YAML::Value << ms(cl.heartbeat_timeout);
  out << YAML::Key << "connect_deadline_ms" << YAML::Value << ms(cl.connect_deadline);
  out << YAML::EndMap;

  const auto& tr = t.trainer;
  out << YAML::Key << "trainer" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "node" << YAML::Value << tr.node;
  out << YAML::Key << "source" << YAML::Value << std::string(to_string(tr.source));
  if (!tr.dir.empty())
    out << YAML::Key << "dir" << YAML::Value << tr.dir;
  if (tr.source != trainer_source::external) { // an outside process decides these
    out << YAML::Key << "step_time_ms" << YAML::Value << ms(tr.step_time);
    out << YAML::Key << "perturb" << YAML::Value << format_double(tr.perturb);
    out << YAML::Key << "seed" << YAML::Value << static_cast<unsigned long long>(tr.seed);
  }
  out << YAML::Key << "ranks" << YAML::Value << YAML::BeginSeq;
  for (auto& r : tr.ranks) {
    out << YAML::BeginMap << YAML::Key << "node" << YAML::Value << r.node;
    out << YAML::Key << "layers" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (auto l : r.layers)
      out << i64(l);
    out << YAML::EndSeq;
    if (r.experts) {
      out << YAML::Key << "experts" << YAML::Value << YAML::Flow << YAML::BeginSeq;
      for (auto e : *r.experts)
        out << i64(e);
      out << YAML::EndSeq;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndSeq << YAML::EndMap;

  out << YAML::Key << "engines" << YAML::Value << YAML::BeginSeq;
  for (auto& e : t.engines) {
    out << YAML::BeginMap;
    out << YAML::Key << "name" << YAML::Value << e.name;
    out << YAML::Key << "group" << YAML::Value << e.group;
    out << YAML::Key << "replica" << YAML::Value << i64(e.replica);
    out << YAML::Key << "node" << YAML::Value << e.node;
    out << YAML::Key << "tp" << YAML::Value << i64(e.tp);
    if (e.dp != 1 || e.dp_balance != "least_outstanding") {
      out << YAML::Key << "dp" << YAML::Value << i64(e.dp);
      out << YAML::Key << "dp_balance" << YAML::Value << e.dp_balance;
    }
    if (e.expert_parallel)
      out << YAML::Key << "expert_parallel" << YAML::Value << true;
    if (e.weights != "received")
      out << YAML::Key << "weights" << YAML::Value << e.weights;
    if (e.device != "cpu")
      out << YAML::Key << "device" << YAML::Value << e.device;
    out << YAML::Key << "max_batch" << YAML::Value << i64(e.max_batch);
    out << YAML::Key << "queue_limit" << YAML::Value << i64(e.queue_limit);
    out << YAML::Key << "kv_block_tokens" << YAML::Value << i64(e.kv_block_tokens);
    out << YAML::Key << "prefix_cache_blocks" << YAML::Value << i64(e.prefix_cache_blocks);
    out << YAML::Key << "kind" << YAML::Value << std::string(to_string(e.kind));
    if (e.kind == engine_kind::vllm) {
      out << YAML::Key << "url" << YAML::Value << e.url;
      if (!e.api_key_file.empty())
        out << YAML::Key << "api_key_file" << YAML::Value << e.api_key_file;
      out << YAML::Key << "weights_dir" << YAML::Value << e.weights_dir;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;

  out << YAML::Key << "router" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "node" << YAML::Value << t.router.node;
  out << YAML::Key << "policy" << YAML::Value << std::string(to_string(t.router.policy));
  out << YAML::Key << "queue_limit" << YAML::Value << i64(t.router.queue_limit);
  if (t.router.http_port)
    out << YAML::Key << "http_port" << YAML::Value << static_cast<int>(*t.router.http_port);
  out << YAML::EndMap;

  out << YAML::Key << "coordinator" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "node" << YAML::Value << t.coordinator.node;
  if (!t.coordinator.state_file.empty())
    out << YAML::Key << "state_file" << YAML::Value << t.coordinator.state_file;
  out << YAML::EndMap;

  const auto& x = t.transfer;
  out << YAML::Key << "transfer" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "backend" << YAML::Value << std::string(to_string(x.backend));
  out << YAML::Key << "mode" << YAML::Value << std::string(to_string(x.mode));
  out << YAML::Key << "bucket_bytes" << YAML::Value << i64(x.bucket_bytes);
  if (auto h = human_size(x.bucket_bytes); !h.empty())
    out << YAML::Comment(h);
  out << YAML::Key << "groups_in_flight" << YAML::Value << i64(x.groups_in_flight);
  out << YAML::Key << "ucx_transports" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (auto u : x.ucx_transports)
    out << std::string(to_string(u));
  out << YAML::EndSeq;
  out << YAML::Key << "packed_budget_bytes" << YAML::Value << i64(x.packed_budget_bytes);
  if (x.packed_budget_bytes == 0)
    out << YAML::Comment("the default: " + std::to_string(std::max<std::int64_t>(2, 2 * x.groups_in_flight))
                         + " x the largest group");
  else if (auto h = human_size(x.packed_budget_bytes); !h.empty())
    out << YAML::Comment(h);
  out << YAML::Key << "huge_pages" << YAML::Value << x.huge_pages;
  if (x.collective)
    out << YAML::Key << "collective" << YAML::Value << x.collective;
  out << YAML::EndMap;

  const auto& s = t.sync;
  out << YAML::Key << "sync" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "every_versions" << YAML::Value << i64(s.every_versions);
  out << YAML::Key << "staleness" << YAML::Value << i64(s.staleness);
  out << YAML::Key << "wave_size" << YAML::Value << i64(s.wave_size);
  out << YAML::Key << "deadlines_ms" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "pause" << YAML::Value << ms(s.deadlines.pause);
  out << YAML::Key << "flush" << YAML::Value << ms(s.deadlines.flush);
  out << YAML::Key << "start" << YAML::Value << ms(s.deadlines.start);
  out << YAML::Key << "transfer" << YAML::Value << ms(s.deadlines.transfer);
  out << YAML::Key << "finish" << YAML::Value << ms(s.deadlines.finish);
  out << YAML::Key << "continue" << YAML::Value << ms(s.deadlines.resume) << YAML::EndMap;
  out << YAML::Key << "pause" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "mode" << YAML::Value << std::string(name_of(pause_mode_choices, s.pause.mode));
  out << YAML::Key << "clear_cache" << YAML::Value << s.pause.clear_cache << YAML::EndMap;
  out << YAML::Key << "min_live_engines" << YAML::Value << i64(s.min_live_engines);
  out << YAML::Key << "max_restarts" << YAML::Value << i64(s.max_restarts);
  out << YAML::Key << "first_round_wait_ms" << YAML::Value << ms(s.first_round_wait) << YAML::EndMap;

  const auto& w = t.workload;
  out << YAML::Key << "workload" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "prompts" << YAML::Value << i64(w.prompts);
  out << YAML::Key << "concurrency" << YAML::Value << i64(w.concurrency);
  out << YAML::Key << "max_tokens" << YAML::Value << i64(w.max_tokens);
  out << YAML::Key << "temperature" << YAML::Value << format_double(w.temperature);
  out << YAML::Key << "top_p" << YAML::Value << format_double(w.top_p);
  out << YAML::Key << "seed" << YAML::Value << static_cast<unsigned long long>(w.seed);
  out << YAML::Key << "request_deadline_ms" << YAML::Value << i64(w.request_deadline.count()) << YAML::EndMap;

  if (!t.drill.faults.empty()) {
    out << YAML::Key << "drill" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "faults" << YAML::Value << YAML::BeginSeq;
    for (auto& f : t.drill.faults) {
      out << YAML::BeginMap;
      if (f.at_sync) {
        out << YAML::Key << "at_sync" << YAML::Value << i64(*f.at_sync);
        out << YAML::Key << "phase" << YAML::Value << std::string(name_of(phase_choices, f.phase));
      }
      if (f.at)
        out << YAML::Key << "at_ms" << YAML::Value << ms(*f.at);
      out << YAML::Key << "action" << YAML::Value << std::string(to_string(f.action));
      out << YAML::Key << "target" << YAML::Value << f.target;
      out << YAML::Key << "target_kind" << YAML::Value << std::string(to_string(f.target_kind));
      if (f.duration)
        out << YAML::Key << "duration_ms" << YAML::Value << ms(*f.duration);
      if (f.action == fault_action::kill_worker) {
        out << YAML::Key << "dp_rank" << YAML::Value << i64(f.dp_rank);
        out << YAML::Key << "worker" << YAML::Value << i64(f.worker);
      }
      out << YAML::EndMap;
    }
    out << YAML::EndSeq << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

} // namespace rlsync
