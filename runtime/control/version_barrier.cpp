#include "runtime/control/version_barrier.hpp"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

namespace rlsync {

namespace {

std::string rank_name(std::uint32_t r) { return "rank " + std::to_string(r); }

/// "a, b, c and 4 more": at most `shown` of `names`.
std::string first_names(const std::vector<std::string>& names, std::size_t shown = 3) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < shown; ++i)
    out += (i == 0 ? "" : ", ") + names[i];
  if (names.size() > shown)
    out += " and " + std::to_string(names.size() - shown) + " more";
  return out;
}

const version_info* find_version(const std::deque<version_info>& window, std::uint64_t v) {
  for (auto& vi : window)
    if (vi.version == v)
      return &vi;
  return nullptr;
}

} // namespace

version_barrier::version_barrier(std::uint32_t ranks, std::vector<std::string> parameter_names,
                                 std::size_t keep_window)
  : ranks_(ranks), parameter_names_(std::move(parameter_names)), keep_window_(std::max<std::size_t>(keep_window, 1)) {
  std::sort(parameter_names_.begin(), parameter_names_.end());
  parameter_names_.erase(std::unique(parameter_names_.begin(), parameter_names_.end()), parameter_names_.end());
}

std::string version_barrier::join(const rank_info& info, std::uint64_t vouches_from) {
  if (info.rank >= ranks_)
    return rank_name(info.rank) + " is not a rank of the topology, which has " + std::to_string(ranks_)
           + (ranks_ == 1 ? " rank" : " ranks");
  if (!parameter_names_.empty()) {
    std::vector<std::string> unknown;
    for (auto& name : info.held)
      if (!std::binary_search(parameter_names_.begin(), parameter_names_.end(), name))
        unknown.push_back(name);
    if (!unknown.empty())
      return rank_name(info.rank) + " holds " + first_names(unknown) + ", no parameter of the model";
  }
  joined_[info.rank] = rank_record{info, {}, vouches_from}; // a new incarnation holds nothing published yet
  check_layout();
  return {};
}

void version_barrier::check_layout() {
  layout_errors_.clear();
  if (!complete() || parameter_names_.empty())
    return; // a rank still missing may hold the rest
  std::set<std::string> held;
  for (auto& [r, rec] : joined_)
    held.insert(rec.info.held.begin(), rec.info.held.end());
  std::vector<std::string> unheld;
  for (auto& name : parameter_names_)
    if (held.count(name) == 0)
      unheld.push_back(name);
  if (unheld.empty())
    return;
  std::string ranks;
  for (auto& [r, rec] : joined_)
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  layout_errors_.push_back(barrier_error{"unheld", std::to_string(unheld.size()) + " tensors held by no rank (ranks "
                                                     + ranks + " registered): " + first_names(unheld)});
}

std::string version_barrier::publish(std::uint32_t rank, const version_info& vi) {
  auto i = joined_.find(rank);
  if (i == joined_.end())
    return rank_name(rank) + " published v" + std::to_string(vi.version) + " before registering";
  auto& rec = i->second;
  if (!vi.checksums.empty() && vi.checksums.size() != rec.info.held.size())
    return rank_name(rank) + " published v" + std::to_string(vi.version) + " with " + std::to_string(vi.checksums.size())
           + " checksums for the " + std::to_string(rec.info.held.size()) + " tensors it holds";
  if (vi.version == 0 || (!rec.window.empty() && vi.version <= rec.window.back().version))
    return {}; // nothing new from this rank (a repeat, or its subscription's first report)
  rec.window.push_back(vi);
  while (rec.window.size() > keep_window_)
    rec.window.pop_front();
  newest_published_ = std::max(newest_published_, vi.version);
  return {};
}

void version_barrier::check_version(std::uint64_t v, std::vector<barrier_error>& errors) const {
  // Group counts: one model, so every rank says the same.
  const version_info* first = nullptr;
  std::uint32_t first_rank = 0;
  for (auto& [r, rec] : joined_) {
    auto* vi = find_version(rec.window, v);
    if (!first) {
      first = vi;
      first_rank = r;
    } else if (vi->groups != first->groups) {
      errors.push_back(barrier_error{"groups " + std::to_string(first_rank) + " " + std::to_string(r),
                                     "v" + std::to_string(v) + ": " + rank_name(first_rank) + " publishes "
                                       + std::to_string(first->groups) + " groups, " + rank_name(r) + " "
                                       + std::to_string(vi->groups)});
    }
  }
  // A tensor two ranks hold: the same bytes (where both computed checksums).
  std::map<std::string, std::pair<std::uint32_t, std::uint64_t>> seen; // name -> first rank, checksum
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::vector<std::string>> differing; // rank pair -> tensors
  for (auto& [r, rec] : joined_) {
    auto* vi = find_version(rec.window, v);
    if (vi->checksums.empty())
      continue;
    for (std::size_t k = 0; k < rec.info.held.size(); ++k) {
      auto [it, fresh] = seen.emplace(rec.info.held[k], std::make_pair(r, vi->checksums[k]));
      if (!fresh && it->second.second != vi->checksums[k])
        differing[{it->second.first, r}].push_back(rec.info.held[k]);
    }
  }
  for (auto& [pair, names] : differing)
    errors.push_back(barrier_error{"checksums " + std::to_string(pair.first) + " " + std::to_string(pair.second),
                                   "v" + std::to_string(v) + ": " + rank_name(pair.first) + " and " + rank_name(pair.second)
                                     + " hold different bytes of " + std::to_string(names.size())
                                     + (names.size() == 1 ? " tensor: " : " tensors: ") + first_names(names)});
}

bool version_barrier::holds(std::uint64_t v) const {
  if (!complete() || !layout_errors_.empty())
    return false;
  for (auto& [r, rec] : joined_)
    if (!find_version(rec.window, v))
      return false;
  std::vector<barrier_error> errors;
  check_version(v, errors);
  return errors.empty();
}

barrier_verdict version_barrier::evaluate() {
  barrier_verdict out;
  out.errors = layout_errors_;
  if (!complete())
    return out;
  for (auto& [r, rec] : joined_)
    if (rec.window.empty())
      return out; // a rank has published nothing yet (a restart catching up)
  // The newest version in every window: candidates are the first rank's.
  const auto& first = joined_.begin()->second.window;
  std::optional<std::uint64_t> common;
  for (auto it = first.rbegin(); it != first.rend() && !common; ++it) {
    auto v = it->version;
    bool everywhere = std::all_of(joined_.begin(), joined_.end(),
                                  [&](const auto& kv) { return find_version(kv.second.window, v) != nullptr; });
    if (everywhere)
      common = v;
  }
  if (!common) {
    auto by_newest = [](const auto& a, const auto& b) { return a.second.window.back().version < b.second.window.back().version; };
    auto oldest = std::min_element(joined_.begin(), joined_.end(), by_newest);
    auto newest = std::max_element(joined_.begin(), joined_.end(), by_newest);
    out.catch_up_to = newest->second.window.back().version;
    for (auto& [r, rec] : joined_)
      if (rec.window.back().version < out.catch_up_to)
        out.behind.push_back(r);
    if (oldest->second.window.back().version < last_syncable_)
      return out; // a restarted rank below what was synced: catching up, no error
    out.errors.push_back(barrier_error{
      "skew " + std::to_string(oldest->first) + " " + std::to_string(newest->first),
      "ranks publish different versions: " + rank_name(newest->first) + " at v"
        + std::to_string(newest->second.window.back().version) + " is past " + rank_name(oldest->first) + " at v"
        + std::to_string(oldest->second.window.back().version) + " by more than the " + std::to_string(keep_window_)
        + " versions a rank keeps: no version is held by every rank"});
    return out;
  }
  if (*common < last_syncable_)
    return out; // never backwards (a rank restarted below the others)
  auto errors_before = out.errors.size();
  check_version(*common, out.errors);
  if (!layout_errors_.empty() || out.errors.size() > errors_before)
    return out; // no round on a broken layout or on this version
  version_info vi;
  vi.version = *common;
  bool same_known = true;
  for (auto& [r, rec] : joined_) {
    auto* held = find_version(rec.window, *common);
    const auto since = std::max(held->same_bytes_since, rec.vouches_from);
    same_known = same_known && held->same_bytes_since != 0 && since <= *common;
    vi.same_bytes_since = std::max(vi.same_bytes_since, since);
    vi.groups = held->groups;
    // Bytes the ranks hold together (a tensor held twice counts twice); saturates.
    auto room = std::numeric_limits<std::uint64_t>::max() - vi.total_bytes;
    vi.total_bytes += std::min(room, held->total_bytes);
  }
  if (!same_known)
    vi.same_bytes_since = 0;
  last_syncable_ = *common;
  out.syncable = vi;
  return out;
}

} // namespace rlsync
