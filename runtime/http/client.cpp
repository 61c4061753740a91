#include "runtime/http/client.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <netdb.h>
#include <sys/socket.h>

#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <system_error>
#include <thread>

namespace rlsync::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

// A host name is looked up on a thread of its own, so that a call waits for
// the system resolver no longer than its deadline: getaddrinfo cannot be
// interrupted. A lookup that outlives its call is abandoned and finishes on
// its own; at most max_lookups_in_flight abandoned ones may be running, so a
// resolver that never answers holds a bounded number of threads, and at most
// max_lookups_running in all (callers that start together, each within its
// deadline, could otherwise all pass the first bound before any is counted).
struct name_lookup {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  bool abandoned = false; // its call ended at the deadline
  std::vector<tcp::endpoint> endpoints;
  std::string error;
};

std::atomic<int> lookups_abandoned{0};
std::atomic<int> lookups_running{0};
std::mutex lookup_hook_mutex;
std::function<void(const std::string&)> lookup_hook; // tests: runs before the resolver

// getaddrinfo itself, not asio's resolver, on the lookup's thread: a lookup
// that ends after main returned touches no library state being torn down.
void look_up(name_lookup& lookup, const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  std::vector<tcp::endpoint> endpoints;
  for (const addrinfo* a = found; rc == 0 && a; a = a->ai_next) {
    tcp::endpoint e;
    if ((a->ai_family != AF_INET && a->ai_family != AF_INET6) || a->ai_addrlen > e.capacity())
      continue; // not an IP address asio's endpoint holds
    std::memcpy(e.data(), a->ai_addr, a->ai_addrlen);
    e.resize(a->ai_addrlen);
    endpoints.push_back(e);
  }
  if (found)
    ::freeaddrinfo(found);
  std::lock_guard<std::mutex> lock(lookup.m);
  lookup.endpoints = std::move(endpoints);
  if (rc != 0)
    lookup.error = ::gai_strerror(rc);
  else if (lookup.endpoints.empty())
    lookup.error = "no address";
  lookup.done = true;
  if (lookup.abandoned)
    lookups_abandoned.fetch_sub(1);
  lookups_running.fetch_sub(1);
}

std::vector<tcp::endpoint> resolve_until(const std::string& host, std::uint16_t port,
                                         std::chrono::steady_clock::time_point until) {
  if (lookups_abandoned.load() >= detail::max_lookups_in_flight)
    throw client_error("cannot resolve " + host + ": " + std::to_string(detail::max_lookups_in_flight)
                       + " earlier lookups are still unanswered past their calls' deadlines (is the system's "
                         "resolver answering?)");
  if (lookups_running.fetch_add(1) >= detail::max_lookups_running) {
    lookups_running.fetch_sub(1);
    throw client_error("cannot resolve " + host + ": " + std::to_string(detail::max_lookups_running)
                       + " lookups are running already");
  }
  auto lookup = std::make_shared<name_lookup>();
  std::function<void(const std::string&)> hook;
  {
    std::lock_guard<std::mutex> lock(lookup_hook_mutex);
    hook = lookup_hook;
  }
  try {
    std::thread([lookup, host, port, hook = std::move(hook)] {
      if (hook)
        hook(host);
      look_up(*lookup, host, port);
      lookup->cv.notify_all();
    }).detach();
  } catch (const std::system_error& e) {
    lookups_running.fetch_sub(1);
    throw client_error("cannot resolve " + host + ": no thread for the lookup (" + e.what() + ")");
  }
  std::unique_lock<std::mutex> lock(lookup->m);
  if (!lookup->cv.wait_until(lock, until, [&] { return lookup->done; })) {
    lookup->abandoned = true;
    lookups_abandoned.fetch_add(1);
    throw client_error("cannot resolve " + host + ": the system's resolver did not answer within the deadline");
  }
  if (!lookup->error.empty())
    throw client_error("cannot resolve " + host + ": " + lookup->error);
  return std::move(lookup->endpoints);
}

} // namespace

std::vector<std::string> resolve_addresses(const std::string& host, std::chrono::steady_clock::time_point until) {
  std::vector<std::string> out;
  for (const auto& e : resolve_until(host, 0, until))
    out.push_back(e.address().to_string());
  return out;
}

namespace detail {
void set_lookup_hook(std::function<void(const std::string&)> hook) {
  std::lock_guard<std::mutex> lock(lookup_hook_mutex);
  lookup_hook = std::move(hook);
}
int lookups_abandoned() { return rlsync::http::lookups_abandoned.load(); }
} // namespace detail

struct client::impl {
  std::string host;
  std::uint16_t port;
  std::chrono::milliseconds deadline;
  std::chrono::steady_clock::time_point until; // of the call under way: every step expires then
  std::uint64_t max_answer_bytes = std::uint64_t{256} << 20;
  std::size_t events_scanned = 0; // of pending_events, searched for an event's end already
  std::vector<std::pair<std::string, std::string>> default_headers;
  asio::io_context ioc{1};
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;
  std::optional<bhttp::response_parser<bhttp::string_body>> stream_parser;
  std::string pending_events;

  // Runs the queued operations until they complete (each carries its own deadline).
  void run() {
    ioc.restart();
    ioc.run();
  }

  void start_call() { until = std::chrono::steady_clock::now() + deadline; }

  void connect() {
    stream.emplace(ioc);
    buffer.clear();
    beast::error_code result;
    std::vector<tcp::endpoint> endpoints;
    beast::error_code ec;
    if (const auto address = asio::ip::make_address(host, ec); !ec) {
      endpoints.emplace_back(address, port); // an address: nothing to resolve
    } else {
      endpoints = resolve_until(host, port, until);
    }
    stream->expires_at(until);
    stream->async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) { result = e; });
    run();
    if (result) {
      stream.reset();
      throw client_error("cannot connect to " + host + ":" + std::to_string(port) + ": " + result.message());
    }
  }

  bhttp::request<bhttp::string_body> build(const client_request& rq) {
    bhttp::request<bhttp::string_body> req;
    req.version(11);
    req.method_string(rq.method);
    req.target(rq.target);
    req.set(bhttp::field::host, host + ":" + std::to_string(port));
    req.set(bhttp::field::user_agent, "rlsync");
    for (auto& [n, v] : default_headers)
      req.set(n, v);
    for (auto& [n, v] : rq.headers)
      req.set(n, v);
    if (!rq.body.empty() || rq.method != "GET") {
      if (!rq.body.empty())
        req.set(bhttp::field::content_type, rq.content_type);
      req.body() = rq.body;
    }
    req.keep_alive(true);
    req.prepare_payload();
    return req;
  }

  void write(const client_request& rq) {
    auto req = build(rq);
    for (int attempt = 0;; ++attempt) {
      if (!stream)
        connect();
      beast::error_code result;
      stream->expires_at(until);
      bhttp::async_write(*stream, req, [&](beast::error_code e, std::size_t) { result = e; });
      run();
      if (!result)
        return;
      stream.reset();
      // A kept-alive connection the server closed meanwhile: one fresh try.
      if (attempt > 0 || result == beast::error::timeout)
        throw client_error("cannot send " + rq.method + " " + rq.target + ": " + result.message());
    }
  }

  template <class Message> static std::map<std::string, std::string> headers_of(const Message& m) {
    std::map<std::string, std::string> out;
    for (auto& f : m) {
      std::string name(f.name_string());
      for (auto& c : name)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      out[name] = std::string(f.value());
    }
    return out;
  }
};

client::client(std::string host, std::uint16_t port, std::chrono::milliseconds deadline)
    : impl_(std::make_unique<impl>()) {
  impl_->host = std::move(host);
  impl_->port = port;
  impl_->deadline = deadline;
}

client::~client() = default;

void client::set_default_header(std::string name, std::string value) {
  impl_->default_headers.emplace_back(std::move(name), std::move(value));
}

void client::set_max_answer_bytes(std::uint64_t bytes) { impl_->max_answer_bytes = bytes; }

client_response client::send(const client_request& rq) {
  impl_->stream_parser.reset();
  impl_->start_call();
  impl_->write(rq);
  bhttp::response_parser<bhttp::string_body> parser;
  parser.body_limit(impl_->max_answer_bytes);
  beast::error_code result;
  auto fail = [&](const std::string& what) {
    impl_->stream.reset();
    throw client_error("no answer to " + rq.method + " " + rq.target + ": " + what);
  };
  impl_->stream->expires_at(impl_->until);
  // The header first: Boost 1.74's async_read checks a Content-Length
  // against the body limit only when the header arrives alone.
  const std::string over = "a body over " + std::to_string(impl_->max_answer_bytes) + " bytes";
  bhttp::async_read_header(*impl_->stream, impl_->buffer, parser, [&](beast::error_code e, std::size_t) { result = e; });
  impl_->run();
  if (result)
    fail(result == bhttp::error::body_limit ? over : result.message());
  if (auto length = parser.content_length(); length && *length > impl_->max_answer_bytes)
    fail(over);
  if (!parser.is_done()) {
    bhttp::async_read(*impl_->stream, impl_->buffer, parser, [&](beast::error_code e, std::size_t) { result = e; });
    impl_->run();
    if (result)
      fail(result == bhttp::error::body_limit ? over : result.message());
  }
  auto& msg = parser.get();
  client_response out{msg.result_int(), impl::headers_of(msg), std::move(msg.body())};
  if (!parser.keep_alive()) // the parser's: false also for a body that ended at close
    impl_->stream.reset();
  return out;
}

client_response client::open_stream(const client_request& rq) {
  impl_->start_call();
  impl_->write(rq);
  auto& parser = impl_->stream_parser.emplace();
  // No limit on a stream's length (next_event bounds each event). Not
  // boost::none: Boost 1.74 compares a Content-Length against the empty
  // optional as larger, and refuses every answer that has one.
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  impl_->pending_events.clear();
  impl_->events_scanned = 0;
  beast::error_code result;
  auto fail = [&](const std::string& what) {
    impl_->stream.reset();
    impl_->stream_parser.reset();
    throw client_error("no answer to " + rq.method + " " + rq.target + ": " + what);
  };
  impl_->stream->expires_at(impl_->until);
  bhttp::async_read_header(*impl_->stream, impl_->buffer, parser, [&](beast::error_code e, std::size_t) { result = e; });
  impl_->run();
  if (result)
    fail(result.message());
  auto& msg = parser.get();
  client_response head{msg.result_int(), impl::headers_of(msg), {}};
  if (head.status / 100 == 2)
    return head;
  // A refusal is not a stream: read its body (an error message, bounded) so
  // the caller can say why.
  // The parser checks a Content-Length against its limit only with the header.
  if (auto length = parser.content_length(); length && *length > max_error_body_bytes)
    fail("HTTP " + std::to_string(head.status) + " with a body of " + std::to_string(*length) + " bytes, over "
         + std::to_string(max_error_body_bytes));
  parser.body_limit(max_error_body_bytes);
  bhttp::async_read(*impl_->stream, impl_->buffer, parser, [&](beast::error_code e, std::size_t) { result = e; });
  impl_->run();
  if (result && result != bhttp::error::end_of_stream)
    fail("HTTP " + std::to_string(head.status) + ", then " + result.message());
  head.body = std::move(parser.get().body());
  if (!parser.keep_alive() || !parser.is_done()) // parser's: false also for a body that ended at close
    impl_->stream.reset();
  impl_->stream_parser.reset();
  return head;
}

std::optional<std::string> client::next_event(const std::function<bool()>& stop) {
  if (!impl_->stream_parser)
    return std::nullopt;
  auto& parser = *impl_->stream_parser;
  // One deadline for this event: a server that sends only comments (or an
  // event a byte at a time) does not hold the caller past it.
  impl_->start_call();
  for (;;) {
    // Events end with a blank line; "\r\n" line ends are allowed too.
    // Searched from where the last search ended (less what could be the
    // start of a separator cut by a read), not from the start each time.
    auto& text = impl_->pending_events;
    const std::size_t from = impl_->events_scanned > 3 ? impl_->events_scanned - 3 : 0;
    std::size_t end = std::string::npos, sep = 0;
    for (const char* s : {"\n\n", "\r\n\r\n"}) {
      auto at = text.find(s, from);
      if (at != std::string::npos && (end == std::string::npos || at < end)) {
        end = at;
        sep = std::char_traits<char>::length(s);
      }
    }
    impl_->events_scanned = text.size();
    if (end != std::string::npos) {
      std::string event = text.substr(0, end);
      text.erase(0, end + sep);
      impl_->events_scanned = 0;
      std::string data;
      bool any = false;
      std::size_t at = 0;
      while (at <= event.size()) {
        auto nl = event.find('\n', at);
        std::string line = event.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
        if (!line.empty() && line.back() == '\r')
          line.pop_back();
        if (line.rfind("data:", 0) == 0) {
          auto value = line.substr(5);
          if (!value.empty() && value.front() == ' ')
            value.erase(0, 1);
          data += (any ? "\n" : "") + value;
          any = true;
        }
        if (nl == std::string::npos)
          break;
        at = nl + 1;
      }
      if (any)
        return data;
      continue; // a comment or an event without data
    }
    if (text.size() > max_event_bytes) { // a server that never ends its event must not fill memory
      impl_->stream.reset();
      impl_->stream_parser.reset();
      throw client_error("stream broken: more than " + std::to_string(max_event_bytes)
                         + " bytes without the blank line that ends an event");
    }
    if (parser.is_done()) {
      impl_->stream_parser.reset();
      return std::nullopt;
    }
    if (stop && stop()) { // the rest of the stream is not read: the connection goes
      impl_->stream.reset();
      impl_->stream_parser.reset();
      return std::nullopt;
    }
    beast::error_code result;
    bool read = false;
    impl_->stream->expires_at(impl_->until);
    bhttp::async_read_some(*impl_->stream, impl_->buffer, parser, [&](beast::error_code e, std::size_t) {
      result = e;
      read = true;
    });
    // A silent server holds a read up to the deadline: `stop` is asked
    // every stop_poll meanwhile too, so a stream given up ends now.
    impl_->ioc.restart();
    while (!read) {
      impl_->ioc.run_for(stop_poll);
      if (!read && stop && stop()) {
        impl_->stream->cancel();
        impl_->run(); // the read ends, aborted
        impl_->stream.reset();
        impl_->stream_parser.reset();
        return std::nullopt;
      }
    }
    text += parser.get().body();
    parser.get().body().clear();
    if (result == bhttp::error::end_of_stream || (result && parser.is_done())) {
      impl_->stream.reset();
      impl_->stream_parser.reset();
      return std::nullopt;
    }
    if (result) {
      impl_->stream.reset();
      impl_->stream_parser.reset();
      if (result == beast::error::timeout)
        throw client_error("stream broken: no event within " + std::to_string(impl_->deadline.count()) + " ms");
      throw client_error("stream broken: " + result.message());
    }
  }
}

client_response request_once(const std::string& host, std::uint16_t port, const client_request& rq,
                             std::chrono::milliseconds deadline) {
  client c(host, port, deadline);
  return c.send(rq);
}

} // namespace rlsync::http
