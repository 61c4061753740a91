#include "actors/assembly/verify_weights.hpp"

#include "runtime/engine/engine_core.hpp"
#include "runtime/engine/loader.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

namespace rlsync {

std::vector<engine_verification> verify_weights(const topology& t, const transfer::weight_source& source,
                                                const std::vector<weight_digest>& digests) {
  return verify_weights(t, std::vector<const transfer::weight_source*>{&source}, digests);
}

std::vector<engine_verification> verify_weights(const topology& t,
                                                const std::vector<const transfer::weight_source*>& sources,
                                                const std::vector<weight_digest>& digests) {
  std::vector<engine_verification> out;
  // The trainer's weights through the engines' own loader, per (version, tp,
  // expert parallelism): the shards each such engine holds.
  using shape_key = std::tuple<std::uint64_t, std::int64_t, bool>;
  std::map<shape_key, std::map<std::string, std::uint64_t>> reference;
  std::map<shape_key, std::string> incomplete; // why no reference was made
  for (const auto& digest : digests) {
    engine_verification v;
    v.engine = digest.engine;
    v.version = digest.version;
    v.dirty = digest.dirty;
    const engine_spec* spec = t.find_engine(digest.engine);
    if (!spec) {
      v.error = "not an engine of the topology";
    } else if (digest.names.empty()) {
      v.error = "no checksums (no weights, or no answer in time)";
    } else {
      auto key = std::make_tuple(v.version, spec->tp, spec->expert_parallel);
      if (!reference.count(key) && !incomplete.count(key)) {
        // Every rank's tensors of that version, each name once (replicas of
        // a layer range hold the same bytes; the coordinator checks that).
        std::vector<transfer::snapshot_ptr> snaps;
        std::vector<const tensor_view*> tensors;
        std::set<std::string> seen;
        bool held = !sources.empty();
        for (const auto* source : sources) {
          if (!source)
            continue;
          auto snap = source->find(v.version);
          if (!snap) {
            held = false;
            break;
          }
          for (const auto& tv : snap->tensors())
            if (seen.insert(tv.name).second)
              tensors.push_back(&tv);
          snaps.push_back(std::move(snap)); // keeps the views valid
        }
        if (held) {
          try { // ranks that together miss a tensor make no reference
            // Stored as the engines store what the trainer sends: in its dtype.
            const dtype stored = tensors.empty() ? dtype::bf16 : tensors.front()->type;
            auto set = engine::weight_set::make(t.model.config, static_cast<int>(spec->tp), stored,
                                                spec->expert_parallel);
            engine::load_weights(tensors, *set);
            reference[key] = engine::weight_checksums(*set);
          } catch (const std::exception& e) {
            incomplete[key] = e.what();
          }
        }
      }
      auto ref = reference.find(key);
      if (std::all_of(sources.begin(), sources.end(), [](auto* s) { return s == nullptr; })) {
        v.error = "no trainer rank runs in this process to compare with";
      } else if (auto why = incomplete.find(key); why != incomplete.end()) {
        v.error = "the trainer's version " + std::to_string(v.version) + " here is incomplete: " + why->second;
      } else if (ref == reference.end()) {
        v.error = "the trainer no longer holds version " + std::to_string(v.version);
      } else {
        v.shards = digest.names.size();
        if (v.shards != ref->second.size())
          v.error = std::to_string(v.shards) + " parameter shards, the trainer's version has "
                    + std::to_string(ref->second.size());
        for (std::size_t k = 0; k < digest.names.size() && k < digest.checksums.size(); ++k) {
          auto it = ref->second.find(digest.names[k]);
          if (it == ref->second.end() || it->second != digest.checksums[k])
            ++v.mismatched;
        }
      }
    }
    out.push_back(v);
  }
  for (const auto& e : t.engines) // an engine nobody could ask is unverified, not forgotten
    if (std::none_of(out.begin(), out.end(), [&](auto& v) { return v.engine == e.name; }))
      out.push_back({e.name, 0, false, 0, 0, "not a member of the cluster (never registered, or dead)", false});
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.engine < b.engine; });
  return out;
}

} // namespace rlsync
