#include "runtime/transfer/ucx/puller_impl.hpp"

#include "runtime/base/checksum.hpp"

#include <algorithm>
#include <system_error>
#include <thread>

namespace rlsync::transfer::ucx_detail {

puller_impl::~puller_impl() {
  std::vector<connecting> threads;
  stopping = true; // connections ahead give up at their next attempt or page
  {
    std::lock_guard<std::mutex> lock(mutex);
    threads.swap(ahead);
  }
  for (auto& t : threads) // each ends by its connect_ahead_timeout, or sooner seeing `stopping`
    t.thread.join();
  auto channels = std::move(idle);
  for (auto& ch : channels)
    destroy(std::move(ch));
  const auto until = clock::now() + std::chrono::milliseconds(500);
  for (;;) {
    reap_parked();
    std::lock_guard<std::mutex> lock(mutex);
    if (parked.empty() || clock::now() >= until)
      break;
  }
  if (!parked.empty()) {
    // Destroying these workers (or the context under them) would make
    // UCX abort the process: leak them instead.
    say(options.log, "ucx puller: " + std::to_string(parked.size())
                         + " connection(s) never closed; their UCX resources are leaked");
    for (auto& ch : parked)
      (void)ch.release();
    (void)ctx.release();
  }
  spare.clear();
  for (auto& w : ready)
    ucp_worker_destroy(w.handle); // no endpoint was ever made on them
  ready.clear();
  ctx.reset();
}

// -- connections --------------------------------------------------------------------

void puller_impl::make_ready_worker() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (ready.size() >= workers.size())
      return;
  }
  worker_handle w;
  try {
    w = make_worker(ctx->handle, "puller");
  } catch (const ucx_error& e) {
    say(options.log, std::string("ucx puller: no worker made ahead (the first connection makes its own): ") + e.what());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (ready.size() < workers.size()) {
      ready.push_back(w);
      ++st.workers_made_ahead;
      return;
    }
  }
  ucp_worker_destroy(w.handle); // registrations raced past the bound
}

void puller_impl::trim_ready_workers() {
  std::vector<worker_handle> extra;
  {
    std::lock_guard<std::mutex> lock(mutex);
    while (ready.size() > workers.size()) {
      extra.push_back(ready.back());
      ready.pop_back();
    }
  }
  for (auto& w : extra)
    ucp_worker_destroy(w.handle);
}

// A connection is bound to the engine worker its token was issued for: only
// that worker's pulls reuse it.
std::unique_ptr<channel> puller_impl::acquire(const pull_request& req) {
  reap_parked(); // closes that completed since: their workers go now, not at the next destroy
  {
    // A connection being made ahead for this worker is this pull's: wait
    // for it (until the pull's deadline) rather than make a second one.
    std::unique_lock<std::mutex> lock(mutex);
    ahead_done.wait_until(lock, req.deadline,
                          [&] { return !connecting_ahead.count({req.engine, req.worker}); });
  }
  for (;;) {
    std::unique_ptr<channel> ch;
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = std::find_if(idle.begin(), idle.end(), [&](const std::unique_ptr<channel>& c) {
        return c->engine == req.engine && c->engine_worker == req.worker;
      });
      if (it == idle.end())
        break;
      ch = std::move(*it);
      idle.erase(it);
    }
    // Notice a producer that went away while the connection was idle.
    for (int i = 0; i < 8; ++i)
      ucp_worker_progress(ch->worker.handle);
    ch->pump();
    bool current = false;
    {
      std::lock_guard<std::mutex> lock(mutex);
      current = ch->address == producer;
    }
    const bool fresh = clock::now() - ch->idle_since < options.max_idle;
    if (!ch->failed && current && fresh) {
      ch->clear_replies();
      return ch;
    }
    destroy(std::move(ch));
  }
  return connect(req);
}

void puller_impl::release(std::unique_ptr<channel> ch) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    // Kept only for an engine worker still registered: one unregistered
    // during this pull would never take it again.
    if (ch->address == producer && !ch->failed && workers.count({ch->engine, ch->engine_worker})) {
      ch->idle_since = clock::now();
      idle.push_back(std::move(ch));
      return;
    }
  }
  destroy(std::move(ch)); // the producer changed meanwhile, or the engine went
}

// `grace` bounds each wait (the goodbye, the close); a close that takes
// longer parks the connection.
void puller_impl::destroy(std::unique_ptr<channel> ch, std::chrono::milliseconds grace) {
  if (!ch)
    return;
  reap_parked();
  if (ch->worker.handle) {
    if (ch->ep && ch->connected && !ch->failed) {
      // Say goodbye and let the producer close first (see its bye
      // handler): a close from this side would show there as a failed
      // endpoint. Its answer says it has.
      const std::uint64_t bye = ++ch->seq;
      if (ch->outbox.send(ch->ep, am_request, wire::encode(wire::bye_msg{bye}), true)) {
        drive(ch->worker, clock::now() + std::min(grace, std::chrono::milliseconds(200)), [&] {
          ch->pump();
          return ch->failed || ch->replies.count(bye);
        }, std::chrono::milliseconds(1));
        if (ch->replies.count(bye)) {
          std::lock_guard<std::mutex> lock(mutex);
          ++st.goodbyes_answered;
        }
      }
    }
    ch->outbox.poll();
    // See close_ep: close first if sends are outstanding, or if the
    // producer did not close its side.
    if (ch->ep && (!ch->outbox.inflight.empty() || (ch->connected && !ch->failed)))
      ch->closing = close_ep(ch->worker, ch->ep, grace);
    ch->ep = nullptr;
    if (ch->closing) {
      // Not safe to destroy yet (a partitioned producer): parked, retried later.
      say(options.log, "ucx puller: the connection to producer " + ch->peer
                           + " does not close; keeping its worker until it does");
      std::lock_guard<std::mutex> lock(mutex);
      parked.push_back(std::move(ch));
      st.peak_parked = std::max(st.peak_parked, parked.size());
      return;
    }
    destroy_worker(*ch);
  }
  recycle_buffers(*ch);
}

void puller_impl::destroy_worker(channel& ch) {
  // Bytes of sends UCX may read, and of fetches it may write, until the worker goes.
  std::vector<std::vector<std::uint8_t>> keep;
  ch.inbox.abandon(keep);
  ch.outbox.abandon(keep);
  ucp_worker_destroy(ch.worker.handle); // after this UCX touches none of our buffers
  ch.worker.handle = nullptr;
}

void puller_impl::recycle_buffers(channel& ch) {
  std::lock_guard<std::mutex> lock(mutex);
  for (auto& b : ch.slots)
    if (b.capacity() > 0 && spare.size() < 4 * std::max<std::size_t>(1, options.groups_in_flight))
      spare.push_back(std::move(b));
}

// Why no connection may be made now, or "": every connection that does not
// close keeps a worker, so their number is bounded here, where new ones
// are made. Reaps first: a close may have completed since.
std::string puller_impl::parked_bound_reached(const std::vector<std::uint8_t>& producer_address) {
  reap_parked();
  std::lock_guard<std::mutex> lock(mutex);
  // Per producer, so that a hung producer's connections do not keep an
  // engine from the one that replaced it; and a few times that in all.
  const std::size_t bound = std::max<std::size_t>(1, options.max_parked_connections);
  const auto to_this = static_cast<std::size_t>(std::count_if(
      parked.begin(), parked.end(), [&](const std::unique_ptr<channel>& ch) { return ch->address == producer_address; }));
  std::string why;
  if (to_this >= bound)
    why = std::to_string(to_this) + " earlier connections to this producer are still closing";
  else if (parked.size() >= parked_bound_factor * bound)
    why = std::to_string(parked.size()) + " earlier connections to producers are still closing";
  else
    return "";
  ++st.attempts_held_back;
  return why + " (it stopped answering; max_parked_connections " + std::to_string(bound)
         + " per producer): no new connection is made until one of them closes";
}

// Destroys parked workers whose close has completed.
void puller_impl::reap_parked() {
  std::vector<std::unique_ptr<channel>> done;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto it = parked.begin(); it != parked.end();) {
      for (int i = 0; i < 8; ++i)
        ucp_worker_progress((*it)->worker.handle);
      if (ucp_request_check_status((*it)->closing) == UCS_INPROGRESS) {
        ++it;
        continue;
      }
      ucp_request_free((*it)->closing);
      (*it)->closing = nullptr;
      done.push_back(std::move(*it));
      it = parked.erase(it);
    }
  }
  for (auto& ch : done) {
    destroy_worker(*ch);
    recycle_buffers(*ch);
  }
}

namespace {

std::string producer_name(const std::vector<std::uint8_t>& address) {
  return "ucx-" + checksum_hex(checksum64(address.data(), address.size())).substr(0, 8);
}

} // namespace

std::unique_ptr<channel> puller_impl::new_channel(const ucx_credentials& creds, const pull_request& req) {
  auto ch = std::make_unique<channel>();
  ch->address = creds.producer;
  ch->peer = producer_name(creds.producer);
  ch->engine = req.engine;
  ch->engine_worker = req.worker;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!ready.empty()) {
      ch->worker = ready.back();
      ready.pop_back();
      ++st.workers_taken_ahead;
    }
  }
  if (!ch->worker.handle)
    ch->worker = make_worker(ctx->handle, "puller");
  try {
    ch->inbox.install(ch->worker.handle, am_reply, max_reply_bytes);
  } catch (...) {
    ucp_worker_destroy(ch->worker.handle); // no endpoint was made on it
    throw;
  }
  return ch;
}

// Credentials for the request's engine worker, from the control plane. A
// producer address other than the last one (a restarted head) retires the
// idle connections to the old one.
ucx_credentials puller_impl::credentials(const pull_request& req) {
  if (!options.credentials)
    throw transfer_error(transfer_failure::producer_failed,
                         "ucx transfer: " + who(req) + ": no way to get credentials for the producer");
  ucx_credentials creds;
  try {
    creds = options.credentials(req.engine, req.worker, req.deadline);
  } catch (const std::exception& e) {
    throw transfer_error(transfer_failure::producer_failed,
                         "ucx transfer: " + who(req) + ": no credentials for the producer: " + e.what());
  }
  if (creds.producer.empty() || creds.token.size() != ucx_token_bytes)
    throw transfer_error(transfer_failure::producer_failed,
                         "ucx transfer: " + who(req) + ": the credentials name no producer address or a token of "
                             + std::to_string(creds.token.size()) + " bytes");
  std::vector<std::unique_ptr<channel>> old;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (producer != creds.producer) {
      producer = creds.producer;
      for (auto it = idle.begin(); it != idle.end();)
        if ((*it)->address != producer) {
          old.push_back(std::move(*it));
          it = idle.erase(it);
        } else {
          ++it;
        }
    }
  }
  // Inline in a pull, before its own connection: a short grace each (the
  // old producer is likely gone), and a close that needs longer is parked,
  // reaped at a later acquire.
  for (auto& ch : old)
    destroy(std::move(ch), std::chrono::milliseconds(20));
  return creds;
}

void puller_impl::start_connect_ahead(const std::string& engine, int worker) {
  const std::pair<std::string, int> key{engine, worker};
  std::lock_guard<std::mutex> lock(mutex);
  if (stopping || connecting_ahead.count(key) || !workers.count(key))
    return; // under way, or unregistered meanwhile
  for (auto it = ahead.begin(); it != ahead.end();)
    if (it->done->load()) {
      it->thread.join(); // returns at once: it has finished
      it = ahead.erase(it);
    } else {
      ++it;
    }
  ahead.reserve(ahead.size() + 1); // so that keeping the thread below cannot throw
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread t;
  try {
    t = std::thread([this, key, done] {
      pull_request req;
      req.engine = key.first;
      req.worker = key.second;
      req.deadline = clock::now() + options.connect_ahead_timeout;
      std::unique_ptr<channel> ch;
      bool failed = false; // a connection that failed its plan is dropped below
      try {
        ch = connect(req, true);
        // Its plan too: a producer expecting sharded sessions packs (or
        // checksums) its newest version ahead for it.
        registration reg;
        {
          std::lock_guard<std::mutex> l(mutex);
          if (auto it = workers.find(key); it != workers.end())
            reg = it->second;
        }
        // With less than an attempt's time left (the hello's fault-in took
        // it), the first pull registers the plan instead.
        if (reg.plan && clock::now() + options.connect_attempt_timeout <= req.deadline)
          register_plan(*ch, req, reg);
      } catch (const std::exception& e) {
        failed = true;
        say(options.log, "ucx puller: " + who(req) + " not connected ahead (its first pull connects): " + e.what());
      } catch (...) {
        failed = true;
        say(options.log, "ucx puller: " + who(req) + " not connected ahead (its first pull connects)");
      }
      bool keep = false;
      {
        std::lock_guard<std::mutex> l(mutex);
        keep = ch && !failed && !stopping && workers.count(key); // the engine may have gone meanwhile
      }
      if (keep) {
        release(std::move(ch)); // idle: the worker's first pull takes it
      } else if (ch) {
        destroy(std::move(ch));
      }
      {
        std::lock_guard<std::mutex> l(mutex);
        if (keep)
          ++st.connected_ahead;
        connecting_ahead.erase(key);
      }
      ahead_done.notify_all();
      *done = true;
    });
  } catch (const std::system_error& e) { // no thread to spare: the first pull connects
    say(options.log, "ucx puller: engine '" + engine + "' worker " + std::to_string(worker)
                         + " not connected ahead: " + e.what());
    return;
  }
  connecting_ahead.insert(key);
  ahead.push_back({std::move(t), std::move(done)});
}

// Reading one byte a page maps each page into this process now: the
// first touch of a fresh mapping is what costs (a trap per page on a VM),
// not the copy that follows. A page of the memfd's size: one read a huge
// page where it has them.
void puller_impl::map_ahead(channel& ch, const std::vector<wire::shared_region>& regions,
                            clock::time_point deadline) {
  std::size_t mapped = 0;
  for (const auto& r : regions) {
    if (stopping || clock::now() >= deadline)
      break; // what is left the pull maps as it needs it
    if (r.id == 0 || r.pid != ch.shared_pid || ch.maps.count(r.id) || ch.maps.size() >= max_mappings)
      continue;
    std::string why;
    shared_mapping m(r, why);
    if (!m)
      continue; // the pull maps it, or says why, if a group is lent in it
    volatile std::uint8_t sink = 0;
    for (std::size_t at = 0; at < m.data_bytes(); at += m.page_bytes()) {
      if (at % huge_page_bytes == 0 && (stopping || clock::now() >= deadline))
        break; // the pull faults in the rest as it reads it
      sink = static_cast<std::uint8_t>(sink + m.data()[at]);
    }
    ch.maps.emplace(r.id, channel::mapped{std::move(m), ch.pulls});
    ++mapped;
  }
  std::size_t bytes = 0;
  for (const auto& [id, x] : ch.maps)
    bytes += x.map.mapped_bytes();
  std::lock_guard<std::mutex> lock(mutex);
  st.mapped_ahead += mapped;
  st.mappings += mapped;
  st.peak_mapped_bytes = std::max(st.peak_mapped_bytes, bytes);
}

// Connects and says hello, retrying with backoff until the deadline; a
// refused token ends it at once.
std::unique_ptr<channel> puller_impl::connect(const pull_request& req, bool map_ahead) {
  const ucx_credentials creds = credentials(req);
  const std::string peer = producer_name(creds.producer);
  auto backoff = std::max(options.backoff_initial, std::chrono::milliseconds(1));
  std::string last = "no attempt made before the deadline";
  int attempts = 0;
  for (;;) {
    const auto now = clock::now();
    if (now >= req.deadline || stopping)
      break;
    ++attempts;
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++st.connect_attempts;
    }
    const auto attempt_deadline = std::min(req.deadline, now + options.connect_attempt_timeout);
    // Each attempt on a worker of its own, destroyed with whatever a
    // failed attempt leaves behind.
    std::unique_ptr<channel> ch;
    std::string err = parked_bound_reached(creds.producer);
    if (err.empty()) {
      try {
        ch = new_channel(creds, req);
      } catch (const ucx_error& e) {
        err = e.what(); // no worker (out of file descriptors?): a failed attempt, retried
      }
    }
    if (ch)
      err = try_connect(*ch, creds, attempt_deadline, map_ahead);
    if (ch && err.empty()) {
      const std::string refused = lanes_refused(ch->lanes, options.transports);
      say(options.log, "ucx puller: " + who(req) + " connected to producer " + peer + " (attempt "
                           + std::to_string(attempts) + ") over " + ch->lanes.text + " [" + ch->lanes.summary()
                           + "]" + (refused.empty() ? "" : "; refused: " + refused)
                           + (ch->shared ? "; groups in shared memory"
                                         : ch->shared_why.empty() ? "" : "; no shared memory: " + ch->shared_why));
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++st.connections;
        last_lanes = ch->lanes.text + " [" + ch->lanes.summary() + "]";
      }
      if (!refused.empty()) {
        destroy(std::move(ch));
        throw transfer_error(transfer_failure::producer_failed,
                             "ucx transfer: " + who(req) + ": producer " + peer + ": " + refused);
      }
      return ch;
    } else if (ch && !ch->refused.empty()) {
      const std::string why = ch->refused;
      destroy(std::move(ch), std::chrono::milliseconds(50));
      throw transfer_error(transfer_failure::producer_failed,
                           "ucx transfer: " + who(req) + ": producer " + peer + " refused the connection: " + why);
    } else {
      last = err;
    }
    // A failed attempt closes at once; an unanswered one may take until
    // the deadline, and is parked after that.
    destroy(std::move(ch), std::clamp(ms_until(req.deadline), std::chrono::milliseconds(10),
                                      std::chrono::milliseconds(500)));
    const auto pause = std::min<clock::duration>(backoff, req.deadline - clock::now());
    if (pause > clock::duration::zero())
      std::this_thread::sleep_for(pause);
    backoff = std::min(backoff * 2, std::max(options.backoff_max, backoff));
  }
  throw transfer_error(transfer_failure::timeout,
                       "ucx transfer: " + who(req) + ": could not connect to producer " + peer
                           + " before the deadline (" + std::to_string(attempts) + " attempt"
                           + (attempts == 1 ? "" : "s") + "; last: " + last + ")");
}

// One endpoint per worker, ever: the producer makes the endpoint this one's
// connection makes on its side its own by connecting back, and UCX pairs
// the two by a per-worker-pair count of connections (both first here).
bool puller_impl::create_endpoint(channel& ch, std::string& why) {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER
                  | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(ch.address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_NONE; // PEER would restrict UCX to tcp lanes
  ep.err_handler.cb = &channel::on_error;
  ep.err_handler.arg = &ch;
  const ucs_status_t s = ucp_ep_create(ch.worker.handle, &ep, &ch.ep);
  if (s != UCS_OK) {
    ch.ep = nullptr;
    why = std::string("cannot create an endpoint: ") + ucs_status_string(s);
    return false;
  }
  return true;
}

// "" on success.
std::string puller_impl::try_connect(channel& ch, const ucx_credentials& creds, clock::time_point deadline,
                                     bool map_ahead) {
  std::string why;
  if (!create_endpoint(ch, why))
    return why;
  const std::uint64_t seq = ++ch.seq;
  if (!options.shared_memory)
    ch.shared_why = "turned off (groups by tag)";
  // The hello travels as the header of the first message (see wire::hello_msg).
  std::vector<std::uint8_t> header;
  try {
    wire::hello_msg hello{seq, ch.engine, ch.engine_worker, creds.token,
                          options.shared_memory ? this_host_id() : std::string(),
                          worker_address(ch.worker.handle, "puller")};
    if (hello.address.size() > wire::max_worker_address_bytes)
      return "this worker's UCX address of " + std::to_string(hello.address.size())
             + " bytes is over the hello's limit of " + std::to_string(wire::max_worker_address_bytes)
             + " (too many devices: see UCX_NET_DEVICES)";
    header = wire::encode(hello);
  } catch (const ucx_error& e) {
    return e.what();
  }
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  if (ucp_worker_query(ch.worker.handle, &attr) == UCS_OK && header.size() > attr.max_am_header)
    return "a hello of " + std::to_string(header.size()) + " bytes is over UCX's largest message header here ("
           + std::to_string(attr.max_am_header) + " bytes): a shorter engine name, or fewer devices (UCX_NET_DEVICES)";
  if (!ch.outbox.send(ch.ep, am_request, {}, true, std::move(header)))
    return "cannot send";
  const bool answered = drive(ch.worker, deadline, [&] {
    ch.pump();
    return ch.failed || ch.replies.count(seq) || ch.replies.count(0);
  });
  if (ch.failed)
    return ch.failure;
  if (!answered)
    return "no answer within " + std::to_string(options.connect_attempt_timeout.count()) + " ms";
  auto it = ch.replies.find(seq);
  if (it == ch.replies.end())
    it = ch.replies.find(0);
  if (const auto* a = std::get_if<wire::ack_msg>(&it->second); a && a->status == wire::status::ok) {
    if (a->probe.id != 0) { // the producer is on this host: can we map its memory?
      std::string why;
      ch.shared = static_cast<bool>(shared_mapping(a->probe, why));
      ch.shared_pid = ch.shared ? a->probe.pid : 0;
      ch.shared_why = why;
      if (ch.shared && map_ahead)
        this->map_ahead(ch, a->buffers, deadline);
    }
    ch.erase_reply(it);
    ch.lanes = ep_lanes(ch.ep);
    ch.connected = true;
    return {};
  }
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, wire::ack_msg> || std::is_same_v<T, wire::reject_msg>)
          ch.refused = wire::to_string(m.status) + ": " + m.error;
        else
          ch.refused = "an unexpected answer to hello";
      },
      it->second);
  return ch.refused;
}

} // namespace rlsync::transfer::ucx_detail
