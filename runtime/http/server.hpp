#pragma once
// A small HTTP/1.1 server for rlsync's control and completion ports, on
// Boost.Beast + Asio (header-only, from Debian).
//
// Shape (other components mount routes on it: `rlsync serve`'s control
// routes, /v1/completions, /metrics):
//   server srv{options};
//   srv.route("GET", "/health", [](const request& rq, std::shared_ptr<responder> r) {
//     r->reply({200, "application/json", ""});
//   }, /*needs_token=*/false);
//   auto port = srv.start();   // bound port (options.port 0: ephemeral)
//   ...
//   srv.stop();
//
// One I/O thread runs every connection. Handlers run on it and must not
// block: they hand the responder to whoever answers (an actor, a thread),
// which completes it from any thread. A responder dropped without an answer
// answers 500, so a lost reply never hangs a client.
//
// Bounds: connections (extra ones get 503 and are closed), header and body
// bytes (431 / 413), a deadline for reading a whole request (a slow client
// is cut), one for an idle keep-alive connection, one per write (a client
// that stops reading is cut), and a bounded queue of stream chunks.
// Unknown path: 404 {"detail": "Not Found"}; known path, wrong method: 405.
// Every non-stream answer carries Content-Length; streams are chunked.
// With a bearer token configured, routes that need it answer 401 unless
// the request carries `Authorization: Bearer <token>`.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rlsync::http {

struct request {
  std::string method;                        ///< as sent, e.g. "POST"
  std::string target;                        ///< path and query as sent
  std::string path;                          ///< target without the query (not decoded)
  std::map<std::string, std::string> query;  ///< decoded (%XX and '+'); a repeated key keeps the last
  std::map<std::string, std::string> headers; ///< lower-case names
  std::string body;
  std::string peer; ///< "address:port" of the client
};

struct response {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  /// Extra header fields (e.g. Allow, WWW-Authenticate).
  std::vector<std::pair<std::string, std::string>> headers;
};

class connection; // one client connection (server.cpp)
struct server_core;

/// Completes one request. Thread-safe: any thread may call it, once it is
/// completed further calls do nothing.
class responder {
public:
  responder(std::shared_ptr<server_core> core, std::shared_ptr<connection> conn);
  ~responder(); ///< answers 500 when neither reply nor a stream happened
  responder(const responder&) = delete;
  responder& operator=(const responder&) = delete;

  /// A whole answer (with Content-Length). False when already completed,
  /// the client has gone or the server has stopped.
  bool reply(response r);
  /// Starts a chunked 200 answer (e.g. "text/event-stream").
  bool start_stream(const std::string& content_type);
  /// One chunk of a started stream. False once the client is gone, the
  /// stream's queue is full (the client reads too slowly: the stream is
  /// then cut, without its end, and later writes and finish() do nothing)
  /// or it finished; the caller should then stop producing.
  bool write(std::string chunk);
  /// Ends a started stream.
  void finish();
  /// True once the client has gone (or the server stopped).
  bool client_gone() const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

using handler = std::function<void(const request&, std::shared_ptr<responder>)>;

struct server_options {
  std::string host = "127.0.0.1"; ///< loopback unless told otherwise
  std::uint16_t port = 0;         ///< 0: ephemeral
  std::size_t max_connections = 64;
  /// Connections from one client address; 0: only max_connections bounds them.
  std::size_t max_connections_per_address = 0;
  std::size_t max_body_bytes = 8u << 20;
  std::size_t max_header_bytes = 16u << 10;
  std::chrono::milliseconds request_read_deadline{10000}; ///< a whole request, from its first read
  std::chrono::milliseconds idle_deadline{60000};         ///< waiting for the next request on keep-alive
  std::chrono::milliseconds write_deadline{30000};        ///< one answer or one stream chunk
  std::size_t max_stream_queue_bytes = 4u << 20;          ///< chunks not yet written, per stream
  std::optional<std::string> bearer_token;
};

class server {
public:
  explicit server(server_options options);
  ~server(); ///< stops
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// Mounts `h` for `method` on `path` (exact match, no query). Call before
  /// start(). needs_token: requires the bearer token when one is configured.
  void route(std::string method, std::string path, handler h, bool needs_token = true);
  /// Binds, starts the I/O thread and returns the bound port. Throws
  /// std::runtime_error when the address cannot be bound.
  std::uint16_t start();
  /// Closes the listener and every connection and joins the I/O thread.
  void stop();
  const server_options& options() const;
  /// Connections open now.
  std::size_t connections() const;
  /// Accepts that failed (out of file descriptors, say); each waits
  /// accept_retry before the next.
  std::size_t accept_failures() const;

private:
  std::shared_ptr<server_core> core_;
};

/// Decodes %XX and '+' (application/x-www-form-urlencoded); nullopt for a
/// malformed escape.
std::optional<std::string> url_decode(const std::string& s);
/// Splits "a=1&b=two" into decoded pairs; nullopt when an escape is malformed.
std::optional<std::map<std::string, std::string>> parse_query(const std::string& query);

} // namespace rlsync::http
