#pragma once
// A small synchronous HTTP/1.1 client with a deadline on every operation
// (Boost.Beast): tests drive rlsync's servers with it, and rlsync drives
// servers that speak vLLM's API. One connection, kept alive between
// requests and reopened when the server closed it.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace rlsync::http {

struct client_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct client_request {
  std::string method = "GET";
  std::string target = "/";
  std::string body; ///< sent with Content-Length (also when empty, for POST)
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
};

struct client_response {
  unsigned status = 0;
  std::map<std::string, std::string> headers; ///< lower-case names
  std::string body;
};

class client {
public:
  /// deadline bounds each request (connect, write and read together, from
  /// the call) and each wait for a stream event (from the call to
  /// next_event: bytes that end no event, such as comments, do not extend
  /// it). A host name, not an address, is looked up within the same
  /// deadline; while detail::max_lookups_in_flight lookups of calls that
  /// ended at their deadlines are still unanswered, or max_lookups_running
  /// run in all, a call by name is refused.
  client(std::string host, std::uint16_t port, std::chrono::milliseconds deadline = std::chrono::seconds(30));
  ~client();
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  /// Sends `rq` and reads the whole answer. Throws client_error on a
  /// connection failure, a malformed answer or the deadline.
  client_response send(const client_request& rq);
  /// Sets a header sent with every request (e.g. Authorization).
  void set_default_header(std::string name, std::string value);
  /// The largest answer body send() reads (default 256 MiB); a larger one
  /// is an error, read no further.
  void set_max_answer_bytes(std::uint64_t bytes);

  /// Sends `rq` and reads the answer's header; the body then comes event by
  /// event through next_event(). Returns status and headers (body empty).
  /// An answer other than 2xx is read whole (its error message, at most
  /// max_error_body_bytes) and returned with its body; no events follow.
  client_response open_stream(const client_request& rq);
  static constexpr std::uint64_t max_error_body_bytes = std::uint64_t{1} << 20;
  /// The next Server-Sent Event's data (its `data:` lines joined by "\n");
  /// nullopt once the stream ended, or when `stop` (asked before each read,
  /// and every stop_poll while a read waits) returns true. Throws
  /// client_error on the deadline and when the stream sends more than
  /// max_event_bytes without ending an event.
  std::optional<std::string> next_event(const std::function<bool()>& stop = {});
  static constexpr std::size_t max_event_bytes = std::size_t{16} << 20;
  static constexpr std::chrono::milliseconds stop_poll{100};

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// The addresses host name `host` resolves to, looked up as a client's
/// calls are (the system's resolver on a thread of its own, abandoned at
/// `until`; the detail:: bounds below). Throws client_error naming the host.
std::vector<std::string> resolve_addresses(const std::string& host, std::chrono::steady_clock::time_point until);

namespace detail {
inline constexpr int max_lookups_in_flight = 16; ///< abandoned by their calls, still unanswered
inline constexpr int max_lookups_running = 256;  ///< all together
/// Tests: `hook` runs on each lookup's thread before the system's resolver
/// (empty: none), so that a test can hold a lookup.
void set_lookup_hook(std::function<void(const std::string&)> hook);
/// Lookups whose call ended at its deadline and whose resolver has not
/// answered yet; at max_lookups_in_flight a call by name is refused at once.
int lookups_abandoned();
} // namespace detail

/// One request on a fresh connection.
client_response request_once(const std::string& host, std::uint16_t port, const client_request& rq,
                             std::chrono::milliseconds deadline = std::chrono::seconds(30));

} // namespace rlsync::http
