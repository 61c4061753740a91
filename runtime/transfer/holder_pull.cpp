#include "runtime/transfer/holder_pull.hpp"

#include "runtime/base/parallel.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/plan/holders.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>

namespace rlsync::transfer {

producer_link::producer_link(producer_holding holding, std::shared_ptr<weight_puller> puller)
    : holding_(std::move(holding)), puller_(std::move(puller)) {
  if (!puller_)
    throw std::invalid_argument("M:N pull: trainer rank " + std::to_string(holding_.rank) + " has no puller");
}

void producer_link::unregister(const std::string& engine) {
  std::lock_guard<std::mutex> lock(mutex_);
  puller_->unregister_engine(engine);
  registered_.clear();
}

std::vector<std::shared_ptr<producer_link>>
links_for(producer_links& links, const std::vector<producer_holding>& holdings, const std::string& engine,
          const std::function<std::shared_ptr<weight_puller>(std::size_t)>& make_puller) {
  std::vector<std::shared_ptr<producer_link>> out;
  for (std::size_t i = 0; i < holdings.size(); ++i) {
    const auto& h = holdings[i];
    auto kept = links.find(h.rank);
    if (kept == links.end() || kept->second->holding().incarnation != h.incarnation
        || kept->second->holding().held != h.held) {
      const auto rank = "no puller for trainer rank " + std::to_string(h.rank);
      std::shared_ptr<weight_puller> puller;
      try {
        puller = make_puller(i);
      } catch (const std::exception& e) {
        throw std::runtime_error(rank + ": " + e.what());
      }
      if (!puller)
        throw std::runtime_error(rank);
      auto link = std::make_shared<producer_link>(h, std::move(puller));
      if (kept == links.end()) {
        kept = links.emplace(h.rank, std::move(link)).first;
      } else {
        kept->second->unregister(engine); // an earlier incarnation: its registrations go with it
        kept->second = std::move(link);
      }
    }
    out.push_back(kept->second);
  }
  return out;
}

void producer_link::ensure_registered(const std::string& engine, const plan::worker_plan& plan,
                                      const std::vector<std::size_t>& indices) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = registered_.find(plan.worker);
  if (it != registered_.end() && it->second == indices)
    return;
  registered_.erase(plan.worker); // a registration that throws leaves nothing assumed
  puller_->register_worker(engine, plan::sub_plan(plan, indices));
  registered_[plan.worker] = indices;
}

namespace {

bool retryable(transfer_failure f) {
  return f != transfer_failure::checksum_mismatch && f != transfer_failure::abandoned;
}

std::string who(const std::string& engine, int worker) {
  return "engine '" + engine + "' worker " + std::to_string(worker);
}

// One worker's M:N pull: what has arrived, and the merging of parts.
class worker_pull {
public:
  worker_pull(const model_config& c, const holder_pull_request& req, const plan::worker_plan& plan,
              const plan::holder_index& index, const std::vector<std::shared_ptr<producer_link>>& producers,
              const group_sink& sink)
      : c_(c), req_(req), plan_(plan), index_(index), producers_(producers), sink_(sink) {
    const std::size_t n = plan.entries.size();
    group_.resize(n);
    offset_.resize(n);
    place_.resize(n);
    done_.assign(n, false);
    for (std::size_t i = 0; i < n; ++i) {
      const auto& e = plan.entries[i];
      const std::uint32_t g = plan::group_of(c, e.source);
      group_[i] = g;
      auto& layout = groups_[g];
      offset_[i] = layout.bytes; // plan order within a group: each entry after the previous
      place_[i] = layout.entries;
      layout.bytes += e.bytes();
      ++layout.entries;
      ++layout.left;
      by_name_[e.source].push_back(i);
    }
  }

  pull_report run() {
    const auto t0 = clock::now();
    std::vector<bool> excluded(producers_.size(), false);
    std::vector<std::string> failures(producers_.size());
    std::optional<transfer_failure> last_failure;
    for (;;) {
      std::vector<std::size_t> pending;
      for (std::size_t i = 0; i < done_.size(); ++i)
        if (!done_[i])
          pending.push_back(i);
      if (pending.empty())
        break;
      plan::holder_choice choice;
      try {
        choice = plan::choose_holders(c_, plan_, index_, pending, excluded);
      } catch (const std::invalid_argument& e) {
        if (!last_failure)
          throw; // nobody failed: the layout itself leaves a tensor unheld
        std::string tried;
        for (std::size_t p = 0; p < failures.size(); ++p)
          if (!failures[p].empty())
            tried += "; " + failures[p];
        throw transfer_error(*last_failure, "M:N pull: " + who(req_.engine, plan_.worker) + ", version "
                                                + std::to_string(req_.version) + ": " + e.what() + "; tried "
                                                + index_.describe(excluded) + tried);
      }
      std::vector<std::size_t> active;
      for (std::size_t p = 0; p < choice.entries.size(); ++p)
        if (!choice.entries[p].empty())
          active.push_back(p);
      // A backend whose pulls are collectives takes the ranks one at a time,
      // in rank order, the same on every worker (nccl_puller's collective).
      const bool in_rank_order = std::any_of(active.begin(), active.end(), [&](std::size_t p) {
        return producers_[p]->puller().needs_rank_order(req_.mode);
      });
      if (in_rank_order)
        std::sort(active.begin(), active.end(),
                  [&](std::size_t a, std::size_t b) { return index_.rank(a) < index_.rank(b); });
      std::vector<std::exception_ptr> errors(active.size());
      auto attempt = [&](std::size_t k) {
        try {
          pull_part(active[k], choice.entries[active[k]], attempt_deadline(active[k], choice.entries[active[k]], excluded));
        } catch (...) {
          errors[k] = std::current_exception();
        }
      };
      if (in_rank_order) {
        for (std::size_t k = 0; k < active.size(); ++k)
          attempt(k);
      } else {
        std::vector<std::thread> threads;
        std::size_t started = 1;
        try {
          for (; started < active.size(); ++started)
            threads.emplace_back(attempt, started);
        } catch (...) { // out of threads: the parts not started are pulled here, in turn
        }
        for (std::size_t k = 0; k < active.size(); ++k)
          if (k == 0 || k >= started)
            attempt(k);
        for (auto& t : threads)
          t.join();
      }
      for (std::size_t k = 0; k < active.size(); ++k) {
        if (!errors[k])
          continue;
        try {
          std::rethrow_exception(errors[k]);
        } catch (const transfer_error& e) {
          const auto p = active[k];
          std::string named = "rank " + std::to_string(index_.rank(p)) + ": " + e.what();
          if (!retryable(e.failure))
            throw transfer_error(e.failure, named);
          excluded[p] = true;
          failures[p] = std::move(named);
          last_failure = e.failure;
        }
      }
    }
    pull_report r;
    r.engine = req_.engine;
    r.worker = plan_.worker;
    r.version = req_.version;
    r.bytes = bytes_;
    r.groups = static_cast<std::uint32_t>(delivered_groups_.size());
    r.duration = clock::now() - t0;
    r.waited = slowest_part_.waited;
    r.stored = slowest_part_.stored;
    r.ran = slowest_part_.ran;
    r.queued = slowest_part_.queued;
    return r;
  }

private:
  struct group_layout {
    std::uint64_t bytes = 0;   // the worker's packed bytes of the group
    std::size_t entries = 0;   // its plan entries
    std::size_t left = 0;      // entries not delivered yet
    std::vector<std::uint8_t> partial; // parts merged so far (only while split and incomplete)
  };

  // Half the time left when every entry of the part has another holder
  // (a retry can still finish), all of it otherwise.
  clock::time_point attempt_deadline(std::size_t p, const std::vector<std::size_t>& entries,
                                     const std::vector<bool>& excluded) const {
    auto others = excluded;
    others[p] = true;
    for (auto i : entries)
      if (index_.holders_left(plan_.entries[i].source, others) == 0)
        return req_.deadline;
    const auto now = clock::now();
    return now >= req_.deadline ? req_.deadline : now + (req_.deadline - now) / 2;
  }

  void pull_part(std::size_t p, const std::vector<std::size_t>& entries, clock::time_point deadline) {
    auto& link = *producers_[p];
    const std::string rank = "rank " + std::to_string(link.holding().rank);
    link.ensure_registered(req_.engine, plan_, entries);
    // The part's entries of each group, in plan order: the layout of the
    // producer's packed bytes of that group.
    std::unordered_map<std::uint32_t, std::vector<std::size_t>> part;
    std::set<std::string> names;
    for (auto i : entries) {
      part[group_[i]].push_back(i);
      names.insert(plan_.entries[i].source);
    }
    group_sink mine;
    mine.on_group = [&](int, std::uint32_t g, const std::uint8_t* bytes, std::size_t size) {
      auto it = part.find(g);
      if (it == part.end()) {
        if (size != 0)
          throw transfer_error(transfer_failure::producer_failed,
                               rank + " sent " + std::to_string(size) + " bytes of group " + std::to_string(g)
                                   + ", for which it serves nothing");
        return; // a group the producer holds with none of this part's entries
      }
      deliver_part(g, it->second, bytes, size, rank);
    };
    mine.on_full_group = [&](int, std::uint32_t g, const std::vector<tensor_view>& tensors) {
      deliver_tensors(g, tensors, names);
    };
    mine.abandoned = sink_.abandoned;
    if (sink_.on_device && sink_.targets) {
      // A backend that holds the part on a device lands it there: the part's
      // entries of the engine's targets, in the sub-plan's (plan) order.
      mine.land_targets = [&](int, std::uint32_t g) {
        std::vector<store_target> out;
        const auto it = part.find(g);
        const auto layout = groups_.find(g);
        if (it == part.end() || layout == groups_.end())
          return out;
        const auto all = sink_.targets(plan_.worker, g);
        if (all.size() != layout->second.entries)
          return out; // the engine converts the group: nothing lands
        for (auto i : it->second)
          out.push_back(all[place_[i]]);
        return out;
      };
      mine.on_device = sink_.on_device;
      mine.lands_from = sink_.lands_from;
    }
    pull_request r{req_.engine, plan_.worker, req_.version, req_.mode, deadline};
    const auto part_report = link.puller().pull(r, mine);
    std::lock_guard<std::mutex> lock(mutex_);
    if (part_report.duration >= slowest_part_.duration) // parts run at once: the slowest part's, as for workers
      slowest_part_ = part_report;
    for (auto i : entries)
      if (!done_[i])
        throw transfer_error(transfer_failure::producer_failed,
                             rank + " ended version " + std::to_string(req_.version) + " without tensor '"
                                 + plan_.entries[i].source + "' (group " + std::to_string(group_[i])
                                 + ") that it says it holds");
  }

  // Sharded: the producer's packed bytes of group g, entries `idx` of the plan.
  void deliver_part(std::uint32_t g, const std::vector<std::size_t>& idx, const std::uint8_t* bytes, std::size_t size,
                    const std::string& rank) {
    std::uint64_t want = 0;
    for (auto i : idx)
      want += plan_.entries[i].bytes();
    if (size != want)
      throw transfer_error(transfer_failure::producer_failed,
                           rank + " sent " + std::to_string(size) + " bytes of group " + std::to_string(g) + ", "
                               + std::to_string(want) + " expected");
    std::lock_guard<std::mutex> lock(mutex_);
    auto& layout = groups_[g];
    for (auto i : idx)
      if (done_[i])
        return; // delivered before this attempt (a backend never sends a group twice in one pull)
    if (idx.size() == layout.entries) { // the whole group from one producer: straight through
      sink_.on_group(plan_.worker, g, bytes, size);
    } else {
      if (layout.partial.empty())
        layout.partial.resize(static_cast<std::size_t>(layout.bytes));
      std::size_t at = 0;
      for (auto i : idx) {
        const auto n = static_cast<std::size_t>(plan_.entries[i].bytes());
        std::memcpy(layout.partial.data() + offset_[i], bytes + at, n);
        at += n;
      }
      if (layout.left > idx.size()) {
        mark_done(idx, layout);
        return;
      }
      sink_.on_group(plan_.worker, g, layout.partial.data(), layout.partial.size());
      std::vector<std::uint8_t>().swap(layout.partial);
    }
    mark_done(idx, layout);
    bytes_ += layout.bytes;
    delivered_groups_.insert(g);
  }

  // Broadcast: keeps the tensors this producer was chosen for.
  void deliver_tensors(std::uint32_t g, const std::vector<tensor_view>& tensors, const std::set<std::string>& names) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<tensor_view> kept;
    for (const auto& t : tensors) {
      if (!names.count(t.name))
        continue;
      auto it = by_name_.find(t.name);
      if (it == by_name_.end() || done_[it->second.front()])
        continue;
      kept.push_back(t);
    }
    if (kept.empty())
      return;
    sink_.on_full_group(plan_.worker, g, kept);
    for (const auto& t : kept) {
      for (auto i : by_name_[t.name]) {
        done_[i] = true;
        --groups_[group_[i]].left;
      }
      bytes_ += t.size;
    }
    delivered_groups_.insert(g);
  }

  void mark_done(const std::vector<std::size_t>& idx, group_layout& layout) {
    for (auto i : idx)
      done_[i] = true;
    layout.left -= idx.size();
  }

  const model_config& c_;
  const holder_pull_request& req_;
  const plan::worker_plan& plan_;
  const plan::holder_index& index_;
  const std::vector<std::shared_ptr<producer_link>>& producers_;
  const group_sink& sink_;

  std::vector<std::uint32_t> group_; // per entry
  std::vector<std::uint64_t> offset_; // per entry: where its bytes lie in its group's packed bytes
  std::vector<std::size_t> place_;    // per entry: its place among its group's entries
  std::unordered_map<std::string, std::vector<std::size_t>> by_name_; // tensor -> its entries

  std::mutex mutex_; // the rest, and the sink calls
  std::vector<bool> done_; // per entry: delivered to the sink
  std::map<std::uint32_t, group_layout> groups_;
  std::set<std::uint32_t> delivered_groups_;
  std::uint64_t bytes_ = 0;
  pull_report slowest_part_; // of the parts pulled, the one whose pull took longest
};

} // namespace

transfer_report pull_from_holders(const model_config& c, const holder_pull_request& req,
                                  const std::vector<std::shared_ptr<const plan::worker_plan>>& plans,
                                  const std::vector<std::shared_ptr<producer_link>>& producers,
                                  const group_sink& sink) {
  if (producers.empty())
    throw std::invalid_argument("M:N pull: " + who(req.engine, 0) + ": no producers");
  if (plans.empty())
    throw std::invalid_argument("M:N pull: engine '" + req.engine + "': no workers");
  if (req.mode == transfer_mode::broadcast ? !sink.on_full_group : !sink.on_group)
    throw std::invalid_argument("M:N pull: engine '" + req.engine + "': no sink for " + to_string(req.mode) + " groups");
  std::vector<producer_holding> holdings;
  for (const auto& p : producers) {
    if (!p)
      throw std::invalid_argument("M:N pull: engine '" + req.engine + "': a producer without a link");
    holdings.push_back(p->holding());
  }
  for (std::size_t w = 0; w < plans.size(); ++w)
    if (!plans[w] || plans[w]->worker != static_cast<int>(w))
      throw std::invalid_argument("M:N pull: engine '" + req.engine + "': worker " + std::to_string(w)
                                  + " has no plan of its own");
  const plan::holder_index index(holdings);
  const auto t0 = clock::now();
  std::vector<pull_report> reports(plans.size());
  parallel_for(plans.size(), plans.size(), [&](std::size_t w) {
    worker_pull one(c, req, *plans[w], index, producers, sink);
    reports[w] = one.run();
  });
  return engine_report(req.engine, req.version, reports, clock::now() - t0);
}

} // namespace rlsync::transfer
