#include "runtime/transfer/ucx/puller_impl.hpp"

#include "runtime/transfer/ucx/address.hpp"

#include <algorithm>
#include <thread>

namespace rlsync::transfer::ucx_detail {

puller_impl::~puller_impl() {
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
  ctx.reset();
}

// -- connections --------------------------------------------------------------------

std::unique_ptr<channel> puller_impl::acquire(const std::string& peer, const pull_request& req) {
  for (;;) {
    std::unique_ptr<channel> ch;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (idle.empty())
        break;
      ch = std::move(idle.back());
      idle.pop_back();
    }
    // Notice a producer that went away while the connection was idle.
    for (int i = 0; i < 8; ++i)
      ucp_worker_progress(ch->worker.handle);
    ch->pump();
    if (!ch->failed && ch->peer == peer) {
      ch->replies.clear();
      return ch;
    }
    destroy(std::move(ch));
  }
  return connect(peer, req);
}

void puller_impl::release(std::unique_ptr<channel> ch) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (ch->peer == producer && !ch->failed) {
      idle.push_back(std::move(ch));
      return;
    }
  }
  destroy(std::move(ch)); // the producer changed meanwhile
}

// `grace` bounds each wait (the goodbye, the close); a close that takes
// longer parks the connection.
void puller_impl::destroy(std::unique_ptr<channel> ch, std::chrono::milliseconds grace) {
  if (!ch)
    return;
  reap_parked();
  if (ch->worker.handle) {
    ch->inbox.cancel_all();
    if (ch->ep && ch->connected && !ch->failed) {
      // Say goodbye and let the producer close first (see its bye
      // handler): a close from this side would show there as a failed
      // endpoint, and closing that makes UCX log flush errors.
      if (ch->outbox.send(ch->ep, am_request, wire::encode(wire::bye_msg{++ch->seq}), true))
        drive(ch->worker, clock::now() + std::min(grace, std::chrono::milliseconds(200)), [&] {
          ch->pump();
          return ch->failed;
        }, std::chrono::milliseconds(1));
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
      return;
    }
    destroy_worker(*ch);
  }
  recycle_buffers(*ch);
}

void puller_impl::destroy_worker(channel& ch) {
  std::vector<std::vector<std::uint8_t>> keep; // bytes of sends UCX may hold until the worker goes
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

std::unique_ptr<channel> puller_impl::new_channel(const std::string& peer) {
  auto ch = std::make_unique<channel>();
  ch->peer = peer;
  ch->worker = make_worker(ctx->handle, "puller");
  ch->inbox.install(ch->worker.handle, am_reply, std::size_t(256) << 20);
  return ch;
}

// Connects and says hello, retrying with backoff until the deadline.
std::unique_ptr<channel> puller_impl::connect(const std::string& peer, const pull_request& req) {
  auto backoff = std::max(options.backoff_initial, std::chrono::milliseconds(1));
  std::string last = "no attempt made before the deadline";
  int attempts = 0;
  for (;;) {
    const auto now = clock::now();
    if (now >= req.deadline)
      break;
    ++attempts;
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++st.connect_attempts;
    }
    const auto attempt_deadline = std::min(req.deadline, now + options.connect_attempt_timeout);
    // Each attempt on a worker of its own, destroyed with whatever a
    // failed attempt leaves behind.
    std::unique_ptr<channel> ch = new_channel(peer);
    if (auto err = try_connect(*ch, peer, attempt_deadline); err.empty()) {
      const std::string refused = lanes_refused(ch->lanes, options.transports);
      say(options.log, "ucx puller: " + who(req) + " connected to producer " + peer + " (attempt "
                           + std::to_string(attempts) + ") over " + ch->lanes.text + " [" + ch->lanes.summary()
                           + "]" + (refused.empty() ? "" : "; refused: " + refused));
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

// "" on success.
std::string puller_impl::try_connect(channel& ch, const std::string& peer, clock::time_point deadline) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  try {
    addr = resolve(split_address(peer), len, false);
  } catch (const std::exception& e) {
    return e.what();
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLER
                  | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  ep.sockaddr.addrlen = len;
  ep.err_mode = UCP_ERR_HANDLING_MODE_NONE; // PEER would restrict UCX to tcp lanes
  ep.err_handler.cb = &channel::on_error;
  ep.err_handler.arg = &ch;
  const ucs_status_t s = ucp_ep_create(ch.worker.handle, &ep, &ch.ep);
  if (s != UCS_OK) {
    ch.ep = nullptr;
    return std::string("cannot create an endpoint: ") + ucs_status_string(s);
  }
  const std::uint64_t seq = ++ch.seq;
  if (!ch.outbox.send(ch.ep, am_request, wire::encode(wire::hello_msg{seq}), true))
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
    ch.replies.erase(it);
    ch.lanes = ep_lanes(ch.ep);
    ch.connected = true;
    return {};
  }
  return "unexpected answer to hello";
}

} // namespace rlsync::transfer::ucx_detail
