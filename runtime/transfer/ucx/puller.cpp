#include "runtime/transfer/ucx/puller_impl.hpp"

#include "runtime/base/checksum.hpp"
#include "runtime/base/thread_schedule.hpp"
#include "runtime/plan/grouped_plan.hpp"
#include "runtime/transfer/store_in_place.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <thread>
#include <type_traits>

namespace rlsync::transfer {
namespace ucx_detail {

namespace {

transfer_failure failure_of(wire::status s) {
  switch (s) {
    case wire::status::version_unavailable: return transfer_failure::version_unavailable;
    case wire::status::not_registered: return transfer_failure::not_registered;
    case wire::status::shutting_down: return transfer_failure::cancelled;
    default: return transfer_failure::producer_failed;
  }
}

// Broadcast, lent in place: a group sent by tag after all holds its tensors
// back to back, as a consumer gathers them from the version's memory.
plan::full_group_layout back_to_back(const std::vector<tensor_view>& tensors) {
  plan::full_group_layout l;
  for (const auto& t : tensors) {
    l.specs.push_back(t);
    l.offsets.push_back(l.bytes);
    l.bytes += t.size;
  }
  return l;
}

} // namespace

// -- request/reply ------------------------------------------------------------------

[[noreturn]] void puller_impl::lost(channel& ch, const pull_request& req, const std::string& doing) {
  const bool reset = ch.failure.find("reset") != std::string::npos || ch.failure.find("closed") != std::string::npos;
  throw transfer_error(reset ? transfer_failure::cancelled : transfer_failure::producer_failed,
                       "ucx transfer: " + who(req) + ": the connection to producer " + ch.peer + " failed while "
                           + doing + ": " + ch.failure);
}

void puller_impl::send(channel& ch, const pull_request& req, const wire::message& m, const std::string& doing) {
  if (!ch.outbox.send(ch.ep, am_request, wire::encode(m), true)) {
    ch.failed = true;
    ch.failure = "cannot send";
    lost(ch, req, doing);
  }
}

// Waits for the reply with sequence `seq`; throws on failure or timeout.
wire::message puller_impl::await(channel& ch, const pull_request& req, std::uint64_t seq, const std::string& doing) {
  const bool ok = drive(ch.worker, req.deadline, [&] {
    ch.pump();
    return ch.failed || ch.replies.count(seq) || ch.replies.count(0);
  });
  if (ch.failed)
    lost(ch, req, doing);
  if (!ok)
    throw transfer_error(transfer_failure::timeout, "ucx transfer: " + who(req) + ": producer " + ch.peer
                                                        + " did not answer before the deadline while " + doing);
  auto it = ch.replies.find(seq);
  if (it == ch.replies.end())
    it = ch.replies.find(0);
  auto m = std::move(it->second);
  ch.erase_reply(it);
  if (const auto* r = std::get_if<wire::reject_msg>(&m))
    throw transfer_error(failure_of(r->status), "ucx transfer: " + who(req) + ": producer " + ch.peer
                                                    + " rejected the request while " + doing + " ("
                                                    + wire::to_string(r->status) + "): " + r->error);
  return m;
}

void puller_impl::register_plan(channel& ch, const pull_request& req, const registration& r) {
  if (ch.plans.count(r.digest))
    return;
  const std::uint64_t seq = ++ch.seq;
  send(ch, req, wire::plan_msg{seq, *r.encoded}, "registering the sharding plan");
  auto m = await(ch, req, seq, "registering the sharding plan");
  const auto* a = std::get_if<wire::ack_msg>(&m);
  if (!a)
    throw transfer_error(transfer_failure::producer_failed, "ucx transfer: " + who(req) + ": producer " + ch.peer
                                                                + " answered the plan with no ack");
  if (a->status != wire::status::ok)
    throw transfer_error(failure_of(a->status), "ucx transfer: " + who(req) + ": producer " + ch.peer
                                                    + " refused the sharding plan: " + a->error);
  if (a->digest != r.digest)
    throw transfer_error(transfer_failure::producer_failed, "ucx transfer: " + who(req) + ": producer " + ch.peer
                                                                + " acknowledged plan " + checksum_hex(a->digest)
                                                                + ", sent " + checksum_hex(r.digest));
  ch.plans.insert(r.digest);
}

// -- the pull -----------------------------------------------------------------------

std::string manifest_size_problem(const std::vector<wire::group_info>& groups, std::uint64_t max_group_bytes,
                                  std::optional<std::uint64_t> plan_bytes) {
  std::uint64_t announced = 0;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto g = std::to_string(groups[i].group);
    if (i > 0 && groups[i].group <= groups[i - 1].group)
      return "groups out of order";
    if (groups[i].bytes > max_group_bytes)
      return "group " + g + " of " + std::to_string(groups[i].bytes) + " bytes exceeds max_group_bytes ("
             + std::to_string(max_group_bytes) + ")";
    if (__builtin_add_overflow(announced, groups[i].bytes, &announced))
      return "its groups announce more than 2^64 bytes by group " + g;
    if (plan_bytes && announced > *plan_bytes)
      return "its groups announce " + std::to_string(announced) + " bytes by group " + g + ", more than the "
             + std::to_string(*plan_bytes) + " this worker's plan keeps";
  }
  return {};
}

pull_report puller_impl::pull(const pull_request& req, const group_sink& sink) {
  const auto t0 = clock::now();
  const auto schedule0 = thread_schedule::now();
  const bool broadcast = req.mode == transfer_mode::broadcast;
  if (broadcast ? !sink.on_full_group : !sink.on_group)
    throw std::invalid_argument("ucx transfer: " + who(req) + ": no sink for " + to_string(req.mode) + " groups");
  registration reg;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = workers.find({req.engine, req.worker});
    if (it == workers.end())
      throw transfer_error(transfer_failure::not_registered,
                           "ucx transfer: " + who(req) + " has not registered its sharding plan");
    reg = it->second;
    ++pulling[{req.engine, req.worker}];
  }
  struct pulling_mark {
    puller_impl* self;
    std::pair<std::string, int> key;
    ~pulling_mark() {
      std::lock_guard<std::mutex> lock(self->mutex);
      if (auto it = self->pulling.find(key); it != self->pulling.end() && --it->second == 0)
        self->pulling.erase(it);
    }
  } mark{this, {req.engine, req.worker}};

  std::unique_ptr<channel> ch = acquire(req);
  struct guard {
    puller_impl* self;
    std::unique_ptr<channel>& ch;
    ~guard() {
      // A failed pull leaves the connection in an unknown state: drop it,
      // waiting little (the caller's deadline may have passed already).
      if (ch)
        self->destroy(std::move(ch), std::chrono::milliseconds(50));
    }
  } g{this, ch};

  pull_report report;
  report.engine = req.engine;
  report.worker = req.worker;
  report.version = req.version;
  // Blocked on the producer (its answers, its sends) vs storing what came.
  const auto waiting_since = [&report](clock::time_point since) { report.waited += clock::now() - since; };
  if (!broadcast)
    register_plan(*ch, req, reg); // once per connection: counted with the rest, not as waiting
  auto since = clock::now();

  // Open the version; the first groups_in_flight gets ride on the open
  // (their sequence numbers and tags reserved here), so the first group
  // follows the manifest without another round trip. Their receives are
  // posted once the manifest gave the sizes; UCX holds what arrives first.
  const auto timeout_ms = [&] {
    return static_cast<std::uint32_t>(std::clamp<std::int64_t>(ms_until(req.deadline).count(), 1, UINT32_MAX));
  };
  const std::uint64_t open_seq = ++ch->seq;
  const auto prefetch = static_cast<std::uint32_t>(std::min<std::size_t>(options.groups_in_flight, wire::max_prefetch));
  const std::uint64_t first_seq = ch->seq + 1;
  const std::uint64_t tag_base = ch->tag + 1;
  ch->seq += prefetch;
  ch->tag += prefetch;
  ++ch->pulls;
  const wire::open_msg open{open_seq,  req.engine, req.worker,   reg.plan->tp, req.version, req.mode,
                            broadcast ? 0 : reg.digest, prefetch, tag_base,     timeout_ms(), ch->shared};
  send(*ch, req, open, "opening version " + std::to_string(req.version));
  auto reply = await(*ch, req, open_seq, "opening version " + std::to_string(req.version));
  waiting_since(since);
  auto* manifest = std::get_if<wire::manifest_msg>(&reply);
  if (!manifest)
    throw transfer_error(transfer_failure::producer_failed,
                         "ucx transfer: " + who(req) + ": producer " + ch->peer + " answered open with no manifest");
  if (manifest->status != wire::status::ok)
    throw transfer_error(failure_of(manifest->status), "ucx transfer: " + who(req) + ": producer " + ch->peer + ": "
                                                           + manifest->error);
  if (manifest->shared && !ch->shared)
    throw transfer_error(transfer_failure::producer_failed, "ucx transfer: " + who(req) + ": producer " + ch->peer
                                                                + " lends groups in shared memory unasked");
  // Lent: each group is copied from the producer's shared memory, no
  // receive is posted (unless the producer sends one by tag after all).
  // In place: gathered from the version's own memory, as the manifest
  // places its tensors there.
  const bool lent = manifest->shared;
  const bool in_place = manifest->in_place;
  // Mappings of buffers the producer no longer holds go: they would keep
  // freed memory alive beyond its budget. The rest stay mapped for the
  // next pulls (mapping a buffer anew costs a page-table walk of it).
  if (lent) {
    const std::set<std::uint64_t> live(manifest->live_buffers.begin(), manifest->live_buffers.end());
    for (auto it = ch->maps.begin(); it != ch->maps.end();)
      it = live.count(it->first) ? std::next(it) : ch->maps.erase(it);
  }
  const auto& groups = manifest->groups;
  std::vector<plan::full_group_layout> layouts(broadcast ? groups.size() : 0);
  std::uint64_t largest = 0;
  auto bad = [&](const std::string& why) {
    throw transfer_error(transfer_failure::producer_failed,
                         "ucx transfer: " + who(req) + ": producer " + ch->peer + " sent a bad manifest: " + why);
  };
  // Sharded, the worker keeps its plan's bytes: no producer (one rank's
  // share included) sends it more.
  if (auto why = manifest_size_problem(groups, options.max_group_bytes,
                                       broadcast ? std::nullopt
                                                 : std::optional<std::uint64_t>(plan::bytes_per_worker(*reg.plan)));
      !why.empty())
    bad(why);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    if (broadcast) {
      std::vector<tensor_view> views;
      std::uint64_t sum = 0; // each tensor is below 2^63 bytes, the sum kept at most max_group_bytes: no wrap
      for (const auto& s : groups[i].tensors) {
        tensor_view v;
        static_cast<tensor_spec&>(v) = s;
        v.size = static_cast<std::size_t>(s.bytes());
        sum += v.size;
        if (sum > groups[i].bytes)
          bad("group " + std::to_string(groups[i].group) + " announces " + std::to_string(groups[i].bytes)
              + " bytes, its tensors take more");
        views.push_back(std::move(v));
      }
      // In place, a group that comes by tag after all is its tensors back
      // to back, as they are gathered.
      layouts[i] = in_place ? back_to_back(views) : plan::full_group_layout::of(views);
      if (layouts[i].bytes != groups[i].bytes)
        bad("group " + std::to_string(groups[i].group) + " announces " + std::to_string(groups[i].bytes)
            + " bytes, its tensors take " + std::to_string(layouts[i].bytes));
    }
    largest = std::max(largest, groups[i].bytes);
  }

  // Receive buffers: allocated and touched once, reused by later pulls
  // (a lent session needs them only for a group sent by tag after all).
  // At most what a connection may hold waiting, with the gets its open carried.
  const std::size_t window = std::min<std::size_t>({std::max<std::size_t>(1, options.groups_in_flight), groups.size(),
                                                    max_waiting_replies - wire::max_prefetch});
  if (!lent)
    ensure_slots(*ch, window, static_cast<std::size_t>(largest));

  std::vector<posted> slot_state(window);
  // A failed pull leaves receives posted. While the producer is healthy
  // and the deadline not past (a checksum mismatch, a throwing sink),
  // let them complete for a moment: the producer's sends then finish
  // normally instead of failing with the connection. Then cancel and
  // release the rest before the connection (and its buffers) goes.
  struct cancel_guard {
    channel& ch;
    std::vector<posted>& posts;
    clock::time_point deadline;
    ~cancel_guard() {
      auto pending = [&] {
        return std::any_of(posts.begin(), posts.end(), [](const posted& p) { return p.request != nullptr; });
      };
      if (pending() && !ch.failed && clock::now() < deadline)
        drive(ch.worker, std::min(deadline, clock::now() + std::chrono::milliseconds(200)), [&] {
          for (auto& p : posts)
            if (p.request && ucp_request_check_status(p.request) != UCS_INPROGRESS) {
              ucp_request_free(p.request);
              p.request = nullptr;
            }
          return !pending();
        }, std::chrono::milliseconds(1));
      for (auto& p : posts)
        if (p.request) {
          ucp_request_cancel(ch.worker.handle, p.request);
          ucp_request_free(p.request);
          p.request = nullptr;
        }
    }
  } cancel{*ch, slot_state, req.deadline};

  auto post_receive = [&](std::size_t idx) {
    ensure_slots(*ch, window, static_cast<std::size_t>(largest));
    auto& p = slot_state[idx % window];
    // Never completed in place, though a small group sent eagerly may have
    // arrived first (those the open carried): UCX 1.13 then reports its
    // length as 0, failing a whole group. ucp_tag_recv_request_test says.
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    void* r = ucp_tag_recv_nbx(ch->worker.handle, ch->slots[idx % window].data(),
                               static_cast<std::size_t>(groups[idx].bytes), p.tag, ~std::uint64_t(0), &rp);
    if (UCS_PTR_IS_ERR(r) || !r) {
      ch->failed = true;
      ch->failure = std::string("cannot post a receive: ")
                    + (r ? ucs_status_string(UCS_PTR_STATUS(r)) : "UCX completed it in place though asked not to");
      lost(*ch, req, "requesting group " + std::to_string(groups[idx].group));
    }
    p.request = r;
  };
  // Gives group idx a tag and (unless lent) posts its receive; sends its
  // get unless the open carried it.
  auto issue = [&](std::size_t idx) {
    auto& p = slot_state[idx % window];
    if (p.request) { // its slot's last group was answered in shared memory after a receive was posted
      ch->failed = true;
      ch->failure = "the producer answered group " + std::to_string(groups[idx - window].group)
                    + " both by tag and in shared memory";
      lost(*ch, req, "receiving group " + std::to_string(groups[idx - window].group)); // the guard cancels it
    }
    p = posted{};
    const bool carried = idx < prefetch;
    p.tag = carried ? tag_base + idx : ++ch->tag;
    if (!lent)
      post_receive(idx);
    if (carried) {
      p.seq = first_seq + idx;
      return;
    }
    p.seq = ++ch->seq;
    send(*ch, req, wire::get_msg{p.seq, manifest->session, groups[idx].group, p.tag, timeout_ms()},
         "requesting group " + std::to_string(groups[idx].group));
  };
  auto settle = [&](posted& p) {
    if (p.done || !p.request)
      return;
    ucp_tag_recv_info_t info{};
    const ucs_status_t s = ucp_tag_recv_request_test(p.request, &info);
    if (s == UCS_INPROGRESS)
      return;
    p.done = true;
    p.status = s;
    p.length = info.length;
    ucp_request_free(p.request);
    p.request = nullptr;
  };

  for (std::size_t idx = 0; idx < window; ++idx)
    issue(idx);
  for (std::size_t idx = 0; idx < groups.size(); ++idx) {
    const std::uint32_t group = groups[idx].group;
    auto& p = slot_state[idx % window];
    const std::string doing =
        "receiving group " + std::to_string(group) + " of version " + std::to_string(req.version);
    const wire::group_msg* header = nullptr;
    since = clock::now();
    const bool arrived = drive(ch->worker, req.deadline, [&] {
      ch->pump();
      settle(p);
      auto it = ch->replies.find(p.seq);
      header = it == ch->replies.end() ? nullptr : std::get_if<wire::group_msg>(&it->second);
      const bool in_shared = header && header->shared.id != 0;
      if (lent && header && header->status == wire::status::ok && !in_shared && !p.request && !p.done)
        post_receive(idx); // a lent session's group sent by tag after all (the corrupt drill)
      return ch->failed || ch->replies.count(0) || (it != ch->replies.end() && !header)
             || (header && (header->status != wire::status::ok || p.done || in_shared));
    });
    waiting_since(since);
    if (ch->failed)
      lost(*ch, req, doing);
    if (!arrived)
      throw transfer_error(transfer_failure::timeout,
                           "ucx transfer: " + who(req) + ": group " + std::to_string(group) + " of version "
                               + std::to_string(req.version) + " did not arrive from producer " + ch->peer
                               + " before the deadline; " + std::to_string(idx) + " of "
                               + std::to_string(groups.size()) + " groups received");
    if (!header) {
      (void)await(*ch, req, p.seq, doing); // throws for a reject
      throw transfer_error(transfer_failure::producer_failed, "ucx transfer: " + who(req) + ": producer " + ch->peer
                                                                  + " answered a get with something else");
    }
    if (header->status != wire::status::ok)
      throw transfer_error(failure_of(header->status), "ucx transfer: " + who(req) + ": producer " + ch->peer
                                                           + " could not send group " + std::to_string(group)
                                                           + " of version " + std::to_string(req.version) + " ("
                                                           + wire::to_string(header->status) + "): " + header->error);
    const std::uint8_t* bytes = nullptr;
    std::size_t size = p.length;
    if (header->shared.id != 0) {
      if (!lent || header->group != group || header->bytes != groups[idx].bytes)
        throw transfer_error(transfer_failure::producer_failed,
                             "ucx transfer: " + who(req) + ": producer " + ch->peer + " lent group "
                                 + std::to_string(header->group) + " of " + std::to_string(header->bytes)
                                 + " bytes " + (lent ? "" : "unasked ") + "for group " + std::to_string(group) + " of "
                                 + std::to_string(groups[idx].bytes));
      bytes = mapped_group(*ch, req, header->shared, header->bytes);
      size = static_cast<std::size_t>(header->bytes);
    } else if (p.status != UCS_OK || header->group != group || header->bytes != groups[idx].bytes
               || p.length != groups[idx].bytes)
      throw transfer_error(transfer_failure::producer_failed,
                           "ucx transfer: " + who(req) + ": group " + std::to_string(group) + " of version "
                               + std::to_string(req.version) + " from producer " + ch->peer + " arrived damaged ("
                               + (p.status != UCS_OK ? std::string(ucs_status_string(p.status))
                                                     : std::to_string(p.length) + " bytes received, "
                                                           + std::to_string(header->bytes) + " announced for group "
                                                           + std::to_string(header->group) + ", "
                                                           + std::to_string(groups[idx].bytes) + " expected")
                               + ")");
    else
      bytes = ch->slots[idx % window].data();
    // Into a sink that keeps the bytes as sent, one pass: sharded, the
    // group stored in place and checksummed as it lands; broadcast, the
    // whole group checksummed and the worker's pieces of it stored from
    // each window just read (store_kept). Else checksummed here first and
    // handed over. (A lent buffer read twice so does not change in between:
    // the producer rewrites a buffer only after every lend of it came back
    // done; one not given back is never reused.)
    const auto storing = clock::now();
    const bool gather_in_place = in_place && header->shared.id != 0;
    auto bad_placement = [&](const std::invalid_argument& e) {
      return transfer_error(transfer_failure::producer_failed, "ucx transfer: " + who(req) + ": producer " + ch->peer
                                                                   + " sent group " + std::to_string(group) + " "
                                                                   + (gather_in_place ? "in place " : "") + e.what());
    };
    std::vector<store_target> targets;
    if (!broadcast) {
      try { // the group's size is the producer's word: checked against the sink's targets
        targets = group_targets(sink, req.worker, group, size);
      } catch (const std::invalid_argument& e) {
        throw bad_placement(e);
      }
    }
    std::vector<source_piece> whole{{bytes, size}}; // broadcast: the group as sent
    std::vector<tensor_view> views;                 // broadcast: its tensors where they lie
    std::uint64_t got = 0;
    if (gather_in_place) {
      const auto& mapping = ch->maps.at(header->shared.id).map;
      std::vector<source_piece> pieces;
      try { // the manifest is the producer's word: checked against the mapping and the plan
        pieces = lent_pieces(*reg.plan, groups[idx].tensors, groups[idx].offsets, mapping.data(),
                             mapping.data_bytes(), broadcast, groups[idx].bytes);
      } catch (const std::invalid_argument& e) {
        throw bad_placement(e);
      }
      if (broadcast) { // where the manifest placed them, checked just now
        views = plan::view_full_group({groups[idx].tensors, groups[idx].offsets, groups[idx].bytes}, mapping.data());
        whole = std::move(pieces);
      } else if (!targets.empty()) {
        got = store_pieces(pieces, targets);
      } else { // a sink that takes packed bytes: gathered into a slot, the checksum folded in
        ensure_slots(*ch, window, static_cast<std::size_t>(largest));
        bytes = ch->slots[idx % window].data();
        got = store_pieces(pieces, {{ch->slots[idx % window].data(), size}});
      }
    } else if (broadcast) {
      views = plan::view_full_group(layouts[idx], bytes);
    } else {
      got = targets.empty() ? checksum64(bytes, size) : store_group(bytes, targets);
    }
    if (broadcast) {
      std::vector<source_piece> kept;
      try { // the tensors are the producer's word: checked against the plan and the targets
        targets = broadcast_targets(sink, *reg.plan, req.worker, group, views, kept);
        got = targets.empty() ? checksum_pieces(whole) : store_kept(whole, kept, targets);
      } catch (const std::invalid_argument& e) {
        throw bad_placement(e);
      }
    }
    if (got != header->checksum)
      throw transfer_error(transfer_failure::checksum_mismatch,
                           "ucx transfer: " + who(req) + ": group " + std::to_string(group) + " of version "
                               + std::to_string(req.version) + " failed its checksum (sent " + checksum_hex(header->checksum)
                               + ", received " + checksum_hex(got) + " over " + std::to_string(size)
                               + " bytes from producer " + ch->peer + "); the update is void");
    const bool from_shared = header->shared.id != 0;
    if (auto it = ch->replies.find(p.seq); it != ch->replies.end())
      ch->erase_reply(it);
    report.bytes += size;
    ++report.groups;
    if (!targets.empty())
      sink.on_stored(req.worker, group);
    else if (broadcast) // the engine slices what it keeps from the views
      sink.on_full_group(req.worker, group, views);
    else
      sink.on_group(req.worker, group, bytes, size);
    report.stored += clock::now() - storing;
    if (from_shared) { // copied: the producer may reuse the buffer (no answer awaited)
      ch->outbox.send(ch->ep, am_request, wire::encode(wire::done_msg{p.seq, manifest->session, group}), true);
      std::lock_guard<std::mutex> lock(mutex);
      ++st.groups_mapped;
    }
    if (idx + window < groups.size())
      issue(idx + window);
  }
  // A receive still posted (a producer that answered a group by tag and
  // then in shared memory) must not outlive the pull on a kept connection.
  for (std::size_t i = 0; i < window; ++i)
    if (slot_state[i].request) {
      ch->failed = true;
      ch->failure = "the producer answered a group both by tag and in shared memory";
      lost(*ch, req, "receiving the last groups"); // the guard cancels it
    }
  // The session is done; no answer is awaited (a lost close only keeps a
  // session the producer drops later).
  const std::uint64_t close_seq = ++ch->seq;
  ch->outbox.send(ch->ep, am_request, wire::encode(wire::close_msg{close_seq, manifest->session}), true);
  ch->pump();
  report.duration = clock::now() - t0;
  const auto schedule = thread_schedule::now().since(schedule0);
  report.ran = schedule.ran;
  report.queued = schedule.queued;
  {
    std::lock_guard<std::mutex> lock(mutex);
    ++st.pulls;
    st.bytes += report.bytes;
  }
  release(std::move(ch));
  return report;
}

const std::uint8_t* puller_impl::mapped_group(channel& ch, const pull_request& req, const wire::shared_region& r,
                                              std::uint64_t bytes) {
  if (r.pid != ch.shared_pid)
    throw transfer_error(transfer_failure::producer_failed,
                         "ucx transfer: " + who(req) + ": producer " + ch.peer + " lent a group in process "
                             + std::to_string(r.pid) + ", its probe was in process " + std::to_string(ch.shared_pid));
  auto it = ch.maps.find(r.id);
  if (it == ch.maps.end() || it->second.map.mapped_bytes() != r.bytes) {
    std::string why;
    shared_mapping m(r, why);
    if (!m)
      throw transfer_error(transfer_failure::producer_failed, "ucx transfer: " + who(req) + ": cannot map the shared "
                                                                  "memory producer " + ch.peer + " lent a group in: "
                                                                  + why);
    if (it != ch.maps.end())
      ch.maps.erase(it);
    if (ch.maps.size() >= max_mappings)
      ch.maps.erase(std::min_element(ch.maps.begin(), ch.maps.end(), [](const auto& a, const auto& b) {
        return a.second.last_pull < b.second.last_pull;
      }));
    it = ch.maps.emplace(r.id, channel::mapped{std::move(m), ch.pulls}).first;
    std::size_t mapped = 0;
    for (const auto& [id, x] : ch.maps)
      mapped += x.map.mapped_bytes();
    std::lock_guard<std::mutex> lock(mutex);
    ++st.mappings;
    st.peak_mapped_bytes = std::max(st.peak_mapped_bytes, mapped);
  }
  it->second.last_pull = ch.pulls;
  if (bytes > it->second.map.data_bytes())
    throw transfer_error(transfer_failure::producer_failed,
                         "ucx transfer: " + who(req) + ": producer " + ch.peer + " lent a group of "
                             + std::to_string(bytes) + " bytes in a buffer of "
                             + std::to_string(it->second.map.data_bytes()));
  return it->second.map.data();
}

void puller_impl::ensure_slots(channel& ch, std::size_t window, std::size_t size) {
  if (ch.slots.size() < window)
    ch.slots.resize(window);
  for (std::size_t i = 0; i < window; ++i) {
    if (ch.slots[i].capacity() >= size && (size > 0 || ch.slots[i].capacity() > 0))
      continue;
    // A spare buffer of a closed connection, else a new one (touched now,
    // not while the bytes arrive).
    host_buffer b;
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = std::find_if(spare.begin(), spare.end(), [&](const host_buffer& s) { return s.capacity() >= size; });
      if (it != spare.end()) {
        b = std::move(*it);
        spare.erase(it);
      }
    }
    if (b.capacity() < std::max<std::size_t>(size, 1)) {
      b = host_buffer(std::max<std::size_t>(size, 1));
      std::lock_guard<std::mutex> lock(mutex);
      ++st.buffers;
      st.buffer_bytes += b.capacity();
    }
    ch.slots[i] = std::move(b);
  }
}

} // namespace ucx_detail

using namespace ucx_detail;

ucx_puller::ucx_puller(ucx_puller_options options) : impl_(std::make_unique<ucx_detail::puller_impl>()) {
  options.groups_in_flight = std::max<std::size_t>(1, options.groups_in_flight);
  impl_->options = std::move(options);
  impl_->ctx = make_context(impl_->options.transports, impl_->options.net_devices, "puller");
}

ucx_puller::~ucx_puller() = default;

void ucx_puller::register_worker(const std::string& engine, std::shared_ptr<const plan::worker_plan> plan) {
  if (!plan)
    throw std::invalid_argument("ucx transfer: engine '" + engine + "' registered no plan");
  try {
    wire::check_plan(*plan);
  } catch (const wire::wire_error& e) {
    throw std::invalid_argument("ucx transfer: engine '" + engine + "' worker " + std::to_string(plan->worker) + ": "
                                + e.what());
  }
  const int worker_of_plan = plan->worker;
  registration r;
  auto encoded = std::make_shared<std::vector<std::uint8_t>>(wire::encode_plan(*plan));
  r.digest = wire::plan_digest(encoded->data(), encoded->size());
  r.encoded = std::move(encoded);
  r.plan = std::move(plan);
  bool fresh = false;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    auto& slot = impl_->workers[{engine, r.plan->worker}];
    fresh = !slot.plan;
    slot = std::move(r);
  }
  // A new engine worker's first connection gets its UCX worker now (engine
  // start) rather than inside the first sync. A re-registration (holder
  // pulls change their plan at pull time) keeps its connection: none made.
  if (fresh) {
    impl_->make_ready_worker();
    if (impl_->options.connect_ahead)
      impl_->start_connect_ahead(engine, worker_of_plan);
  }
}

void ucx_puller::connect_ahead(const std::string& engine) {
  std::vector<int> unconnected;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    for (const auto& [key, r] : impl_->workers)
      if (key.first == engine && !impl_->pulling.count(key)
          && std::none_of(impl_->idle.begin(), impl_->idle.end(), [&, w = key.second](const auto& ch) {
               return ch->engine == engine && ch->engine_worker == w;
             }))
        unconnected.push_back(key.second);
  }
  for (int worker : unconnected)
    impl_->start_connect_ahead(engine, worker);
}

void ucx_puller::unregister_engine(const std::string& engine) {
  std::vector<std::unique_ptr<ucx_detail::channel>> gone; // its idle connections: their mappings would outlive it
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    for (auto it = impl_->workers.begin(); it != impl_->workers.end();)
      it = it->first.first == engine ? impl_->workers.erase(it) : std::next(it);
    for (auto it = impl_->idle.begin(); it != impl_->idle.end();)
      if ((*it)->engine == engine) {
        gone.push_back(std::move(*it));
        it = impl_->idle.erase(it);
      } else {
        ++it;
      }
  }
  for (auto& ch : gone)
    impl_->destroy(std::move(ch));
  impl_->trim_ready_workers();
}

pull_report ucx_puller::pull(const pull_request& req, const group_sink& sink) {
  return impl_->pull(req, sink);
}

void ucx_puller::reset_connections() {
  std::vector<std::unique_ptr<channel>> old;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->producer.clear();
    old.swap(impl_->idle);
  }
  for (auto& ch : old)
    impl_->destroy(std::move(ch));
}

ucx_puller_stats ucx_puller::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto out = impl_->st;
  out.parked = impl_->parked.size();
  return out;
}

std::string ucx_puller::last_transports() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->last_lanes;
}

std::string ucx_puller::flood_raw(const std::vector<std::uint8_t>& message, std::size_t count,
                                  const std::function<bool()>& stop, clock::time_point until) {
  pull_request req;
  req.engine = "(raw)";
  req.deadline = until;
  std::unique_ptr<channel> ch = impl_->connect(req);
  for (std::size_t i = 0; i < count; ++i)
    ch->outbox.send(ch->ep, am_request, message, true);
  while (!stop() && clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // Reads at last, for a moment: what the producer did with the flood.
  drive(ch->worker, clock::now() + std::chrono::milliseconds(500), [&] {
    ch->pump();
    ch->clear_replies();
    return ch->failed;
  }, std::chrono::milliseconds(1));
  std::string failure = ch->failure;
  impl_->destroy_worker(*ch); // as a dead consumer's: no goodbye, no close
  return failure;
}

namespace {

// A raw message's answer as "status: text".
std::string answer_of(const wire::message& reply) {
  return std::visit(
    [](const auto& m) -> std::string {
      using T = std::decay_t<decltype(m)>;
      if constexpr (std::is_same_v<T, wire::reject_msg> || std::is_same_v<T, wire::ack_msg>
                    || std::is_same_v<T, wire::group_msg> || std::is_same_v<T, wire::manifest_msg>)
        return wire::to_string(m.status) + ": " + m.error;
      else
        return "unexpected reply";
    },
    reply);
}

} // namespace

std::vector<std::string> ucx_puller::converse_raw(const std::vector<std::vector<std::uint8_t>>& messages,
                                                  clock::time_point deadline,
                                                  const std::function<bool()>& release) {
  pull_request req;
  req.engine = "(raw)";
  req.deadline = deadline;
  std::unique_ptr<channel> ch = impl_->connect(req);
  ch->seq = UINT64_MAX; // raw messages carry whatever numbers they carry
  std::vector<std::string> answers;
  for (const auto& message : messages) {
    const auto m = wire::decode(message.data(), message.size());
    const std::uint64_t seq = std::visit([](const auto& x) { return x.seq; }, m);
    std::string answer;
    if (ch->outbox.send(ch->ep, am_request, message, true)) {
      drive(ch->worker, deadline, [&] {
        ch->pump();
        return ch->failed || ch->replies.count(seq) != 0;
      });
      if (auto it = ch->replies.find(seq); it != ch->replies.end()) {
        answer = answer_of(it->second);
        ch->erase_reply(it);
      }
    }
    answers.push_back(answer);
  }
  if (release)
    drive(ch->worker, deadline, [&] {
      ch->pump();
      ch->clear_replies();
      return release();
    }, std::chrono::milliseconds(1));
  impl_->destroy_worker(*ch); // as a dead consumer's: no goodbye, no close
  return answers;
}

std::string ucx_puller::send_raw(const std::vector<std::uint8_t>& message, clock::time_point deadline,
                                 bool hello_first, bool say_goodbye, const std::vector<std::uint8_t>& header) {
  pull_request req;
  req.engine = "(raw)";
  req.deadline = deadline;
  std::unique_ptr<channel> ch;
  if (hello_first) {
    ch = impl_->connect(req);
  } else {
    ch = impl_->new_channel(impl_->credentials(req), req);
    if (std::string why; !impl_->create_endpoint(*ch, why)) {
      impl_->destroy(std::move(ch));
      throw transfer_error(transfer_failure::producer_failed, "ucx transfer: " + why);
    }
  }
  std::string out;
  ch->seq = UINT64_MAX; // a raw message carries whatever number it carries: any reply answers it
  if (ch->outbox.send(ch->ep, am_request, message, true, hello_first ? std::vector<std::uint8_t>{} : header)) {
    drive(ch->worker, deadline, [&] {
      ch->pump();
      return ch->failed || !ch->replies.empty();
    });
    if (!ch->replies.empty())
      out = answer_of(ch->replies.begin()->second);
  }
  if (say_goodbye) {
    ch->clear_replies(); // what the raw message drew (a reject under 0 among them)
    ch->seq = UINT64_MAX - 1; // the goodbye, next, is answered under UINT64_MAX
    impl_->destroy(std::move(ch));
  }
  else
    impl_->destroy_worker(*ch); // its endpoint still open, as when a consumer's process dies
  return out;
}


} // namespace rlsync::transfer
