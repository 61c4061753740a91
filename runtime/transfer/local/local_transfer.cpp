#include "runtime/transfer/local/local_transfer.hpp"

#include "runtime/base/checksum.hpp"
#include "runtime/base/parallel.hpp"
#include "runtime/base/thread_schedule.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/transfer/host_buffer.hpp"
#include "runtime/transfer/store_in_place.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace rlsync::transfer {

namespace {

using worker_id = std::pair<std::string, int>; // (engine, worker)

// Whether two plans pack the same bytes: the same slices of the same
// tensors, in the same order (which parameter they fill does not matter).
bool same_packing(const plan::worker_plan& a, const plan::worker_plan& b) {
  if (&a == &b)
    return true;
  if (a.entries.size() != b.entries.size())
    return false;
  for (std::size_t i = 0; i < a.entries.size(); ++i) {
    const auto& x = a.entries[i];
    const auto& y = b.entries[i];
    if (x.source != y.source || x.source_type != y.source_type || x.source_shape != y.source_shape
        || x.view.offset != y.view.offset || x.view.shape != y.view.shape || x.view.strides != y.view.strides)
      return false;
  }
  return true;
}

// A sharded stream is the packing of one plan: replicas' worker w of one tp
// share it, and so do sub-plans of an M:N pull that are equal; a worker
// whose sub-plan differs (a retry re-planned on this producer) gets its own.
struct stream_key {
  bool broadcast = false;
  int tp = 0;
  int worker = 0;
  std::shared_ptr<const plan::grouped_plan> plan; // sharded only

  bool operator==(const stream_key& o) const {
    if (broadcast || o.broadcast)
      return broadcast == o.broadcast;
    return tp == o.tp && worker == o.worker && same_packing(plan->plan(), o.plan->plan());
  }
  std::string describe() const {
    return broadcast ? std::string("broadcast")
                     : "tp " + std::to_string(tp) + " worker " + std::to_string(worker);
  }
};

std::string who(const pull_request& r) {
  return "engine '" + r.engine + "' worker " + std::to_string(r.worker);
}

} // namespace

// -- shared: stats and faults --------------------------------------------------------

struct local_transfer::shared {
  mutable std::mutex stats_mutex;
  mutable std::condition_variable stats_changed;
  local_transfer_stats stats;

  fault_hooks faults;

  // Packed buffers no pass holds, kept touched for the next ones: a fresh
  // 24 MB buffer costs page faults worth more than packing it (at most
  // max_spare_buffers, 2 x groups_in_flight, the largest kept).
  std::mutex spare_mutex;
  std::vector<host_buffer> spare;
  std::size_t max_spare_buffers = 8;

  host_buffer take_buffer(std::size_t size) {
    {
      std::lock_guard<std::mutex> lock(spare_mutex);
      auto best = spare.end();
      for (auto it = spare.begin(); it != spare.end(); ++it)
        if (it->capacity() >= size && (best == spare.end() || it->capacity() < best->capacity()))
          best = it;
      if (best != spare.end()) {
        host_buffer b = std::move(*best);
        spare.erase(best);
        return b;
      }
    }
    {
      std::lock_guard<std::mutex> lock(stats_mutex);
      ++stats.buffers_made;
    }
    return host_buffer(size);
  }

  // At registration, not in the first sync's stall: enough touched buffers
  // of `size` for one pass's window (`count`), within max_spare_buffers.
  void prefault(std::size_t size, std::size_t count) {
    std::lock_guard<std::mutex> lock(spare_mutex);
    std::size_t fit = 0;
    for (const auto& b : spare)
      fit += b.capacity() >= size ? 1 : 0;
    while (fit < count && spare.size() < max_spare_buffers) {
      spare.emplace_back(size);
      ++fit;
    }
  }

  void give_back(host_buffer b) {
    if (b.capacity() == 0)
      return;
    std::lock_guard<std::mutex> lock(spare_mutex);
    spare.push_back(std::move(b));
    if (spare.size() > max_spare_buffers) { // drop the smallest
      auto smallest = std::min_element(spare.begin(), spare.end(), [](const host_buffer& x, const host_buffer& y) {
        return x.capacity() < y.capacity();
      });
      spare.erase(smallest);
    }
  }

  void count_offer(std::uint64_t bytes, bool lent) {
    {
      std::lock_guard<std::mutex> lock(stats_mutex);
      ++stats.packs;
      stats.lent += lent ? 1 : 0;
      stats.packed_bytes += bytes;
    }
    stats_changed.notify_all();
  }

  void note_live_buffers(std::size_t n, std::uint64_t bytes) {
    std::lock_guard<std::mutex> lock(stats_mutex);
    stats.peak_buffers = std::max(stats.peak_buffers, n);
    stats.peak_buffer_bytes = std::max(stats.peak_buffer_bytes, bytes);
  }

  bool take_corruption(const pull_request& r, std::uint32_t group) {
    if (!faults.take_corruption(r.engine, r.worker, r.version, group))
      return false;
    std::lock_guard<std::mutex> s(stats_mutex);
    ++stats.corruptions;
    return true;
  }
};

// -- packed buffers ----------------------------------------------------------------------

namespace {

// Counts the packed buffers of one pass that are alive, wherever they are
// referenced from (window or a consumer copying), for the memory bound.
struct live_counter {
  std::mutex m;
  std::size_t live = 0;
  std::uint64_t bytes = 0;
  std::shared_ptr<local_transfer::shared> owner;

  void add(std::size_t n) {
    std::size_t count;
    std::uint64_t total;
    {
      std::lock_guard<std::mutex> lock(m);
      count = ++live;
      total = bytes += n;
    }
    owner->note_live_buffers(count, total);
  }
  void remove(std::size_t n) {
    std::lock_guard<std::mutex> lock(m);
    --live;
    bytes -= n;
  }
};

// A packed group's reused buffer: the first `size` bytes of `buffer`.
struct packed_buffer {
  explicit packed_buffer(std::shared_ptr<live_counter> c, std::size_t n)
      : buffer(c->owner->take_buffer(n)), size(n), counter(std::move(c)) {
    counter->add(size);
  }
  ~packed_buffer() {
    counter->remove(size);
    counter->owner->give_back(std::move(buffer));
  }
  packed_buffer(const packed_buffer&) = delete;
  packed_buffer& operator=(const packed_buffer&) = delete;

  std::uint8_t* data() const { return buffer.data(); }

  host_buffer buffer;
  std::size_t size = 0;
  std::shared_ptr<live_counter> counter;
};

// A group as a pass offers it: the pieces its packed order reads, where the
// version lies (lent) or in a buffer packed once (`packed`, with the
// checksum taken while packing). A lent group's checksum comes after it, in
// pass::sums: the producer takes it while consumers copy.
struct offered_group {
  std::vector<source_piece> pieces;
  std::size_t size = 0;
  std::unique_ptr<packed_buffer> packed;
  std::uint64_t packed_checksum = 0;
};

struct consumer {
  worker_id id;
  std::size_t next = 0; // index (into pass::groups) of the next group to copy
};

} // namespace

// -- one pass: a producer thread and its consumers ---------------------------------------

struct local_transfer::pass {
  using consumer_it = std::list<consumer>::iterator;

  // Fixed at construction.
  stream_key key;
  std::uint64_t version = 0;
  snapshot_ptr snapshot;
  std::shared_ptr<const plan::grouped_plan> plan; // sharded only
  std::vector<std::uint32_t> groups;        // what this pass delivers, in order
  std::shared_ptr<shared> owner;
  std::shared_ptr<live_counter> buffers;
  std::size_t window_limit = 1;
  clock::time_point join_closes;

  std::mutex m;
  std::condition_variable cv;
  std::set<worker_id> expected; // registered for the stream, not joined yet
  std::list<consumer> consumers;
  std::deque<std::shared_ptr<const offered_group>> window;
  std::size_t front = 0;  // index of window.front()
  std::vector<std::optional<std::uint64_t>> sums; // the producer's checksum of each group, once taken
  bool released_any = false;
  bool cancelled = false;
  bool producer_exited = false;
  std::string failure;
  clock::time_point deadline; // the latest of the consumers' deadlines
  std::thread producer;

  bool join_closed(clock::time_point now) const { return expected.empty() || now >= join_closes; }

  // Drops window groups every consumer has copied; stops the pass when all
  // consumers left and nobody else may join. Called with `m` held.
  void settle_locked(clock::time_point now) {
    const bool closed = join_closed(now);
    while (!window.empty() && !consumers.empty() && (released_any || closed)
           && std::all_of(consumers.begin(), consumers.end(), [&](const consumer& c) { return c.next > front; })) {
      window.pop_front();
      ++front;
      released_any = true;
    }
    if (consumers.empty() && closed) {
      // Over: nobody reads on and nobody may join; a running producer stops.
      window.clear();
      cancelled = true;
    }
  }

  std::optional<consumer_it> try_attach(const worker_id& id, clock::time_point consumer_deadline) {
    std::lock_guard<std::mutex> lock(m);
    if (released_any || cancelled || !failure.empty()) // cancelled too once its version is let go
      return std::nullopt;
    auto it = consumers.insert(consumers.end(), consumer{id, 0});
    expected.erase(id);
    deadline = std::max(deadline, consumer_deadline);
    settle_locked(clock::now());
    cv.notify_all();
    return it;
  }

  void forget(const std::string& engine) {
    std::lock_guard<std::mutex> lock(m);
    for (auto it = expected.begin(); it != expected.end();)
      it = it->first == engine ? expected.erase(it) : std::next(it);
    settle_locked(clock::now());
    cv.notify_all();
  }

  void cancel() {
    {
      std::lock_guard<std::mutex> lock(m);
      cancelled = true;
    }
    cv.notify_all();
  }

  // Over: its producer is done, and nobody reads on or may still join (a
  // producer that offered lent groups may finish before a peer joins).
  bool finished() {
    std::lock_guard<std::mutex> lock(m);
    return finished_locked(clock::now());
  }
  bool finished_locked(clock::time_point now) const {
    return producer_exited && consumers.empty() && (released_any || join_closed(now));
  }
  // A finished pass lets go of its version at once: the source may have
  // dropped it, and the pass itself is reaped only by a later pull. Called
  // with `m` held; nobody reads `snapshot` once the pass is finished.
  void let_go_if_finished_locked(clock::time_point now) {
    if (!finished_locked(now))
      return;
    snapshot.reset();
    window.clear();   // lent pieces point into the version
    cancelled = true; // and nobody may join a pass without its version
  }

  // -- consumer side --

  // Waits on `lock` until `ready()`. Throws when the producer failed, when
  // the pass stopped before `awaited` came ("group 3"), or at r's deadline
  // (`late()` says what did not come).
  template <class Ready, class Late>
  void await(std::unique_lock<std::mutex>& lock, const pull_request& r, Ready ready, const std::string& awaited,
             Late late) {
    for (;;) {
      if (!failure.empty())
        throw transfer_error(transfer_failure::producer_failed,
                             who(r) + ": the producer failed on version " + std::to_string(version) + ": " + failure);
      if (ready())
        return;
      if (cancelled)
        throw transfer_error(transfer_failure::cancelled, who(r) + ": the producer stopped before " + awaited
                                                              + " of version " + std::to_string(version));
      if (clock::now() >= r.deadline)
        throw transfer_error(transfer_failure::timeout, who(r) + ": " + late());
      cv.wait_until(lock, r.deadline);
    }
  }

  std::shared_ptr<const offered_group> wait_group(std::size_t idx, const pull_request& r) {
    std::unique_lock<std::mutex> lock(m);
    const std::string group = "group " + std::to_string(groups[idx]);
    await(lock, r, [&] { return idx >= front && idx < front + window.size(); }, group, [&] {
      return group + " of version " + std::to_string(version) + " (" + key.describe()
             + " stream) did not arrive before the deadline; " + std::to_string(idx) + " of "
             + std::to_string(groups.size()) + " groups received";
    });
    return window[idx - front];
  }

  // The producer's checksum of group `idx`, once taken (a lent group's is
  // taken while consumers copy it).
  std::uint64_t wait_checksum(std::size_t idx, const pull_request& r) {
    std::unique_lock<std::mutex> lock(m);
    const std::string group = "group " + std::to_string(groups[idx]);
    await(lock, r, [&] { return sums[idx].has_value(); }, "checksumming " + group, [&] {
      return "the checksum of " + group + " of version " + std::to_string(version) + " did not come before the deadline";
    });
    return *sums[idx];
  }

  void consumed(consumer_it it, std::size_t idx) {
    {
      std::lock_guard<std::mutex> lock(m);
      it->next = idx + 1;
      settle_locked(clock::now());
    }
    cv.notify_all();
  }

  void detach(consumer_it it) {
    {
      std::lock_guard<std::mutex> lock(m);
      consumers.erase(it);
      const auto now = clock::now();
      settle_locked(now);
      let_go_if_finished_locked(now);
    }
    cv.notify_all();
  }

  // -- producer side --

  void produce() {
    for (std::size_t i = 0; i < groups.size(); ++i) {
      const bool lend = key.broadcast || lends_in_runs(*plan, groups[i]);
      if (!wait_for_room(lend))
        break;
      if (owner->faults.is_withheld(version, groups[i])) {
        // The drill: this group never comes. Stay until the pass is over.
        std::unique_lock<std::mutex> lock(m);
        while (!cancelled && clock::now() < deadline)
          cv.wait_until(lock, deadline);
        break;
      }
      std::shared_ptr<offered_group> group;
      try {
        group = offer(i, lend);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(m);
        failure = e.what();
        break;
      }
      const std::size_t size = group->size;
      {
        std::lock_guard<std::mutex> lock(m);
        if (!lend)
          sums[i] = group->packed_checksum;
        window.push_back(group); // `group` stays ours too: consumers may drop it before its checksum is in
      }
      owner->count_offer(size, lend); // counted once consumers can take it (wait_for_packs)
      cv.notify_all();
      if (lend) { // consumers copy it meanwhile; they compare once this is here
        std::optional<std::uint64_t> sum;
        std::string why;
        try {
          sum = checksum_pieces(group->pieces);
        } catch (const std::exception& e) { // its scratch window could not be allocated
          why = e.what();
        }
        {
          std::lock_guard<std::mutex> lock(m);
          if (sum)
            sums[i] = *sum;
          else
            failure = why;
        }
        cv.notify_all();
        if (!sum)
          break;
      }
    }
    {
      std::lock_guard<std::mutex> lock(m);
      producer_exited = true;
      let_go_if_finished_locked(clock::now());
    }
    cv.notify_all();
  }

  // Waits until the window has room for a group; false when the pass is
  // over. A lent group holds no memory: only packed ones count, so that a
  // fast consumer is not held back by a slow one for want of memory that
  // nothing uses.
  bool wait_for_room(bool lent) {
    std::unique_lock<std::mutex> lock(m);
    for (;;) {
      const auto now = clock::now();
      settle_locked(now);
      if (cancelled)
        return false;
      const auto packed = std::count_if(window.begin(), window.end(), [](const auto& x) { return x->packed != nullptr; });
      if (lent || static_cast<std::size_t>(packed) < window_limit)
        return true;
      if (now >= deadline) {
        cancelled = true; // every consumer's deadline has passed
        cv.notify_all();
        return false;
      }
      cv.wait_until(lock, join_closed(now) ? deadline : std::min(deadline, join_closes));
    }
  }

  // Lent where the version lies (checksummed by produce()), or packed,
  // checksum folded in, where the group's runs are too short to copy one
  // by one.
  std::shared_ptr<offered_group> offer(std::size_t idx, bool lend) {
    const std::uint32_t g = groups[idx];
    auto out = std::make_shared<offered_group>();
    out->size = static_cast<std::size_t>(key.broadcast ? snapshot->group_bytes(g) : plan->bytes(g));
    if (lend) {
      out->pieces = key.broadcast ? full_group_pieces(*snapshot, g) : group_pieces(*plan, g, *snapshot);
    } else {
      out->packed = std::make_unique<packed_buffer>(buffers, out->size);
      out->packed_checksum = pack_group_checksummed(*plan, g, *snapshot, out->packed->data());
      out->pieces = {{out->packed->data(), out->size}};
    }
    return out;
  }
};

// -- registry: registered workers and running passes -------------------------------------

struct local_transfer::registry {
  std::mutex mutex;
  std::map<worker_id, std::shared_ptr<const plan::grouped_plan>> workers;
  std::map<worker_id, std::uint64_t> last_version; // the newest version each worker started pulling
  std::vector<std::shared_ptr<pass>> passes;
};

local_transfer::local_transfer(std::shared_ptr<const weight_source> source, local_transfer_options options)
    : source_(std::move(source)), options_(options), shared_(std::make_shared<shared>()),
      registry_(std::make_unique<registry>()) {
  if (!source_)
    throw std::invalid_argument("local transfer: no weight source");
  options_.groups_in_flight = std::max<std::size_t>(1, options_.groups_in_flight);
  shared_->max_spare_buffers = 2 * options_.groups_in_flight;
}

local_transfer::~local_transfer() {
  std::vector<std::shared_ptr<pass>> passes;
  {
    std::lock_guard<std::mutex> lock(registry_->mutex);
    passes.swap(registry_->passes);
  }
  for (auto& p : passes)
    p->cancel();
  for (auto& p : passes)
    if (p->producer.joinable())
      p->producer.join();
}

void local_transfer::end_passes() {
  // Cancelled, not joined: their producers stop at once (a pack under way
  // ends first) and the passes are reaped, as finished ones are, by a pull.
  std::lock_guard<std::mutex> lock(registry_->mutex);
  for (auto& p : registry_->passes)
    p->cancel();
}

void local_transfer::register_worker(const std::string& engine, std::shared_ptr<const plan::worker_plan> plan) {
  if (!plan)
    throw std::invalid_argument("local transfer: engine '" + engine + "' registered no plan");
  if (plan->tp < 1 || plan->worker < 0 || plan->worker >= plan->tp)
    throw std::invalid_argument("local transfer: engine '" + engine + "': worker " + std::to_string(plan->worker)
                                + " of tp " + std::to_string(plan->tp));
  auto grouped = std::make_shared<const plan::grouped_plan>(source_->config(), std::move(plan));
  std::uint64_t largest = 0; // of the groups packed, not lent
  for (std::uint32_t g = 0; g < grouped->group_count(); ++g)
    if (!lends_in_runs(*grouped, g))
      largest = std::max(largest, grouped->bytes(g));
  if (largest > 0)
    shared_->prefault(static_cast<std::size_t>(largest), options_.groups_in_flight);
  std::lock_guard<std::mutex> lock(registry_->mutex);
  registry_->workers[{engine, grouped->worker()}] = std::move(grouped);
}

void local_transfer::unregister_engine(const std::string& engine) {
  std::lock_guard<std::mutex> lock(registry_->mutex);
  for (auto it = registry_->workers.begin(); it != registry_->workers.end();)
    it = it->first.first == engine ? registry_->workers.erase(it) : std::next(it);
  for (auto it = registry_->last_version.begin(); it != registry_->last_version.end();)
    it = it->first.first == engine ? registry_->last_version.erase(it) : std::next(it);
  for (auto& p : registry_->passes)
    p->forget(engine);
}

pull_report local_transfer::pull(const pull_request& req, const group_sink& sink) {
  const auto t0 = clock::now();
  const auto schedule0 = thread_schedule::now();
  const bool broadcast = req.mode == transfer_mode::broadcast;
  if (broadcast ? !sink.on_full_group : !sink.on_group)
    throw std::invalid_argument("local transfer: " + who(req) + ": no sink for " + to_string(req.mode) + " groups");

  // Join the running pass of this stream and version, or start one.
  std::shared_ptr<pass> p;
  pass::consumer_it me;
  std::vector<std::shared_ptr<pass>> finished;
  std::shared_ptr<const plan::grouped_plan> mine; // this worker's plan
  {
    std::lock_guard<std::mutex> lock(registry_->mutex);
    auto reg = registry_->workers.find({req.engine, req.worker});
    if (reg == registry_->workers.end())
      throw transfer_error(transfer_failure::not_registered, "local transfer: " + who(req)
                                                                 + " has not registered its sharding plan");
    const std::shared_ptr<const plan::grouped_plan>& plan = reg->second;
    mine = plan;
    auto snapshot = source_->find(req.version);
    if (!snapshot) {
      std::string held;
      for (auto v : source_->versions())
        held += (held.empty() ? "" : ", ") + std::to_string(v);
      throw transfer_error(transfer_failure::version_unavailable,
                           "local transfer: " + who(req) + ": version " + std::to_string(req.version)
                               + " is not held (held: " + (held.empty() ? "none" : held) + ")");
    }
    const stream_key key = broadcast ? stream_key{true, 0, 0, nullptr} : stream_key{false, plan->tp(), plan->worker(), plan};

    auto& passes = registry_->passes;
    for (auto it = passes.begin(); it != passes.end();) {
      if ((*it)->finished()) {
        finished.push_back(std::move(*it));
        it = passes.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& q : passes)
      if (q->key == key && q->version == req.version)
        if (auto c = q->try_attach({req.engine, req.worker}, req.deadline)) {
          p = q;
          me = *c;
          break;
        }
    if (!p) {
      p = std::make_shared<pass>();
      p->key = key;
      p->version = req.version;
      p->snapshot = snapshot;
      if (!broadcast)
        p->plan = plan;
      p->groups = snapshot->groups();
      p->sums.resize(p->groups.size());
      p->owner = shared_;
      p->buffers = std::make_shared<live_counter>();
      p->buffers->owner = shared_;
      p->window_limit = options_.groups_in_flight;
      p->join_closes = clock::now() + options_.join_grace;
      p->deadline = req.deadline;
      // Wait for the workers of this stream that have not pulled this
      // version yet (those that have would not come again).
      for (const auto& [id, wp] : registry_->workers) {
        auto last = registry_->last_version.find(id);
        if ((broadcast || key == stream_key{false, wp->tp(), wp->worker(), wp})
            && (last == registry_->last_version.end() || last->second < req.version))
          p->expected.insert(id);
      }
      me = *p->try_attach({req.engine, req.worker}, req.deadline);
      pass* raw = p.get(); // the pass outlives its thread: joined before it is dropped
      p->producer = std::thread([raw] { raw->produce(); });
      passes.push_back(p);
      std::lock_guard<std::mutex> s(shared_->stats_mutex);
      ++shared_->stats.passes;
    }
    auto& last = registry_->last_version[{req.engine, req.worker}];
    last = std::max(last, req.version);
  }
  for (auto& f : finished)
    if (f->producer.joinable())
      f->producer.join();

  struct detach_guard {
    std::shared_ptr<pass> p;
    pass::consumer_it it;
    ~detach_guard() { p->detach(it); }
  } guard{p, me};

  pull_report report;
  report.engine = req.engine;
  report.worker = req.worker;
  report.version = req.version;
  // A group gathered for a sink of packed bytes (below): a touched buffer
  // of the spare pool (a fresh one would fault its pages in every pull),
  // sized for the largest group of this worker's plan so that it is taken
  // once, and given back when the pull ends.
  struct scratch_buffer {
    std::shared_ptr<shared> pool;
    std::size_t largest = 0;
    host_buffer buffer;
    std::uint8_t* at_least(std::size_t n) {
      if (buffer.capacity() < n) {
        pool->give_back(std::move(buffer));
        buffer = pool->take_buffer(std::max(n, largest));
      }
      return buffer.data();
    }
    ~scratch_buffer() { pool->give_back(std::move(buffer)); }
  } scratch{shared_, 0, {}};
  if (!broadcast)
    for (std::uint32_t g = 0; g < mine->group_count(); ++g)
      scratch.largest = std::max(scratch.largest, static_cast<std::size_t>(mine->bytes(g)));
  for (std::size_t idx = 0; idx < p->groups.size(); ++idx) {
    stop_if_abandoned(sink, who(req), idx, p->groups.size());
    const std::uint32_t g = p->groups[idx];
    const auto waiting = clock::now();
    auto offered = p->wait_group(idx, req); // the producer readies it, or another worker holds the pass
    const auto storing = clock::now();
    report.waited += storing - waiting;
    const std::size_t size = offered->size;
    const auto& pieces = offered->pieces;
    // Broadcast: the group's tensors where the version holds them, and the
    // pieces of them this worker keeps (store_kept).
    const std::vector<tensor_view>* views = broadcast ? &p->snapshot->group(g) : nullptr;
    std::vector<source_piece> kept;
    const auto targets = broadcast ? broadcast_targets(sink, mine->plan(), req.worker, g, *views, kept)
                                   : group_targets(sink, req.worker, g, size);
    const bool corrupt = size > 0 && shared_->take_corruption(req, g);
    const std::uint8_t* bytes = nullptr; // sharded without targets: the packed bytes the sink reads
    std::uint64_t got = 0;
    if (!targets.empty()) { // one pass into staging, the checksum folded in
      got = broadcast ? store_kept(pieces, kept, targets, corrupt) : store_pieces(pieces, targets, corrupt);
    } else if (broadcast) { // the sink reads the tensors where they lie, verified first; the drill alters a copy
      got = corrupt ? store_pieces(pieces, {{scratch.at_least(size), size}}, true) : checksum_pieces(pieces);
    } else if (offered->packed && !corrupt && options_.groups_in_flight > 1) {
      // Read in its slot, verified first, while the producer readies the
      // next groups in the rest of the window.
      bytes = offered->packed->data();
      got = checksum64(bytes, size);
    } else {
      // Gathered into a buffer of this worker's, the checksum folded in: a
      // lent group, a packed one whose slot a window of one must free for
      // the producer to go on, or the drill's altered copy.
      bytes = scratch.at_least(size);
      got = store_pieces(pieces, {{scratch.buffer.data(), size}}, corrupt);
      offered.reset();
      p->consumed(me, idx);
    }
    const auto verifying = clock::now(); // waiting for the producer again, if it is still checksumming
    const std::uint64_t sent = p->wait_checksum(idx, req);
    const auto checksum_wait = clock::now() - verifying;
    report.waited += checksum_wait;
    if (got != sent)
      throw transfer_error(transfer_failure::checksum_mismatch,
                           "local transfer: " + who(req) + ": group " + std::to_string(g) + " of version "
                               + std::to_string(req.version) + " failed its checksum (sent " + checksum_hex(sent)
                               + ", received " + checksum_hex(got) + " over " + std::to_string(size)
                               + " bytes); the update is void");
    if (!targets.empty())
      sink.on_stored(req.worker, g);
    else if (broadcast)
      sink.on_full_group(req.worker, g, *views);
    else
      sink.on_group(req.worker, g, bytes, size);
    if (offered) {
      offered.reset();
      p->consumed(me, idx); // the producer may offer the next group in this slot
    }
    report.bytes += size;
    ++report.groups;
    report.stored += clock::now() - storing - checksum_wait;
  }
  report.duration = clock::now() - t0;
  const auto schedule = thread_schedule::now().since(schedule0);
  report.ran = schedule.ran;
  report.queued = schedule.queued;
  return report;
}

local_transfer_stats local_transfer::stats() const {
  std::lock_guard<std::mutex> lock(shared_->stats_mutex);
  return shared_->stats;
}

bool local_transfer::wait_for_packs(std::uint64_t packs, clock::time_point deadline) const {
  std::unique_lock<std::mutex> lock(shared_->stats_mutex);
  return shared_->stats_changed.wait_until(lock, deadline, [&] { return shared_->stats.packs >= packs; });
}

void local_transfer::corrupt(corruption c) { shared_->faults.corrupt(std::move(c)); }

std::uint32_t local_transfer::corruptions_landed(const std::string& engine) const {
  return shared_->faults.corruptions_landed(engine);
}

void local_transfer::withhold(std::uint32_t group, std::uint64_t version, fault_hooks::clock::time_point until) {
  shared_->faults.withhold(group, version, until);
}

void local_transfer::clear_faults() { shared_->faults.clear(); }

// -- puller.hpp ---------------------------------------------------------------------------

std::string to_string(transfer_failure x) {
  switch (x) {
    case transfer_failure::checksum_mismatch: return "checksum_mismatch";
    case transfer_failure::timeout: return "timeout";
    case transfer_failure::version_unavailable: return "version_unavailable";
    case transfer_failure::not_registered: return "not_registered";
    case transfer_failure::producer_failed: return "producer_failed";
    case transfer_failure::cancelled: return "cancelled";
    case transfer_failure::abandoned: return "abandoned";
  }
  return "transfer_failure(" + std::to_string(static_cast<int>(x)) + ")";
}

void stop_if_abandoned(const group_sink& sink, const std::string& who, std::size_t received, std::size_t groups) {
  if (sink.abandoned && sink.abandoned())
    throw transfer_error(transfer_failure::abandoned, who + ": the pull was let go (its round went on without it) after "
                                                        + std::to_string(received) + " of " + std::to_string(groups)
                                                        + " groups");
}

transfer_report pull_engine(weight_puller& puller, const std::string& engine, int tp, std::uint64_t version,
                            transfer_mode mode, const group_sink& sink, clock::time_point deadline) {
  if (tp < 1)
    throw std::invalid_argument("pull_engine: tp " + std::to_string(tp));
  const auto t0 = clock::now();
  std::vector<pull_report> reports(static_cast<std::size_t>(tp));
  parallel_for(static_cast<std::size_t>(tp), static_cast<std::size_t>(tp), [&](std::size_t w) {
    reports[w] = puller.pull(pull_request{engine, static_cast<int>(w), version, mode, deadline}, sink);
  });
  return engine_report(engine, version, reports, clock::now() - t0);
}

transfer_report engine_report(const std::string& engine, std::uint64_t version, const std::vector<pull_report>& workers,
                              clock::duration took) {
  transfer_report out;
  out.engine = engine;
  out.version = version;
  out.groups = workers.empty() ? 0 : workers.front().groups;
  const pull_report* slowest = nullptr;
  for (const auto& r : workers) {
    out.bytes += r.bytes;
    if (!slowest || r.duration > slowest->duration)
      slowest = &r;
  }
  auto ns = [](std::chrono::nanoseconds d) { return static_cast<std::uint64_t>(std::max<std::int64_t>(0, d.count())); };
  out.duration_ns = ns(std::chrono::duration_cast<std::chrono::nanoseconds>(took));
  if (slowest) {
    out.wait_ns = ns(slowest->waited);
    out.store_ns = ns(slowest->stored);
    out.ran_ns = ns(slowest->ran);
    out.queued_ns = ns(slowest->queued);
  }
  return out;
}

} // namespace rlsync::transfer
