#include "runtime/transfer/ucx/producer_impl.hpp"

#include "runtime/base/checksum.hpp"
#include "runtime/transfer/packing.hpp"

#include <algorithm>

namespace rlsync::transfer::ucx_detail {

// -- the packed-group cache ---------------------------------------------------------

// Serves a get from the cache: sends a packed group, waits for one being
// packed, or starts packing it in a free (or freed) slot; with every slot
// busy sending, the get waits in `blocked` until one frees or its deadline.
void producer_impl::start_get(get_job j) {
  auto it = cache.find(j.key);
  if (it == cache.end()) {
    if (cache.size() >= options.max_packed_groups && !evict_one()) {
      blocked.push_back(std::move(j));
      return;
    }
    auto e = std::make_shared<cache_entry>();
    e->key = j.key;
    it = cache.emplace(j.key, e).first;
    {
      std::lock_guard<std::mutex> lock(stats_mutex);
      st.peak_packed = std::max(st.peak_packed, cache.size());
    }
    pack_job pj;
    pj.key = j.key;
    pj.snapshot = j.snapshot;
    pj.plan = j.key.broadcast ? nullptr : j.plan;
    pj.buffer = take_spare();
    {
      std::lock_guard<std::mutex> lock(pack_mutex);
      pack_queue.push_back(std::move(pj));
    }
    pack_cv.notify_one();
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

host_buffer producer_impl::take_spare() {
  if (spare.empty())
    return {};
  auto best = std::max_element(spare.begin(), spare.end(), [](const host_buffer& a, const host_buffer& b) {
    return a.capacity() < b.capacity();
  });
  host_buffer b = std::move(*best);
  spare.erase(best);
  return b;
}

// Frees the least recently used entry nobody waits for or sends from.
bool producer_impl::evict_one() {
  auto victim = cache.end();
  for (auto it = cache.begin(); it != cache.end(); ++it)
    if (it->second->refs == 0 && it->second->st != cache_entry::state::packing
        && (victim == cache.end() || it->second->last_use < victim->second->last_use))
      victim = it;
  if (victim == cache.end())
    return false;
  if (victim->second->buffer.capacity() > 0 && spare.size() + cache.size() <= options.max_packed_groups)
    spare.push_back(std::move(victim->second->buffer));
  cache.erase(victim);
  return true;
}

void producer_impl::release(const entry_ptr& e) {
  if (--e->refs == 0)
    retry_blocked = true;
}

void producer_impl::finish_get(const get_job& j) {
  if (j.conn->outstanding > 0)
    --j.conn->outstanding;
}

void producer_impl::fail_get(const get_job& j, const entry_ptr& e) {
  reply(j.conn, wire::group_msg{j.seq, wire::status::producer_failed,
                                "the producer failed to pack group " + std::to_string(j.group) + " of version "
                                    + std::to_string(j.version) + ": " + e->error,
                                j.group, 0, 0});
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
  const std::uint8_t* data = e->buffer.data();
  if (take_corruption(j) && e->size > 0) {
    // The drill: this consumer receives altered bytes under the true checksum.
    op.altered.assign(data, data + e->size);
    op.altered[op.altered.size() / 2] ^= 0x5a;
    data = op.altered.data();
  }
  ucp_request_param_t rp{};
  rp.op_attr_mask = 0;
  void* req = ucp_tag_send_nbx(j.conn->ep, data, e->size, j.tag, &rp);
  if (UCS_PTR_IS_ERR(req)) {
    reply(j.conn, wire::group_msg{j.seq, wire::status::producer_failed,
                                  std::string("cannot send: ") + ucs_status_string(UCS_PTR_STATUS(req)), j.group,
                                  0, 0});
    finish_get(j);
    release(e);
    return;
  }
  reply(j.conn, wire::group_msg{j.seq, wire::status::ok, "", j.group, e->size, e->checksum});
  finish_get(j);
  if (req == nullptr) {
    count_sent(op.bytes);
    release(e);
    return;
  }
  op.request = req;
  sends.push_back(std::move(op));
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
    const ucs_status_t s = ucp_request_check_status(it->request);
    if (s == UCS_INPROGRESS) {
      if (!it->abandoned && now >= it->deadline) {
        // The consumer has given up on this group (its deadline passed):
        // it is gone or partitioned. Close the connection; the entry
        // leaves the cache (its slot serves others) but its buffer stays
        // alive with this send until UCX lets go of it.
        it->abandoned = true;
        for (auto c = cache.begin(); c != cache.end(); ++c)
          if (c->second == it->entry) {
            cache.erase(c);
            break;
          }
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
    it = sends.erase(it);
    ++n;
  }
  if (retry_blocked) {
    retry_blocked = false;
    n += start_blocked();
  }
  return n;
}

unsigned producer_impl::start_blocked() {
  unsigned n = 0;
  while (!blocked.empty() && (cache.count(blocked.front().key) || cache.size() < options.max_packed_groups
                              || evict_one())) {
    auto j = std::move(blocked.front());
    blocked.pop_front();
    start_get(std::move(j));
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
                                  "no packing slot freed before the deadline ("
                                      + std::to_string(options.max_packed_groups)
                                      + " packed groups alive, all being sent)",
                                  j.group, 0, 0});
    finish_get(j);
  }
  std::vector<conn_ptr> idle;
  for (auto& [ep, c] : conns)
    if (c->outstanding == 0 && now - c->last_active > options.idle_timeout)
      idle.push_back(c);
  for (auto& c : idle)
    close_connection(c, "idle for longer than " + std::to_string(options.idle_timeout.count()) + " ms");
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
    e->size = r.size;
    e->checksum = r.checksum;
    e->error = r.error;
    e->st = r.error.empty() ? cache_entry::state::ready : cache_entry::state::failed;
    if (r.error.empty()) {
      std::lock_guard<std::mutex> lock(stats_mutex);
      ++st.packs;
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
      if (job.key.broadcast) {
        const auto& tensors = job.snapshot->group(g);
        const auto layout = plan::full_group_layout::of(tensors);
        r.size = static_cast<std::size_t>(layout.bytes);
        if (job.buffer.capacity() < r.size)
          job.buffer = host_buffer(r.size);
        pack_full_group(tensors, layout, job.buffer.data());
      } else {
        r.size = static_cast<std::size_t>(job.plan->bytes(g));
        if (job.buffer.capacity() < r.size)
          job.buffer = host_buffer(r.size);
        pack_group(*job.plan, g, *job.snapshot, job.buffer.data());
      }
      r.checksum = checksum64(job.buffer.data(), r.size);
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
