// The transfer section (with the nccl and cuda_ipc backends' own checks),
// sync and workload.
#include "runtime/config/topology_reader.hpp"

#include "runtime/config/build_features.hpp"

namespace rlsync::topology_reading {

// Parameters of the model's largest group (groups.hpp: one transformer
// block; the first also holds the embeddings, the last the final norm and
// the LM head unless tied), and which group that is.
std::pair<std::int64_t, std::int64_t> largest_group_parameters(const model_config& c) {
  const std::int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim(),
                     kv = c.num_key_value_heads * c.head_dim();
  const std::int64_t attention = 2 * h + 2 * q * h + 2 * kv * h + (c.qk_norm() ? 2 * c.head_dim() : 0);
  auto block = [&](std::int64_t l) {
    return attention
           + (c.sparse_layer(l) ? c.num_experts * h * (1 + 3 * c.moe_intermediate_size) : 3 * h * c.intermediate_size);
  };
  const std::int64_t last = c.num_hidden_layers - 1;
  if (last == 0)
    return {0, block(0) + c.vocab_size * h + h + (c.tie_word_embeddings ? 0 : c.vocab_size * h)};
  std::pair<std::int64_t, std::int64_t> best{0, block(0) + c.vocab_size * h};
  for (std::int64_t l = 1; l <= last; ++l) {
    const std::int64_t g = block(l) + (l == last ? h + (c.tie_word_embeddings ? 0 : c.vocab_size * h) : 0);
    if (g > best.second)
      best = {l, g};
  }
  return best;
}

// cuda_ipc: engines in other processes map the trainer's exported device
// buffer (ipc_puller.hpp), which needs CUDA in this build, one host, and
// whole groups (it does not pack shards on the device yet). The device
// itself is checked at start-up, where it is used.
void reader::check_cuda_ipc(const map_reader& r) {
  if (!validated_features().cuda) {
    r.error("backend", std::string("'cuda_ipc' needs rlsync built with CUDA, and this build has none (") + why_no_cuda()
                         + "); use local or ucx");
    return;
  }
  for (const auto& n : t.nodes)
    if (n.address != t.nodes.front().address) {
      r.error("backend", "'cuda_ipc' maps the trainer's GPU memory into the engines' processes, so every node "
                         "runs on one host: node '" + n.name + "' is at " + n.address + ", node '"
                           + t.nodes.front().name + "' at " + t.nodes.front().address + "; use ucx across hosts");
      return;
    }
  if (t.transfer.mode != transfer_mode::broadcast)
    r.error("backend", "'cuda_ipc' moves whole groups, which every engine worker slices itself: set "
                       "transfer.mode: broadcast (sharded pulls over cuda_ipc need packing on the device, not "
                       "built yet)");
}

// nccl: each engine worker in another process than a trainer rank is a
// member of the coordinator's communicator and receives its groups point
// to point (nccl_puller.hpp: whole in broadcast mode, its plan's entries
// packed by the rank in sharded mode); it needs CUDA and NCCL in this
// build and rlsync's own engines (a vLLM server's GPUs are not the node's).
// The device itself is checked at start-up.
void reader::check_nccl(const map_reader& r) {
  if (const auto built = validated_features(); !built.nccl) {
    r.error("backend", std::string("'nccl' needs rlsync built with CUDA and NCCL, and this build has ")
                         + (built.cuda ? std::string("no NCCL (nccl.h or libnccl was not found when it was configured)")
                                       : std::string("no CUDA (") + why_no_cuda() + ")")
                         + "; use local or ucx");
    return;
  }
  std::int64_t members = static_cast<std::int64_t>(t.trainer.ranks.size()); // each term bounded: no overflow
  for (const auto& e : t.engines) {
    if (e.kind == engine_kind::vllm) {
      r.error("backend", "'nccl' delivers into rlsync's own engines, and engine '" + e.name
                           + "' is a vLLM server, whose GPUs this node does not hold; use ucx");
      return;
    }
    members += e.tp;
  }
  if (members > topology_limits::max_nccl_members)
    r.error("backend", "'nccl' puts every trainer rank and engine worker in one communicator, at most "
                         + std::to_string(topology_limits::max_nccl_members) + " members; this topology has "
                         + std::to_string(members));
}

void reader::read_transfer(const map_reader& root) {
  auto r = root.map("transfer", {"backend", "mode", "bucket_bytes", "groups_in_flight", "ucx_transports",
                                 "packed_budget_bytes", "collective", "huge_pages"});
  auto& tr = t.transfer;
  const bool backend_read = r.read_choice("backend", tr.backend, backend_choices);
  r.read_choice("mode", tr.mode, mode_choices);
  if (r.has("collective") && r.read("collective", tr.collective) && tr.collective) {
    // Several trainer ranks: each broadcasts its groups in a communicator of its own (gpu/nccl_group.hpp).
    if (tr.backend != transfer_backend::nccl || tr.mode != transfer_mode::broadcast)
      r.error("collective", "a collective broadcast runs over NCCL and sends whole groups: it needs backend: nccl "
                            "and mode: broadcast");
    else if (t.trainer.ranks.size() > 1)
      // Every worker is in every rank's communicator, and an engine beside a
      // rank takes that rank's groups in its own process: it would never join
      // that rank's broadcasts, which would then wait out their join window
      // every round and move point to point.
      for (const auto& e : t.engines)
        for (std::size_t i = 0; i < t.trainer.ranks.size(); ++i)
          if (e.node == t.trainer.ranks[i].node) {
            r.error("collective", "with several trainer ranks every engine must run on a node of its own: engine '"
                                    + e.name + "' shares node '" + e.node + "' with trainer rank "
                                    + std::to_string(i) + ", whose groups it takes in its own process and so "
                                    + "never joins that rank's broadcasts");
            return;
          }
  }
  if (backend_read && tr.backend == transfer_backend::nccl)
    check_nccl(r);
  if (backend_read && tr.backend == transfer_backend::cuda_ipc)
    check_cuda_ipc(r);
  // Only the nccl collective cuts what it sends into buckets (of whole
  // groups): every other data plane moves one whole group per message or buffer.
  const std::int64_t default_bucket = transfer_spec{}.bucket_bytes;
  if (r.read_size("bucket_bytes", tr.bucket_bytes, positive())) {
    const auto got = std::to_string(tr.bucket_bytes)
                     + (human_size(tr.bucket_bytes).empty() ? "" : " (" + human_size(tr.bucket_bytes) + ")");
    if (tr.bucket_bytes != default_bucket && !tr.collective)
      r.error("bucket_bytes", "only the default " + human_size(default_bucket)
                                + " is accepted here: buckets are what the nccl collective broadcasts (collective: "
                                  "true); every other data plane moves one whole parameter group (a transformer "
                                  "block) per message or buffer and does not cut it into buckets; got "
                                + got);
    else if (tr.bucket_bytes > topology_limits::max_bucket_bytes)
      r.error("bucket_bytes", "must be at most " + human_size(topology_limits::max_bucket_bytes)
                                + " (each member's device staging holds one bucket); got " + got);
  }
  if (r.read("groups_in_flight", tr.groups_in_flight, between(1, max_groups_in_flight)) && backend_read) {
    if ((tr.backend == transfer_backend::cuda_ipc || tr.backend == transfer_backend::nccl)
        && tr.groups_in_flight != transfer_spec{}.groups_in_flight)
      r.error("groups_in_flight", "only the default " + std::to_string(transfer_spec{}.groups_in_flight)
                                    + " is accepted with backend '" + std::string(to_string(tr.backend))
                                    + "': its pullers move one group at a time; got "
                                    + std::to_string(tr.groups_in_flight));
    else if (tr.backend == transfer_backend::ucx && tr.groups_in_flight > max_ucx_groups_in_flight)
      r.error("groups_in_flight", "must be at most " + std::to_string(max_ucx_groups_in_flight)
                                    + " with backend 'ucx' (the gets an engine worker's open carries to its "
                                      "producer); got " + std::to_string(tr.groups_in_flight));
  }
  // Keys only the ucx backend reads (its producer and pullers); the backend
  // is the default (local) when not given, unknown when given wrong.
  const bool other_backend = (backend_read || !r.has("backend")) && tr.backend != transfer_backend::ucx;
  const std::string other = "backend '" + std::string(to_string(tr.backend)) + "'";
  if (r.has("huge_pages") && r.read("huge_pages", tr.huge_pages) && other_backend)
    r.error("huge_pages", "only the ucx backend's producer makes shared buffers (in huge pages or not); " + other
                            + " has none");
  if (r.has("ucx_transports") && other_backend)
    r.error("ucx_transports", "only the ucx backend moves weights over UCX; " + other + " does not use it");
  else if (auto items = r.list("ucx_transports")) {
    for (auto& item : *items) {
      auto v = read_choice(d, item.node, item.node.Mark(), item.path, ucx_transport_choices);
      if (!v)
        continue;
      if (std::find(tr.ucx_transports.begin(), tr.ucx_transports.end(), *v) != tr.ucx_transports.end())
        d.add(item.node.Mark(), item.path, "'" + item.node.Scalar() + "' is listed twice");
      else
        tr.ucx_transports.push_back(*v);
    }
  }
  if (r.has("huge_pages") && backend_read && tr.backend == transfer_backend::ucx && !ucx_lends_shared_memory(tr))
    r.error("huge_pages", "ucx_transports name no shm: the producer lends no shared memory, in huge pages or not");
  // The producer packs one whole group at a time: a budget below the
  // largest group one consumer needs could never be met. Sharded, a
  // worker's share of a group is at least 1/tp of it (every element goes to
  // some worker); broadcast sends it whole. A checkpoint's dtype is not
  // known yet: its smallest possible element (2 bytes) gives the bound.
  if (r.has("packed_budget_bytes") && other_backend)
    r.error("packed_budget_bytes", "only the ucx backend's producer packs groups; " + other + " has no packed budget");
  else if (r.read_size("packed_budget_bytes", tr.packed_budget_bytes, between(0, topology_limits::max_packed_budget_bytes))
      && tr.packed_budget_bytes > 0 && model_ok && !t.engines.empty()) {
    const auto [group, parameters] = largest_group_parameters(t.model.config);
    const std::int64_t element = t.model.weights_dtype ? static_cast<std::int64_t>(dtype_size(*t.model.weights_dtype)) : 2;
    std::int64_t tp = 0; // the engine whose share is largest: the smallest tp it pulls with
    const engine_spec* whole = nullptr; // a vLLM engine: its adapter pulls whole tensors
    for (const auto& e : t.engines) {
      tp = tp == 0 ? pulling_workers(e) : std::min(tp, pulling_workers(e));
      if (!whole && e.kind == engine_kind::vllm)
        whole = &e;
    }
    if (tr.mode == transfer_mode::broadcast)
      tp = 1;
    const std::int64_t needed = (parameters + tp - 1) / tp * element;
    if (tr.packed_budget_bytes < needed)
      r.error("packed_budget_bytes",
              std::to_string(tr.packed_budget_bytes) + " bytes is less than one packed group: group "
                + std::to_string(group) + " of the model is " + std::to_string(parameters * element) + " bytes"
                + (t.model.weights_dtype ? "" : " (at 2 bytes a parameter)")
                + (tp > 1 ? ", of which a worker of tp " + std::to_string(tp) + " needs at least "
                              + std::to_string(needed)
                          : tr.mode == transfer_mode::broadcast ? ", sent whole in broadcast"
                          : whole ? ", pulled whole by vLLM engine '" + whole->name + "''s adapter"
                                  : std::string())
                + "; the producer packs whole groups, so give at least " + std::to_string(needed)
                + " (or 0 for the default)");
  }
}

void reader::read_sync(const map_reader& root) {
  auto r = root.map("sync", {"every_versions", "staleness", "wave_size", "deadlines_ms", "pause",
                             "min_live_engines", "max_restarts", "first_round_wait_ms"});
  auto& s = t.sync;
  bool every_ok = r.read("every_versions", s.every_versions, between(1, max_version_count)) || !r.has("every_versions");
  bool staleness_ok = r.read("staleness", s.staleness, between(0, max_version_count)) || !r.has("staleness");
  // Between rounds engines trail the trainer by up to every_versions - 1:
  // a smaller bound would hold every request back until the next round.
  if (every_ok && staleness_ok && s.staleness < s.every_versions - 1)
    r.error(r.has("staleness") ? "staleness" : "every_versions",
            "staleness (" + std::to_string(s.staleness) + ") must be at least every_versions - 1 ("
              + std::to_string(s.every_versions - 1) + "): engines sync every "
              + std::to_string(s.every_versions) + " versions, so between rounds they trail the trainer by up to "
              + std::to_string(s.every_versions - 1));
  if (r.read("wave_size", s.wave_size, between(0, max_replicas)) && t.transfer.collective && s.wave_size > 0
      && s.wave_size < static_cast<std::int64_t>(t.engines.size()))
    r.error("wave_size", "with transfer.collective every engine joins one broadcast; a wave of "
                           + std::to_string(s.wave_size) + " of the " + std::to_string(t.engines.size())
                           + " engines would fall back to point-to-point pulls: leave it 0 or give at least "
                           + std::to_string(t.engines.size()));
  auto pause = r.map("pause", {"mode", "clear_cache"});
  pause.read_choice("mode", s.pause.mode, pause_mode_choices);
  pause.read("clear_cache", s.pause.clear_cache);
  auto dl = r.map("deadlines_ms", {"pause", "flush", "start", "transfer", "finish", "continue"});
  const auto deadline = between(1, max_duration_ms);
  dl.read_ms("pause", s.deadlines.pause, deadline);
  dl.read_ms("flush", s.deadlines.flush, deadline);
  dl.read_ms("start", s.deadlines.start, deadline);
  dl.read_ms("transfer", s.deadlines.transfer, deadline);
  dl.read_ms("finish", s.deadlines.finish, deadline);
  dl.read_ms("continue", s.deadlines.resume, deadline);
  // A round needing more live engines than exist could never complete.
  if (r.read("min_live_engines", s.min_live_engines, between(1, max_replicas)) && engines_ok
      && s.min_live_engines > static_cast<std::int64_t>(t.engines.size()))
    r.error("min_live_engines", "must not exceed the number of engine replicas ("
                                  + std::to_string(t.engines.size()) + "), got "
                                  + std::to_string(s.min_live_engines));
  r.read("max_restarts", s.max_restarts, between(0, max_restarts_limit));
  r.read_ms("first_round_wait_ms", s.first_round_wait, between(0, max_duration_ms));
}

void reader::read_workload(const map_reader& root) {
  auto r = root.map("workload",
                    {"prompts", "concurrency", "max_tokens", "temperature", "top_p", "seed", "request_deadline_ms"});
  auto& w = t.workload;
  r.read("prompts", w.prompts, between(0, max_prompts));
  r.read("concurrency", w.concurrency, between(1, max_concurrency));
  r.read("max_tokens", w.max_tokens, between(1, max_tokens));
  if (r.read("temperature", w.temperature) && !(w.temperature >= 0 && w.temperature <= max_temperature))
    r.error("temperature", "must be in [0, " + format_double(max_temperature) + "], got " + format_double(w.temperature));
  if (r.read("top_p", w.top_p) && !(w.top_p >= min_top_p && w.top_p <= 1))
    r.error("top_p", std::string("must be in (0, 1]") + (w.top_p > 0 && w.top_p < min_top_p ? " and not below a float's smallest normal value (about 1.18e-38)" : "")
                         + ", got " + format_double(w.top_p));
  r.read("seed", w.seed);
  r.read_ms("request_deadline_ms", w.request_deadline, between(1, max_request_deadline_ms));
}

} // namespace rlsync::topology_reading
