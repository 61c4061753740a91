// The producer's door: the tokens it issues over the control plane, the
// hello that must present one (judged in UCX's receive callback, where the
// endpoint is sure to be alive), the endpoint it then makes its own, and
// the failures UCX reports for those endpoints.
#include "runtime/transfer/ucx/producer_impl.hpp"

#include "runtime/base/printable.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace rlsync::transfer::ucx_detail {

// -- tokens -------------------------------------------------------------------------

namespace {

void random_bytes(std::uint8_t* out, std::size_t n) {
  while (n > 0) {
    const ssize_t got = ::getrandom(out, n, 0);
    if (got < 0) {
      if (errno == EINTR)
        continue;
      throw ucx_error(std::string("ucx producer: no random bytes for a token: ") + std::strerror(errno));
    }
    out += got;
    n -= static_cast<std::size_t>(got);
  }
}

// Compares every byte whatever differs first, so that timing tells an
// outsider nothing about a token's bytes.
bool same_token(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  if (a.size() != b.size())
    return false;
  std::uint8_t diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<std::uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

} // namespace

ucx_credentials producer_impl::issue(const std::string& engine, int worker_rank) {
  issued_token t;
  t.token.resize(ucx_token_bytes);
  random_bytes(t.token.data(), t.token.size());
  t.engine = engine;
  t.worker = worker_rank;
  t.expires = clock::now() + options.token_lifetime;
  ucx_credentials out{address, t.token};
  {
    std::lock_guard<std::mutex> lock(token_mutex);
    const auto now = clock::now();
    const auto same_worker = [&](const issued_token& x) { return x.worker == worker_rank && x.engine == engine; };
    if (static_cast<std::size_t>(std::count_if(tokens.begin(), tokens.end(), same_worker))
        >= std::max<std::size_t>(1, options.max_tokens_per_worker))
      tokens.erase(std::find_if(tokens.begin(), tokens.end(), same_worker)); // its own oldest
    while (!tokens.empty() && tokens.front().expires <= now)
      tokens.pop_front(); // issued in order: the oldest expires first
    if (!tokens.empty() && tokens.size() >= options.max_tokens) {
      // Full: the engine holding the most gives up its oldest, so a node
      // asking in a loop (for any worker numbers) pushes out only its own.
      // The asking engine counts its new token; ties go to the oldest token.
      std::map<std::string, std::size_t> held{{engine, 1}};
      std::size_t most = 1;
      for (const auto& x : tokens)
        most = std::max(most, ++held[x.engine]);
      tokens.erase(std::find_if(tokens.begin(), tokens.end(),
                                [&](const issued_token& x) { return held[x.engine] == most; }));
    }
    tokens.push_back(std::move(t));
  }
  std::lock_guard<std::mutex> lock(stats_mutex);
  ++st.tokens_issued;
  return out;
}

std::string producer_impl::check_token(const wire::hello_msg& m) {
  if (m.token.size() != ucx_token_bytes)
    return "a token of " + std::to_string(m.token.size()) + " bytes (expected " + std::to_string(ucx_token_bytes)
           + ")";
  std::lock_guard<std::mutex> lock(token_mutex);
  const issued_token* found = nullptr;
  for (const auto& t : tokens)
    if (same_token(t.token, m.token))
      found = &t;
  if (!found)
    return "a token this producer did not issue (or forgot: " + std::to_string(options.max_tokens)
           + " are kept)";
  if (found->engine != m.engine || found->worker != m.worker)
    return "a token issued for another engine worker";
  if (clock::now() >= found->expires)
    return "an expired token (tokens open connections for " + std::to_string(options.token_lifetime.count())
           + " ms)";
  return {};
}

// -- hellos and endpoints -----------------------------------------------------------

void producer_impl::refuse_endpoint(ucp_ep_h ep, std::uint64_t seq, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(stats_mutex);
    ++st.rejected;
    ++st.refused_hellos;
  }
  (*refusal_log)("ucx producer: refused an endpoint: " + why);
  if (!ep)
    return; // sent without a reply endpoint: nothing to answer
  // Answered (while few such answers are in flight), not closed: the
  // endpoint was never made ours, and UCX frees it once its peer goes
  // (closing it here, in the receive callback, would free it under UCX's feet).
  outbox.refuse(ep, am_reply, wire::encode(wire::reject_msg{seq, wire::status::unauthorized, "producer: " + why}));
}

// In the receive callback (see am_inbox), for a message on an endpoint that
// is not a connection's: its header must be a valid hello.
void producer_impl::admit(const am_inbox::first_message& m) {
  const ucp_ep_h ep = m.reply_ep;
  if (ep && still_closing(ep)) {
    count_rejected(); // arrived while its endpoint closes: nobody to answer
    return;
  }
  const auto* header = static_cast<const std::uint8_t*>(m.header);
  if (m.header_length == 0) {
    const auto seq = m.data ? wire::peek_seq(static_cast<const std::uint8_t*>(m.data), m.length) : 0;
    refuse_endpoint(ep, seq, "a request before hello");
    return;
  }
  wire::message decoded;
  try {
    decoded = wire::decode(header, m.header_length);
  } catch (const wire::wire_error& e) {
    refuse_endpoint(ep, wire::peek_seq(header, m.header_length), std::string("a malformed hello: ") + e.what());
    return;
  }
  const auto* hello = std::get_if<wire::hello_msg>(&decoded);
  if (!hello) {
    refuse_endpoint(ep, std::visit([](const auto& x) { return seq_of(x); }, decoded),
                    "a first message whose header is not a hello");
    return;
  }
  if (m.length != 0) {
    refuse_endpoint(ep, hello->seq, "a hello with a body of " + std::to_string(m.length) + " bytes (it has none)");
    return;
  }
  if (auto why = check_token(*hello); !why.empty()) {
    refuse_endpoint(ep, hello->seq, "engine '" + printable(hello->engine) + "' worker " + std::to_string(hello->worker)
                                        + " presented " + why);
    return;
  }
  if (!ep) {
    refuse_endpoint(ep, hello->seq, "a hello without a reply endpoint");
    return;
  }
  if (stopping) {
    refuse_endpoint(ep, hello->seq, "a hello while the producer stops");
    return;
  }
  // A connection whose close waits on its consumer (one that does not read)
  // still holds what it was sent: it counts until the close completes.
  if (conns.size() + connections_closing.size() >= options.max_connections) {
    refuse_endpoint(ep, hello->seq, "a hello beyond the limit of " + std::to_string(options.max_connections)
                                        + " connections (" + std::to_string(connections_closing.size())
                                        + " of them closing)");
    return;
  }
  auto c = std::make_shared<connection>();
  c->id = next_conn;
  c->ep = ep;
  c->engine = hello->engine;
  c->worker = hello->worker;
  c->peer = "engine '" + printable(c->engine) + "' worker " + std::to_string(c->worker) + " (connection "
            + std::to_string(c->id) + ")";
  c->last_active = clock::now();
  c->same_host = !host.empty() && hello->host == host;
  if (std::string why; !claim(ep, *hello, why)) {
    refuse_endpoint(ep, hello->seq, "engine '" + printable(hello->engine) + "' worker "
                                        + std::to_string(hello->worker) + " sent " + why);
    return;
  }
  ++next_conn;
  conns[ep] = c;
  {
    std::lock_guard<std::mutex> lock(stats_mutex);
    ++st.connections;
  }
  say(options.log, "ucx producer: accepted a connection from " + c->peer);
  check_lanes(*c);
  if (!c->refused.empty()) {
    count_rejected();
    reply(c, wire::ack_msg{hello->seq, wire::status::not_allowed, 0, "producer: " + c->refused, {}, {}});
    return;
  }
  wire::ack_msg ack{hello->seq, wire::status::ok, 0, "", {}, {}};
  if (c->same_host) {
    ack.probe = region_of(probe);
    // The buffers groups will be lent in: a consumer connecting ahead of
    // its first pull maps and faults them in then. First the newest version
    // when it lies in shareable memory (a first pull reads it in place; an
    // older one it would not), then packed buffers.
    std::set<std::uint64_t> named;
    auto offer = [&](const host_buffer& b) {
      if (b.shared() && ack.buffers.size() < wire::max_live_buffers && named.insert(b.id()).second)
        ack.buffers.push_back(region_of(b));
    };
    if (auto newest = source->latest(); newest && newest->shared_buffer())
      offer(*newest->shared_buffer());
    for (const auto& b : spare)
      offer(b.buffer);
    for (const auto& [k, e] : cache)
      offer(e->buffer);
  }
  reply(c, ack);
  if (options.expected_mode == transfer_mode::broadcast)
    expect(*c, true, 0, nullptr);
}

// A second hello on a connection: valid only with a valid token for the
// same engine worker; otherwise the connection is closed.
void producer_impl::handle(const conn_ptr& c, const wire::hello_msg& m) {
  std::string why = check_token(m);
  if (why.empty() && (m.engine != c->engine || m.worker != c->worker))
    why = "a token for another engine worker than the connection's";
  if (why.empty()) {
    reply(c, wire::ack_msg{m.seq, wire::status::ok, 0, "", {}, {}});
    return;
  }
  {
    std::lock_guard<std::mutex> lock(stats_mutex);
    ++st.refused_hellos;
  }
  count_rejected();
  (*refusal_log)("ucx producer: refused a hello on " + c->peer + ": " + why);
  reply(c, wire::ack_msg{m.seq, wire::status::unauthorized, 0, "producer: " + why, {}, {}});
  close_connection(c, "refused hello", false);
}

// Makes `ep`, the endpoint an authenticated hello came on, ours: a
// connection from this worker to the hello's address is matched by UCX to
// the endpoint the consumer's own connection made here, and handed back
// marked as the user's, with our error callback. (An endpoint UCX made for
// a peer's connection and nobody claimed is freed the moment its peer
// fails, leaving whoever kept its handle a dangling pointer.)
bool producer_impl::claim(ucp_ep_h ep, const wire::hello_msg& hello, std::string& why) {
  if (hello.address.empty()) {
    why = "no worker address";
    return false;
  }
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t*>(hello.address.data());
  p.err_handler.cb = &producer_impl::on_endpoint_error;
  p.err_handler.arg = this;
  ucp_ep_h own = nullptr;
  if (const ucs_status_t s = ucp_ep_create(worker.handle, &p, &own); s != UCS_OK) {
    why = std::string("a worker address UCX cannot connect to (") + ucs_status_string(s) + ")";
    return false;
  }
  if (own != ep) {
    strays.insert(own); // a new connection: closed after this progress
    why = "a worker address that is not its own";
    return false;
  }
  return true;
}

// UCX's error callback for endpoints we made ours: noted, handled after
// the progress call that reported it (nothing may be closed inside it).
void producer_impl::on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<producer_impl*>(arg);
  try {
    self->failed_endpoints.emplace_back(ep, status);
  } catch (...) {
    // Out of memory: its connection ends at the idle sweep instead.
  }
}

unsigned producer_impl::handle_failures() {
  unsigned n = 0;
  for (const auto& [ep, status] : std::exchange(failed_endpoints, {})) {
    ++n;
    if (auto it = conns.find(ep); it != conns.end()) {
      {
        std::lock_guard<std::mutex> lock(stats_mutex);
        ++st.endpoint_failures;
      }
      // Its endpoint is not closed: UCX has swapped its lanes for failed
      // ones, so a close's flush only fails (UCX logs it as an error) and
      // the endpoint, connected from its peer's side, would still be kept
      // until the worker goes. It stays UCX's, allocated, its address not
      // reused while we might still hold it.
      it->second->failed = true;
      close_connection(it->second, std::string("UCX reports its endpoint failed (") + ucs_status_string(status)
                                       + "): the consumer is gone");
    }
  }
  for (auto ep : std::exchange(strays, {})) // failed or not

    start_close(ep);
  return n;
}

void producer_impl::check_lanes(connection& c) {
  const lane_info l = ep_lanes(c.ep);
  c.refused = lanes_refused(l, options.transports);
  {
    std::lock_guard<std::mutex> lock(stats_mutex);
    st.data_transports.insert(l.data_tls.begin(), l.data_tls.end());
  }
  say(options.log, "ucx producer: connection from " + c.peer + " uses " + l.text + " [" + l.summary() + "]"
                       + (c.refused.empty() ? "" : "; refused: " + c.refused));
}

} // namespace rlsync::transfer::ucx_detail
