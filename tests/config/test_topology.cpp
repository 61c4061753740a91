// Topology loading: the shipped configs, defaults and resolution, and one
// row per error path with the exact "file:line:col: path: message" text.
#include "runtime/config/topology.hpp"
#include "runtime/config/build_features.hpp"
#include "runtime/config/yaml_fields.hpp"
#include "tests/support/scratch_dir.hpp"
#include "tests/support/ucx_transport_cases.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

using namespace rlsync;

namespace {

// A small valid topology, one line per section, so that rows can replace a
// section and know on which line their error lands:
//   1 name, 2 model, 3 nodes, 4 trainer, 5 engines, 6+ whatever a row appends.
const std::vector<std::pair<std::string, std::string>> base_lines = {
  {"name", "name: t"},
  {"model", "model: {synthetic: {layers: 4, hidden_size: 256, heads: 8, kv_heads: 4, intermediate_size: 704}}"},
  {"nodes", "nodes: [{name: a}, {name: b}]"},
  {"trainer", "trainer: {node: a}"},
  {"engines", "engines: [{name: e, node: a, replicas: 2, tp: 2}]"},
};

// The base with the `key` line replaced by `text` (dropped when empty).
std::string with(const std::string& key, const std::string& text) {
  std::string out;
  for (auto& [k, line] : base_lines) {
    const std::string& l = k == key ? text : line;
    if (!l.empty())
      out += l + "\n";
  }
  return out;
}

// The base with `extra` appended from line 6.
std::string plus(const std::string& extra) { return with("", "") + extra + "\n"; }

// Two nodes need TLS or this (checked once everything else is valid).
const std::string insecure = "cluster: {allow_insecure_network: true}\n";

// One node that external trainer ranks join (so it needs TLS or the above too).
const std::string one_node_external_ranks = [] {
  std::string text = with("nodes", "nodes: [{name: a, port: 7400}]");
  const std::string trainer = "trainer: {node: a}";
  return text.replace(text.find(trainer), trainer.size(), "trainer: {node: a, source: external}");
}();

// A synthetic model in block style: `fields` go on lines 4.. of the file.
std::string synthetic(const std::string& fields) {
  return with("model", "model:\n  synthetic:\n" + fields);
}

std::vector<std::string> errors_of(const std::string& text) {
  try {
    parse_topology(text, "t.yaml", "/base");
  } catch (const topology_error& e) {
    return e.errors;
  }
  return {};
}

// What load_topology refuses in file `path` (its relative paths resolve beside it).
std::vector<std::string> load_errors_of(const std::string& path) {
  try {
    load_topology(path);
  } catch (const topology_error& e) {
    return e.errors;
  }
  return {};
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (auto& l : lines)
    out += l + "\n";
  return out;
}

struct error_row {
  const char* title;
  std::string text;
  std::string expected; // every error, one per line, in order
};

void check_rows(const std::vector<error_row>& rows) {
  for (auto& row : rows) {
    CAPTURE(row.title);
    CAPTURE(row.text);
    CHECK(joined(errors_of(row.text)) == row.expected + "\n");
  }
}

const std::string top_keys =
  "name, model, nodes, cluster, trainer, engines, router, coordinator, transfer, sync, workload, drill";

} // namespace

TEST_CASE("topology: the base document of the error rows is valid") {
  auto t = parse_topology(with("", "") + insecure, "t.yaml", "/base");
  CHECK(t.engines.size() == 2);
  CHECK(t.cluster.allow_insecure_network);
  // One node alone needs no TLS; once external ranks join it, it does (errors row), or this.
  auto alone = parse_topology(with("nodes", "nodes: [{name: a}]"), "t.yaml", "/base");
  CHECK_FALSE(alone.others_join_the_head());
  auto joined = parse_topology(one_node_external_ranks + insecure, "t.yaml", "/base");
  CHECK(joined.others_join_the_head());
}

TEST_CASE("topology errors: syntax and document shape") {
  check_rows({
    {"syntax error", "name: t\nnodes: [a, b\n",
     "t.yaml:3:1: syntax error: end of sequence flow not found"},
    {"bad indentation", "name: t\n  model: x\n", "t.yaml:2:8: syntax error: illegal map value"},
    {"empty file", "", "t.yaml:1:1: topology: the file is empty"},
    {"only comments", "# nothing\n", "t.yaml:1:1: topology: the file is empty"},
    {"two documents", "name: t\n---\nname: u\n", "t.yaml:3:1: topology: expected one YAML document, got 2"},
    {"top level is a list", "- a\n- b\n", "t.yaml:1:1: topology: expected a map, got a list"},
    {"top level is a scalar", "hello\n", "t.yaml:1:1: topology: expected a map, got 'hello'"},
  });
}

TEST_CASE("topology errors: top-level keys") {
  check_rows({
    {"unknown key with suggestion", plus("nmae: x"),
     "t.yaml:6:1: nmae: unknown key, did you mean 'name'? (expected one of: " + top_keys + ")"},
    {"unknown key without suggestion", plus("colour: blue"),
     "t.yaml:6:1: colour: unknown key (expected one of: " + top_keys + ")"},
    {"duplicate key", plus("name: u"), "t.yaml:6:1: name: duplicate key (first at line 1)"},
    {"missing name", with("name", ""), "t.yaml:1:1: name: missing required key"},
    {"missing everything else", "name: t\n",
     "t.yaml:1:1: model: missing required key\n"
     "t.yaml:1:1: nodes: missing required key\n"
     "t.yaml:1:1: trainer: missing required key\n"
     "t.yaml:1:1: engines: missing required key"},
    {"name with a space", with("name", "name: my topo"),
     "t.yaml:1:7: name: must be non-empty and use only letters, digits, '.', '_' and '-', got 'my topo'"},
    {"name is a map", with("name", "name: {a: 1}"), "t.yaml:1:7: name: expected a string, got a map"},
    {"non-scalar key", plus("[a]: 1"), "t.yaml:6:1: topology: keys must be names, got a list"},
  });
}

TEST_CASE("topology errors: model") {
  check_rows({
    {"both checkpoint and synthetic", with("model", "model: {checkpoint: ck, synthetic: {layers: 4}}"),
     "t.yaml:2:8: model: exactly one of checkpoint or synthetic must be set, got both"},
    {"neither", with("model", "model: {}"),
     "t.yaml:2:8: model: exactly one of checkpoint or synthetic must be set, got neither"},
    {"model is a list", with("model", "model: [a]"), "t.yaml:2:8: model: expected a map, got a list"},
    {"checkpoint without config.json", with("model", "model: {checkpoint: ck}"),
     "t.yaml:2:21: model.checkpoint: /base/ck/config.json: config.json: cannot open: No such file or "
     "directory"},
    {"synthetic missing layers",
     synthetic("    hidden_size: 256\n    heads: 8\n    intermediate_size: 704"),
     "t.yaml:4:5: model.synthetic.layers: missing required key"},
    {"synthetic empty", synthetic(""),
     "t.yaml:3:3: model.synthetic.layers: missing required key\n"
     "t.yaml:3:3: model.synthetic.hidden_size: missing required key\n"
     "t.yaml:3:3: model.synthetic.heads: missing required key\n"
     "t.yaml:3:3: model.synthetic.intermediate_size: missing required key"},
    {"kv heads do not divide heads",
     synthetic("    layers: 4\n    hidden_size: 256\n    heads: 8\n    kv_heads: 3\n    intermediate_size: 704"),
     "t.yaml:7:15: model.synthetic.kv_heads: must divide num_attention_heads (8), got 3"},
    {"negative hidden size",
     synthetic("    layers: 4\n    hidden_size: -256\n    heads: 8\n    intermediate_size: 704"),
     "t.yaml:5:18: model.synthetic.hidden_size: must be positive, got -256"},
    {"zero layers", synthetic("    layers: 0\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704"),
     "t.yaml:4:13: model.synthetic.layers: must be positive, got 0"},
    {"heads is text",
     synthetic("    layers: 4\n    hidden_size: 256\n    heads: many\n    intermediate_size: 704"),
     "t.yaml:6:12: model.synthetic.heads: expected an integer, got 'many'"},
    {"vocab too small",
     synthetic("    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n    vocab_size: 100"),
     "t.yaml:8:17: model.synthetic.vocab_size: must be at least 258 (256 bytes, BOS, EOS), got 100"},
    {"dtype out of range",
     synthetic("    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n    dtype: fp8"),
     "t.yaml:8:12: model.synthetic.dtype: must be one of bf16, f16, f32, got 'fp8'"},
    {"yes is not a boolean",
     synthetic("    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n"
               "    tie_word_embeddings: yes"),
     "t.yaml:8:26: model.synthetic.tie_word_embeddings: expected true or false, got 'yes'"},
    {"rope_theta is not a number",
     synthetic("    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n"
               "    rope_theta: fast"),
     "t.yaml:8:17: model.synthetic.rope_theta: expected a number, got 'fast'"},
    {"negative seed",
     synthetic("    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n    seed: -1"),
     "t.yaml:8:11: model.synthetic.seed: must not be negative, got -1"},
    {"typo in a synthetic key",
     synthetic("    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n    kv_head: 4"),
     "t.yaml:8:5: model.synthetic.kv_head: unknown key, did you mean 'kv_heads'? (expected one of: arch, layers, "
     "hidden_size, heads, kv_heads, head_dim, intermediate_size, experts, experts_per_tok, moe_intermediate_size, "
     "norm_topk_prob, decoder_sparse_step, mlp_only_layers, expert_layout, vocab_size, max_position_embeddings, rope_theta, "
     "rms_norm_eps, tie_word_embeddings, dtype, seed)"},
    {"experts on a dense model",
     synthetic("    arch: qwen3\n    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n"
               "    experts: 8"),
     "t.yaml:9:14: model.synthetic.experts: only qwen3_moe models have experts (this is a qwen3)"},
    {"more experts per token than experts",
     synthetic("    arch: qwen3_moe\n    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n"
               "    experts: 4\n    experts_per_tok: 5\n    moe_intermediate_size: 64"),
     "t.yaml:10:22: model.synthetic.experts_per_tok: must be at most num_experts (4), got 5"},
    {"an mlp-only layer past the model",
     synthetic("    arch: qwen3_moe\n    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n"
               "    experts: 4\n    moe_intermediate_size: 64\n    mlp_only_layers: [0, 9]"),
     "t.yaml:11:22: model.synthetic.mlp_only_layers: layer 9 is not in [0, 4)"},
    {"an mlp-only layer that is not a number",
     synthetic("    arch: qwen3_moe\n    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n"
               "    experts: 4\n    moe_intermediate_size: 64\n    mlp_only_layers: [0, x]"),
     "t.yaml:11:26: model.synthetic.mlp_only_layers[1]: expected an integer, got 'x'"},
    {"an mlp-only layer in hex",
     synthetic("    arch: qwen3_moe\n    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n"
               "    experts: 4\n    moe_intermediate_size: 64\n    mlp_only_layers: [0x1]"),
     "t.yaml:11:23: model.synthetic.mlp_only_layers[0]: expected an integer, got '0x1'"},
    {"an mlp-only layer twice",
     synthetic("    arch: qwen3_moe\n    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n"
               "    experts: 4\n    moe_intermediate_size: 64\n    mlp_only_layers: [1, 1]"),
     "t.yaml:11:26: model.synthetic.mlp_only_layers[1]: layer 1 is listed twice"},
    {"an expert layout on a dense model, the default one",
     synthetic("    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n    expert_layout: separate"),
     "t.yaml:8:20: model.synthetic.expert_layout: only qwen3_moe models have experts (this is a llama)"},
    {"no experts on a dense model, said",
     synthetic("    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n    experts: 0"),
     "t.yaml:8:14: model.synthetic.experts: only qwen3_moe models have experts (this is a llama)"},
    {"an expert field on a dense model that only has a default",
     synthetic("    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n    norm_topk_prob: false"),
     "t.yaml:8:21: model.synthetic.norm_topk_prob: only qwen3_moe models have experts (this is a llama)"},
    {"an architecture rlsync does not run",
     synthetic("    arch: mistral\n    layers: 4\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704"),
     "t.yaml:4:11: model.synthetic.arch: must be one of llama, qwen3, qwen3_moe, got 'mistral'"},
    {"head_dim on a llama",
     synthetic("    layers: 4\n    hidden_size: 256\n    heads: 8\n    head_dim: 64\n    intermediate_size: 704"),
     "t.yaml:7:15: model.synthetic.head_dim: only qwen3 and qwen3_moe models may set it (a llama model's is hidden_size / "
     "num_attention_heads)"},
    {"odd qwen3 head_dim",
     synthetic("    arch: qwen3\n    layers: 4\n    hidden_size: 256\n    heads: 8\n    head_dim: 33\n"
               "    intermediate_size: 704"),
     "t.yaml:8:15: model.synthetic.head_dim: must be even for rotary embeddings, got 33"},
  });
}

TEST_CASE("topology: a synthetic Qwen3 keeps its head_dim, a Qwen3-MoE its experts, both print their architecture") {
  auto t = parse_topology(synthetic("    arch: qwen3\n    layers: 2\n    hidden_size: 64\n    heads: 4\n"
                                    "    kv_heads: 2\n    head_dim: 32\n    intermediate_size: 128")
                            + insecure,
                          "t.yaml", "/base");
  CHECK(t.model.config.arch == model_arch::qwen3);
  CHECK(t.model.config.head_dim() == 32);
  CHECK(t.model.config.qk_norm());
  const auto printed = to_yaml(t);
  CHECK(printed.find("arch: qwen3") != std::string::npos);
  CHECK(printed.find("head_dim: 32") != std::string::npos);
  CHECK(printed.find("Qwen3 layout") != std::string::npos);

  auto m = parse_topology(synthetic("    arch: qwen3_moe\n    layers: 4\n    hidden_size: 64\n    heads: 4\n"
                                    "    kv_heads: 2\n    intermediate_size: 128\n    experts: 8\n"
                                    "    moe_intermediate_size: 32\n    mlp_only_layers: [0]\n"
                                    "    decoder_sparse_step: 2\n    expert_layout: fused")
                            + insecure,
                          "t.yaml", "/base");
  const auto& c = m.model.config;
  CHECK(c.arch == model_arch::qwen3_moe);
  CHECK(c.num_experts == 8);
  CHECK(c.num_experts_per_tok == 2); // the default
  CHECK(c.norm_topk_prob);
  CHECK(c.fused_experts);
  // Sparse: (l + 1) % 2 == 0 and not mlp-only: layers 1 and 3.
  CHECK_FALSE(c.sparse_layer(0));
  CHECK(c.sparse_layer(1));
  CHECK_FALSE(c.sparse_layer(2));
  CHECK(c.sparse_layer(3));
  const auto moe_printed = to_yaml(m);
  CHECK(moe_printed.find("experts: 8") != std::string::npos);
  CHECK(moe_printed.find("mlp_only_layers: [0]") != std::string::npos);
  CHECK(moe_printed.find("expert_layout: fused") != std::string::npos);
  CHECK(moe_printed.find("Qwen3-MoE layout") != std::string::npos);

  // Expert parallelism: tp need not divide moe_intermediate_size, at most
  // one worker per expert; the printed topology keeps the key.
  const std::string moe = "    arch: qwen3_moe\n    layers: 2\n    hidden_size: 64\n    heads: 4\n    kv_heads: 2\n"
                          "    intermediate_size: 128\n    experts: 6\n    moe_intermediate_size: 30\n";
  auto moe_with = [&](const std::string& engines) { // engines on line 14
    return "name: t\nmodel:\n  synthetic:\n" + moe + "nodes: [{name: a}, {name: b}]\ntrainer: {node: a}\n" + engines
           + "\n" + insecure;
  };
  auto ep = parse_topology(moe_with("engines: [{name: e, node: a, tp: 4, expert_parallel: true}]"), "t.yaml", "/base");
  CHECK(ep.engines.front().expert_parallel);
  CHECK(to_yaml(ep).find("expert_parallel: true") != std::string::npos);
  auto int8 = parse_topology(moe_with("engines: [{name: e, node: a, tp: 2, weights: int8}]"), "t.yaml", "/base");
  CHECK(int8.engines.front().weights == "int8");
  CHECK(to_yaml(int8).find("weights: int8") != std::string::npos);
  CHECK(to_yaml(ep).find("weights:") == std::string::npos);
  CHECK(to_yaml(m).find("expert_parallel") == std::string::npos);
  // Trainer ranks holding experts: two halves of every sparse layer's
  // experts; every expert of every sparse layer must be held.
  const std::string engines = "engines: [{name: e, node: a}]";
  auto ranks_with = [&](const std::string& ranks) { // ranks on line 13
    return "name: t\nmodel:\n  synthetic:\n" + moe + "nodes: [{name: a}, {name: b}]\ntrainer: {node: a, ranks: "
           + ranks + "}\n" + engines + "\n" + insecure;
  };
  auto halves = parse_topology(ranks_with("[{layers: all, experts: 0-2}, {node: b, layers: all, experts: [5, 3, 4]}]"),
                               "t.yaml", "/base");
  REQUIRE(halves.trainer.ranks.size() == 2);
  CHECK(halves.trainer.ranks[0].experts == std::vector<std::int64_t>{0, 1, 2});
  CHECK(halves.trainer.ranks[1].experts == std::vector<std::int64_t>{3, 4, 5});
  CHECK(to_yaml(halves).find("experts: [3, 4, 5]") != std::string::npos);
  CHECK_FALSE(parse_topology(ranks_with("[{layers: all}]"), "t.yaml", "/base").trainer.ranks[0].experts);
  CHECK(joined(errors_of(ranks_with("[{layers: all, experts: 0-2}, {node: b, layers: all, experts: 3-4}]")))
        == "t.yaml:13:27: trainer.ranks: layer 0: expert 5 is held by no rank holding the layer (the model has 6 "
           "experts)\n");
  CHECK(joined(errors_of(ranks_with("[{layers: 0, experts: 0-5}, {node: b, layers: 1, experts: 0-2}]")))
        == "t.yaml:13:27: trainer.ranks: layer 1: experts 3-5 are held by no rank holding the layer (the model has 6 "
           "experts)\n");
  CHECK(joined(errors_of(ranks_with("[{layers: all, experts: [0, 6]}]")))
        == "t.yaml:13:55: trainer.ranks[0].experts[1]: expert 6 out of range: the model has 6 experts (0-5)\n");
  auto fused = moe + "    expert_layout: fused\n";
  CHECK(joined(errors_of("name: t\nmodel:\n  synthetic:\n" + fused + "nodes: [{name: a}]\ntrainer: {node: a, ranks: "
                         "[{layers: all, experts: 0-2}, {layers: all, experts: 3-5}]}\n" + engines + "\n"))
        == "t.yaml:14:51: trainer.ranks[0].experts: the model's experts are fused (mlp.experts.gate_up_proj holds "
           "every expert of a layer): a rank holds all of a layer's experts or none\n"
           "t.yaml:14:80: trainer.ranks[1].experts: the model's experts are fused (mlp.experts.gate_up_proj holds "
           "every expert of a layer): a rank holds all of a layer's experts or none\n");

  CHECK(joined(errors_of(moe_with("engines: [{name: e, node: a, tp: 4}]")))
        == "t.yaml:14:34: engines[0].tp: must divide moe_intermediate_size (30), got 4\n");
  // With dp the EP size is dp x tp (vLLM's): 3 x 2 workers over 6 experts, not 2 x 4.
  CHECK(parse_topology(moe_with("engines: [{name: e, node: a, tp: 2, dp: 3, expert_parallel: true}]"), "t.yaml",
                       "/base").engines.front().dp == 3);
  CHECK(joined(errors_of(moe_with("engines: [{name: e, node: a, tp: 4, dp: 2, expert_parallel: true}]")))
        == "t.yaml:14:41: engines[0].dp: with expert parallelism, dp 2 x tp 4 workers exceed the model's 6 experts "
           "(every worker computes at least one)\n");
  CHECK(joined(errors_of(moe_with("engines: [{name: e, node: a, tp: 2, expert_parallel: true, kind: vllm, "
                                  "url: 'http://127.0.0.1:8000'}]")))
        == "t.yaml:14:54: engines[0].expert_parallel: applies to the built-in engine only; "
           "rlsync's vLLM adapter serves servers without expert parallelism (its weight check compares the sliced layout)\n");
}

TEST_CASE("topology errors: nodes") {
  check_rows({
    {"empty list", with("nodes", "nodes: []"), "t.yaml:3:8: nodes: must list at least one node"},
    {"a map, not a list", with("nodes", "nodes: {name: a}"), "t.yaml:3:8: nodes: expected a list, got a map"},
    {"nothing", with("nodes", "nodes:"), "t.yaml:3:1: nodes: expected a list, got nothing"},
    {"an entry is not a map", with("nodes", "nodes: [a, {name: b}]"),
     "t.yaml:3:9: nodes[0]: expected a map, got 'a'"},
    {"duplicate name", with("nodes", "nodes: [{name: a}, {name: a}]"),
     "t.yaml:3:27: nodes[1].name: duplicate node name 'a'"},
    {"missing name (references then go unchecked)", with("nodes", "nodes: [{name: a}, {address: h}]"),
     "t.yaml:3:20: nodes[1].name: missing required key"},
    {"port out of range", with("nodes", "nodes: [{name: a, port: 70000}, {name: b}]"),
     "t.yaml:3:25: nodes[0].port: must be between 0 and 65535, got 70000"},
    {"address with a space", with("nodes", "nodes: [{name: a, address: 'my host'}, {name: b}]"),
     "t.yaml:3:28: nodes[0].address: must be a host name or IP address, got 'my host'"},
    {"a member's port", with("nodes", "nodes: [{name: a, port: 4000}, {name: b, port: 4001}]"),
     "t.yaml:3:48: nodes[1].port: only the coordinator's node (a) listens; the others dial it and open no port: "
     "leave it out (or 0)"},
    {"an unknown coordinator node: that error alone", with("nodes", "nodes: [{name: a, port: 4000}, {name: b}]")
                                                         + "coordinator: {node: z}\n",
     "t.yaml:6:21: coordinator.node: unknown node 'z' (defined: a, b)"},
    {"a member's port, the coordinator elsewhere", with("nodes", "nodes: [{name: a, port: 4000}, {name: b, port: 4001}]")
                                                     + "coordinator: {node: b}\n",
     "t.yaml:3:25: nodes[0].port: only the coordinator's node (b) listens; the others dial it and open no port: "
     "leave it out (or 0)"},
    {"metrics port out of range", with("nodes", "nodes: [{name: a, metrics_port: -1}, {name: b}]"),
     "t.yaml:3:33: nodes[0].metrics_port: must not be negative, got -1"},
    {"metrics port is the node's port", with("nodes", "nodes: [{name: a, port: 4000, metrics_port: 4000}, {name: b}]"),
     "t.yaml:3:45: nodes[0].metrics_port: must differ from the node's port 4000"},
    {"metrics port is another node's port",
     with("nodes", "nodes: [{name: a, port: 4000}, {name: b, metrics_port: 4000}]"),
     "t.yaml:3:56: nodes[1].metrics_port: 127.0.0.1:4000 is already used by node 'a'"},
    {"metrics port not a number", with("nodes", "nodes: [{name: a, metrics_port: web}, {name: b}]"),
     "t.yaml:3:33: nodes[0].metrics_port: expected an integer, got 'web'"},
    {"restart not a policy", with("nodes", "nodes: [{name: a}, {name: b, restart: always}]"),
     "t.yaml:3:39: nodes[1].restart: must be one of never, on-failure, got 'always'"},
    {"max_restarts beyond the bound", with("nodes", "nodes: [{name: a}, {name: b, max_restarts: 101}]"),
     "t.yaml:3:44: nodes[1].max_restarts: must be between 0 and 100, got 101"},
    {"negative max_restarts", with("nodes", "nodes: [{name: a}, {name: b, max_restarts: -1}]"),
     "t.yaml:3:44: nodes[1].max_restarts: must not be negative, got -1"},
    {"restart on the coordinator's node", with("nodes", "nodes: [{name: a, restart: on-failure}, {name: b}]"),
     "t.yaml:3:28: nodes[0].restart: the coordinator's node (a) is never restarted: its failure ends the job; "
     "use never here"},
  });
}

TEST_CASE("topology: restart and request deadline keys") {
  auto defaults = parse_topology(with("", "") + insecure, "t.yaml", "/base");
  CHECK(defaults.nodes[1].restart == node_restart::never);
  CHECK(defaults.nodes[1].max_restarts == 3);
  CHECK(defaults.workload.request_deadline == std::chrono::milliseconds(30000));
  auto t = parse_topology(with("nodes", "nodes: [{name: a}, {name: b, restart: on-failure, max_restarts: 7}]")
                            + "workload: {request_deadline_ms: 2500}\n" + insecure,
                          "t.yaml", "/base");
  CHECK(t.nodes[0].restart == node_restart::never);
  CHECK(t.nodes[1].restart == node_restart::on_failure);
  CHECK(t.nodes[1].max_restarts == 7);
  CHECK(t.workload.request_deadline == std::chrono::milliseconds(2500));
  auto yaml = to_yaml(t);
  CHECK(yaml.find("restart: on-failure") != std::string::npos);
  CHECK(yaml.find("request_deadline_ms: 2500") != std::string::npos);
}

TEST_CASE("topology errors: cluster") {
  check_rows({
    {"a secret in the file", plus("cluster:\n  secret: hunter2"),
     "t.yaml:7:3: cluster.secret: secrets are never read from the topology; use secret_file or secret_env"},
    {"a secret under tls", plus("cluster:\n  tls: {ca: c, cert: d, key: k, secret: s}"),
     "t.yaml:7:33: cluster.tls.secret: secrets are never read from the topology; use secret_file or "
     "secret_env"},
    {"a secret at the top level", plus("secret: hunter2"),
     "t.yaml:6:1: secret: secrets are never read from the topology; use secret_file or secret_env"},
    {"insecure beside tls", plus("cluster:\n  tls: {ca: c, cert: d, key: k}\n  allow_insecure_network: true"),
     "t.yaml:8:27: cluster.allow_insecure_network: has no effect beside cluster.tls (the nodes talk TLS): leave it out"},
    {"both secret sources", plus("cluster:\n  secret_file: s\n  secret_env: S"),
     "t.yaml:8:15: cluster.secret_env: set at most one of secret_file and secret_env"},
    {"bad environment variable name", plus("cluster:\n  secret_env: my-secret"),
     "t.yaml:7:15: cluster.secret_env: must be the name of an environment variable (letters, digits, '_'), "
     "not the secret itself"},
    {"tls without a key", plus("cluster:\n  tls: {ca: c, cert: d}"), "t.yaml:7:8: cluster.tls.key: missing required key"},
    {"tls with an empty path", plus("cluster:\n  tls: {ca: '', cert: d, key: k}"), "t.yaml:7:13: cluster.tls.ca: must not be empty"},
    {"{node} in the CA", plus("cluster:\n  tls: {ca: '{node}.pem', cert: d, key: k}"), "t.yaml:7:13: cluster.tls.ca: must not contain {node}: every node trusts the same CA"},
    {"tls is a map", plus("cluster:\n  tls: certs"), "t.yaml:7:8: cluster.tls: expected a map, got 'certs'"},
    {"allow_insecure_network is a bool", plus("cluster:\n  allow_insecure_network: maybe"), "t.yaml:7:27: cluster.allow_insecure_network: expected true or false, got 'maybe'"},
    {"two nodes with neither tls nor allow_insecure_network", plus("cluster:\n  heartbeat_interval_ms: 100"),
     "t.yaml:7:3: cluster: more than one node needs cluster.tls ({ca, cert, key}; `rlsync certs make` makes them): "
     "without it anyone who reaches a node's port can read and forge cluster traffic; set "
     "cluster.allow_insecure_network: true to run without TLS anyway"},
    {"two nodes and no cluster section", with("", ""), 
     "t.yaml:3:8: nodes: more than one node needs cluster.tls ({ca, cert, key}; `rlsync certs make` makes them): "
     "without it anyone who reaches a node's port can read and forge cluster traffic; set "
     "cluster.allow_insecure_network: true to run without TLS anyway"},
    {"one node whose external ranks join it, without tls",
     one_node_external_ranks,
     "t.yaml:3:8: nodes: external trainer ranks (trainer.source: external) join the coordinator's node over the "
     "network, which needs cluster.tls ({ca, cert, key}; `rlsync certs make` makes them): without it anyone who "
     "reaches its port can read and forge cluster traffic; set cluster.allow_insecure_network: true to run without "
     "TLS anyway"},
    {"timeout not above interval", plus("cluster:\n  heartbeat_interval_ms: 500\n  heartbeat_timeout_ms: 500"),
     "t.yaml:8:25: cluster.heartbeat_timeout_ms: must exceed heartbeat_interval_ms (500), got 500"},
    {"zero connect deadline", plus("cluster:\n  connect_deadline_ms: 0"),
     "t.yaml:7:24: cluster.connect_deadline_ms: must be positive, got 0"},
  });
  // The secret's value must not leak into any message.
  for (auto& text : {plus("cluster:\n  secret: hunter2"), plus("secret: hunter2"),
                     plus("cluster: {secret: [hunter2]}"), plus("cluster: {secret_env: hunter2!}")}) {
    auto errs = errors_of(text);
    CHECK(errs.size() == 1);
    for (auto& e : errs)
      CHECK(e.find("hunter2") == std::string::npos);
  }
}

TEST_CASE("topology errors: trainer") {
  check_rows({
    {"missing node", with("trainer", "trainer: {seed: 1}"), "t.yaml:4:10: trainer.node: missing required key"},
    {"unknown node", with("trainer", "trainer: {node: gpu9}"),
     "t.yaml:4:17: trainer.node: unknown node 'gpu9' (defined: a, b)"},
    {"source out of range", with("trainer", "trainer: {node: a, source: magic}"),
     "t.yaml:4:28: trainer.source: must be one of synthetic, checkpoint_dir, external, got 'magic'"},
    {"external with a step time", with("trainer", "trainer: {node: a, source: external, step_time_ms: 5}"),
     "t.yaml:4:52: trainer.step_time_ms: not used with source: external (the rank's own process publishes its versions)"},
    {"external with a perturbation", with("trainer", "trainer: {node: a, source: external, perturb: 0.5}"),
     "t.yaml:4:47: trainer.perturb: not used with source: external (the rank's own process publishes its versions)"},
    {"external with a seed", with("trainer", "trainer: {node: a, source: external, seed: 3}"),
     "t.yaml:4:44: trainer.seed: not used with source: external (the rank's own process publishes its versions)"},
    {"external with a directory", with("trainer", "trainer: {node: a, source: external, dir: ckpts}"),
     "t.yaml:4:43: trainer.dir: only used with source: checkpoint_dir"},
    {"checkpoint_dir without dir", with("trainer", "trainer: {node: a, source: checkpoint_dir}"),
     "t.yaml:4:10: trainer.dir: missing required key"},
    {"dir without checkpoint_dir", with("trainer", "trainer: {node: a, dir: ckpts}"),
     "t.yaml:4:25: trainer.dir: only used with source: checkpoint_dir"},
    {"perturb negative", with("trainer", "trainer: {node: a, perturb: -1}"),
     "t.yaml:4:29: trainer.perturb: must be in [0, 1000], got -1"},
    {"perturb beyond a float", with("trainer", "trainer: {node: a, perturb: 1e39}"),
     "t.yaml:4:29: trainer.perturb: must be in [0, 1000], got 1e+39"},
    {"a checkpoint directory listed back to back", with("trainer", "trainer: {node: a, source: checkpoint_dir, dir: d, step_time_ms: 0}"),
     "t.yaml:4:66: trainer.step_time_ms: must be at least 10, got 0"},
    {"negative step time", with("trainer", "trainer: {node: a, step_time_ms: -5}"),
     "t.yaml:4:34: trainer.step_time_ms: must not be negative, got -5"},
    {"empty ranks", with("trainer", "trainer: {node: a, ranks: []}"),
     "t.yaml:4:27: trainer.ranks: must list at least one rank (or leave ranks out: one rank holds all "
     "layers)"},
    {"rank on an unknown node", with("trainer", "trainer: {node: a, ranks: [{node: c, layers: all}]}"),
     "t.yaml:4:35: trainer.ranks[0].node: unknown node 'c' (defined: a, b)"},
    {"rank without layers", with("trainer", "trainer: {node: a, ranks: [{node: a}]}"),
     "t.yaml:4:28: trainer.ranks[0].layers: missing required key"},
    {"a rank whose node is not a name", with("trainer", "trainer: {node: a, ranks: [{node: [b], layers: all}]}"),
     "t.yaml:4:35: trainer.ranks[0].node: expected a string, got a list"},
    {"a rank with an unknown key", with("trainer", "trainer: {node: a, ranks: [{layers: 0-1, stage: 0}, {layers: 2-3}]}"),
     "t.yaml:4:42: trainer.ranks[0].stage: unknown key (expected one of: node, layers, experts)"},
    {"the second rank out of range", with("trainer", "trainer: {node: a, ranks: [{layers: 0-1}, {node: b, layers: 2-4}]}"),
     "t.yaml:4:61: trainer.ranks[1].layers: layer 4 out of range: the model has 4 layers (0-3)"},
    {"two ranks leaving a layer unheld", with("trainer", "trainer: {node: a, ranks: [{layers: 0-1}, {node: b, layers: 3}]}"),
     "t.yaml:4:27: trainer.ranks: layer 2 is held by no rank (the model has 4 layers)"},
    {"layer out of range", with("trainer", "trainer: {node: a, ranks: [{layers: [0, 1, 2, 3, 9]}]}"),
     "t.yaml:4:50: trainer.ranks[0].layers[4]: layer 9 out of range: the model has 4 layers (0-3)"},
    {"range out of range", with("trainer", "trainer: {node: a, ranks: [{layers: 0-4}]}"),
     "t.yaml:4:37: trainer.ranks[0].layers: layer 4 out of range: the model has 4 layers (0-3)"},
    {"experts of a dense model", with("trainer", "trainer: {node: a, ranks: [{layers: all, experts: 0-3}]}"),
     "t.yaml:4:51: trainer.ranks[0].experts: needs a mixture-of-experts model (arch qwen3_moe), not llama"},
    {"layers not covered", with("trainer", "trainer: {node: a, ranks: [{layers: [0, 1, 3]}]}"),
     "t.yaml:4:27: trainer.ranks: layer 2 is held by no rank (the model has 4 layers)"},
    {"several layers not covered", with("trainer", "trainer: {node: a, ranks: [{layers: [1]}]}"),
     "t.yaml:4:27: trainer.ranks: layers 0, 2-3 are held by no rank (the model has 4 layers)"},
    {"malformed range", with("trainer", "trainer: {node: a, ranks: [{layers: '0..3'}]}"),
     "t.yaml:4:37: trainer.ranks[0].layers: expected `all`, a list of layer indices or a range like \"0-3\", "
     "got '0..3'"},
    {"reversed range", with("trainer", "trainer: {node: a, ranks: [{layers: 3-1}]}"),
     "t.yaml:4:37: trainer.ranks[0].layers: range start must not exceed its end, got '3-1'"},
    {"layer listed twice", with("trainer", "trainer: {node: a, ranks: [{layers: [0, 1, 1, 2, 3]}]}"),
     "t.yaml:4:44: trainer.ranks[0].layers[2]: layer 1 is listed twice"},
    {"negative layer", with("trainer", "trainer: {node: a, ranks: [{layers: [-1, 0, 1, 2, 3]}]}"),
     "t.yaml:4:38: trainer.ranks[0].layers[0]: must not be negative, got -1"},
    {"layers is a map", with("trainer", "trainer: {node: a, ranks: [{layers: {a: 1}}]}"),
     "t.yaml:4:37: trainer.ranks[0].layers: expected `all`, a list of layer indices or a range like \"0-3\", "
     "got a map"},
    {"empty layer list", with("trainer", "trainer: {node: a, ranks: [{layers: []}]}"),
     "t.yaml:4:37: trainer.ranks[0].layers: must name at least one layer"},
  });
}

TEST_CASE("topology errors: engines") {
  const std::string engine_keys =
    "name, node, replicas, tp, dp, dp_balance, expert_parallel, weights, device, max_batch, queue_limit, kv_block_tokens, "
    "prefix_cache_blocks, kind, url, api_key_file, weights_dir";
  check_rows({
    {"typo never falls back to a default", with("engines", "engines:\n  - name: e\n    node: a\n    tpp: 2"),
     "t.yaml:8:5: engines[0].tpp: unknown key, did you mean 'tp'? (expected one of: " + engine_keys + ")"},
    {"tp incompatible with the model", with("engines", "engines:\n  - name: e\n    node: a\n    tp: 3"),
     "t.yaml:8:9: engines[0].tp: must divide num_attention_heads (8), got 3\n"
     "t.yaml:8:9: engines[0].tp: must divide intermediate_size (704), got 3\n"
     "t.yaml:8:9: engines[0].tp: must divide num_key_value_heads (4) or be a multiple of it (kv heads are "
     "then replicated), got 3"},
    {"tp in the second entry",
     with("engines", "engines:\n  - {name: e, node: a}\n  - {name: f, node: b, tp: 16}"),
     "t.yaml:7:28: engines[1].tp: must divide num_attention_heads (8), got 16"},
    {"expert parallelism of a dense model", with("engines", "engines: [{name: e, node: a, expert_parallel: true}]"),
     "t.yaml:5:47: engines[0].expert_parallel: expert parallelism needs a mixture-of-experts model (arch "
     "qwen3_moe), not llama"},
    {"expert parallelism of a dense model, with dp",
     with("engines", "engines: [{name: e, node: a, dp: 2, expert_parallel: true}]"),
     "t.yaml:5:54: engines[0].expert_parallel: expert parallelism needs a mixture-of-experts model (arch "
     "qwen3_moe), not llama"},
    {"an unknown weight format", with("engines", "engines: [{name: e, node: a, weights: fp8}]"),
     "t.yaml:5:39: engines[0].weights: expected received or int8, got 'fp8'"},
    {"an unknown device", with("engines", "engines: [{name: e, node: a, device: tpu}]"),
     "t.yaml:5:38: engines[0].device: expected cpu or cuda, got 'tpu'"},
    {"a device for a vLLM server", with("engines", "engines: [{name: v, node: a, kind: vllm, url: 'http://h:1', device: cuda}]"),
     "t.yaml:5:69: engines[0].device: applies to the built-in engine only; a vLLM server runs on the devices it "
     "was started on"},
    {"expert_parallel not a boolean", with("engines", "engines: [{name: e, node: a, expert_parallel: 2}]"),
     "t.yaml:5:47: engines[0].expert_parallel: expected true or false, got '2'"},
    {"dp zero", with("engines", "engines: [{name: e, node: a, dp: 0}]"),
     "t.yaml:5:34: engines[0].dp: must be positive, got 0"},
    {"dp past the bound", with("engines", "engines: [{name: e, node: a, dp: 65}]"),
     "t.yaml:5:34: engines[0].dp: must be between 1 and 64, got 65"},
    {"an unknown balance", with("engines", "engines: [{name: e, node: a, dp: 2, dp_balance: random}]"),
     "t.yaml:5:49: engines[0].dp_balance: expected least_outstanding or prefix_affinity, got 'random'"},
    {"tp zero", with("engines", "engines: [{name: e, node: a, tp: 0}]"),
     "t.yaml:5:34: engines[0].tp: must be positive, got 0"},
    {"zero replicas", with("engines", "engines: [{name: e, node: a, replicas: 0}]"),
     "t.yaml:5:40: engines[0].replicas: must be positive, got 0"},
    {"implausible replicas", with("engines", "engines: [{name: e, node: a, replicas: 1000000}]"),
     "t.yaml:5:40: engines[0].replicas: must be between 1 and 4096, got 1000000"},
    {"duplicate after expanding replicas",
     with("engines", "engines:\n  - {name: e, node: a, replicas: 2}\n  - {name: e-1, node: b}"),
     "t.yaml:7:12: engines[1].name: duplicate engine name 'e-1' (also from engines[0])"},
    {"duplicate group names", with("engines", "engines:\n  - {name: e, node: a}\n  - {name: e, node: b}"),
     "t.yaml:7:12: engines[1].name: duplicate engine name 'e' (also from engines[0])"},
    {"reserved name", with("engines", "engines: [{name: router, node: a}]"),
     "t.yaml:5:18: engines[0].name: 'router' is reserved (trainer, router and coordinator name those "
     "actors)"},
    {"name of a node", with("engines", "engines: [{name: b, node: a}]"),
     "t.yaml:5:18: engines[0].name: engine 'b' has the name of a node; drill targets would be ambiguous"},
    {"unknown node", with("engines", "engines: [{name: e, node: gpu9}]"),
     "t.yaml:5:27: engines[0].node: unknown node 'gpu9' (defined: a, b)"},
    {"missing node", with("engines", "engines: [{name: e}]"), "t.yaml:5:11: engines[0].node: missing required key"},
    {"not a list", with("engines", "engines: {name: e, node: a}"),
     "t.yaml:5:10: engines: expected a list, got a map"},
    {"entry not a map", with("engines", "engines: [e]"), "t.yaml:5:11: engines[0]: expected a map, got 'e'"},
    {"empty list", with("engines", "engines: []"), "t.yaml:5:10: engines: must list at least one engine"},
    {"partition of an external server",
     with("engines", "engines: [{name: v, node: a, kind: vllm, url: 'http://h:1'}]") + "drill: {faults: [{at_sync: 1, action: partition, target: v}]}\n",
     "t.yaml:6:39: drill.faults[0].action: partition cannot act on engine 'v' (kind vllm: an external server has "
     "no fault gate; kill its server instead)"},
    {"more vLLM streams than the adapter holds threads for",
     with("engines", "engines: [{name: v, node: a, kind: vllm, url: 'http://h:1', queue_limit: 5000}]"),
     "t.yaml:5:74: engines[0].queue_limit: max_batch + queue_limit is at most 4096 for kind vllm (the adapter holds "
     "a thread per open stream); got 5032"},
    {"kind vllm without url", with("engines", "engines: [{name: e, node: a, kind: vllm}]"),
     "t.yaml:5:11: engines[0].url: missing required key"},
    {"https url", with("engines", "engines: [{name: e, node: a, kind: vllm, url: 'https://h:8000'}]"),
     "t.yaml:5:47: engines[0].url: https is not supported (no TLS in rlsync's HTTP client): reach the server over loopback or a private network, e.g. http://127.0.0.1:8000"},
    {"url without a port", with("engines", "engines: [{name: e, node: a, kind: vllm, url: 'http://h'}]"),
     "t.yaml:5:47: engines[0].url: must be http://HOST:PORT, got 'http://h'"},
    {"url with a path", with("engines", "engines: [{name: e, node: a, kind: vllm, url: 'http://h:8000/v1'}]"),
     "t.yaml:5:47: engines[0].url: must be http://HOST:PORT, got 'http://h:8000/v1'"},
    {"url port out of range", with("engines", "engines: [{name: e, node: a, kind: vllm, url: 'http://h:70000'}]"),
     "t.yaml:5:47: engines[0].url: port must be between 1 and 65535, got 70000"},
    {"kind out of range", with("engines", "engines: [{name: e, node: a, kind: sglang}]"),
     "t.yaml:5:36: engines[0].kind: must be one of builtin, vllm, got 'sglang'"},
    {"replicas of a server", with("engines", "engines: [{name: e, node: a, kind: vllm, url: 'http://h:1', replicas: 2}]"),
     "t.yaml:5:71: engines[0].replicas: must be 1 for kind vllm: each server is its own entry with its own url"},
    {"built-in cache keys on a server", with("engines", "engines: [{name: e, node: a, kind: vllm, url: 'http://h:1', prefix_cache_blocks: 8}]"),
     "t.yaml:5:82: engines[0].prefix_cache_blocks: applies to the built-in engine only; a vLLM server sets its own caches"},
    {"url on a built-in engine", with("engines", "engines: [{name: e, node: a, url: 'http://h:1'}]"),
     "t.yaml:5:35: engines[0].url: applies to kind vllm only (this entry runs the built-in engine)"},
    {"empty weights_dir", with("engines", "engines: [{name: e, node: a, kind: vllm, url: 'http://h:1', weights_dir: ''}]"),
     "t.yaml:5:74: engines[0].weights_dir: must not be empty"},
    {"max_batch with junk", with("engines", "engines: [{name: e, node: a, max_batch: 32x}]"),
     "t.yaml:5:41: engines[0].max_batch: expected an integer, got '32x'"},
    {"fractional queue_limit", with("engines", "engines: [{name: e, node: a, queue_limit: 1.5}]"),
     "t.yaml:5:43: engines[0].queue_limit: expected an integer, got '1.5'"},
    {"huge integer", with("engines", "engines: [{name: e, node: a, max_batch: 99999999999999999999}]"),
     "t.yaml:5:41: engines[0].max_batch: integer out of range: '99999999999999999999'"},
    {"negative prefix cache", with("engines", "engines: [{name: e, node: a, prefix_cache_blocks: -1}]"),
     "t.yaml:5:51: engines[0].prefix_cache_blocks: must not be negative, got -1"},
  });
}

TEST_CASE("topology errors: router, coordinator, transfer") {
  check_rows({
    {"policy out of range", plus("router: {policy: fastest}"),
     "t.yaml:6:18: router.policy: must be one of least_outstanding, round_robin, prefix_affinity, got "
     "'fastest'"},
    {"router on an unknown node", plus("router: {node: z}"),
     "t.yaml:6:16: router.node: unknown node 'z' (defined: a, b)"},
    {"empty value", plus("router:\n  queue_limit:"), "t.yaml:7:3: router.queue_limit: expected an integer, got nothing"},
    {"http port out of range", plus("router: {http_port: 65536}"),
     "t.yaml:6:21: router.http_port: must be between 0 and 65535, got 65536"},
    {"http port is text", plus("router: {http_port: web}"),
     "t.yaml:6:21: router.http_port: expected an integer, got 'web'"},
    {"http port is the router node's port",
     with("nodes", "nodes: [{name: a, port: 4000}, {name: b}]") + "router: {node: a, http_port: 4000}\n",
     "t.yaml:6:30: router.http_port: 127.0.0.1:4000 is already used by node 'a'"},
    {"http port is another node's metrics port on the same address",
     with("nodes", "nodes: [{name: a}, {name: b, metrics_port: 9100}]") + "router: {node: a, http_port: 9100}\n",
     "t.yaml:6:30: router.http_port: 127.0.0.1:9100 is already used by node 'b'"},
    {"empty state file", plus("coordinator: {state_file: ''}"),
     "t.yaml:6:27: coordinator.state_file: must not be empty"},
    {"backend out of range", plus("transfer: {backend: rdma}"),
     "t.yaml:6:21: transfer.backend: must be one of local, ucx, nccl, cuda_ipc, got 'rdma'"},
    // Only the nccl collective cuts buckets: elsewhere only the default size is honest.
    {"bucket_bytes other than the default", plus("transfer: {bucket_bytes: 256MiB}"),
     "t.yaml:6:26: transfer.bucket_bytes: only the default 64 MiB is accepted here: buckets are what the nccl "
     "collective broadcasts (collective: true); every other data plane moves one whole parameter group (a "
     "transformer block) per message or buffer and does not cut it into buckets; got 268435456 (256 MiB)"},
    {"bucket_bytes in plain bytes", plus("transfer: {bucket_bytes: 1000}"),
     "t.yaml:6:26: transfer.bucket_bytes: only the default 64 MiB is accepted here: buckets are what the nccl "
     "collective broadcasts (collective: true); every other data plane moves one whole parameter group (a "
     "transformer block) per message or buffer and does not cut it into buckets; got 1000"},
    {"mode out of range", plus("transfer: {mode: scatter}"),
     "t.yaml:6:18: transfer.mode: must be one of sharded, broadcast, got 'scatter'"},
    {"size with an unknown unit", plus("transfer: {bucket_bytes: 64Mb}"),
     "t.yaml:6:26: transfer.bucket_bytes: unknown size unit 'Mb' in '64Mb' (use B, KiB, MiB, GiB, TiB, KB, "
     "MB, GB, TB)"},
    {"negative size", plus("transfer: {bucket_bytes: -1MiB}"),
     "t.yaml:6:26: transfer.bucket_bytes: must not be negative, got '-1MiB'"},
    {"zero size", plus("transfer: {bucket_bytes: 0}"), "t.yaml:6:26: transfer.bucket_bytes: must be positive, got 0"},
    {"size is a list", plus("transfer: {bucket_bytes: [1]}"),
     "t.yaml:6:26: transfer.bucket_bytes: expected a size (bytes, or e.g. 64MiB), got a list"},
    {"size is text", plus("transfer: {bucket_bytes: big}"),
     "t.yaml:6:26: transfer.bucket_bytes: expected a size (bytes, or e.g. 64MiB), got 'big'"},
    {"fractional size", plus("transfer: {bucket_bytes: 1.5GiB}"),
     "t.yaml:6:26: transfer.bucket_bytes: expected a size (bytes, or e.g. 64MiB), got '1.5GiB'"},
    {"size overflows", plus("transfer: {bucket_bytes: 99999999999TiB}"),
     "t.yaml:6:26: transfer.bucket_bytes: size out of range: '99999999999TiB'"},
    {"groups_in_flight zero", plus("transfer: {groups_in_flight: 0}"),
     "t.yaml:6:30: transfer.groups_in_flight: must be positive, got 0"},
    {"more groups in flight than a ucx open carries", plus("transfer: {backend: ucx, groups_in_flight: 65}"),
     "t.yaml:6:44: transfer.groups_in_flight: must be at most 64 with backend 'ucx' (the gets an engine worker's "
     "open carries to its producer); got 65"},
    {"transport out of range", plus("transfer: {backend: ucx, ucx_transports: [shm, ib]}"),
     "t.yaml:6:48: transfer.ucx_transports[1]: must be one of shm, cma, tcp, rdma, got 'ib'"},
    {"transports not a list", plus("transfer: {backend: ucx, ucx_transports: tcp}"),
     "t.yaml:6:42: transfer.ucx_transports: expected a list, got 'tcp'"},
    {"transport twice", plus("transfer: {backend: ucx, ucx_transports: [tcp, tcp]}"),
     "t.yaml:6:48: transfer.ucx_transports[1]: 'tcp' is listed twice"},
    {"transports for the local backend, named", plus("transfer: {backend: local, ucx_transports: [tcp]}"),
     "t.yaml:6:44: transfer.ucx_transports: only the ucx backend moves weights over UCX; backend 'local' does "
     "not use it"},
    {"transports for the default backend", plus("transfer: {ucx_transports: [tcp]}"),
     "t.yaml:6:28: transfer.ucx_transports: only the ucx backend moves weights over UCX; backend 'local' does "
     "not use it"},
    {"a packed budget for the local backend", plus("transfer: {packed_budget_bytes: 1GiB}"),
     "t.yaml:6:33: transfer.packed_budget_bytes: only the ucx backend's producer packs groups; backend 'local' "
     "has no packed budget"},
    {"a packed budget past its bound", plus("transfer: {backend: ucx, packed_budget_bytes: 5TiB}"),
     "t.yaml:6:47: transfer.packed_budget_bytes: must be between 0 and 4398046511104, got 5497558138880"},
    {"huge pages for the default backend", plus("transfer: {huge_pages: false}"),
     "t.yaml:6:24: transfer.huge_pages: only the ucx backend's producer makes shared buffers (in huge pages or "
     "not); backend 'local' has none"},
    // The base model's largest group is the last (a block, the final norm,
    // the LM head): 819968 parameters, 1639936 bytes in bf16; a worker of
    // tp 2 packs at least half of it.
    {"packed budget below one worker's share of a group", plus("transfer: {backend: ucx, packed_budget_bytes: 819967}"),
     "t.yaml:6:47: transfer.packed_budget_bytes: 819967 bytes is less than one packed group: group 3 of the "
     "model is 1639936 bytes, of which a worker of tp 2 needs at least 819968; the producer packs whole "
     "groups, so give at least 819968 (or 0 for the default)"},
    {"packed budget below a whole group a vLLM engine pulls",
     with("engines", "engines: [{name: e, node: a, tp: 2}, {name: v, node: b, tp: 2, kind: vllm, url: 'http://h:1'}]")
       + "transfer: {backend: ucx, packed_budget_bytes: 819968}\n",
     "t.yaml:6:47: transfer.packed_budget_bytes: 819968 bytes is less than one packed group: group 3 of the "
     "model is 1639936 bytes, pulled whole by vLLM engine 'v''s adapter; the producer packs whole groups, so give "
     "at least 1639936 (or 0 for the default)"},
    {"packed budget below a whole group in broadcast", plus("transfer: {backend: ucx, mode: broadcast, packed_budget_bytes: 1MiB}"),
     "t.yaml:6:64: transfer.packed_budget_bytes: 1048576 bytes is less than one packed group: group 3 of the "
     "model is 1639936 bytes, sent whole in broadcast; the producer packs whole groups, so give at least "
     "1639936 (or 0 for the default)"},
    {"huge pages named for a backend without shared buffers", plus("transfer: {backend: local, huge_pages: false}"),
     "t.yaml:6:40: transfer.huge_pages: only the ucx backend's producer makes shared buffers (in huge pages or "
     "not); backend 'local' has none"},
    {"huge pages where nothing is lent in shared memory", plus("transfer: {backend: ucx, ucx_transports: [tcp], huge_pages: true}"),
     "t.yaml:6:61: transfer.huge_pages: ucx_transports name no shm: the producer lends no shared memory, in huge "
     "pages or not"},
    {"huge pages not a boolean", plus("transfer: {backend: ucx, huge_pages: maybe}"), "t.yaml:6:38: transfer.huge_pages: expected true or false, got 'maybe'"},
    {"negative packed budget", plus("transfer: {backend: ucx, packed_budget_bytes: -1}"),
     "t.yaml:6:47: transfer.packed_budget_bytes: must not be negative, got '-1'"},
  });
  // One group's worth is enough; 0 picks the default.
  for (const char* ok : {"transfer: {backend: ucx, packed_budget_bytes: 819968}",
                         "transfer: {backend: ucx, packed_budget_bytes: 1GiB}",
                         "transfer: {backend: ucx, packed_budget_bytes: 0}"}) {
    CAPTURE(ok);
    CHECK(errors_of(plus(ok) + insecure).empty());
  }
  CHECK(parse_topology(plus("transfer: {backend: ucx, packed_budget_bytes: 4MiB}") + insecure, "t.yaml", "/base")
          .transfer.packed_budget_bytes
        == 4 << 20);
}

TEST_CASE("topology: cuda_ipc is accepted in a CUDA build for one host and whole groups, refused otherwise") {
  const auto text = plus(insecure + "transfer: {backend: cuda_ipc, mode: broadcast}");
  {
    scoped_build_features without_cuda({false, false}); // what a stub build says, in every build
    check_rows({{"a build without CUDA", text,
                 "t.yaml:7:21: transfer.backend: 'cuda_ipc' needs rlsync built with CUDA, and this build has none "
                 "(gpu/ was configured without nvcc: none found, or -DRLSYNC_WITH_CUDA=OFF); use local or ucx"}});
  }
  if (!cuda_compiled_in()) {
    MESSAGE("acceptance not checked: this build has no CUDA");
    return;
  }
  // The device is checked at start-up (head_node, member_node), not here.
  CHECK(parse_topology(text, "t.yaml", "/base").transfer.backend == transfer_backend::cuda_ipc);
  check_rows({
    {"sharded", plus(insecure + "transfer: {backend: cuda_ipc}"),
     "t.yaml:7:21: transfer.backend: 'cuda_ipc' moves whole groups, which every engine worker slices itself: "
     "set transfer.mode: broadcast (sharded pulls over cuda_ipc need packing on the device, not built yet)"},
    {"two hosts",
     with("nodes", "nodes: [{name: a}, {name: b, address: 10.0.0.2}]") + insecure
       + "transfer: {backend: cuda_ipc, mode: broadcast}\n",
     "t.yaml:7:21: transfer.backend: 'cuda_ipc' maps the trainer's GPU memory into the engines' processes, so "
     "every node runs on one host: node 'b' is at 10.0.0.2, node 'a' at 127.0.0.1; use ucx across hosts"},
    {"groups in flight it would not pipeline", plus(insecure + "transfer: {backend: cuda_ipc, mode: broadcast, groups_in_flight: 4}"),
     "t.yaml:7:66: transfer.groups_in_flight: only the default 2 is accepted with backend 'cuda_ipc': its pullers "
     "move one group at a time; got 4"},
  });
}

TEST_CASE("topology: an engine on device cuda is accepted in a CUDA build, refused by validation otherwise") {
  const auto text = with("engines", "engines: [{name: e, node: a, device: cuda}]") + insecure;
  {
    scoped_build_features without_cuda({false, false});
    check_rows({{"a build without CUDA", text,
                 "t.yaml:5:38: engines[0].device: 'cuda' needs rlsync built with CUDA, and this build has none (gpu/ "
                 "was configured without nvcc: none found, or -DRLSYNC_WITH_CUDA=OFF); use cpu"}});
  }
  if (!cuda_compiled_in()) {
    MESSAGE("acceptance not checked: this build has no CUDA");
    return;
  }
  // The device itself is checked at start-up (backend_device_problem), not here.
  const auto t = parse_topology(text, "t.yaml", "/base");
  CHECK(t.engines.front().device == "cuda");
  CHECK(to_yaml(t).find("device: cuda") != std::string::npos);
  CHECK(to_yaml(parse_topology(with("engines", "engines: [{name: e, node: a}]") + insecure, "t.yaml", "/base"))
          .find("device:")
        == std::string::npos);
}

TEST_CASE("topology: trainer versions are kept lendable in place only in huge pages, over shared memory") {
  struct row {
    const char* transfer;
    bool lendable;
  };
  const row rows[] = {
    {"{backend: ucx}", true},
    {"{backend: ucx, ucx_transports: [shm, tcp]}", true},
    {"{backend: ucx, huge_pages: false}", false},
    {"{backend: ucx, ucx_transports: [tcp]}", false},
    {"{backend: local}", false},
  };
  for (const auto& r : rows) {
    CAPTURE(r.transfer);
    const auto t = parse_topology(plus(insecure + "transfer: " + r.transfer), "t.yaml", "/base");
    CHECK(trainer_versions_lendable(t.transfer) == r.lendable);
  }
}

TEST_CASE("topology: a collective broadcast is refused without nccl") {
  check_rows({
    {"over ucx", plus(insecure + "transfer: {backend: ucx, mode: broadcast, collective: true}"),
     "t.yaml:7:55: transfer.collective: a collective broadcast runs over NCCL and sends whole groups: it needs "
     "backend: nccl and mode: broadcast"},
    {"not a bool", plus(insecure + "transfer: {collective: maybe}"), "t.yaml:7:24: transfer.collective: expected true or false, got 'maybe'"},
  });
  CHECK_FALSE(parse_topology(plus(insecure + "transfer: {collective: false}"), "t.yaml", "/base").transfer.collective);
}

TEST_CASE("topology: nccl is accepted in a CUDA and NCCL build, sharded or broadcast, for built-in engines") {
  const auto text = plus(insecure + "transfer: {backend: nccl, mode: broadcast}");
  {
    scoped_build_features without_cuda({false, false});
    check_rows({{"a build without CUDA", text,
                 "t.yaml:7:21: transfer.backend: 'nccl' needs rlsync built with CUDA and NCCL, and this build has no "
                 "CUDA (gpu/ was configured without nvcc: none found, or -DRLSYNC_WITH_CUDA=OFF); use local or ucx"}});
  }
  {
    scoped_build_features without_nccl({true, false});
    if (cuda_compiled_in())
      check_rows({{"a CUDA build without NCCL", text,
                   "t.yaml:7:21: transfer.backend: 'nccl' needs rlsync built with CUDA and NCCL, and this build has "
                   "no NCCL (nccl.h or libnccl was not found when it was configured); use local or ucx"}});
  }
  if (!nccl_compiled_in()) {
    MESSAGE("acceptance not checked: this build has no NCCL");
    return;
  }
  // The device is checked at start-up (head_node, member_node), not here.
  CHECK(parse_topology(text, "t.yaml", "/base").transfer.backend == transfer_backend::nccl);
  const auto sharded = parse_topology(plus(insecure + "transfer: {backend: nccl}"), "t.yaml", "/base");
  CHECK(sharded.transfer.backend == transfer_backend::nccl);
  CHECK(sharded.transfer.mode == transfer_mode::sharded);
  CHECK_FALSE(sharded.transfer.collective);
  CHECK(parse_topology(plus(insecure + "transfer: {backend: nccl, mode: broadcast, collective: true}"), "t.yaml", "/base")
          .transfer.collective);
  check_rows({{"waves smaller than the collective's broadcast",
               plus(insecure + "transfer: {backend: nccl, mode: broadcast, collective: true}\nsync: {wave_size: 1}"),
               "t.yaml:8:19: sync.wave_size: with transfer.collective every engine joins one broadcast; a wave of 1 of "
               "the 2 engines would fall back to point-to-point pulls: leave it 0 or give at least 2"}});
  CHECK(parse_topology(plus(insecure + "transfer: {backend: nccl, mode: broadcast, collective: true}\nsync: {wave_size: 2}"),
                       "t.yaml", "/base")
          .sync.wave_size == 2);
  // Two ranks, apart from the engines: each broadcasts in a communicator of its own.
  CHECK(parse_topology(with("trainer", "trainer: {node: b, ranks: [{node: b, layers: 0-1}, {node: b, layers: 2-3}]}")
                         + insecure + "transfer: {backend: nccl, mode: broadcast, collective: true}\n",
                       "t.yaml", "/base")
          .transfer.collective);
  // The collective's buckets: any size up to what a member's staging may hold.
  CHECK(parse_topology(plus(insecure + "transfer: {backend: nccl, mode: broadcast, collective: true, bucket_bytes: 16GiB}"),
                       "t.yaml", "/base")
          .transfer.bucket_bytes
        == std::int64_t(16) << 30);
  CHECK(parse_topology(plus(insecure + "transfer: {backend: nccl, mode: broadcast, collective: true, bucket_bytes: 1GiB}"),
                       "t.yaml", "/base")
          .transfer.bucket_bytes
        == std::int64_t(1) << 30);
  check_rows({
    {"a collective bucket past the bound",
     plus(insecure + "transfer: {backend: nccl, mode: broadcast, collective: true, bucket_bytes: 17GiB}"),
     "t.yaml:7:76: transfer.bucket_bytes: must be at most 16 GiB (each member's device staging holds one bucket); "
     "got 18253611008 (17 GiB)"},
    {"a collective of two ranks, an engine beside one",
     with("trainer", "trainer: {node: a, ranks: [{node: a, layers: 0-1}, {node: b, layers: 2-3}]}") + insecure
       + "transfer: {backend: nccl, mode: broadcast, collective: true}\n",
     "t.yaml:7:56: transfer.collective: with several trainer ranks every engine must run on a node of its own: "
     "engine 'e-0' shares node 'a' with trainer rank 0, whose groups it takes in its own process and so never joins "
     "that rank's broadcasts"},
    {"a collective of shards", plus(insecure + "transfer: {backend: nccl, collective: true}"),
     "t.yaml:7:39: transfer.collective: a collective broadcast runs over NCCL and sends whole groups: it needs "
     "backend: nccl and mode: broadcast"},
    {"more members than a communicator takes",
     "name: t\nmodel: {synthetic: {layers: 2, hidden_size: 1024, heads: 64, kv_heads: 64, intermediate_size: 128}}\n"
     "nodes: [{name: a}, {name: b}]\ntrainer: {node: a}\nengines: [{name: e, node: a, replicas: 1024, tp: 64}]\n"
       + insecure + "transfer: {backend: nccl, mode: broadcast}\n",
     "t.yaml:7:21: transfer.backend: 'nccl' puts every trainer rank and engine worker in one communicator, at "
     "most 65536 members; this topology has 65537"},
    {"a vLLM engine", with("engines", "engines: [{name: v, node: a, kind: vllm, url: 'http://h:1'}]") + insecure
                        + "transfer: {backend: nccl, mode: broadcast}\n",
     "t.yaml:7:21: transfer.backend: 'nccl' delivers into rlsync's own engines, and engine 'v' is a vLLM server, "
     "whose GPUs this node does not hold; use ucx"},
  });
}

TEST_CASE("topology errors: sync and workload") {
  check_rows({
    {"zero deadline", plus("sync: {deadlines_ms: {pause: 0}}"),
     "t.yaml:6:30: sync.deadlines_ms.pause: must be positive, got 0"},
    {"unknown phase", plus("sync: {deadlines_ms: {resume: 10}}"),
     "t.yaml:6:23: sync.deadlines_ms.resume: unknown key (expected one of: pause, flush, start, transfer, "
     "finish, continue)"},
    {"more live engines than replicas", plus("sync: {min_live_engines: 3}"),
     "t.yaml:6:26: sync.min_live_engines: must not exceed the number of engine replicas (2), got 3"},
    {"negative staleness", plus("sync: {staleness: -1}"), "t.yaml:6:19: sync.staleness: must not be negative, got -1"},
    {"staleness below the cadence", plus("sync: {every_versions: 3, staleness: 1}"),
     "t.yaml:6:38: sync.staleness: staleness (1) must be at least every_versions - 1 (2): engines sync every "
     "3 versions, so between rounds they trail the trainer by up to 2"},
    {"the default staleness below the cadence", plus("sync: {every_versions: 3}"),
     "t.yaml:6:24: sync.every_versions: staleness (1) must be at least every_versions - 1 (2): engines sync "
     "every 3 versions, so between rounds they trail the trainer by up to 2"},
    {"negative wave_size", plus("sync: {wave_size: -1}"), "t.yaml:6:19: sync.wave_size: must not be negative, got -1"},
    {"pause mode out of range", plus("sync: {pause: {mode: freeze}}"),
     "t.yaml:6:22: sync.pause.mode: must be one of keep, wait, abort, got 'freeze'"},
    {"pause clear_cache not a bool", plus("sync: {pause: {clear_cache: yes}}"),
     "t.yaml:6:29: sync.pause.clear_cache: expected true or false, got 'yes'"},
    {"pause is a word", plus("sync: {pause: keep}"), "t.yaml:6:15: sync.pause: expected a map, got 'keep'"},
    {"fractional every_versions", plus("sync: {every_versions: 1.5}"),
     "t.yaml:6:24: sync.every_versions: expected an integer, got '1.5'"},
    {"sync is a list", plus("sync: [1]"), "t.yaml:6:7: sync: expected a map, got a list"},
    {"top_p zero", plus("workload: {top_p: 0}"), "t.yaml:6:19: workload.top_p: must be in (0, 1], got 0"},
    {"top_p above one", plus("workload: {top_p: 1.5}"), "t.yaml:6:19: workload.top_p: must be in (0, 1], got 1.5"},
    {"top_p below a float's normal range", plus("workload: {top_p: 1e-50}"),
     "t.yaml:6:19: workload.top_p: must be in (0, 1] and not below a float's smallest normal value (about 1.18e-38), got 1e-50"},
    {"negative temperature", plus("workload: {temperature: -0.5}"),
     "t.yaml:6:25: workload.temperature: must be in [0, 100], got -0.5"},
    {"temperature beyond a float", plus("workload: {temperature: 1e39}"),
     "t.yaml:6:25: workload.temperature: must be in [0, 100], got 1e+39"},
    {"zero concurrency", plus("workload: {concurrency: 0}"),
     "t.yaml:6:25: workload.concurrency: must be positive, got 0"},
    {"prompts as text", plus("workload: {prompts: lots}"),
     "t.yaml:6:21: workload.prompts: expected an integer, got 'lots'"},
    {"zero request deadline", plus("workload: {request_deadline_ms: 0}"),
     "t.yaml:6:33: workload.request_deadline_ms: must be positive, got 0"},
    {"request deadline beyond an hour", plus("workload: {request_deadline_ms: 3600001}"),
     "t.yaml:6:33: workload.request_deadline_ms: must be between 1 and 3600000, got 3600001"},
  });
}

TEST_CASE("hostile topologies: every size, count and deadline has an upper bound") {
  check_rows({
    {"intermediate_size that wraps the parameter count",
     synthetic("    layers: 2\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 9223372036854775800"),
     "t.yaml:7:24: model.synthetic.intermediate_size: must be at most 1048576, got 9223372036854775800"},
    {"vocab_size INT64_MAX",
     synthetic("    layers: 2\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n"
               "    vocab_size: 9223372036854775807"),
     "t.yaml:8:17: model.synthetic.vocab_size: must be at most 16777216, got 9223372036854775807"},
    {"vocab_size beyond int64",
     synthetic("    layers: 2\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704\n"
               "    vocab_size: 99999999999999999999"),
     "t.yaml:8:17: model.synthetic.vocab_size: integer out of range: '99999999999999999999'"},
    {"layers: 100000000 (expanding it hung validate)",
     synthetic("    layers: 100000000\n    hidden_size: 256\n    heads: 8\n    intermediate_size: 704"),
     "t.yaml:4:13: model.synthetic.layers: must be at most 1024, got 100000000"},
    {"hidden_size too large", synthetic("    layers: 2\n    hidden_size: 131072\n    heads: 8\n    intermediate_size: 704"),
     "t.yaml:5:18: model.synthetic.hidden_size: must be at most 65536, got 131072"},
    {"every size in range, the product too large",
     synthetic("    layers: 1024\n    hidden_size: 65536\n    heads: 512\n    intermediate_size: 1048576"),
     "t.yaml:4:13: model.synthetic.layers: the model would have 228698594803712 parameters, more than the "
     "limit of 1099511627776 (2^40)"},
    {"deadline near INT64_MAX (overflowed into instant eviction)",
     plus("sync: {deadlines_ms: {transfer: 9223372036854775000}}"),
     "t.yaml:6:33: sync.deadlines_ms.transfer: must be between 1 and 86400000, got 9223372036854775000"},
    {"heartbeat interval beyond a day", plus("cluster: {heartbeat_interval_ms: 86400001}"),
     "t.yaml:6:34: cluster.heartbeat_interval_ms: must be between 1 and 86400000, got 86400001"},
    {"step_time_ms beyond a day", with("trainer", "trainer: {node: a, step_time_ms: 100000000000}"),
     "t.yaml:4:34: trainer.step_time_ms: must be between 0 and 86400000, got 100000000000"},
    {"tp too large", with("engines", "engines: [{name: e, node: a, tp: 4096}]"),
     "t.yaml:5:34: engines[0].tp: must be between 1 and 1024, got 4096"},
    {"queue_limit too large", with("engines", "engines: [{name: e, node: a, queue_limit: 2000000000}]"),
     "t.yaml:5:43: engines[0].queue_limit: must be between 1 and 1048576, got 2000000000"},
    {"max_batch too large", with("engines", "engines: [{name: e, node: a, max_batch: 100000}]"),
     "t.yaml:5:41: engines[0].max_batch: must be between 1 and 65536, got 100000"},
    {"replicas in all beyond the cap",
     with("engines", "engines: [{name: e, node: a, replicas: 4096}, {name: f, node: a, replicas: 1}]"),
     "t.yaml:5:76: engines[1].replicas: more than 4096 engine replicas in all"},
    {"router queue too large", plus("router: {queue_limit: 4294967296}"),
     "t.yaml:6:23: router.queue_limit: must be between 1 and 1048576, got 4294967296"},
    {"max_tokens beyond 2^32 (was narrowed)", plus("workload: {max_tokens: 4294967297}"),
     "t.yaml:6:24: workload.max_tokens: must be between 1 and 1048576, got 4294967297"},
    {"prompts too many", plus("workload: {prompts: 100000000}"),
     "t.yaml:6:21: workload.prompts: must be between 0 and 16777216, got 100000000"},
    {"every_versions too large", plus("sync: {every_versions: 9223372036854775807, staleness: 1}"),
     "t.yaml:6:24: sync.every_versions: must be between 1 and 1048576, got 9223372036854775807"},
    {"max_restarts too large", plus("sync: {max_restarts: 1000000}"),
     "t.yaml:6:22: sync.max_restarts: must be between 0 and 1000, got 1000000"},
    {"a negative first round wait", plus("sync: {first_round_wait_ms: -1}"),
     "t.yaml:6:29: sync.first_round_wait_ms: must not be negative, got -1"},
    {"a first round wait beyond a day", plus("sync: {first_round_wait_ms: 86400001}"),
     "t.yaml:6:29: sync.first_round_wait_ms: must be between 0 and 86400000, got 86400001"},
    {"a drill delay beyond a day",
     plus("drill:\n  faults:\n    - {at_ms: 9223372036854775807, action: kill, target: e-0}"),
     "t.yaml:8:15: drill.faults[0].at_ms: must be between 0 and 86400000, got 9223372036854775807"},
    {"a rank listing more layers than any model has",
     with("trainer", "trainer: {node: a, ranks: [{layers: [" + [] {
            std::string l;
            for (int i = 0; i < 1025; ++i)
              l += (i ? "," : "") + std::to_string(i);
            return l;
          }() + "]}]}"),
     "t.yaml:4:37: trainer.ranks[0].layers: must list at most 1024 layers, got 1025"},
  });
}

TEST_CASE("hostile topologies: control characters in echoed text are escaped") {
  check_rows({
    {"a name with an escape sequence", with("name", "name: \"a\\e[2Jb\""),
     "t.yaml:1:7: name: must be non-empty and use only letters, digits, '.', '_' and '-', got 'a\\x1b[2Jb'"},
    {"an unknown key with a newline", plus("\"x\\ny\": 1"),
     "t.yaml:6:1: x\\x0ay: unknown key (expected one of: " + top_keys + ")"},
    {"an integer field with a carriage return", plus("workload: {prompts: \"1\\r2\"}"),
     "t.yaml:6:21: workload.prompts: expected an integer, got '1\\x0d2'"},
  });
}

TEST_CASE("topology errors: drill") {
  const std::string kill_targets =
    "an engine (e-0, e-1), a node (a, b), trainer, router or coordinator";
  check_rows({
    {"unknown kill target", plus("drill:\n  faults:\n    - {at_sync: 1, action: kill, target: e-7}"),
     "t.yaml:8:42: drill.faults[0].target: unknown target 'e-7' for kill (expected " + kill_targets + ")"},
    {"partition needs a node or an engine", plus("drill:\n  faults:\n    - {at_sync: 1, action: partition, target: trainer}"),
     "t.yaml:8:47: drill.faults[0].target: unknown target 'trainer' for partition (expected an engine (e-0, e-1) "
     "or a node (a, b))"},
    {"phase without at_sync", plus("drill:\n  faults:\n    - {at_ms: 5, phase: transfer, action: kill, target: e-0}"),
     "t.yaml:8:25: drill.faults[0].phase: only used with at_sync (the phase of that round the fault fires in)"},
    {"unknown phase", plus("drill:\n  faults:\n    - {at_sync: 1, phase: resume, action: kill, target: e-0}"),
     "t.yaml:8:27: drill.faults[0].phase: must be one of pause, flush, start, transfer, finish, continue, got "
     "'resume'"},
    {"delay_acks needs an engine", plus("drill:\n  faults:\n    - {at_ms: 10, action: delay_acks, target: a}"),
     "t.yaml:8:47: drill.faults[0].target: unknown target 'a' for delay_acks (expected an engine (e-0, e-1))"},
    {"corrupt needs an engine", plus("drill:\n  faults:\n    - {at_sync: 2, action: corrupt, target: trainer}"),
     "t.yaml:8:45: drill.faults[0].target: unknown target 'trainer' for corrupt (expected an engine (e-0, "
     "e-1))"},
    {"both times", plus("drill:\n  faults:\n    - {at_sync: 1, at_ms: 5, action: kill, target: e-0}"),
     "t.yaml:8:27: drill.faults[0].at_ms: set either at_sync or at_ms, not both"},
    {"no time", plus("drill:\n  faults:\n    - {action: kill, target: e-0}"),
     "t.yaml:8:7: drill.faults[0]: needs at_sync (a sync round, from 1) or at_ms (time since start) to say "
     "when it fires"},
    {"at_sync zero", plus("drill:\n  faults:\n    - {at_sync: 0, action: kill, target: e-0}"),
     "t.yaml:8:17: drill.faults[0].at_sync: must be positive, got 0"},
    {"duration on corrupt", plus("drill:\n  faults:\n    - {at_sync: 1, action: corrupt, target: e-0, duration_ms: 5}"),
     "t.yaml:8:63: drill.faults[0].duration_ms: only used with kill or kill_worker (restart after it), partition or "
     "delay_acks"},
    {"zero duration", plus("drill:\n  faults:\n    - {at_sync: 1, action: partition, target: b, duration_ms: 0}"),
     "t.yaml:8:63: drill.faults[0].duration_ms: must be positive, got 0"},
    {"action out of range", plus("drill:\n  faults:\n    - {at_sync: 1, action: explode, target: e-0}"),
     "t.yaml:8:28: drill.faults[0].action: must be one of kill, restart, partition, heal, delay_acks, "
     "corrupt, kill_worker, got 'explode'"},
    {"kill_worker past the engine's ranks",
     plus("drill:\n  faults:\n    - {at_sync: 1, action: kill_worker, target: e-0, dp_rank: 1}"),
     "t.yaml:8:63: drill.faults[0].dp_rank: engine 'e-0' has 1 data-parallel rank (0..0)"},
    {"kill_worker past the rank's workers",
     plus("drill:\n  faults:\n    - {at_sync: 1, action: kill_worker, target: e-0, worker: 2}"),
     "t.yaml:8:62: drill.faults[0].worker: engine 'e-0' has 2 tp workers per rank (0..1)"},
    {"dp_rank on a kill", plus("drill:\n  faults:\n    - {at_sync: 1, action: kill, target: e-0, dp_rank: 0}"),
     "t.yaml:8:56: drill.faults[0].dp_rank: only used with kill_worker (which rank's worker thread dies)"},
    {"kill_worker needs an engine", plus("drill:\n  faults:\n    - {at_sync: 1, action: kill_worker, target: a}"),
     "t.yaml:8:49: drill.faults[0].target: unknown target 'a' for kill_worker (expected an engine (e-0, e-1))"},
    {"missing target", plus("drill:\n  faults:\n    - {at_sync: 1, action: kill}"),
     "t.yaml:8:7: drill.faults[0].target: missing required key"},
    {"killing an external trainer", with("trainer", "trainer: {node: a, source: external}")
                                       + "drill:\n  faults:\n    - {at_sync: 1, action: kill, target: trainer}\n",
     "t.yaml:8:42: drill.faults[0].target: kill cannot act on the trainer: its ranks are outside processes (source: "
     "external); stop them yourself"},
    {"killing a trainer of several ranks", with("trainer", "trainer: {node: a, ranks: [{node: a, layers: 0-1}, {node: b, layers: 2-3}]}")
                                             + "drill:\n  faults:\n    - {at_sync: 1, action: kill, target: trainer}\n",
     "t.yaml:8:42: drill.faults[0].target: kill of the trainer would act on one process, and this trainer has 2 ranks "
     "on a, b: target the nodes hosting them instead"},
    {"restarting a trainer whose rank is elsewhere", with("trainer", "trainer: {node: a, ranks: [{node: b, layers: all}]}")
                                                       + "drill:\n  faults:\n    - {at_sync: 1, action: restart, target: trainer}\n",
     "t.yaml:8:45: drill.faults[0].target: restart of the trainer would act on one process, and this trainer has 1 "
     "rank on b: target the nodes hosting them instead"},
    {"faults not a list", plus("drill: {faults: {at_sync: 1}}"),
     "t.yaml:6:17: drill.faults: expected a list, got a map"},
  });
}

TEST_CASE("topology errors: every problem is reported, in file order") {
  auto errs = errors_of("name: t\n"
                        "model: {synthetic: {layers: 4, hidden_size: 256, heads: 8, intermediate_size: 704}}\n"
                        "nodes: [{name: a, port: -1}]\n"
                        "trainer: {node: b}\n"
                        "engines: [{name: e, node: a, tp: 3, replica: 2}]\n"
                        "router: {policy: fastest}\n");
  REQUIRE(errs.size() == 7);
  CHECK(errs[0].rfind("t.yaml:3:25: nodes[0].port:", 0) == 0);
  CHECK(errs[1].rfind("t.yaml:4:17: trainer.node: unknown node 'b'", 0) == 0);
  CHECK(errs[2].rfind("t.yaml:5:34: engines[0].tp:", 0) == 0);
  CHECK(errs[5].rfind("t.yaml:5:37: engines[0].replica: unknown key, did you mean 'replicas'?", 0) == 0);
  CHECK(errs[6].rfind("t.yaml:6:18: router.policy:", 0) == 0);
  try {
    parse_topology("name: t\n", "t.yaml", "/base");
    FAIL("expected a topology_error");
  } catch (const topology_error& e) {
    CHECK(std::string(e.what()) == joined(e.errors).substr(0, joined(e.errors).size() - 1));
  }
}

TEST_CASE("topology: trainer ranks on any node, several per node, replicas of a layer range") {
  struct row {
    const char* name;
    std::string ranks;
    std::vector<std::pair<std::string, std::vector<std::int64_t>>> expected; // node, layers per rank
  };
  const std::vector<row> rows{
    {"left out: one rank on the trainer's node", "", {{"a", {0, 1, 2, 3}}}},
    {"two pipeline stages on two nodes", ", ranks: [{node: a, layers: 0-1}, {node: b, layers: 2-3}]",
     {{"a", {0, 1}}, {"b", {2, 3}}}},
    {"two stages on one node, default node", ", ranks: [{layers: 2-3}, {layers: [1, 0]}]",
     {{"a", {2, 3}}, {"a", {0, 1}}}},
    {"no rank on the trainer's own node", ", ranks: [{node: b, layers: all}]", {{"b", {0, 1, 2, 3}}}},
    {"two replicas of every layer", ", ranks: [{node: a, layers: all}, {node: b, layers: all}]",
     {{"a", {0, 1, 2, 3}}, {"b", {0, 1, 2, 3}}}},
    {"overlapping ranges", ", ranks: [{node: b, layers: 0-2}, {node: b, layers: 2-3}]",
     {{"b", {0, 1, 2}}, {"b", {2, 3}}}},
  };
  for (const auto& r : rows) {
    CAPTURE(r.name);
    auto t = parse_topology(with("trainer", "trainer: {node: a" + r.ranks + "}") + insecure, "t.yaml", "/base");
    REQUIRE(t.trainer.ranks.size() == r.expected.size());
    for (std::size_t i = 0; i < r.expected.size(); ++i) {
      CHECK(t.trainer.ranks[i].node == r.expected[i].first);
      CHECK(t.trainer.ranks[i].layers == r.expected[i].second);
    }
  }
}

TEST_CASE("topology: the coordinator's node may host the coordinator alone") {
  auto t = parse_topology(with("nodes", "nodes: [{name: a}, {name: b}, {name: head}]")
                            + "router: {node: b}\ncoordinator: {node: head}\n" + insecure,
                          "t.yaml", "/base");
  CHECK(t.coordinator.node == "head");
  CHECK(t.router.node == "b");
  CHECK(t.trainer.ranks.at(0).node == "a");
  CHECK(std::none_of(t.engines.begin(), t.engines.end(), [](auto& e) { return e.node == "head"; }));
}

TEST_CASE("topology: defaults are filled in") {
  auto t = parse_topology(with("engines", "engines: [{name: e, node: b}]") + insecure, "t.yaml", "/base");
  CHECK(t.name == "t");
  CHECK(t.source == "t.yaml");
  CHECK(t.base_dir == "/base");
  CHECK(t.model.synthetic());
  CHECK(t.model.config.num_hidden_layers == 4);
  CHECK(t.model.config.num_key_value_heads == 4);
  CHECK(t.model.config.vocab_size == 320);
  CHECK(t.model.config.max_position_embeddings == 2048);
  CHECK(t.model.config.rope_theta == 10000.0);
  CHECK(t.model.config.rms_norm_eps == 1e-5);
  CHECK_FALSE(t.model.config.tie_word_embeddings);
  CHECK(t.model.weights_dtype == dtype::bf16);
  CHECK(t.model.seed == 1);
  REQUIRE(t.nodes.size() == 2);
  CHECK(t.nodes[0].address == "127.0.0.1");
  CHECK(t.nodes[0].port == 0);
  CHECK_FALSE(t.nodes[0].metrics_port);
  CHECK(t.cluster.http_api_key_file.empty());
  CHECK(t.cluster.secret_file.empty());
  CHECK(t.cluster.secret_env.empty());
  CHECK_FALSE(t.cluster.tls);
  CHECK(t.cluster.heartbeat_interval == milliseconds(500));
  CHECK(t.cluster.heartbeat_timeout == milliseconds(2000));
  CHECK(t.cluster.connect_deadline == milliseconds(10000));
  CHECK(t.trainer.node == "a");
  CHECK(t.trainer.source == trainer_source::synthetic);
  CHECK(t.trainer.dir.empty());
  CHECK(t.trainer.step_time == milliseconds(200));
  CHECK(t.trainer.perturb == 0.01);
  CHECK(t.trainer.seed == 7);
  REQUIRE(t.trainer.ranks.size() == 1);
  CHECK(t.trainer.ranks[0].node == "a");
  CHECK(t.trainer.ranks[0].layers == std::vector<std::int64_t>{0, 1, 2, 3});
  REQUIRE(t.engines.size() == 1);
  auto& e = t.engines[0];
  CHECK(e.name == "e"); // one replica: the name itself
  CHECK(e.group == "e");
  CHECK(e.replica == 0);
  CHECK(e.node == "b");
  CHECK(e.tp == 1);
  CHECK(e.max_batch == 32);
  CHECK(e.queue_limit == 256);
  CHECK(e.kv_block_tokens == 16);
  CHECK(e.prefix_cache_blocks == 1024);
  CHECK(t.router.node == "a"); // the first node
  CHECK(t.router.policy == router_policy::least_outstanding);
  CHECK(t.router.queue_limit == 1024);
  CHECK_FALSE(t.router.http_port);
  CHECK(t.coordinator.node == "a");
  CHECK(t.coordinator.state_file.empty());
  CHECK(t.transfer.backend == transfer_backend::local);
  CHECK(t.transfer.mode == transfer_mode::sharded);
  CHECK(t.transfer.bucket_bytes == 64 * 1024 * 1024);
  CHECK(t.transfer.groups_in_flight == 2);
  CHECK(t.transfer.ucx_transports.empty());
  CHECK(t.sync.every_versions == 1);
  CHECK(t.sync.staleness == 1);
  CHECK(t.sync.wave_size == 0);
  CHECK(t.sync.deadlines.pause == milliseconds(5000));
  CHECK(t.sync.deadlines.flush == milliseconds(1000));
  CHECK(t.sync.deadlines.start == milliseconds(1000));
  CHECK(t.sync.deadlines.transfer == milliseconds(60000));
  CHECK(t.sync.deadlines.finish == milliseconds(5000));
  CHECK(t.sync.deadlines.resume == milliseconds(1000));
  CHECK(t.sync.pause.mode == pause_mode::keep);
  CHECK_FALSE(t.sync.pause.clear_cache);
  CHECK(t.sync.min_live_engines == 1);
  CHECK(t.sync.max_restarts == 3);
  CHECK(t.sync.first_round_wait == milliseconds(0));
  CHECK(t.workload.prompts == 64);
  CHECK(t.workload.concurrency == 8);
  CHECK(t.workload.max_tokens == 32);
  CHECK(t.workload.temperature == 0.0);
  CHECK(t.workload.top_p == 1.0);
  CHECK(t.workload.seed == 1);
  CHECK(t.drill.faults.empty());
  CHECK(t.find_node("b") == &t.nodes[1]);
  CHECK(t.find_node("z") == nullptr);
  CHECK(t.find_engine("e") == &t.engines[0]);
  CHECK(t.find_engine("e-0") == nullptr);
}

TEST_CASE("topology: a synthetic trainer's perturb and seeds are read, the other sources refuse them") {
  const std::string dir_trainer = "trainer: {node: a, source: checkpoint_dir, dir: d";
  const std::string seeded = "model: {synthetic: {layers: 4, hidden_size: 256, heads: 8, kv_heads: 4, "
                             "intermediate_size: 704, seed: 42}}";
  // The base document with both its model and trainer lines replaced.
  auto doc = [](const std::string& model, const std::string& trainer) {
    std::string out;
    for (auto& [key, line] : base_lines)
      out += (key == "model" ? model : key == "trainer" ? trainer : line) + "\n";
    return out;
  };
  auto t = parse_topology(doc(seeded, "trainer: {node: a, perturb: 0.5, seed: 9}") + insecure, "t.yaml", "/base");
  CHECK(t.model.seed == 42);
  CHECK(t.trainer.perturb == 0.5);
  CHECK(t.trainer.seed == 9);
  check_rows({
    {"perturb from a checkpoint directory", with("trainer", dir_trainer + ", perturb: 0.5}"),
     "t.yaml:4:61: trainer.perturb: not used with source: checkpoint_dir (each version is a step the trainer wrote)"},
    {"a trainer seed from a checkpoint directory", with("trainer", dir_trainer + ", seed: 9}"),
     "t.yaml:4:58: trainer.seed: not used with source: checkpoint_dir (each version is a step the trainer wrote)"},
    {"a model seed from a checkpoint directory", doc(seeded, dir_trainer + "}"),
     "t.yaml:2:103: model.synthetic.seed: only a synthetic trainer generates the model's values from a seed; not "
     "used with source: checkpoint_dir (each version is a step the trainer wrote)"},
    {"a model seed with an external trainer", doc(seeded, "trainer: {node: a, source: external}"),
     "t.yaml:2:103: model.synthetic.seed: only a synthetic trainer generates the model's values from a seed; not "
     "used with source: external (the rank's own process publishes its versions)"},
  });
}

TEST_CASE("topology: keys that apply only with another key's value are refused without it") {
  check_rows({
    {"max_restarts without restart: on-failure", with("nodes", "nodes: [{name: a}, {name: b, max_restarts: 2}]"),
     "t.yaml:3:44: nodes[1].max_restarts: only used with restart: on-failure (rlsync launch restarts the node's "
     "process up to this many times)"},
    {"dp_balance with one data-parallel rank", with("engines", "engines: [{name: e, node: a, dp_balance: prefix_affinity}]"),
     "t.yaml:5:42: engines[0].dp_balance: balances requests over data-parallel ranks, and this engine has one "
     "(dp: 1, the default)"},
  });
  CHECK(errors_of(with("nodes", "nodes: [{name: a}, {name: b, restart: on-failure, max_restarts: 2}]") + insecure).empty());
  CHECK(errors_of(with("engines", "engines: [{name: e, node: a, dp: 2, dp_balance: prefix_affinity}]") + insecure).empty());
}

TEST_CASE("topology: empty sections read as defaults") {
  auto t = parse_topology(with("nodes", "nodes: [{name: a}]") + "router:\ncoordinator:\ncluster:\nsync: {}\nworkload:\ndrill:\n",
                          "t.yaml", "/base");
  CHECK(t.router.node == "a");
  CHECK(t.workload.prompts == 64);
  CHECK(t.drill.faults.empty());
}

TEST_CASE("topology: an external vLLM server as an engine") {
  auto t = parse_topology(with("engines", "engines:\n"
                                           "  - {name: v, node: a, kind: vllm, url: 'http://10.0.0.5:8000/', tp: 2,\n"
                                           "     api_key_file: keys/v.key, weights_dir: /dev/shm/w}\n"
                                           "  - {name: w, node: b, kind: vllm, url: 'http://[::1]:8001'}\n"
                                           "  - {name: e, node: a}")
                            + insecure,
                          "t.yaml", "/base");
  REQUIRE(t.engines.size() == 3);
  const auto& v = t.engines[0];
  CHECK(v.kind == engine_kind::vllm);
  CHECK(v.url == "http://10.0.0.5:8000/");
  CHECK(v.url_host == "10.0.0.5");
  CHECK(v.url_port == 8000);
  CHECK(v.tp == 2); // the server's tensor parallelism: how its weights are verified
  CHECK(v.api_key_file == "/base/keys/v.key");
  CHECK(v.weights_dir == "/dev/shm/w");
  CHECK(t.engines[1].url_host == "::1");
  CHECK(t.engines[1].url_port == 8001);
  CHECK(t.engines[1].api_key_file.empty());
  CHECK(t.engines[1].weights_dir == "/dev/shm/rlsync-w"); // tmpfs by default
  CHECK(t.engines[2].kind == engine_kind::builtin);
  CHECK(t.engines[2].url.empty());
}

TEST_CASE("topology: every field is read") {
  auto t = parse_topology(R"(name: full
model:
  synthetic: {layers: 6, hidden_size: 128, heads: 4, kv_heads: 2, intermediate_size: 344, vocab_size: 512,
              max_position_embeddings: 4096, rope_theta: 500000, rms_norm_eps: 1.0e-6,
              tie_word_embeddings: true, dtype: f32}
nodes:
  - {name: n1, address: 10.0.0.1, metrics_port: 9100}
  - {name: n2, address: host-2.example, port: 4000, metrics_port: 0}
cluster:
  secret_file: secrets/cluster.key
  http_api_key_file: secrets/http.key
  tls: {ca: certs/ca.pem, cert: "certs/{node}.pem", key: "/etc/{node}.key"}
  heartbeat_interval_ms: 100
  heartbeat_timeout_ms: 300
  connect_deadline_ms: 2500
trainer:
  node: n1
  source: checkpoint_dir
  dir: ckpts
  step_time_ms: 25
  ranks:
    - {node: n1, layers: [2, 5, 0, 3, 4, 1]}
engines:
  - {name: big, node: n2, tp: 2, max_batch: 8, queue_limit: 16, kv_block_tokens: 32, prefix_cache_blocks: 0}
  - {name: many, node: n1, replicas: 3, tp: 4}
router: {node: n2, policy: prefix_affinity, queue_limit: 7, http_port: 8100}
coordinator: {node: n2, state_file: state/version}
transfer: {backend: ucx, mode: broadcast, bucket_bytes: 64 MiB, groups_in_flight: 3, ucx_transports: [shm, rdma]}
sync:
  every_versions: 2
  staleness: 3
  wave_size: 2
  deadlines_ms: {pause: 1, flush: 2, start: 3, transfer: 4, finish: 5, continue: 6}
  pause: {mode: abort, clear_cache: true}
  min_live_engines: 4
  max_restarts: 0
  first_round_wait_ms: 2500
workload: {prompts: 0, concurrency: 1, max_tokens: 5, temperature: 0.7, top_p: 0.9, seed: 3}
drill:
  faults:
    - {at_sync: 2, action: kill, target: many-1}
    - {at_sync: 3, action: restart, target: n2}
    - {at_ms: 0, action: partition, target: n2, duration_ms: 3000}
    - {at_ms: 4000, action: heal, target: n2}
    - {at_sync: 4, action: delay_acks, target: big, duration_ms: 100}
    - {at_sync: 5, action: corrupt, target: many-0}
    - {at_sync: 6, action: kill, target: trainer}
    - {at_sync: 6, action: restart, target: router}
    - {at_sync: 7, action: kill, target: coordinator}
)",
                          "full.yaml", "/cfg");
  auto& c = t.model.config;
  CHECK(c.num_hidden_layers == 6);
  CHECK(c.hidden_size == 128);
  CHECK(c.num_attention_heads == 4);
  CHECK(c.num_key_value_heads == 2);
  CHECK(c.intermediate_size == 344);
  CHECK(c.vocab_size == 512);
  CHECK(c.max_position_embeddings == 4096);
  CHECK(c.rope_theta == 500000.0);
  CHECK(c.rms_norm_eps == 1e-6);
  CHECK(c.tie_word_embeddings);
  CHECK(t.model.weights_dtype == dtype::f32);
  CHECK(t.nodes[1].address == "host-2.example");
  CHECK(t.nodes[1].port == 4000);
  CHECK(t.cluster.secret_file == "/cfg/secrets/cluster.key");
  CHECK(t.cluster.http_api_key_file == "/cfg/secrets/http.key");
  CHECK(t.nodes[0].metrics_port == std::optional<std::uint16_t>{9100});
  CHECK(t.nodes[1].metrics_port == std::optional<std::uint16_t>{0});
  REQUIRE(t.cluster.tls);
  CHECK(t.cluster.tls->ca == "/cfg/certs/ca.pem");
  CHECK(t.cluster.tls->cert == "/cfg/certs/{node}.pem");
  CHECK(t.cluster.tls->for_node("n2").cert == "/cfg/certs/n2.pem");
  CHECK(t.cluster.tls->for_node("n2").key == "/etc/n2.key");
  CHECK_FALSE(t.cluster.per_node_secrets());
  CHECK(t.cluster.heartbeat_interval == milliseconds(100));
  CHECK(t.cluster.heartbeat_timeout == milliseconds(300));
  CHECK(t.cluster.connect_deadline == milliseconds(2500));
  CHECK(t.trainer.source == trainer_source::checkpoint_dir);
  CHECK(t.trainer.dir == "/cfg/ckpts");
  CHECK(t.trainer.step_time == milliseconds(25));
  REQUIRE(t.trainer.ranks.size() == 1);
  CHECK(t.trainer.ranks[0].node == "n1");
  CHECK(t.trainer.ranks[0].layers == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5}); // sorted
  REQUIRE(t.engines.size() == 4);
  CHECK(t.engines[0].name == "big");
  CHECK(t.engines[0].max_batch == 8);
  CHECK(t.engines[0].queue_limit == 16);
  CHECK(t.engines[0].kv_block_tokens == 32);
  CHECK(t.engines[0].prefix_cache_blocks == 0);
  for (int i = 0; i < 3; ++i) {
    auto& e = t.engines[static_cast<std::size_t>(i + 1)];
    CHECK(e.name == "many-" + std::to_string(i));
    CHECK(e.group == "many");
    CHECK(e.replica == i);
    CHECK(e.node == "n1");
    CHECK(e.tp == 4);
  }
  CHECK(t.router.node == "n2");
  CHECK(t.router.policy == router_policy::prefix_affinity);
  CHECK(t.router.queue_limit == 7);
  CHECK(t.router.http_port == std::uint16_t{8100});
  CHECK(t.coordinator.node == "n2");
  CHECK(t.coordinator.state_file == "/cfg/state/version");
  CHECK(t.transfer.backend == transfer_backend::ucx);
  CHECK(t.transfer.mode == transfer_mode::broadcast);
  CHECK(t.transfer.bucket_bytes == std::int64_t(64) << 20);
  CHECK(t.transfer.groups_in_flight == 3);
  CHECK(t.transfer.ucx_transports == std::vector<ucx_transport>{ucx_transport::shm, ucx_transport::rdma});
  CHECK(t.sync.every_versions == 2);
  CHECK(t.sync.staleness == 3);
  CHECK(t.sync.wave_size == 2);
  CHECK(t.sync.pause.mode == pause_mode::abort);
  CHECK(t.sync.pause.clear_cache);
  CHECK(t.sync.deadlines.pause == milliseconds(1));
  CHECK(t.sync.deadlines.flush == milliseconds(2));
  CHECK(t.sync.deadlines.start == milliseconds(3));
  CHECK(t.sync.deadlines.transfer == milliseconds(4));
  CHECK(t.sync.deadlines.finish == milliseconds(5));
  CHECK(t.sync.deadlines.resume == milliseconds(6));
  CHECK(t.sync.min_live_engines == 4);
  CHECK(t.sync.max_restarts == 0);
  CHECK(t.sync.first_round_wait == milliseconds(2500));
  CHECK(t.workload.prompts == 0);
  CHECK(t.workload.concurrency == 1);
  CHECK(t.workload.max_tokens == 5);
  CHECK(t.workload.temperature == 0.7);
  CHECK(t.workload.top_p == 0.9);
  CHECK(t.workload.seed == 3);
  auto& f = t.drill.faults;
  REQUIRE(f.size() == 9);
  CHECK(f[0].at_sync == 2);
  CHECK_FALSE(f[0].at);
  CHECK(f[0].action == fault_action::kill);
  CHECK(f[0].target == "many-1");
  CHECK(f[0].target_kind == fault_target::engine);
  CHECK(f[1].target_kind == fault_target::node);
  CHECK(f[2].at == milliseconds(0));
  CHECK_FALSE(f[2].at_sync);
  CHECK(f[2].action == fault_action::partition);
  CHECK(f[2].duration == milliseconds(3000));
  CHECK(f[3].action == fault_action::heal);
  CHECK_FALSE(f[3].duration);
  CHECK(f[4].action == fault_action::delay_acks);
  CHECK(f[4].target_kind == fault_target::engine);
  CHECK(f[5].action == fault_action::corrupt);
  CHECK(f[6].target_kind == fault_target::trainer);
  CHECK(f[7].target_kind == fault_target::router);
  CHECK(f[8].target_kind == fault_target::coordinator);
}

TEST_CASE("yaml_fields: size fields accept integers and unit strings") {
  struct row {
    const char* text;
    std::int64_t bytes;
  };
  const row rows[] = {
    {"4096", 4096},          {"1B", 1},
    {"2KiB", 2048},          {"64MiB", 64ll << 20},
    {"1 GiB", 1ll << 30},    {"1TiB", 1ll << 40},
    {"3KB", 3000},           {"5MB", 5000000},
    {"2GB", 2000000000},     {"1TB", 1000000000000},
    {"'128MiB'", 128ll << 20},
  };
  for (auto& r : rows) {
    CAPTURE(r.text);
    yaml_fields::diagnostics d("t.yaml");
    auto v = yaml_fields::read_size(d, YAML::Load(r.text), YAML::Mark(), "size");
    CHECK(d.empty());
    CHECK(v == r.bytes);
  }
  // The topology's one size field takes every spelling of its default.
  for (auto text : {"67108864", "64MiB", "64 MiB", "65536KiB", "'64MiB'"}) {
    CAPTURE(text);
    auto t = parse_topology(plus(insecure + "transfer: {bucket_bytes: " + text + "}"), "t.yaml", "/base");
    CHECK(t.transfer.bucket_bytes == std::int64_t(64) << 20);
  }
}

TEST_CASE("topology: a checkpoint model takes its shape from config.json") {
  test::scratch_dir dir;
  std::filesystem::create_directories(dir / "ckpt");
  model_config c;
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  write_config_json(dir / "ckpt/config.json", c);
  {
    std::ofstream(dir / "t.yaml") << with("model", "model: {checkpoint: ckpt}") << insecure;
  }
  auto t = load_topology(dir / "t.yaml");
  CHECK_FALSE(t.model.synthetic());
  CHECK(t.model.checkpoint == dir / "ckpt");
  CHECK_FALSE(t.model.weights_dtype);
  CHECK(t.model.config.num_hidden_layers == 3);
  CHECK(t.model.config.vocab_size == 300);
  CHECK(t.trainer.ranks[0].layers == std::vector<std::int64_t>{0, 1, 2});
  CHECK(to_yaml(t).find("checkpoint: " + (dir / "ckpt")) != std::string::npos);

  // tp is checked against the checkpoint's shape (4 heads).
  {
    std::ofstream(dir / "t.yaml") << "name: t\nmodel: {checkpoint: ckpt}\nnodes: [{name: a}]\n"
                                     "trainer: {node: a}\nengines: [{name: e, node: a, tp: 8}]\n";
  }
  auto errs = joined(load_errors_of(dir / "t.yaml"));
  CHECK(errs.rfind((dir / "t.yaml") + ":5:34: engines[0].tp: must divide num_attention_heads (4), got 8", 0) == 0);

  // What the built-in engine does not compute (Llama 3.1's RoPE scaling):
  // refused for a built-in engine, at the engine; a vLLM server computes it.
  {
    std::string json = [&] {
      std::ifstream in(dir / "ckpt/config.json");
      return std::string(std::istreambuf_iterator<char>(in), {});
    }();
    json.insert(json.find('{') + 1, R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0},)");
    std::ofstream(dir / "ckpt/config.json") << json;
    std::ofstream(dir / "t.yaml") << with("model", "model: {checkpoint: ckpt}") << insecure;
  }
  auto scaled = joined(load_errors_of(dir / "t.yaml"));
  CHECK_MESSAGE(scaled.find(": engines[0].name: the model's config.json: rope_scaling: ") != std::string::npos, scaled);
  CHECK(scaled.find("(a vLLM engine computes it: kind: vllm)") != std::string::npos);
  {
    std::string vllm = with("model", "model: {checkpoint: ckpt}");
    const std::string builtin = "engines: [{name: e, node: a, replicas: 2, tp: 2}]";
    vllm.replace(vllm.find(builtin), builtin.size(), "engines: [{name: e, node: a, kind: vllm, url: 'http://h:1'}]");
    std::ofstream(dir / "t.yaml") << vllm << insecure;
  }
  CHECK(load_topology(dir / "t.yaml").model.config.not_computed.size() == 1);
  write_config_json(dir / "ckpt/config.json", c);

  // An invalid config.json is reported at the checkpoint field, with its own reason.
  c.num_key_value_heads = 3;
  write_config_json(dir / "ckpt/config.json", c);
  {
    std::ofstream(dir / "t.yaml") << with("model", "model: {checkpoint: ckpt}");
  }
  try {
    load_topology(dir / "t.yaml");
    FAIL("expected a topology_error");
  } catch (const topology_error& e) {
    REQUIRE(e.errors.size() == 1);
    CHECK(e.errors[0].rfind((dir / "t.yaml") + ":2:21: model.checkpoint: " + (dir / "ckpt/config.json"), 0) == 0);
    CHECK(e.errors[0].find("num_key_value_heads") != std::string::npos);
  }
}

TEST_CASE("topology: load_topology resolves paths against the file's directory") {
  test::scratch_dir dir;
  std::filesystem::create_directories(dir / "sub");
  {
    std::ofstream(dir / "sub/t.yaml") << plus(insecure + "coordinator: {state_file: ../state/v}");
  }
  auto t = load_topology(dir / "sub/t.yaml");
  CHECK(t.source == dir / "sub/t.yaml");
  CHECK(t.base_dir == dir / "sub");
  CHECK(t.coordinator.state_file == dir / "state/v");

  try {
    load_topology(dir / "missing.yaml");
    FAIL("expected a topology_error");
  } catch (const topology_error& e) {
    CHECK(std::string(e.what()) == (dir / "missing.yaml") + ": cannot open: No such file or directory");
  }
}

TEST_CASE("hostile topologies: files that are not regular files are refused at once") {
  test::scratch_dir dir;
  REQUIRE(::mkfifo((dir / "fifo.yaml").c_str(), 0600) == 0);
  std::filesystem::create_directories(dir / "ckpt");
  REQUIRE(::mkfifo((dir / "ckpt/config.json").c_str(), 0600) == 0);
  std::filesystem::create_directories(dir / "dir.yaml");
  struct row {
    const char* title;
    std::string path;
    std::string expected;
  };
  {
    std::ofstream(dir / "t.yaml") << with("model", "model: {checkpoint: ckpt}");
  }
  const row rows[] = {
    {"a FIFO as the topology (opening it would wait for a writer)", dir / "fifo.yaml",
     dir / "fifo.yaml" + ": is a FIFO, not a regular file"},
    {"a directory as the topology", dir / "dir.yaml", dir / "dir.yaml" + ": is a directory, not a regular file"},
    {"a character device as the topology (it never ends)", "/dev/zero",
     "/dev/zero: is a character device, not a regular file"},
    {"a FIFO as the checkpoint's config.json", dir / "t.yaml",
     dir / "t.yaml" + ":2:21: model.checkpoint: " + (dir / "ckpt/config.json")
       + ": config.json: is a FIFO, not a regular file"},
  };
  for (auto& r : rows) {
    CAPTURE(r.title);
    try {
      load_topology(r.path);
      FAIL("expected a topology_error");
    } catch (const topology_error& e) {
      CHECK(std::string(e.what()) == r.expected);
    }
  }
}

TEST_CASE("topology: the shipped configs load") {
  const std::string src = RLSYNC_SOURCE_DIR;
  auto local = load_topology(src + "/configs/local.yaml");
  CHECK(local.name == "local");
  REQUIRE(local.nodes.size() == 1);
  REQUIRE(local.engines.size() == 2);
  CHECK(local.engines[0].name == "rollout-0");
  CHECK(local.engines[1].name == "rollout-1");
  CHECK(local.engines[1].tp == 2);
  CHECK(local.model.synthetic());
  CHECK(local.model.config.num_hidden_layers == 4);
  CHECK(local.model.config.num_key_value_heads == 4);
  CHECK(local.transfer.backend == transfer_backend::local);
  CHECK(local.workload.prompts == 64);

  auto pytorch = load_topology(src + "/configs/pytorch.yaml");
  CHECK(pytorch.trainer.source == trainer_source::external);
  CHECK(pytorch.trainer.ranks.size() == 1);
  CHECK(pytorch.trainer.ranks[0].node == "trainer");
  CHECK_FALSE(pytorch.node_runs_anything("trainer"));
  CHECK(pytorch.node_runs_anything("head"));
  CHECK(pytorch.router.http_port == std::optional<std::uint16_t>(8421));

  auto cluster = load_topology(src + "/configs/cluster.yaml");
  CHECK(cluster.nodes.size() == 3);
  CHECK(cluster.nodes[1].address == "10.0.0.2");
  CHECK(cluster.transfer.backend == transfer_backend::ucx);
  // Mutual TLS and per-node secrets, {node} kept for each node to fill in.
  CHECK(cluster.cluster.secret_file == src + "/configs/certs/{node}.secret");
  CHECK(cluster.cluster.per_node_secrets());
  CHECK(cluster.cluster.secret_file_for("engine-node-a") == src + "/configs/certs/engine-node-a.secret");
  REQUIRE(cluster.cluster.tls);
  CHECK(cluster.cluster.tls->ca == src + "/configs/certs/ca.pem");
  CHECK(cluster.cluster.tls->for_node("engine-node-b").cert == src + "/configs/certs/engine-node-b.pem");
  CHECK(cluster.cluster.tls->for_node("engine-node-b").key == src + "/configs/certs/engine-node-b.key");
  CHECK_FALSE(cluster.cluster.allow_insecure_network);
  auto multiprocess = load_topology(src + "/configs/multiprocess.yaml");
  REQUIRE(multiprocess.cluster.tls);
  CHECK(multiprocess.cluster.per_node_secrets());
  REQUIRE(cluster.trainer.ranks.size() == 2); // two pipeline stages
  CHECK(cluster.trainer.ranks[0].layers == std::vector<std::int64_t>{0, 1, 2, 3});
  CHECK(cluster.trainer.ranks[1].layers == std::vector<std::int64_t>{4, 5, 6, 7});
  CHECK(cluster.transfer.mode == transfer_mode::sharded);
  for (auto& e : cluster.engines) // rollout-b: two data-parallel ranks of tp 2
    CHECK(e.tp * e.dp == 4);
  CHECK(std::any_of(cluster.engines.begin(), cluster.engines.end(), [](auto& e) { return e.dp == 2; }));
  CHECK(cluster.sync.min_live_engines == 2);
  CHECK(cluster.sync.wave_size == 2);
  std::set<std::string> engine_nodes;
  for (auto& e : cluster.engines)
    engine_nodes.insert(e.node);
  CHECK(engine_nodes == std::set<std::string>{"engine-node-a", "engine-node-b"});
}

TEST_CASE("topology: to_yaml shows the resolved view") {
  auto t = parse_topology(plus(insecure + "transfer: {backend: ucx, bucket_bytes: 64MiB, ucx_transports: [tcp]}\n"
                               "sync: {pause: {mode: wait, clear_cache: true}}\n"
                               "drill: {faults: [{at_sync: 1, action: kill, target: e-1}]}"),
                          "t.yaml", "/base");
  auto text = to_yaml(t);
  // It is YAML, and it says what was resolved.
  auto y = YAML::Load(text);
  CHECK(y["name"].as<std::string>() == "t");
  CHECK(y["engines"].size() == 2);
  CHECK(y["engines"][1]["name"].as<std::string>() == "e-1");
  CHECK(y["engines"][1]["group"].as<std::string>() == "e");
  CHECK(y["engines"][1]["tp"].as<int>() == 2);
  CHECK(y["model"]["head_dim"].as<int>() == 32);
  CHECK(y["model"]["kv_heads"].as<int>() == 4);
  CHECK(y["model"]["dtype"].as<std::string>() == "bf16");
  CHECK(y["model"]["weight_bytes"].as<std::int64_t>() == 2 * y["model"]["parameters"].as<std::int64_t>());
  CHECK(y["transfer"]["bucket_bytes"].as<std::int64_t>() == 64 << 20);
  CHECK(y["transfer"]["ucx_transports"][0].as<std::string>() == "tcp");
  CHECK(y["trainer"]["ranks"][0]["layers"].size() == 4);
  CHECK(y["router"]["node"].as<std::string>() == "a");
  CHECK(y["sync"]["deadlines_ms"]["continue"].as<int>() == 1000);
  CHECK(y["sync"]["pause"]["mode"].as<std::string>() == "wait");
  CHECK(y["sync"]["pause"]["clear_cache"].as<bool>());
  CHECK(y["drill"]["faults"][0]["target"].as<std::string>() == "e-1");
  CHECK(y["drill"]["faults"][0]["target_kind"].as<std::string>() == "engine");
  CHECK(text.find("bucket_bytes: 67108864  # 64 MiB") != std::string::npos);
  CHECK(y["transfer"]["huge_pages"].as<bool>()); // the default
  auto off = parse_topology(plus(insecure + "transfer: {backend: ucx, huge_pages: false}"), "t.yaml", "/base");
  CHECK_FALSE(off.transfer.huge_pages);
  CHECK_FALSE(YAML::Load(to_yaml(off))["transfer"]["huge_pages"].as<bool>());
}

TEST_CASE("topology: enum names round-trip") {
  CHECK(to_string(router_policy::prefix_affinity) == "prefix_affinity");
  CHECK(to_string(transfer_backend::cuda_ipc) == "cuda_ipc");
  CHECK(to_string(transfer_mode::broadcast) == "broadcast");
  CHECK(to_string(ucx_transport::cma) == "cma");
  CHECK(to_string(trainer_source::checkpoint_dir) == "checkpoint_dir");
  CHECK(to_string(fault_action::delay_acks) == "delay_acks");
  CHECK(to_string(fault_target::coordinator) == "coordinator");
}

TEST_CASE("topology: ucx lends groups in shared memory only where ucx_transports allow shm") {
  for (const auto& c : test::ucx_transport_cases()) {
    CAPTURE(c.name);
    CHECK(ucx_lends_shared_memory(c.spec()) == c.lends_shared_memory);
  }
}

TEST_CASE("topology: which trainer ranks may have a built-in engine on their host") {
  const std::string nodes = "nodes: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.1}, "
                            "{name: c, address: 10.0.0.2}, {name: d, address: 10.0.0.3}]";
  const std::string two_ranks = "trainer: {node: a, ranks: [{node: a, layers: [0, 1]}, {node: c, layers: [2, 3]}]}";
  struct row {
    const char* name;
    std::string trainer, engines;
    std::vector<bool> near; // per rank
  };
  const std::vector<row> rows = {
    {"an engine on the rank's node", "trainer: {node: a}", "engines: [{name: e, node: a}]", {true}},
    {"an engine on another node of the same address", "trainer: {node: a}", "engines: [{name: e, node: b}]", {true}},
    {"engines on other addresses only", "trainer: {node: a}", "engines: [{name: e, node: c}, {name: f, node: d}]",
     {false}},
    {"a vLLM server on the rank's node maps nothing", "trainer: {node: a}",
     "engines: [{name: v, node: a, kind: vllm, url: 'http://h:1'}, {name: e, node: c}]", {false}},
    {"two ranks, an engine beside the second only", two_ranks, "engines: [{name: e, node: c}]", {false, true}},
    {"two ranks, an engine beside each", two_ranks, "engines: [{name: e, node: b}, {name: f, node: c}]",
     {true, true}},
  };
  for (const auto& r : rows) {
    CAPTURE(r.name);
    const std::string text =
      with("", "").substr(0, with("", "").find("nodes:")) + nodes + "\n" + r.trainer + "\n" + r.engines + "\n";
    const auto t = parse_topology(text + insecure, "t.yaml", "/base");
    REQUIRE(t.trainer.ranks.size() == r.near.size());
    for (std::size_t rank = 0; rank < r.near.size(); ++rank) {
      CAPTURE(rank);
      CHECK(engine_near_trainer_rank(t, rank) == r.near[rank]);
    }
    CHECK_FALSE(engine_near_trainer_rank(t, r.near.size())); // no such rank
  }
}

TEST_CASE("yaml_fields: closest key suggestions") {
  using yaml_fields::closest;
  const std::vector<std::string> keys = {"name", "node", "replicas", "tp", "policy", "max_batch"};
  CHECK(closest("tpp", keys) == "tp");
  CHECK(closest("replica", keys) == "replicas");
  CHECK(closest("polciy", keys) == "policy"); // transposition
  CHECK(closest("Name", keys) == "name");     // case
  CHECK(closest("maxbatch", keys) == "max_batch");
  CHECK(closest("x", keys) == "");
  CHECK(closest("colour", keys) == "");
}
