#include "runtime/transfer/ucx/producer_impl.hpp"

#include "runtime/base/checksum.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/base/thread_schedule.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/transfer/ucx/shared_memory.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace rlsync::transfer {
namespace ucx_detail {

namespace {

constexpr std::size_t max_plans_per_connection = 256;
// The encoded bytes of the plans a connection holds (decoded, a few times
// that): a worker's plan is a few MB for the largest models.
constexpr std::uint64_t max_plan_bytes_per_connection = std::uint64_t(256) << 20;
// A connection is one engine worker's, which runs one pull at a time; each
// session holds its version alive, so sessions never closed (a close lost,
// or a consumer that never sends one) keep at most this many versions
// beyond the trainer's keep_versions: the least recently used goes first.
constexpr std::size_t max_sessions_per_connection = 4;
// A consumer has at most its groups in flight outstanding (its gets are
// bounded by max_outstanding_per_connection: 64 at most from a topology)
// and reads each answer; one that leaves this many unread asks and does not
// read, and would grow the outbox.
constexpr std::size_t max_unread_replies = 256;

} // namespace

// -- setup --------------------------------------------------------------------------

void producer_impl::start() {
  // The default budget: a few of the largest groups a consumer may ask for
  // (broadcast's, with its alignment, is the largest).
  const std::uint64_t largest = std::max<std::uint64_t>(1, largest_full_group_bytes(*source));
  budget = options.packed_budget_bytes != 0 ? options.packed_budget_bytes
                                            : largest * std::max<std::size_t>(1, options.default_budget_groups);
  {
    std::lock_guard<std::mutex> lock(stats_mutex);
    st.budget_bytes = budget;
  }

  if (options.shared_memory) {
    host = this_host_id();
    try {
      if (!host.empty())
        probe = host_buffer(1, shareable);
    } catch (const std::exception& e) {
      say(options.log, std::string("ucx producer: no shared memory, groups go by tag: ") + e.what());
      host.clear();
    }
  }
  prewarm_buffers(largest);
  ctx = make_context(options.transports, options.net_devices, "producer");
  worker = make_worker(ctx->handle, "producer");
  inbox.install(worker.handle, am_request, options.max_message_bytes);
  // A consumer's burst: its gets (max_outstanding_per_connection, beyond
  // which they are refused anyway), a plan, an open and a goodbye.
  inbox.max_fetches_per_sender = options.max_outstanding_per_connection + 8;
  // Only a connection's messages wait in the inbox; any other is a hello to
  // admit, or refused, in the callback. Called on the progress thread,
  // which owns conns.
  inbox.is_member = [this](ucp_ep_h ep) { return conns.count(ep) > 0; };
  inbox.admit = [this](const am_inbox::first_message& m) { admit(m); };
  refusal_log = std::make_unique<rate_limited_log>([log = options.log](const std::string& line) { say(log, line); });

  // No listener: consumers connect to this worker address, which travels
  // only over the authenticated control plane together with a token.
  address = worker_address(worker.handle, "producer");

  say(options.log, "ucx producer: serving on a UCX worker address of " + std::to_string(address.size())
                       + " bytes, no listening port (UCX_TLS="
                       + (ctx->tls.empty() ? std::string("UCX default") : ctx->tls) + ", UCX_NET_DEVICES="
                       + (options.net_devices.empty() ? std::string("UCX default") : options.net_devices) + ")");
  for (unsigned i = 0; i < std::max(1u, options.pack_threads); ++i)
    packers.emplace_back([this] { pack_loop(); });
  progress = std::thread([this] { run(); });
  waker = std::make_shared<publish_waker>();
  waker->worker = worker.handle;
  wake_on_publish = std::make_shared<const std::function<void()>>([w = waker] {
    std::lock_guard<std::mutex> lock(w->mutex);
    if (w->worker)
      ucp_worker_signal(w->worker); // thread-safe
  });
  source->on_publish(wake_on_publish);
}

void producer_impl::stop() {
  if (waker) {
    std::lock_guard<std::mutex> lock(waker->mutex);
    waker->worker = nullptr;
  }
  stopping = true;
  if (worker.handle)
    ucp_worker_signal(worker.handle);
  if (progress.joinable())
    progress.join(); // its shutdown() released the connections
  {
    std::lock_guard<std::mutex> lock(pack_mutex);
    pack_queue.clear();
  }
  pack_cv.notify_all();
  for (auto& t : packers)
    t.join();
  packers.clear();
  if (leak_worker) {
    // Destroying the worker would make UCX abort the process: leak it,
    // the context and every buffer it may still read, on purpose.
    (void)ctx.release();
    worker.handle = nullptr;
    auto* keep = new std::vector<entry_ptr>();
    for (auto& [k, e] : cache)
      keep->push_back(e);
    for (auto& o : sends) {
      keep->push_back(o.entry);
      if (!o.altered.empty())
        (void)new std::vector<std::uint8_t>(std::move(o.altered));
    }
    (void)new std::vector<std::vector<std::uint8_t>>(std::move(graveyard));
    cache.clear();
    sends.clear();
    return;
  }
  if (worker.handle) {
    // Whatever UCX still holds is released with the worker; the buffers
    // it points into (cache entries, graveyard) outlive it.
    ucp_worker_destroy(worker.handle);
    worker.handle = nullptr;
  }
  cache.clear();
  sends.clear();
  graveyard.clear();
  ctx.reset();
}

// -- the progress thread ------------------------------------------------------------

void producer_impl::run() {
  progress_tid = static_cast<long>(::gettid());
  auto last_sweep = clock::now();
  auto last_drop_said = last_sweep;
  std::uint64_t drops_said = 0;
  while (!stopping) {
    unsigned n = 0;
    for (unsigned k; (k = ucp_worker_progress(worker.handle)) != 0 && n < 1024;)
      n += k;
    n += handle_failures();
    inbox.poll();
    outbox.poll();
    poll_closes();
    n += handle_messages();
    n += check_published();
    n += handle_packed();
    n += poll_sends();
    n += close_not_reading();
    const auto now = clock::now();
    if (now - last_sweep >= std::chrono::milliseconds(5)) {
      sweep(now);
      last_sweep = now;
    }
    if (inbox.dropped != drops_said && now - last_drop_said >= std::chrono::seconds(1)) { // at most once a second
      say(options.log, "ucx producer: dropped " + std::to_string(inbox.dropped - drops_said)
                           + " control messages at its inbox's bounds (" + std::to_string(am_inbox::max_ready)
                           + " waiting, " + std::to_string(inbox.max_pending_bytes) + " bytes being fetched)");
      drops_said = inbox.dropped;
      last_drop_said = now;
    }
    if (n != 0)
      continue;
    // Idle: sleep on the event fd; packers and stop() wake us with ucp_worker_signal.
    if (ucp_worker_arm(worker.handle) == UCS_ERR_BUSY)
      continue;
    pollfd p{worker.efd, POLLIN, 0};
    ::poll(&p, 1, 10);
  }
  shutdown();
}

void producer_impl::shutdown() {
  // Idle endpoints are not closed one by one (a graceful close needs each
  // consumer to progress, and an idle one does not): destroying the worker
  // (stop()) releases them, and consumers see the connection reset (their
  // pulls fail with `cancelled`). Endpoints with sends outstanding must be
  // closed first (see close_ep); if that does not complete, the worker is
  // leaked rather than destroyed.
  outbox.poll();
  for (auto& [ep, c] : conns) {
    const bool busy = outbox.pending_on(ep) || std::any_of(sends.begin(), sends.end(), [&](const send_op& o) {
                        return o.conn == c && o.request && ucp_request_check_status(o.request) == UCS_INPROGRESS;
                      });
    c->closed = true;
    if (busy)
      start_close(ep);
  }
  conns.clear();
  drive(worker, clock::now() + std::chrono::milliseconds(500), [&] {
    poll_closes();
    return closes.empty();
  }, std::chrono::milliseconds(1));
  if (!closes.empty()) {
    say(options.log, "ucx producer: " + std::to_string(closes.size())
                         + " connection(s) did not close; the UCX worker is leaked rather than destroyed");
    leak_worker = true;
  }
  for (auto& s : sends)
    if (s.request)
      ucp_request_free(s.request); // the buffers stay alive until the worker is gone
  inbox.abandon(graveyard);
  outbox.abandon(graveyard);
}

// The close flushes what was sent first. (UCX 1.13 refuses a forced close
// of an endpoint without peer error handling, which ours lack: see the
// puller's create_endpoint.)
void producer_impl::start_close(ucp_ep_h ep) {
  if (closing.count(ep))
    return; // closing already: a second close of one endpoint is undefined
  inbox.forget(ep);
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = 0;
  void* req = ucp_ep_close_nbx(ep, &rp);
  if (UCS_PTR_IS_ERR(req)) {
    say(options.log, std::string("ucx producer: UCX refused to close an endpoint: ")
                         + ucs_status_string(UCS_PTR_STATUS(req)));
  } else if (req != nullptr) {
    closes.emplace_back(req, ep);
    closing.insert(ep);
  }
}

void producer_impl::poll_closes() {
  for (auto it = closes.begin(); it != closes.end();)
    it = finish_close(it) ? closes.erase(it) : std::next(it);
}

// Whether the close of `it` completed; then what is left of it is released.
bool producer_impl::finish_close(std::list<std::pair<void*, ucp_ep_h>>::iterator it) {
  if (ucp_request_check_status(it->first) == UCS_INPROGRESS)
    return false;
  ucp_request_free(it->first);
  inbox.forget(it->second);  // what the progress that completed the close delivered from it
  closing.erase(it->second); // gone: its address may name a new endpoint from now on
  connections_closing.erase(it->second);
  return true;
}

// Whether `ep` names an endpoint whose close is still in progress. A close
// can complete inside the progress call that delivers a new peer's first
// message on an endpoint at the same address: then that is a new endpoint.
bool producer_impl::still_closing(ucp_ep_h ep) {
  if (!closing.count(ep))
    return false;
  for (auto it = closes.begin(); it != closes.end(); ++it)
    if (it->second == ep) {
      if (!finish_close(it))
        return true;
      closes.erase(it);
      return false;
    }
  return true;
}

// Drops everything a connection holds and closes its endpoint. Sends in
// flight complete (with an error) once UCX gives up the endpoint.
void producer_impl::close_connection(const conn_ptr& c, const std::string& why, bool loud) {
  if (c->closed)
    return;
  c->closed = true;
  if (loud)
    say(options.log, "ucx producer: closing the connection from " + c->peer + ": " + why);
  for (auto& [key, e] : cache) {
    const auto before = e->waiters.size();
    e->waiters.erase(std::remove_if(e->waiters.begin(), e->waiters.end(),
                                    [&](const get_job& j) { return j.conn == c; }),
                     e->waiters.end());
    e->refs -= before - e->waiters.size();
    if (e->refs == 0)
      retry_blocked = true;
  }
  blocked.erase(std::remove_if(blocked.begin(), blocked.end(), [&](const get_job& j) { return j.conn == c; }),
                blocked.end());
  c->sessions.clear();
  c->plans.clear();
  c->plan_order.clear();
  conns.erase(c->ep);
  retry_blocked = true; // its pins are gone
  if (c->failed)
    inbox.forget(c->ep); // not closed: see handle_failures
  else
    start_close(c->ep); // completes in the background (poll_closes)
  if (closing.count(c->ep))
    connections_closing.insert(c->ep); // counts against max_connections until it completes
}

void producer_impl::reply(const conn_ptr& c, const wire::message& m) {
  if (c->closed || c->not_reading)
    return;
  if (outbox.in_flight_to(c->ep) >= max_unread_replies) {
    // Closed after this turn, not here: the caller may be walking what the
    // connection holds.
    c->not_reading = true;
    not_reading.push_back(c);
    return;
  }
  if (!outbox.send(c->ep, am_reply, wire::encode(m), false))
    say(options.log, "ucx producer: cannot answer " + c->peer);
}

unsigned producer_impl::close_not_reading() {
  auto closing_now = std::move(not_reading);
  not_reading.clear();
  for (const auto& c : closing_now) {
    if (c->closed)
      continue; // for another reason since
    // Its messages are dropped from now on, its answers are UCX's until it
    // reads them or goes, and it counts against max_connections till then.
    close_connection(c, std::to_string(max_unread_replies) + " answers unread: it asks and does not read");
    std::lock_guard<std::mutex> lock(stats_mutex);
    ++st.unread_closes;
  }
  return static_cast<unsigned>(closing_now.size());
}

void producer_impl::count_rejected() {
  std::lock_guard<std::mutex> lock(stats_mutex);
  ++st.rejected;
}

unsigned producer_impl::handle_messages() {
  unsigned n = 0;
  while (!inbox.ready.empty()) {
    auto in = std::move(inbox.ready.front());
    inbox.ready.pop_front();
    ++n;
    {
      std::lock_guard<std::mutex> lock(stats_mutex);
      ++st.requests;
    }
    auto it = conns.find(in.reply_ep);
    if (it == conns.end()) {
      count_rejected(); // its connection closed since (closes forget what waits; this is a guard)
      continue;
    }
    const conn_ptr c = it->second;
    c->last_active = clock::now();
    if (in.too_big) {
      count_rejected();
      say(options.log, "ucx producer: rejected a message of " + std::to_string(in.too_big) + " bytes from "
                           + c->peer + " (limit " + std::to_string(options.max_message_bytes) + ")");
      reply(c, wire::reject_msg{0, wire::status::bad_request,
                                "message of " + std::to_string(in.too_big) + " bytes exceeds the limit of "
                                    + std::to_string(options.max_message_bytes)});
      continue;
    }
    wire::message m;
    try {
      m = wire::decode(in.bytes.data(), in.bytes.size());
    } catch (const wire::wire_error& e) {
      count_rejected();
      say(options.log, "ucx producer: rejected a malformed message from " + c->peer + ": " + e.what());
      reply(c, wire::reject_msg{wire::peek_seq(in.bytes.data(), in.bytes.size()), wire::status::bad_request,
                                std::string("malformed message: ") + e.what()});
      continue;
    }
    if (!c->refused.empty()) {
      count_rejected();
      reply(c, wire::reject_msg{std::visit([](const auto& x) { return seq_of(x); }, m), wire::status::not_allowed,
                                "producer: " + c->refused});
      continue;
    }
    std::visit([&](auto& x) { handle(c, x); }, m);
  }
  return n;
}

// Fresh memory costs most at its first write: a page fault per page, and
// on a VM with shadow paging a trap per page even after MAP_POPULATE (here
// 2.4 ms per MB against 0.06 once written). So the budget's worth of
// buffers the size of the groups consumers are expected to ask for is made
// and written now, before any version is published, and the first sync
// packs into warm ones.
void producer_impl::prewarm_buffers(std::uint64_t largest) {
  if (!options.prewarm_buffers)
    return;
  // As many buffers of a share and 1/64 more as the budget holds (a
  // worker's share of a group exceeds 1/tp of it by replicated norms; a
  // buffer that is too small is dropped and a fresh one made, every
  // version). No larger: the budget counts the bytes a group packs, not
  // the buffer it lies in, so a buffer's slack is memory the budget does
  // not see.
  // Sizes are whole pages, and buffers are made while their capacities
  // (private ones round to huge pages) stay within the budget; at most
  // max_prewarmed_buffers of them (a descriptor and a mapping each), however
  // large the budget is against the groups.
  constexpr std::uint64_t page = 4096;
  const std::uint64_t split = std::max<std::size_t>(1, options.prewarm_split);
  const std::uint64_t share = (largest + split - 1) / split;
  const std::uint64_t size = (std::min(largest, share + share / 64 + 65536) + page - 1) / page * page;
  const std::uint64_t count = std::min<std::uint64_t>(budget / size, max_prewarmed_buffers);
  std::uint64_t held = 0;
  for (std::uint64_t made = 0; made < count; ++made) {
    // Its capacity (whole huge pages for a private one or a shared one in
    // huge pages) must fit; a buffer made otherwise than asked (a fallback)
    // is checked again.
    if (held + host_buffer::capacity_for(size, !host.empty(), pages_for(size)) > budget)
      break;
    host_buffer b = new_buffer(static_cast<std::size_t>(size));
    const std::uint64_t bytes = b.capacity();
    if (held + bytes > budget)
      break;
    held += bytes;
    std::memset(b.data(), 0, b.capacity());
    spare.push_back({std::move(b), bytes});
    std::lock_guard<std::mutex> lock(stats_mutex);
    ++st.buffers_prewarmed;
  }
  std::lock_guard<std::mutex> lock(stats_mutex);
  st.peak_packed_bytes = std::max(st.peak_packed_bytes, held_bytes());
}

wire::shared_region producer_impl::region_of(const host_buffer& b) const {
  return {static_cast<std::uint32_t>(::getpid()), b.fd(), b.mapped_bytes(), b.id()};
}

shared_pages producer_impl::pages_for(std::size_t bytes) const {
  // From 2 MiB on, as private buffers: a smaller one would hold a whole
  // huge page, slack the budget does not see.
  return options.huge_pages && !huge_pool_empty.load() && bytes >= huge_page_bytes ? shared_pages::huge
                                                                                  : shared_pages::normal;
}

host_buffer producer_impl::new_buffer(std::size_t bytes) {
  if (!host.empty()) {
    if (pages_for(bytes) == shared_pages::huge) {
      try {
        host_buffer b(bytes, shareable, shared_pages::huge);
        std::lock_guard<std::mutex> lock(stats_mutex);
        ++st.huge_buffers;
        return b;
      } catch (const std::exception& e) {
        // No pool, or too few free in it: 4 KiB pages from now on (asking
        // again each time would cost a failed allocation per buffer).
        if (!huge_pool_empty.exchange(true))
          say(options.log, std::string("ucx producer: packed buffers in 4 KiB pages (no free huge pages: ")
                               + e.what() + "); reserve some with sysctl vm.nr_hugepages");
      }
    }
    try {
      return host_buffer(bytes, shareable);
    } catch (const std::exception& e) {
      // Out of memfds (descriptors) or mappings: this group goes by tag.
      if (!unshared_logged.exchange(true))
        say(options.log, std::string("ucx producer: a packed buffer of ") + std::to_string(bytes)
                             + " bytes could not be shared, such groups go by tag: " + e.what());
    }
  }
  return host_buffer(bytes);
}

// The consumer copied a group lent in shared memory: it is free again.
void producer_impl::handle(const conn_ptr& c, const wire::done_msg& m) {
  for (auto it = sends.begin(); it != sends.end(); ++it)
    if (it->lent && it->conn == c && it->seq == m.seq && it->group == m.group) {
      if (!it->abandoned)
        count_sent(it->bytes);
      release(it->entry);
      end_send(it);
      return;
    }
  // A done after the deadline closed its lending: nothing to do.
}

// -- requests -----------------------------------------------------------------------

namespace {

// A version in shareable memory needs no packing for a consumer that can map
// it (`shared`): it gathers its bytes from the version's tensors (the drill's
// corrupted group still goes by tag). Not a plan with runs too short to copy
// one by one (a transposed slice): packed once, it is cheaper.
bool lends_in_place(bool shared, bool shareable, bool broadcast, const plan::grouped_plan* plan) {
  return shared && shareable && (broadcast || (plan && lends_in_runs(*plan)));
}

} // namespace

void producer_impl::handle(const conn_ptr& c, const wire::plan_msg& m) {
  auto refuse = [&](wire::status s, const std::string& why) {
    count_rejected();
    say(options.log, "ucx producer: rejected a plan from " + c->peer + ": " + why);
    reply(c, wire::ack_msg{m.seq, s, 0, why, {}, {}});
  };
  const std::uint64_t digest = wire::plan_digest(m.plan.data(), m.plan.size());
  if (c->plans.count(digest)) {
    reply(c, wire::ack_msg{m.seq, wire::status::ok, digest, "", {}, {}});
    return;
  }
  std::shared_ptr<const plan::grouped_plan> grouped;
  try {
    // Made for each plan, as the trainer's nccl path does: a checkpoint
    // directory learns its dtype at its first step, after start().
    grouped = plan_intake(*source).accept(m.plan.data(), m.plan.size());
  } catch (const plan_intake::refusal& e) {
    refuse(e.malformed ? wire::status::bad_request : wire::status::producer_failed, e.what());
    return;
  }
  const auto& held = source->held_groups();
  for (std::uint32_t g = 0; g < grouped->group_count(); ++g)
    if (grouped->bytes(g) > budget && std::binary_search(held.begin(), held.end(), g)) {
      refuse(wire::status::producer_failed,
             "the plan packs " + std::to_string(grouped->bytes(g)) + " bytes for group " + std::to_string(g)
                 + ", more than the producer's packed budget of " + std::to_string(budget)
                 + " bytes (transfer.packed_budget_bytes)");
      return;
    }
  // The oldest plans go first, and with them what was opened or expected
  // with them (nothing is packed ahead for a plan no longer held).
  while (!c->plan_order.empty()
         && (c->plans.size() >= max_plans_per_connection
             || c->plan_bytes + m.plan.size() > max_plan_bytes_per_connection)) {
    const auto oldest = c->plan_order.front().digest;
    c->plan_bytes -= c->plan_order.front().encoded_bytes;
    c->plan_order.pop_front();
    c->plans.erase(oldest);
    c->opened.erase({false, oldest, false});
    c->opened.erase({false, oldest, true});
  }
  const plan::grouped_plan& accepted = *grouped;
  c->plans[digest] = std::move(grouped);
  c->plan_order.push_back({digest, m.plan.size()});
  c->plan_bytes += m.plan.size();
  reply(c, wire::ack_msg{m.seq, wire::status::ok, digest, "", {}, {}});
  if (options.expected_mode == transfer_mode::sharded)
    expect(*c, false, digest, &accepted);
}

// A stream the consumer will open (options.expected_mode), counted as
// opened at no version yet, lent in place as its open will most likely
// be (its hello named this host): the opposite guess is dropped at open.
// Then the newest version is packed ahead for it.
void producer_impl::expect(connection& c, bool broadcast, std::uint64_t digest, const plan::grouped_plan* plan) {
  if (c.opened.count({broadcast, digest, false}) || c.opened.count({broadcast, digest, true}))
    return;
  const bool shareable = !newest || newest->shared_buffer() != nullptr; // none yet: most likely so
  c.opened[{broadcast, digest, lends_in_place(c.same_host, shareable, broadcast, plan)}] = 0;
  pack_ahead();
}

void producer_impl::handle(const conn_ptr& c, const wire::open_msg& m) {
  // A version published since the last loop turn becomes the newest before
  // the open's carried gets pack any of it: packing ahead then knows what
  // they packed, and packs nothing twice.
  check_published();
  wire::manifest_msg out;
  out.seq = m.seq;
  auto refuse = [&](wire::status s, const std::string& why) {
    out.status = s;
    out.error = why;
    reply(c, out);
  };
  if (m.engine != c->engine || m.worker != c->worker) {
    count_rejected();
    out.status = wire::status::unauthorized;
    out.error = "this connection's token is for " + c->peer + ", not engine '" + printable(m.engine) + "' worker "
                + std::to_string(m.worker);
    reply(c, out);
    return;
  }
  const bool broadcast = m.mode == transfer_mode::broadcast;
  std::shared_ptr<const plan::grouped_plan> plan;
  if (!broadcast) {
    auto it = c->plans.find(m.plan);
    if (it == c->plans.end()) {
      refuse(wire::status::not_registered, "plan " + checksum_hex(m.plan) + " is not registered on this connection");
      return;
    }
    plan = it->second;
    if (plan->tp() != m.tp || plan->worker() != m.worker) {
      count_rejected();
      refuse(wire::status::bad_request, "plan " + checksum_hex(m.plan) + " is worker " + std::to_string(plan->worker())
                                            + " of tp " + std::to_string(plan->tp()) + ", the request names worker "
                                            + std::to_string(m.worker) + " of tp " + std::to_string(m.tp));
      return;
    }
  }
  auto snapshot = source->find(m.version);
  if (!snapshot) {
    std::string held;
    for (auto v : source->versions())
      held += (held.empty() ? "" : ", ") + std::to_string(v);
    refuse(wire::status::version_unavailable, "version " + std::to_string(m.version) + " is not held (held: "
                                                  + (held.empty() ? "none" : held) + ")");
    return;
  }
  session s;
  s.id = c->next_session++;
  s.engine = m.engine;
  s.worker = m.worker;
  s.tp = m.tp;
  s.version = m.version;
  s.mode = m.mode;
  s.digest = broadcast ? 0 : m.plan;
  s.shared = m.shared && c->same_host;
  out.shared = s.shared;
  s.in_place = lends_in_place(s.shared, snapshot->shared_buffer() != nullptr, broadcast, plan.get());
  out.in_place = s.in_place;
  if (s.shared)
    out.live_buffers = live_buffers();
  s.snapshot = snapshot;
  s.plan = plan;
  s.last_used = clock::now();
  s.pin_until = s.last_used + options.first_get_grace;
  for (auto g : snapshot->groups()) {
    wire::group_info gi;
    gi.group = g;
    if (s.in_place) {
      for (const auto& t : snapshot->group(g)) {
        gi.tensors.push_back(t);
        gi.offsets.push_back(t.offset);
        if (broadcast)
          gi.bytes += t.size;
      }
      if (!broadcast)
        gi.bytes = plan->bytes(g);
    } else if (broadcast) {
      const auto layout = plan::full_group_layout::of(snapshot->group(g));
      if (layout.bytes > budget) {
        refuse(wire::status::producer_failed,
               "group " + std::to_string(g) + " is " + std::to_string(layout.bytes)
                   + " bytes in broadcast, more than the producer's packed budget of " + std::to_string(budget)
                   + " bytes (transfer.packed_budget_bytes)");
        return;
      }
      gi.bytes = layout.bytes;
      gi.tensors = layout.specs;
    } else {
      gi.bytes = plan->bytes(g);
    }
    out.groups.push_back(std::move(gi));
    s.groups.insert(g);
  }
  if (c->sessions.size() >= max_sessions_per_connection) {
    auto oldest = std::min_element(c->sessions.begin(), c->sessions.end(), [](const auto& a, const auto& b) {
      return a.second.last_used < b.second.last_used;
    });
    c->sessions.erase(oldest);
  }
  out.session = s.id;
  // One stream per plan: a consumer whose version was packed (in private
  // memory) and is now lent in place no longer needs packing ahead.
  c->opened.erase({broadcast, s.digest, !s.in_place});
  auto& opened = c->opened[{broadcast, s.digest, s.in_place}];
  opened = std::max(opened, s.version);
  first_open.emplace(s.version, s.last_used);
  c->sessions[s.id] = std::move(s);
  reply(c, out);
  // The first gets ride on the open: the consumer reserved their sequence
  // numbers and tags, so its first group needs no further round trip.
  const std::size_t first = std::min<std::size_t>(m.prefetch, out.groups.size());
  {
    std::lock_guard<std::mutex> lock(stats_mutex);
    st.gets_carried += first;
  }
  for (std::size_t i = 0; i < first; ++i) {
    auto opened_session = c->sessions.find(out.session);
    if (c->closed || opened_session == c->sessions.end())
      break;
    serve(c, opened_session->second,
          wire::get_msg{m.seq + 1 + i, out.session, out.groups[i].group, m.tag_base + i, m.timeout_ms});
  }
}

void producer_impl::handle(const conn_ptr& c, const wire::get_msg& m) {
  auto sit = c->sessions.find(m.session);
  if (sit == c->sessions.end()) {
    count_rejected();
    reply(c, wire::group_msg{m.seq, wire::status::not_registered,
                             "session " + std::to_string(m.session) + " is not open on this connection", m.group, 0, 0, {}});
    return;
  }
  serve(c, sit->second, m);
}

void producer_impl::serve(const conn_ptr& c, session& s, const wire::get_msg& m) {
  auto refuse = [&](wire::status st, const std::string& why) {
    count_rejected();
    reply(c, wire::group_msg{m.seq, st, why, m.group, 0, 0, {}});
  };
  s.last_used = clock::now();
  if (!s.groups.count(m.group)) {
    refuse(wire::status::bad_request, "group " + std::to_string(m.group) + " is not part of version "
                                          + std::to_string(s.version) + " here");
    return;
  }
  if (c->outstanding >= options.max_outstanding_per_connection) {
    refuse(wire::status::busy, "more than " + std::to_string(options.max_outstanding_per_connection)
                                   + " requests outstanding on this connection");
    return;
  }
  // A get is finished once its group is sent or lent; the consumer asks for
  // the next only after it took one, but its take and this side's send
  // completion race, hence twice the gets. More is a consumer that neither
  // receives nor gives back what it asked for.
  if (c->sending >= 2 * options.max_outstanding_per_connection) {
    refuse(wire::status::busy, std::to_string(c->sending) + " groups sent or lent on this connection and not yet"
                                                             " taken or given back");
    return;
  }
  if (faults.is_withheld(s.version, m.group)) {
    std::lock_guard<std::mutex> lock(stats_mutex);
    ++st.withheld;
    return; // the drill: never answered
  }
  get_job j;
  j.conn = c;
  j.seq = m.seq;
  j.group = m.group;
  j.tag = m.tag;
  j.deadline = clock::now() + std::min<std::chrono::milliseconds>(std::chrono::milliseconds(m.timeout_ms),
                                                                  options.max_send_time);
  j.engine = s.engine;
  j.worker = s.worker;
  j.version = s.version;
  j.key = cache_key{s.mode == transfer_mode::broadcast, s.digest, s.version, m.group, s.in_place};
  j.snapshot = s.snapshot;
  j.plan = s.plan;
  j.shared = s.shared;
  j.bytes = s.in_place ? 0 : packed_size(j.key, *s.snapshot, s.plan.get()); // in place: none of the budget
  s.pin_until = s.got_any ? std::max(s.pin_until, j.deadline) : j.deadline;
  s.got_any = true;
  ++c->outstanding;
  start_get(std::move(j));
}

void producer_impl::unexpected(const conn_ptr& c, std::uint64_t seq) {
  count_rejected();
  reply(c, wire::reject_msg{seq, wire::status::bad_request, "a reply is not a request"});
}

} // namespace ucx_detail

using namespace ucx_detail;

ucx_producer::ucx_producer(std::shared_ptr<const weight_source> source, ucx_producer_options options)
    : impl_(std::make_unique<ucx_detail::producer_impl>()) {
  if (!source)
    throw std::invalid_argument("ucx producer: no weight source");
  impl_->source = std::move(source);
  impl_->options = std::move(options);
  auto& o = impl_->options;
  o.max_outstanding_per_connection = std::max<std::size_t>(1, o.max_outstanding_per_connection);
  o.max_tokens = std::max<std::size_t>(1, o.max_tokens);
  o.max_connections = std::max<std::size_t>(1, o.max_connections);
  try {
    impl_->start();
  } catch (...) {
    impl_->stop();
    throw;
  }
}

ucx_producer::~ucx_producer() {
  impl_->stop();
}

const std::vector<std::uint8_t>& ucx_producer::worker_address() const {
  return impl_->address;
}

ucx_credentials ucx_producer::issue(const std::string& engine, int worker) {
  return impl_->issue(engine, worker);
}

const weight_source& ucx_producer::source() const {
  return *impl_->source;
}

ucx_producer_stats ucx_producer::stats() const {
  thread_schedule progress;
  if (const long tid = impl_->progress_tid; tid != 0)
    progress = thread_schedule::of_task(tid);
  std::lock_guard<std::mutex> lock(impl_->stats_mutex);
  auto out = impl_->st;
  out.progress_ran = progress.ran;
  out.progress_queued = progress.queued;
  return out;
}

void ucx_producer::corrupt(corruption c) { impl_->faults.corrupt(std::move(c)); }

void ucx_producer::withhold(std::uint32_t group, std::uint64_t version, fault_hooks::clock::time_point until) {
  impl_->faults.withhold(group, version, until);
}

void ucx_producer::clear_faults() { impl_->faults.clear(); }

} // namespace rlsync::transfer
