// The trainer section: its source, and its ranks with the layers and
// experts each holds (checked against the model as they are read).
#include "runtime/config/topology_reader.hpp"

#include <cmath>

namespace rlsync::topology_reading {

void reader::read_trainer(const map_reader& root) {
  auto r = root.map("trainer", {"node", "source", "dir", "step_time_ms", "perturb", "seed", "ranks"},
                    presence::required);
  if (!r.present())
    return;
  auto& tr = t.trainer;
  read_node_ref(r, "node", tr.node, presence::required);
  bool source_ok = !r.has("source") || r.read_choice("source", tr.source, trainer_source_choices);
  if (source_ok) {
    if (tr.source == trainer_source::checkpoint_dir)
      read_path(r, "dir", tr.dir, presence::required);
    else if (r.has("dir"))
      r.error("dir", "only used with source: checkpoint_dir");
  }
  // An outside process decides when its versions appear and what they hold;
  // a checkpoint directory's steps hold what the trainer wrote.
  if (source_ok && tr.source != trainer_source::synthetic) {
    const std::string why = tr.source == trainer_source::external
                              ? "source: external (the rank's own process publishes its versions)"
                              : "source: checkpoint_dir (each version is a step the trainer wrote)";
    for (const char* key : {"step_time_ms", "perturb", "seed"})
      if (r.has(key) && !(tr.source == trainer_source::checkpoint_dir && std::string(key) == "step_time_ms"))
        r.error(key, "not used with " + why);
    if (synthetic_seed_at)
      d.add(synthetic_seed_at->first, synthetic_seed_at->second,
            "only a synthetic trainer generates the model's values from a seed; not used with " + why);
  }
  // With a checkpoint directory it is how often the directory is listed:
  // 0 would list it back to back.
  r.read_ms("step_time_ms", tr.step_time,
            between(source_ok && tr.source == trainer_source::checkpoint_dir ? 10 : 0, max_duration_ms));
  // 0: every version holds the first one's bytes (engines holding one skip the data plane).
  if (r.read("perturb", tr.perturb) && !(tr.perturb >= 0 && tr.perturb <= max_perturb))
    r.error("perturb", "must be in [0, " + format_double(max_perturb) + "], got " + format_double(tr.perturb));
  r.read("seed", tr.seed);
  read_ranks(r);
}

void reader::read_ranks(const map_reader& trainer) {
  auto& tr = t.trainer;
  std::int64_t layers = model_ok ? t.model.config.num_hidden_layers : 0;
  auto all_layers = [&] {
    std::vector<std::int64_t> v(static_cast<std::size_t>(layers));
    for (std::int64_t i = 0; i < layers; ++i)
      v[static_cast<std::size_t>(i)] = i;
    return v;
  };
  if (!trainer.has("ranks")) {
    tr.ranks.push_back({tr.node, all_layers()});
    return;
  }
  auto items = trainer.list("ranks");
  if (!items)
    return;
  if (items->empty()) {
    trainer.error("ranks", "must list at least one rank (or leave ranks out: one rank holds all layers)");
    return;
  }
  if (items->size() > static_cast<std::size_t>(max_ranks)) {
    trainer.error("ranks", "must list at most " + std::to_string(max_ranks) + " ranks, got "
                             + std::to_string(items->size()));
    return;
  }
  // Each rank runs on its own node (default: the trainer's); several may
  // share one, and ranks holding the same layers are replicas of them.
  bool ok = true;
  for (auto& item : *items) {
    map_reader r(d, item.node, item.path, {"node", "layers", "experts"}, trainer.mark("ranks"));
    if (!r.valid()) {
      ok = false;
      continue;
    }
    trainer_rank rank;
    rank.node = tr.node;
    if (r.has("node") && !read_node_ref(r, "node", rank.node))
      ok = false;
    auto held = read_layers(r);
    if (!held) {
      ok = false;
      continue;
    }
    rank.layers = std::move(*held);
    if (r.has("experts") && model_ok) {
      const auto& c = t.model.config;
      if (c.arch != model_arch::qwen3_moe) {
        r.error("experts", "needs a mixture-of-experts model (arch qwen3_moe), not " + std::string(to_string(c.arch)));
        ok = false;
      } else if (c.fused_experts) {
        r.error("experts", "the model's experts are fused (mlp.experts.gate_up_proj holds every expert of a "
                           "layer): a rank holds all of a layer's experts or none");
        ok = false;
      } else if (!(rank.experts = read_indices(r, "experts", "expert", c.num_experts, max_experts))) {
        ok = false;
      }
    }
    tr.ranks.push_back(std::move(rank));
  }
  if (!ok || !model_ok)
    return;
  std::vector<bool> covered(static_cast<std::size_t>(layers), false);
  for (auto& rank : tr.ranks)
    for (auto l : rank.layers)
      covered[static_cast<std::size_t>(l)] = true;
  std::vector<std::int64_t> missing;
  for (std::int64_t l = 0; l < layers; ++l)
    if (!covered[static_cast<std::size_t>(l)])
      missing.push_back(l);
  if (!missing.empty())
    trainer.error("ranks", std::string(missing.size() == 1 ? "layer " : "layers ")
                             + format_layers(missing) + (missing.size() == 1 ? " is" : " are")
                             + " held by no rank (the model has " + std::to_string(layers)
                             + " layers)");
  // Every expert of every sparse layer, by some rank holding that layer.
  const auto& c = t.model.config;
  if (!missing.empty() || c.arch != model_arch::qwen3_moe)
    return;
  // Bounded work: the (layer, listed expert) pairs to mark.
  std::int64_t pairs = 0;
  for (auto& rank : tr.ranks)
    if (rank.experts)
      pairs += static_cast<std::int64_t>(rank.layers.size()) * static_cast<std::int64_t>(rank.experts->size());
  if (pairs > (std::int64_t(1) << 26)) {
    trainer.error("ranks", "the ranks list " + std::to_string(pairs) + " (layer, expert) pairs, more than 2^26");
    return;
  }
  for (std::int64_t l = 0; l < layers; ++l) {
    if (!c.sparse_layer(l))
      continue;
    std::vector<bool> held(static_cast<std::size_t>(c.num_experts), false);
    for (auto& rank : tr.ranks) {
      if (!std::binary_search(rank.layers.begin(), rank.layers.end(), l))
        continue;
      if (!rank.experts) { // every expert of the layer
        held.assign(held.size(), true);
        break;
      }
      for (auto e : *rank.experts)
        held[static_cast<std::size_t>(e)] = true;
    }
    std::vector<std::int64_t> unheld;
    for (std::int64_t e = 0; e < c.num_experts; ++e)
      if (!held[static_cast<std::size_t>(e)])
        unheld.push_back(e);
    if (!unheld.empty()) {
      trainer.error("ranks", "layer " + std::to_string(l) + ": " + (unheld.size() == 1 ? "expert " : "experts ")
                               + format_layers(unheld) + (unheld.size() == 1 ? " is" : " are")
                               + " held by no rank holding the layer (the model has "
                               + std::to_string(c.num_experts) + " experts)");
      return; // one layer says it; the others are usually the same
    }
  }
}

// `all`, a list of indices, or a range string "a-b" (inclusive; "a" alone is
// one index) of a rank's `key` (layers, experts): `count` of them, each a
// `unit`. Indices are checked against the model when its shape is known.
std::optional<std::vector<std::int64_t>> reader::read_indices(const map_reader& rank, const char* key,
                                                              const std::string& unit, std::int64_t count,
                                                              std::int64_t max_listed) {
  const std::string path = rank.path(key);
  YAML::Node node = rank.get(key);
  const std::string expected = "expected `all`, a list of " + unit + " indices or a range like \"0-3\", got ";
  std::vector<std::int64_t> layers;
  bool ok = true;
  auto in_range = [&](std::int64_t l, const YAML::Mark& at, const std::string& p) {
    if (!model_ok || l < count)
      return true;
    d.add(at, p, unit + " " + std::to_string(l) + " out of range: the model has " + std::to_string(count) + " "
                   + unit + "s (0-" + std::to_string(count - 1) + ")");
    return false;
  };
  if (node.IsScalar()) {
    const std::string& text = node.Scalar();
    if (text == "all") {
      for (std::int64_t i = 0; i < count; ++i)
        layers.push_back(i);
      return layers;
    }
    auto dash = text.find('-');
    std::string first = text.substr(0, dash), last = dash == std::string::npos ? first : text.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() < 10
             && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
    };
    if (!digits(first) || !digits(last)) {
      rank.error(key, expected + describe(node));
      return std::nullopt;
    }
    std::int64_t a = std::stoll(first), b = std::stoll(last);
    if (a > b) {
      rank.error(key, "range start must not exceed its end, got '" + printable(text) + "'");
      return std::nullopt;
    }
    if (!in_range(b, rank.mark(key), path))
      return std::nullopt;
    if (!model_ok)
      return layers; // unchecked: do not expand "0-999999999"
    for (std::int64_t i = a; i <= b; ++i)
      layers.push_back(i);
    return layers;
  }
  if (!node.IsSequence()) {
    rank.error(key, expected + describe(node));
    return std::nullopt;
  }
  // Each index at most once: a longer list is wrong, and checking repeats
  // in it would take quadratic time.
  if (node.size() > static_cast<std::size_t>(max_listed)) {
    rank.error(key, "must list at most " + std::to_string(max_listed) + " " + unit + "s, got "
                      + std::to_string(node.size()));
    return std::nullopt;
  }
  std::size_t i = 0;
  for (auto it = node.begin(); it != node.end(); ++it, ++i) {
    YAML::Node item = *it;
    std::string item_path = index_path(path, i);
    auto l = read_int(d, item, item.Mark(), item_path, non_negative());
    if (!l || !in_range(*l, item.Mark(), item_path)) {
      ok = false;
      continue;
    }
    if (std::find(layers.begin(), layers.end(), *l) != layers.end()) {
      d.add(item.Mark(), item_path, unit + " " + std::to_string(*l) + " is listed twice");
      ok = false;
      continue;
    }
    layers.push_back(*l);
  }
  if (!ok)
    return std::nullopt;
  if (layers.empty()) {
    rank.error(key, "must name at least one " + unit);
    return std::nullopt;
  }
  std::sort(layers.begin(), layers.end());
  return layers;
}

std::optional<std::vector<std::int64_t>> reader::read_layers(const map_reader& rank) {
  if (!rank.require("layers"))
    return std::nullopt;
  return read_indices(rank, "layers", "layer", model_ok ? t.model.config.num_hidden_layers : 0, max_hidden_layers);
}

} // namespace rlsync::topology_reading
