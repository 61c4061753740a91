#include "runtime/transfer/ucx/producer_impl.hpp"

#include "runtime/base/checksum.hpp"
#include "runtime/transfer/packing.hpp"

#include <algorithm>

namespace rlsync::transfer::ucx_detail {

// -- the packed-group cache ---------------------------------------------------------

std::string consumer_of(const std::string& engine, int worker) {
  return engine + '\n' + std::to_string(worker);
}

// Serves a get from the cache: sends a packed group, waits for one being
// packed, or starts packing it once there is room in the budget; without
// room the get waits in `blocked` until there is, or its deadline.
void producer_impl::start_get(get_job j) {
  // A shared session's groups are lent in order: its consumer copies them
  // in order and gives each back only then, so a later group lent while an
  // earlier one waits for room could hold the budget the earlier one needs.
  if (j.shared && std::any_of(blocked.begin(), blocked.end(), [&](const get_job& b) { return b.conn == j.conn; })) {
    blocked.push_back(std::move(j));
    return;
  }
  auto it = cache.find(j.key);
  if (it == cache.end()) {
    if (j.bytes > budget) { // refused at plan or open already; kept as a guard
      reply(j.conn, wire::group_msg{j.seq, wire::status::producer_failed,
                                    "group " + std::to_string(j.group) + " packs " + std::to_string(j.bytes)
                                        + " bytes, more than the producer's packed budget of "
                                        + std::to_string(budget) + " bytes (transfer.packed_budget_bytes)",
                                    j.group, 0, 0, {}});
      finish_get(j);
      return;
    }
    host_buffer reuse; // in place nothing is packed: no room, no buffer
    if (!j.key.in_place && !make_room(j.bytes, &j, reuse)) {
      blocked.push_back(std::move(j));
      return;
    }
    it = cache.find(start_pack(j.key, j.snapshot, j.key.broadcast ? nullptr : j.plan, j.bytes, std::move(reuse),
                               false)
                        ->key);
  }
  const entry_ptr e = it->second;
  e->last_use = ++use_clock;
  ++e->refs;
  switch (e->st) {
    case cache_entry::state::packing: e->waiters.push_back(std::move(j)); break;
    case cache_entry::state::ready: send_group(std::move(j), e); break;
    case cache_entry::state::failed: fail_get(j, e); break;
  }
}

std::vector<source_piece> producer_impl::in_place_pieces(const cache_key& k, const weight_snapshot& s,
                                                        const plan::grouped_plan* p) {
  return k.broadcast ? full_group_pieces(s, k.group) : group_pieces(*p, k.group, s);
}

std::uint64_t producer_impl::packed_size(const cache_key& k, const weight_snapshot& s,
                                         const plan::grouped_plan* p) const {
  if (k.broadcast)
    return plan::full_group_layout::of(s.group(k.group)).bytes;
  return p->bytes(k.group);
}

// Packed groups, spare buffers, and groups that left the cache while a
// send or a lend still holds them (UCX reads them, or a consumer may map
// them): everything counted against the budget, each group once.
std::uint64_t producer_impl::held_bytes() const {
  std::uint64_t n = 0;
  for (const auto& [k, e] : cache)
    n += e->bytes;
  for (const auto& b : spare)
    n += b.bytes;
  std::set<const cache_entry*> gone;
  for (const auto& o : sends)
    if (auto it = cache.find(o.entry->key); (it == cache.end() || it->second != o.entry)
                                            && gone.insert(o.entry.get()).second)
      n += o.entry->bytes;
  return n;
}

pins producer_impl::pins_of(const cache_entry& e, clock::time_point now) const {
  // A consumer may have several connections (a reconnect, an idle one).
  struct consumer {
    bool hard = false, session = false;
    std::uint64_t opened = 0; // the newest version it opened with this plan
  };
  std::map<std::string, consumer> seen;
  for (const auto& [ep, c] : conns) {
    if (c->closed)
      continue;
    auto used = c->opened.find({e.key.broadcast, e.key.plan, e.key.in_place});
    if (used == c->opened.end())
      continue;
    const std::string who = consumer_of(c->engine, c->worker);
    if (e.served.count(who))
      continue;
    auto& k = seen[who];
    k.opened = std::max(k.opened, used->second);
    for (const auto& [id, s] : c->sessions) {
      if (s.version != e.key.version || (s.mode == transfer_mode::broadcast) != e.key.broadcast
          || s.digest != e.key.plan || s.in_place != e.key.in_place)
        continue;
      k.session = true;
      k.hard = k.hard || now < s.pin_until;
    }
  }
  pins p;
  const bool newest_version = newest && e.key.version == newest->version();
  for (const auto& [who, k] : seen) {
    if (k.hard)
      p.hard.push_back(who);
    else if (!k.session && k.opened < e.key.version && newest_version)
      p.soft = true; // it pulled an earlier version with this plan: expected for this one
  }
  return p;
}

// What may go to make room, best first: a group nobody still needs (every
// replica had it, its version is old, its sessions ended or passed their
// deadlines), least recently used; then, for a get only, a group packed
// ahead for replicas without a session (of another version than the get's,
// or once soft_pin_grace has passed since the get's version's first session
// opened); then, when every group held waits only for consumers that are
// themselves waiting for room (nothing else could free any), the least
// recently used of them.
entry_ptr producer_impl::pick_victim(const get_job* demand, clock::time_point now, bool& still_needed) {
  std::set<std::string> stuck;
  if (demand) {
    stuck.insert(consumer_of(demand->engine, demand->worker));
    for (const auto& j : blocked)
      stuck.insert(consumer_of(j.engine, j.worker));
  }
  bool soft_expired = false;
  if (demand)
    if (auto f = first_open.find(demand->version); f != first_open.end())
      soft_expired = now >= f->second + options.soft_pin_grace;
  entry_ptr free_one, soft_one, forced_one;
  bool all_stuck = demand != nullptr;
  auto older = [](const entry_ptr& a, const entry_ptr& b) { return !b || a->last_use < b->last_use; };
  for (const auto& [k, e] : cache) {
    if (k.in_place)
      continue; // holds none of the budget: dropping it makes no room
    if (e->refs > 0 || e->st == cache_entry::state::packing) {
      all_stuck = false;
      continue;
    }
    const pins p = pins_of(*e, now);
    const bool soft_droppable = !p.soft || (demand && (e->key.version != demand->version || soft_expired));
    if (p.hard.empty() && !p.soft) {
      if (older(e, free_one))
        free_one = e;
      continue;
    }
    if (p.hard.empty() && soft_droppable && demand) {
      // Another version's first, then the group packed furthest ahead: it is needed last.
      auto rank = [&](const entry_ptr& x) { return std::make_pair(x->key.version != demand->version, x->key.group); };
      if (!soft_one || rank(e) > rank(soft_one))
        soft_one = e;
      continue;
    }
    const bool stuck_only = soft_droppable && !p.hard.empty()
                            && std::all_of(p.hard.begin(), p.hard.end(),
                                           [&](const std::string& who) { return stuck.count(who) > 0; });
    if (!stuck_only)
      all_stuck = false;
    else if (older(e, forced_one))
      forced_one = e;
  }
  still_needed = !free_one;
  if (free_one)
    return free_one;
  if (soft_one)
    return soft_one;
  return all_stuck ? forced_one : nullptr;
}

entry_ptr producer_impl::stale_entry(clock::time_point now) const {
  if (!newest)
    return nullptr;
  entry_ptr oldest;
  for (const auto& [k, e] : cache)
    if (!k.in_place && k.version < newest->version() && e->refs == 0 && e->st != cache_entry::state::packing
        && (!oldest || e->last_use < oldest->last_use)) {
      const pins p = pins_of(*e, now);
      if (p.hard.empty() && !p.soft)
        oldest = e;
    }
  return oldest;
}

std::vector<std::uint64_t> producer_impl::live_buffers() const {
  std::vector<std::uint64_t> ids;
  std::set<std::uint64_t> named;
  auto name = [&](std::uint64_t id) {
    if (id != 0 && named.insert(id).second)
      ids.push_back(id);
  };
  // First the versions held in shareable memory, newest first (lent in
  // place; relabeled versions share a buffer), and the rest of the source's
  // such memory (spares, a version being made), then packed buffers.
  const auto versions = source->versions();
  for (auto v = versions.rbegin(); v != versions.rend(); ++v)
    if (auto s = source->find(*v); s && s->shared_buffer())
      name(s->shared_buffer()->id());
  for (auto id : source->lendable_buffer_ids()) // the next versions' memory too: kept mapped, no faults then
    name(id);
  for (const auto& [k, e] : cache)
    name(e->buffer_id);
  for (const auto& b : spare)
    name(b.buffer.id());
  if (ids.size() > wire::max_live_buffers)
    ids.resize(wire::max_live_buffers); // the consumer maps the rest again when lent them
  return ids;
}

void producer_impl::forget(const entry_ptr& e) {
  if (auto it = cache.find(e->key); it != cache.end() && it->second == e)
    cache.erase(it);
}

void producer_impl::drop(const entry_ptr& e) {
  if (e->buffer.capacity() > 0)
    spare.push_back({std::move(e->buffer), e->bytes});
  cache.erase(e->key);
}

bool producer_impl::make_room(std::uint64_t bytes, const get_job* demand, host_buffer& reuse) {
  const auto now = clock::now();
  for (;;) {
    auto fit = spare.end();
    for (auto it = spare.begin(); it != spare.end(); ++it)
      if (it->buffer.capacity() >= bytes && (fit == spare.end() || it->buffer.capacity() < fit->buffer.capacity()))
        fit = it;
    const std::uint64_t held = held_bytes();
    if (fit != spare.end() && held - fit->bytes + bytes <= budget) {
      reuse = std::move(fit->buffer);
      spare.erase(fit);
      return true;
    }
    // Before touching fresh memory, recycle a group of an older version
    // that nobody still needs: reusing a buffer beats faulting in new pages.
    if (const entry_ptr stale = stale_entry(now)) {
      drop(stale);
      continue;
    }
    if (held + bytes <= budget)
      return true;
    if (!spare.empty()) { // too small to reuse, or in the way: the largest goes
      spare.erase(std::max_element(spare.begin(), spare.end(), [](const spare_buffer& a, const spare_buffer& b) {
        return a.bytes < b.bytes;
      }));
      continue;
    }
    bool still_needed = false;
    const entry_ptr victim = pick_victim(demand, now, still_needed);
    if (!victim)
      return false;
    if (still_needed) {
      std::lock_guard<std::mutex> lock(stats_mutex);
      ++st.evictions;
    }
    drop(victim);
  }
}

entry_ptr producer_impl::start_pack(const cache_key& k, snapshot_ptr snapshot,
                                    std::shared_ptr<const plan::grouped_plan> plan, std::uint64_t bytes,
                                    host_buffer buffer, bool ahead) {
  auto e = std::make_shared<cache_entry>();
  e->key = k;
  e->buffer_id = buffer.id();
  if (k.in_place) {
    e->lent_from = snapshot;
    e->buffer_id = snapshot->shared_buffer()->id();
  }
  e->bytes = bytes;
  e->ahead = ahead;
  e->last_use = ++use_clock;
  cache.emplace(k, e);
  if (newest && k.version == newest->version())
    packed_in_newest.insert(k);
  {
    const std::uint64_t held = held_bytes();
    std::lock_guard<std::mutex> lock(stats_mutex);
    const auto packed = static_cast<std::size_t>(
        std::count_if(cache.begin(), cache.end(), [](const auto& x) { return !x.first.in_place; }));
    st.peak_packed = std::max(st.peak_packed, packed);
    st.peak_packed_bytes = std::max(st.peak_packed_bytes, held);
  }
  pack_job pj;
  pj.key = k;
  pj.snapshot = std::move(snapshot);
  pj.plan = std::move(plan);
  pj.buffer = std::move(buffer);
  {
    std::lock_guard<std::mutex> lock(pack_mutex);
    if (ahead)
      pack_queue.push_back(std::move(pj));
    else
      pack_queue.push_front(std::move(pj)); // a consumer waits for it: before packing ahead
  }
  pack_cv.notify_one();
  return e;
}

// A newer version published: forget what was packed of the last one and
// pack the new one ahead.
unsigned producer_impl::check_published() {
  auto latest = source->latest();
  if (!latest || (newest && latest->version() <= newest->version()))
    return 0;
  newest = std::move(latest);
  packed_in_newest.clear();
  forget_old_in_place();
  while (first_open.size() > 16)
    first_open.erase(first_open.begin());
  retry_blocked = true; // groups of older versions no longer wait for anyone without a session
  pack_ahead();
  return 1;
}

// Checksums of groups lent in place from versions older than the newest,
// no longer lent nor being made: kept, they would keep those versions'
// memory alive (a late replica checksums again). At each publish and sweep.
void producer_impl::forget_old_in_place() {
  if (!newest)
    return;
  for (auto it = cache.begin(); it != cache.end();)
    if (it->first.in_place && it->second->refs == 0 && it->second->st != cache_entry::state::packing
        && it->first.version < newest->version())
      it = cache.erase(it);
    else
      ++it;
}

// Packs the newest version for every plan (and broadcast) that consumers
// opened sessions with, group by group, each (plan, group) once, as far as
// the budget allows without dropping anything still needed. Gets waiting
// for room go first.
unsigned producer_impl::pack_ahead() {
  if (!options.pack_ahead || !newest)
    return 0;
  // A step that changed nothing: engines serving the version before pull
  // none of it (the zero-byte round); one that does pull packs on demand.
  if (const auto v = newest->version(); source->same_bytes_since(v) != v)
    return 0;
  // Plans (and broadcast) by whether they were lent in place: a version
  // in shareable memory is checksummed for those, packed for the others.
  const bool shareable = newest->shared_buffer() != nullptr;
  std::map<std::pair<std::uint64_t, bool>, std::shared_ptr<const plan::grouped_plan>> plans;
  std::set<bool> broadcast;
  for (const auto& [ep, c] : conns) {
    if (c->closed)
      continue;
    for (const auto& [stream, version] : c->opened) {
      const bool in_place = stream.in_place && shareable;
      if (stream.broadcast)
        broadcast.insert(in_place);
      else if (auto p = c->plans.find(stream.plan); p != c->plans.end())
        plans.emplace(std::make_pair(stream.plan, in_place), p->second);
    }
  }
  unsigned n = 0;
  const std::uint64_t v = newest->version();
  // False when the budget has no room for it now: stop there, in order.
  auto pack = [&](const cache_key& k, const std::shared_ptr<const plan::grouped_plan>& p) {
    if (packed_in_newest.count(k) || cache.count(k))
      return true;
    if (!k.broadcast && !newest->holds_group(k.group))
      return true;
    std::uint64_t bytes = 0;
    try {
      bytes = k.in_place ? 0 : packed_size(k, *newest, p.get());
    } catch (const std::exception&) {
      return true; // a get will pack it and say what is wrong
    }
    if (bytes > budget)
      return true;
    host_buffer reuse;
    if (!k.in_place && !make_room(bytes, nullptr, reuse))
      return false;
    start_pack(k, newest, p, bytes, std::move(reuse), true);
    ++n;
    return true;
  };
  // In place first: a checksum takes no room, so neither a packed group
  // that waits for room nor a get that does holds it up.
  for (bool in_place : {true, false}) {
    if (!in_place && !blocked.empty())
      return n; // gets waiting for room go first
    for (auto g : newest->groups()) {
      for (const auto& [d, p] : plans)
        if (d.second == in_place && !pack({false, d.first, v, g, in_place}, p))
          return n;
      if (broadcast.count(in_place) && !pack({true, 0, v, g, in_place}, nullptr))
        return n;
    }
  }
  return n;
}

void producer_impl::release(const entry_ptr& e) {
  if (--e->refs > 0)
    return;
  retry_blocked = true;
  if (e->key.in_place && newest && e->key.version < newest->version())
    forget(e); // see forget_old_in_place
}

void producer_impl::finish_get(const get_job& j) {
  if (j.conn->outstanding > 0)
    --j.conn->outstanding;
}

void producer_impl::fail_get(const get_job& j, const entry_ptr& e) {
  reply(j.conn, wire::group_msg{j.seq, wire::status::producer_failed,
                                "the producer failed to pack group " + std::to_string(j.group) + " of version "
                                    + std::to_string(j.version) + ": " + e->error,
                                j.group, 0, 0, {}});
  finish_get(j);
  release(e);
}

void producer_impl::send_group(get_job j, const entry_ptr& e) {
  if (j.conn->closed) {
    finish_get(j);
    release(e);
    return;
  }
  send_op op;
  op.entry = e;
  op.conn = j.conn;
  op.deadline = j.deadline;
  op.bytes = e->size;
  op.group = j.group;
  wire::group_msg header{j.seq, wire::status::ok, "", j.group, e->size, e->checksum, {}};
  const bool corrupt = take_corruption(j) && e->size > 0;
  if (j.shared && (e->buffer.shared() || e->lent_from) && !corrupt) {
    // Lent: the consumer maps the buffer (or the version's memory) and
    // copies the group from it; it stays pinned until the consumer's done,
    // or the get's deadline.
    op.lent = true;
    op.seq = j.seq;
    header.shared = region_of(e->lent_from ? *e->lent_from->shared_buffer() : e->buffer);
    std::lock_guard<std::mutex> lock(stats_mutex);
    ++st.groups_lent;
    if (e->lent_from)
      ++st.groups_lent_in_place;
  } else {
    const std::uint8_t* data = e->buffer.data();
    if (corrupt) {
      // The drill: this consumer receives altered bytes under the true
      // checksum, by tag (a shared session's consumer takes such a group by
      // tag too; one lent in place gets the bytes it would have gathered).
      if (e->lent_from) {
        for (const auto& p : in_place_pieces(j.key, *j.snapshot, j.plan.get()))
          op.altered.insert(op.altered.end(), p.at, p.at + p.bytes);
      } else {
        op.altered.assign(data, data + e->size);
      }
      op.altered[op.altered.size() / 2] ^= 0x5a;
      data = op.altered.data();
    }
    ucp_request_param_t rp{};
    rp.op_attr_mask = 0;
    op.request = ucp_tag_send_nbx(j.conn->ep, data, e->size, j.tag, &rp);
    if (UCS_PTR_IS_ERR(op.request)) {
      reply(j.conn, wire::group_msg{j.seq, wire::status::producer_failed,
                                    std::string("cannot send: ") + ucs_status_string(UCS_PTR_STATUS(op.request)),
                                    j.group, 0, 0, {}});
      finish_get(j);
      release(e);
      return;
    }
  }
  reply(j.conn, header);
  e->served.insert(consumer_of(j.engine, j.worker));
  retry_blocked = true; // it may be needed by nobody now
  finish_get(j);
  if (!op.lent && op.request == nullptr) { // sent already
    count_sent(op.bytes);
    release(e);
    return;
  }
  ++op.conn->sending;
  sends.push_back(std::move(op));
}

std::list<send_op>::iterator producer_impl::end_send(std::list<send_op>::iterator it) {
  if (it->conn->sending > 0)
    --it->conn->sending;
  return sends.erase(it);
}

void producer_impl::count_sent(std::uint64_t bytes) {
  std::lock_guard<std::mutex> lock(stats_mutex);
  ++st.groups_sent;
  st.bytes_sent += bytes;
}

unsigned producer_impl::poll_sends() {
  unsigned n = 0;
  const auto now = clock::now();
  for (auto it = sends.begin(); it != sends.end();) {
    if (it->lent) {
      // Not given back (its consumer gone, or past the consumer's
      // deadline): the consumer may still map the buffer, so it leaves the
      // cache and is freed, never reused for another group (which the
      // consumer could read unchecked); the connection is closed. Lent in
      // place, the version's memory is retired likewise: its source frees
      // it instead of writing a later version into it.
      const bool gone = it->conn->closed;
      if (gone || now >= it->deadline) {
        if (const auto& v = it->entry->lent_from; v && v->shared_buffer())
          source->retire_buffer(v->shared_buffer()->id());
        forget(it->entry);
        if (!gone)
          close_connection(it->conn, "group " + std::to_string(it->group)
                                         + " was not given back before the consumer's deadline");
        release(it->entry);
        it = end_send(it);
        ++n;
        continue;
      }
      ++it;
      continue;
    }
    const ucs_status_t s = ucp_request_check_status(it->request);
    if (s == UCS_INPROGRESS) {
      if (!it->abandoned && now >= it->deadline) {
        // The consumer has given up on this group (its deadline passed):
        // it is gone or partitioned. Close the connection; the entry
        // leaves the cache (its slot serves others) but its buffer stays
        // alive with this send until UCX lets go of it.
        it->abandoned = true;
        forget(it->entry);
        close_connection(it->conn, "group " + std::to_string(it->group)
                                       + " was not taken before the consumer's deadline");
        ++n;
      }
      ++it;
      continue;
    }
    ucp_request_free(it->request);
    if (s == UCS_OK)
      count_sent(it->bytes);
    else if (!it->conn->closed)
      say(options.log, "ucx producer: sending group " + std::to_string(it->group) + " to " + it->conn->peer
                           + " failed: " + ucs_status_string(s));
    release(it->entry);
    it = end_send(it);
    ++n;
  }
  if (retry_blocked) {
    retry_blocked = false;
    n += start_blocked();
    n += pack_ahead();
  }
  return n;
}

// Gets waiting for room, in arrival order; one that still finds none keeps
// its place, and those behind it may be served from groups packed already.
unsigned producer_impl::start_blocked() {
  unsigned n = 0;
  std::deque<get_job> waiting;
  waiting.swap(blocked);
  while (!waiting.empty()) {
    auto j = std::move(waiting.front());
    waiting.pop_front();
    const std::size_t before = blocked.size();
    start_get(std::move(j));
    if (blocked.size() == before)
      ++n;
  }
  return n;
}

// Deadlines of blocked gets, idle connections.
void producer_impl::sweep(clock::time_point now) {
  for (std::size_t i = 0; i < blocked.size();) {
    if (now < blocked[i].deadline) {
      ++i;
      continue;
    }
    const auto j = blocked[i];
    blocked.erase(blocked.begin() + static_cast<std::ptrdiff_t>(i));
    count_rejected();
    reply(j.conn, wire::group_msg{j.seq, wire::status::busy,
                                  "no room in the packed budget of " + std::to_string(budget)
                                      + " bytes (transfer.packed_budget_bytes) before the deadline: "
                                      + std::to_string(cache.size())
                                      + " packed groups held, each still needed by a replica",
                                  j.group, 0, 0, {}});
    finish_get(j);
  }
  std::vector<conn_ptr> idle;
  for (auto& [ep, c] : conns)
    if (c->outstanding == 0 && now - c->last_active > options.idle_timeout)
      idle.push_back(c);
  for (auto& c : idle)
    close_connection(c, "idle for longer than " + std::to_string(options.idle_timeout.count()) + " ms");
  forget_old_in_place(); // those whose last lend ended with its connection
  // Pins end with time too (deadlines, soft_pin_grace).
  if (!blocked.empty() || options.pack_ahead)
    retry_blocked = true;
}

unsigned producer_impl::handle_packed() {
  std::deque<pack_result> done;
  {
    std::lock_guard<std::mutex> lock(pack_mutex);
    done.swap(pack_done);
  }
  for (auto& r : done) {
    auto it = cache.find(r.key);
    if (it == cache.end())
      continue; // cannot happen: packing entries are never evicted
    const entry_ptr e = it->second;
    e->buffer = std::move(r.buffer);
    if (!e->lent_from)
      e->buffer_id = e->buffer.id();
    e->size = r.size;
    e->checksum = r.checksum;
    e->error = r.error;
    e->st = r.error.empty() ? cache_entry::state::ready : cache_entry::state::failed;
    if (r.error.empty()) {
      std::lock_guard<std::mutex> lock(stats_mutex);
      ++st.packs;
      if (e->ahead)
        ++st.packs_ahead;
      st.packed_bytes += r.size;
    } else {
      say(options.log, "ucx producer: packing failed: " + r.error);
    }
    auto waiters = std::move(e->waiters);
    e->waiters.clear();
    for (auto& j : waiters) {
      if (e->st == cache_entry::state::ready)
        send_group(std::move(j), e);
      else
        fail_get(j, e);
    }
  }
  return static_cast<unsigned>(done.size());
}

// -- packers ------------------------------------------------------------------------

host_buffer producer_impl::made_buffer(std::size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(stats_mutex);
    ++st.buffers_made;
  }
  return new_buffer(bytes);
}

void producer_impl::pack_loop() {
  for (;;) {
    pack_job job;
    {
      std::unique_lock<std::mutex> lock(pack_mutex);
      pack_cv.wait(lock, [&] { return stopping || !pack_queue.empty(); });
      if (stopping)
        return;
      job = std::move(pack_queue.front());
      pack_queue.pop_front();
    }
    pack_result r;
    r.key = job.key;
    try {
      const std::uint32_t g = job.key.group;
      if (job.key.in_place) { // read only: the consumer gathers the bytes itself
        const auto pieces = in_place_pieces(job.key, *job.snapshot, job.plan.get());
        r.size = 0;
        for (const auto& p : pieces)
          r.size += p.bytes;
        r.checksum = checksum_pieces(pieces);
      } else if (job.key.broadcast) {
        const auto& tensors = job.snapshot->group(g);
        const auto layout = plan::full_group_layout::of(tensors);
        r.size = static_cast<std::size_t>(layout.bytes);
        if (job.buffer.capacity() < r.size)
          job.buffer = made_buffer(r.size);
        r.checksum = pack_full_group_checksummed(tensors, layout, job.buffer.data());
      } else {
        r.size = static_cast<std::size_t>(job.plan->bytes(g));
        if (job.buffer.capacity() < r.size)
          job.buffer = made_buffer(r.size);
        r.checksum = pack_group_checksummed(*job.plan, g, *job.snapshot, job.buffer.data());
      }
    } catch (const std::exception& e) {
      r.error = e.what();
      r.size = 0;
    }
    r.buffer = std::move(job.buffer);
    {
      std::lock_guard<std::mutex> lock(pack_mutex);
      pack_done.push_back(std::move(r));
    }
    ucp_worker_signal(worker.handle); // thread-safe: wakes the progress thread
  }
}

// -- faults -------------------------------------------------------------------------

bool producer_impl::take_corruption(const get_job& j) {
  if (!faults.take_corruption(j.engine, j.worker, j.version, j.group))
    return false;
  std::lock_guard<std::mutex> s(stats_mutex);
  ++st.corruptions;
  return true;
}

} // namespace rlsync::transfer::ucx_detail
