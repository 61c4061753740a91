#include "runtime/transfer/ucx/active_messages.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

namespace rlsync::transfer::ucx_detail {

namespace {

// One less of `key`'s count; a count of none is not kept.
void count_down(std::unordered_map<ucp_ep_h, std::size_t>& counts, ucp_ep_h key) {
  if (auto n = counts.find(key); n != counts.end() && --n->second == 0)
    counts.erase(n);
}

} // namespace

ucs_status_t am_inbox::on_message(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                  const ucp_am_recv_param_t* param) {
  auto* self = static_cast<am_inbox*>(arg);
  const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
  // Returning other than UCS_OK from here drops a large (rendezvous)
  // message's descriptor and fails its send with that status; UCS_OK drops
  // it too, the send succeeding (ucp_am_data_release is only for data kept
  // past the callback with UCS_INPROGRESS).
  auto drop = [&] {
    ++self->dropped;
    return rndv ? UCS_ERR_REJECTED : UCS_OK;
  };
  const ucp_ep_h reply_ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  if (self->is_member && !(reply_ep && self->is_member(reply_ep))) {
    try { // UCX calls this from C: nothing may escape it
      self->admit(first_message{reply_ep, header, header_length, rndv ? nullptr : data, length});
    } catch (...) {
      ++self->dropped;
    }
    return UCS_OK;
  }
  if (self->ready.size() + self->pending.size() >= max_ready)
    return drop();
  // UCX calls this from C: nothing may escape it (an allocation that fails drops the message).
  try {
    incoming in;
    in.reply_ep = reply_ep;
    if (length > self->limit) {
      in.too_big = length; // answered as such; a large one's descriptor is dropped on return
      self->ready.push_back(std::move(in));
      return UCS_OK;
    }
    if (!rndv) {
      const auto* p = static_cast<const std::uint8_t*>(data);
      in.bytes.assign(p, p + length);
      self->ready.push_back(std::move(in));
      return UCS_OK;
    }
    if (length > self->max_pending_bytes - self->pending_bytes) // pending_bytes <= max_pending_bytes always
      return drop();
    if (const auto it = self->fetches_by_sender.find(reply_ep); self->max_fetches_per_sender != 0
        && it != self->fetches_by_sender.end() && it->second >= self->max_fetches_per_sender)
      return drop();
    in.bytes.resize(length);
    auto& f = self->pending.emplace_back(fetching{nullptr, std::move(in)});
    std::size_t* fetching_now = nullptr;
    try { // before the fetch, which owns `data` once started
      fetching_now = &self->fetches_by_sender[reply_ep];
    } catch (...) {
      self->pending.pop_back();
      return drop();
    }
    ucp_request_param_t rp{};
    rp.op_attr_mask = 0; // completion is polled (am_inbox::poll)
    void* req = ucp_am_recv_data_nbx(self->worker, data, f.msg.bytes.data(), length, &rp);
    // From here the fetch owns `data`: whatever follows returns UCS_OK.
    if (UCS_PTR_IS_ERR(req)) {
      self->pending.pop_back(); // lost: the sender's wait will time out
      ++self->dropped;
    } else if (req == nullptr) {
      try {
        self->ready.push_back(std::move(f.msg));
      } catch (...) {
        ++self->dropped;
      }
      self->pending.pop_back();
    } else {
      f.request = req;
      self->pending_bytes += length;
      ++*fetching_now;
    }
    if (*fetching_now == 0)
      self->fetches_by_sender.erase(reply_ep);
    return UCS_OK;
  } catch (...) {
    return drop();
  }
}

void am_inbox::install(ucp_worker_h w, unsigned id, std::size_t max_bytes) {
  worker = w;
  limit = max_bytes;
  max_pending_bytes = max_bytes > SIZE_MAX / 4 ? SIZE_MAX : 4 * max_bytes;
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG
                  | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  hp.id = id;
  hp.cb = &am_inbox::on_message;
  hp.arg = this;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG;
  if (const ucs_status_t st = ucp_worker_set_am_recv_handler(w, &hp); st != UCS_OK)
    throw ucx_error(std::string("ucx: cannot install the message handler: ") + ucs_status_string(st));
}

// Moves finished rendezvous receptions to `ready`.
void am_inbox::poll() {
  for (auto it = pending.begin(); it != pending.end();) {
    const ucs_status_t st = ucp_request_check_status(it->request);
    if (st == UCS_INPROGRESS) {
      ++it;
      continue;
    }
    ucp_request_free(it->request);
    pending_bytes -= it->msg.bytes.size();
    count_down(fetches_by_sender, it->msg.reply_ep);
    if (st == UCS_OK && !it->discard)
      ready.push_back(std::move(it->msg));
    it = pending.erase(it);
  }
}

void am_inbox::forget(ucp_ep_h ep) {
  ready.erase(std::remove_if(ready.begin(), ready.end(), [ep](const incoming& in) { return in.reply_ep == ep; }),
              ready.end());
  for (auto& f : pending)
    if (f.msg.reply_ep == ep)
      f.discard = true;
}

// Only once the worker is about to be destroyed: UCX cannot cancel a
// fetch, so it may write into its buffer until then.
void am_inbox::abandon(std::vector<std::vector<std::uint8_t>>& keep) {
  for (auto& f : pending) {
    ucp_request_free(f.request); // released by UCX once it completes
    keep.push_back(std::move(f.msg.bytes));
  }
  pending.clear();
  pending_bytes = 0;
  fetches_by_sender.clear();
}

// False when UCX refused the send outright.
bool am_outbox::send(ucp_ep_h ep, unsigned id, std::vector<std::uint8_t> bytes, bool reply,
                     std::vector<std::uint8_t> header) {
  auto& s = inflight.emplace_back();
  s.ep = ep;
  s.bytes = std::move(bytes);
  s.header = std::move(header);
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = reply ? UCP_AM_SEND_FLAG_REPLY : 0;
  void* req = ucp_am_send_nbx(ep, id, s.header.empty() ? nullptr : s.header.data(), s.header.size(), s.bytes.data(),
                              s.bytes.size(), &rp);
  if (req == nullptr || UCS_PTR_IS_ERR(req)) {
    inflight.pop_back();
    return req == nullptr;
  }
  s.request = req;
  ++per_endpoint[ep];
  return true;
}

bool am_outbox::refuse(ucp_ep_h ep, unsigned id, std::vector<std::uint8_t> bytes) {
  if (refusals >= max_refusals)
    return false;
  const auto before = inflight.size();
  const bool sent = send(ep, id, std::move(bytes), false);
  if (inflight.size() > before) {
    inflight.back().refusal = true;
    ++refusals;
  }
  return sent;
}

void am_outbox::poll() {
  for (auto it = inflight.begin(); it != inflight.end();) {
    const ucs_status_t st = ucp_request_check_status(it->request);
    if (st == UCS_INPROGRESS) {
      ++it;
      continue;
    }
    if (st != UCS_OK && failed_sends++ == 0)
      first_failure = st;
    ucp_request_free(it->request);
    refusals -= it->refusal;
    count_down(per_endpoint, it->ep);
    it = inflight.erase(it);
  }
}

bool am_outbox::pending_on(ucp_ep_h ep) const { return per_endpoint.count(ep) != 0; }

std::size_t am_outbox::in_flight_to(ucp_ep_h ep) const {
  const auto it = per_endpoint.find(ep);
  return it == per_endpoint.end() ? 0 : it->second;
}

// Only once the worker is about to be destroyed: the bytes must outlive
// any send UCX still holds.
void am_outbox::abandon(std::vector<std::vector<std::uint8_t>>& keep) {
  for (auto& s : inflight) {
    ucp_request_free(s.request);
    keep.push_back(std::move(s.bytes));
    keep.push_back(std::move(s.header));
  }
  inflight.clear();
  refusals = 0;
  per_endpoint.clear();
}

} // namespace rlsync::transfer::ucx_detail
