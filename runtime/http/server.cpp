#include "runtime/http/server.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <deque>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <sys/socket.h>

namespace rlsync::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

std::string lower(std::string s) {
  for (auto& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

// Compares without an early exit, so that timing does not reveal how much
// of a guessed token was right.
bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

std::string json_detail(const char* detail) { return std::string("{\"detail\": \"") + detail + "\"}"; }

/// How long a failed accept waits before the next.
constexpr std::chrono::milliseconds accept_retry{100};

} // namespace

std::optional<std::string> url_decode(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%') {
      if (i + 2 >= s.size())
        return std::nullopt;
      int hi = hex_value(s[i + 1]), lo = hex_value(s[i + 2]);
      if (hi < 0 || lo < 0)
        return std::nullopt;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::optional<std::map<std::string, std::string>> parse_query(const std::string& query) {
  std::map<std::string, std::string> out;
  std::size_t at = 0;
  while (at <= query.size()) {
    auto amp = query.find('&', at);
    if (amp == std::string::npos)
      amp = query.size();
    auto part = query.substr(at, amp - at);
    if (!part.empty()) {
      auto eq = part.find('=');
      auto key = url_decode(part.substr(0, eq));
      auto value = url_decode(eq == std::string::npos ? std::string() : part.substr(eq + 1));
      if (!key || !value)
        return std::nullopt;
      out[*key] = *value;
    }
    at = amp + 1;
  }
  return out;
}

struct route_entry {
  handler h;
  bool needs_token = true;
};

struct server_core {
  // Declared before the io_context: connections destroyed while it is torn
  // down still update the count.
  server_options opt;
  std::map<std::string, std::map<std::string, route_entry>> routes; // path -> method -> route
  std::atomic<std::size_t> open{0};
  std::atomic<std::size_t> accept_failures{0};
  std::mutex mu;
  bool running = false; // posts are accepted
  bool started = false;

  asio::io_context ioc{1};
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::weak_ptr<connection>> live; // I/O thread only
  std::thread io_thread;
  std::weak_ptr<server_core> self;

  /// Runs `f` on the I/O thread; false once the server stopped.
  template <class F> bool post(F&& f) {
    std::lock_guard<std::mutex> lock(mu);
    if (!running)
      return false;
    asio::post(ioc, std::forward<F>(f));
    return true;
  }
  void accept();
  void refuse(tcp::socket& socket);
  /// Whether the client of `socket` holds max_connections_per_address already.
  bool over_per_address_bound(const tcp::socket& socket) const;
};

class connection : public std::enable_shared_from_this<connection> {
public:
  connection(server_core* core, tcp::socket socket)
      : core_(core), stream_(std::move(socket)), idle_timer_(core->ioc) {
    ++core_->open;
    beast::error_code ec;
    auto ep = stream_.socket().remote_endpoint(ec);
    if (!ec) {
      peer_ = ep.address().to_string() + ":" + std::to_string(ep.port());
      peer_address_ = ep.address();
    }
  }
  ~connection() { --core_->open; }
  const asio::ip::address& peer_address() const { return peer_address_; }

  void start() { read_request(); }

  /// Closes the socket; pending operations end with an error.
  void close() {
    gone_ = true;
    idle_timer_.cancel();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

  void send(response r) {
    if (gone_)
      return;
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>();
    res->version(11);
    res->result(r.status);
    res->set(bhttp::field::server, "rlsync");
    if (!r.content_type.empty())
      res->set(bhttp::field::content_type, r.content_type);
    for (auto& [name, value] : r.headers)
      res->set(name, value);
    res->keep_alive(keep_alive_);
    res->body() = std::move(r.body);
    res->prepare_payload(); // Content-Length, also for an empty body
    stream_.expires_after(core_->opt.write_deadline);
    bhttp::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
      if (ec || !self->keep_alive_)
        return self->close();
      self->read_request();
    });
  }

  void begin_stream(const std::string& content_type) {
    if (gone_)
      return;
    std::string head = "HTTP/1.1 200 OK\r\nServer: rlsync\r\nContent-Type: " + content_type +
                       "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
    head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    enqueue(std::move(head), 0);
  }

  void stream_chunk(std::string data, std::size_t counted) {
    if (data.empty()) // an empty chunk would end the stream
      return;
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    enqueue(std::string(size) + data + "\r\n", counted);
  }

  void end_stream() {
    enqueue("0\r\n\r\n", 0);
    finishing_ = true;
    pump();
  }

  std::atomic<bool>& gone() { return gone_; }
  std::atomic<std::size_t>& queued_bytes() { return queued_bytes_; }
  const server_options& options() const { return core_->opt; }

private:
  struct pending_write {
    std::string bytes;
    std::size_t counted = 0; // added to queued_bytes by the writer
  };

  void enqueue(std::string bytes, std::size_t counted) {
    if (gone_) {
      queued_bytes_ -= counted;
      return;
    }
    out_.push_back({std::move(bytes), counted});
    pump();
  }

  void pump() {
    if (writing_ || gone_)
      return;
    if (out_.empty()) {
      if (finishing_) {
        finishing_ = false;
        if (keep_alive_)
          read_request();
        else
          close();
      }
      return;
    }
    writing_ = true;
    stream_.expires_after(core_->opt.write_deadline);
    asio::async_write(stream_, asio::buffer(out_.front().bytes),
                      [self = shared_from_this()](beast::error_code ec, std::size_t) {
                        self->writing_ = false;
                        self->queued_bytes_ -= self->out_.front().counted;
                        self->out_.pop_front();
                        if (ec) {
                          for (auto& w : self->out_)
                            self->queued_bytes_ -= w.counted;
                          self->out_.clear();
                          return self->close();
                        }
                        self->pump();
                      });
  }

  void read_request() {
    if (gone_)
      return;
    parser_.emplace();
    parser_->body_limit(core_->opt.max_body_bytes);
    parser_->header_limit(static_cast<std::uint32_t>(
        std::min<std::size_t>(core_->opt.max_header_bytes, std::numeric_limits<std::uint32_t>::max())));
    if (first_ || buffer_.size() > 0) {
      first_ = false;
      return read_with_deadline();
    }
    // Keep-alive: wait for the next request's first byte under the idle
    // deadline, then read it whole under the request deadline.
    idle_timer_.expires_after(core_->opt.idle_deadline);
    idle_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec)
        self->close();
    });
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      self->idle_timer_.cancel();
      if (ec || self->gone_)
        return self->close();
      self->read_with_deadline();
    });
  }

  void read_with_deadline() {
    stream_.expires_after(core_->opt.request_read_deadline);
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

  void answer_and_close(unsigned status, const char* detail) {
    keep_alive_ = false;
    send({status, "application/json", json_detail(detail), {}});
  }

  void on_read(beast::error_code ec) {
    if (ec == bhttp::error::body_limit)
      return answer_and_close(413, "Request body too large");
    if (ec == bhttp::error::header_limit)
      return answer_and_close(431, "Request header fields too large");
    if (ec == bhttp::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::operation_aborted ||
        ec == asio::error::eof || ec == asio::error::connection_reset)
      return close();
    if (ec)
      return answer_and_close(400, "Bad Request");
    auto& msg = parser_->get();
    keep_alive_ = msg.keep_alive();

    request rq;
    rq.method = std::string(msg.method_string());
    rq.target = std::string(msg.target());
    auto q = rq.target.find('?');
    rq.path = rq.target.substr(0, q);
    if (q != std::string::npos) {
      auto query = parse_query(rq.target.substr(q + 1));
      if (!query)
        return answer_and_close(400, "Malformed query string");
      rq.query = std::move(*query);
    }
    for (auto& field : msg)
      rq.headers[lower(std::string(field.name_string()))] = std::string(field.value());
    rq.body = std::move(msg.body());
    rq.peer = peer_;

    auto path_it = core_->routes.find(rq.path);
    if (path_it == core_->routes.end())
      return send({404, "application/json", json_detail("Not Found"), {}});
    auto method_it = path_it->second.find(rq.method);
    if (method_it == path_it->second.end()) {
      std::string allow;
      for (auto& [m, r] : path_it->second)
        allow += (allow.empty() ? "" : ", ") + m;
      return send({405, "application/json", json_detail("Method Not Allowed"), {{"Allow", allow}}});
    }
    if (method_it->second.needs_token && core_->opt.bearer_token) {
      auto auth = rq.headers.find("authorization");
      const std::string expected = "Bearer " + *core_->opt.bearer_token;
      if (auth == rq.headers.end() || !constant_time_equal(auth->second, expected))
        return send({401, "application/json", "{\"error\": \"Unauthorized\"}", {{"WWW-Authenticate", "Bearer"}}});
    }
    // The handler may answer at once (on this thread) or later from another.
    auto core = core_shared_.lock();
    if (!core)
      return close();
    auto r = std::make_shared<responder>(std::move(core), shared_from_this());
    try {
      method_it->second.h(rq, r);
    } catch (const std::exception&) {
      r->reply({500, "application/json",
                std::string("{\"error\": {\"message\": \"internal error\", \"type\": \"Internal Server Error\", "
                            "\"param\": null, \"code\": 500}}"),
                {}});
    }
  }

public:
  /// While a request is being answered, nothing reads the socket: a client
  /// that hung up would show only at the answer's write. A look without
  /// reading (on the I/O thread, like every other use of the socket) finds
  /// the end of the connection; data instead (a pipelined request) stays for
  /// the next read. client_gone() asks for one and sees its result next time.
  void probe_hangup() {
    if (gone_ || !stream_.socket().is_open())
      return;
    char byte;
    auto n = ::recv(stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      gone_ = true;
  }

private:

public:
  std::weak_ptr<server_core> core_shared_;

private:
  server_core* core_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  asio::steady_timer idle_timer_;
  std::string peer_;
  asio::ip::address peer_address_;
  bool first_ = true;
  bool keep_alive_ = false;
  bool writing_ = false;
  bool finishing_ = false;
  std::atomic<bool> gone_{false};
  std::atomic<std::size_t> queued_bytes_{0};
  std::deque<pending_write> out_;
};

// ---- responder ----

struct responder::impl {
  enum class state { fresh, replied, streaming, finished };
  std::shared_ptr<server_core> core; // declared first: released last
  std::mutex mu;
  std::shared_ptr<connection> conn;
  state st = state::fresh;
};

responder::responder(std::shared_ptr<server_core> core, std::shared_ptr<connection> conn)
    : impl_(std::make_unique<impl>()) {
  impl_->core = std::move(core);
  impl_->conn = std::move(conn);
}

responder::~responder() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->conn || !impl_->core)
    return;
  auto conn = std::move(impl_->conn);
  if (impl_->st == impl::state::fresh) {
    impl_->core->post([conn] {
      conn->send({500, "application/json",
                  "{\"error\": {\"message\": \"the request was dropped without an answer\", \"type\": "
                  "\"Internal Server Error\", \"param\": null, \"code\": 500}}",
                  {}});
    });
  } else if (impl_->st == impl::state::streaming) {
    // Unfinished stream: cut it, so the client does not take it for complete.
    impl_->core->post([conn] { conn->close(); });
  }
}

bool responder::reply(response r) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->st != impl::state::fresh || !impl_->conn || !impl_->core)
    return false;
  impl_->st = impl::state::replied;
  auto conn = std::move(impl_->conn);
  if (conn->gone())
    return false; // the client hung up: nobody reads it
  return impl_->core->post([conn, r = std::move(r)]() mutable { conn->send(std::move(r)); });
}

bool responder::start_stream(const std::string& content_type) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->st != impl::state::fresh || !impl_->conn || !impl_->core)
    return false;
  impl_->st = impl::state::streaming;
  return impl_->core->post([conn = impl_->conn, content_type] { conn->begin_stream(content_type); });
}

bool responder::write(std::string chunk) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->st != impl::state::streaming || !impl_->conn || !impl_->core || impl_->conn->gone())
    return false;
  if (chunk.empty())
    return true;
  auto& queued = impl_->conn->queued_bytes();
  const auto bound = impl_->conn->options().max_stream_queue_bytes;
  const auto size = chunk.size();
  if (size > bound || queued.load() > bound - size) {
    // The chunk is lost, so the stream is cut: later writes (smaller ones
    // would fit once the queue drains) and finish() must not make a stream
    // with a hole in it look whole to the client.
    impl_->st = impl::state::finished;
    impl_->core->post([conn = std::move(impl_->conn)] { conn->close(); });
    return false;
  }
  queued += size;
  if (!impl_->core->post([conn = impl_->conn, c = std::move(chunk), size]() mutable {
        conn->stream_chunk(std::move(c), size);
      })) {
    queued -= size;
    return false;
  }
  return true;
}

void responder::finish() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->st != impl::state::streaming || !impl_->conn || !impl_->core)
    return;
  impl_->st = impl::state::finished;
  auto conn = std::move(impl_->conn);
  impl_->core->post([conn] { conn->end_stream(); });
}

bool responder::client_gone() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->core)
    return true;
  {
    std::lock_guard<std::mutex> core_lock(impl_->core->mu);
    if (!impl_->core->running)
      return true;
  }
  if (!impl_->conn)
    return impl_->st != impl::state::streaming;
  if (impl_->conn->gone())
    return true;
  if (impl_->st == impl::state::fresh) // not answered yet: has it hung up meanwhile?
    // Weak: a queued probe must never be what keeps a connection (and its
    // socket) alive past the server's I/O context.
    impl_->core->post([conn = std::weak_ptr<connection>(impl_->conn)] {
      if (auto c = conn.lock())
        c->probe_hangup();
    });
  return false;
}

// ---- server ----

void server_core::refuse(tcp::socket& socket) {
  static const std::string body = "{\"detail\": \"Too many connections\"}";
  static const std::string busy = "HTTP/1.1 503 Service Unavailable\r\nServer: rlsync\r\nContent-Type: "
                                  "application/json\r\nContent-Length: " + std::to_string(body.size())
                                  + "\r\nConnection: close\r\n\r\n" + body;
  // Best effort and never blocking: the I/O thread serves everyone else.
  beast::error_code ec;
  socket.non_blocking(true, ec);
  if (ec) { // a blocking write or read here would hold the I/O thread
    socket.close(ec);
    return;
  }
  socket.write_some(asio::buffer(busy), ec);
  socket.shutdown(tcp::socket::shutdown_send, ec);
  // A request left unread would make the close a reset, which can destroy
  // the answer before the client reads it: take what has arrived (bounded).
  char sink[16384];
  for (int i = 0; i < 4 && socket.read_some(asio::buffer(sink), ec) > 0 && !ec; ++i) {
  }
  socket.close(ec);
}

bool server_core::over_per_address_bound(const tcp::socket& socket) const {
  if (opt.max_connections_per_address == 0)
    return false;
  beast::error_code ec;
  const auto from = socket.remote_endpoint(ec);
  if (ec)
    return false; // gone already: its first read fails
  std::size_t same = 0;
  for (const auto& weak : live) // at most max_connections
    if (auto c = weak.lock(); c && !c->gone() && c->peer_address() == from.address())
      ++same;
  return same >= opt.max_connections_per_address;
}

void server_core::accept() {
  acceptor->async_accept(ioc, [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor->is_open())
      return;
    if (ec) {
      // Out of descriptors (EMFILE, ENFILE) the connection stays in the
      // backlog and the listener is ready again at once: accepting again now
      // would spin a core until a descriptor frees. Try again shortly.
      ++accept_failures;
      auto retry = std::make_shared<asio::steady_timer>(ioc, accept_retry);
      retry->async_wait([this, retry](beast::error_code) {
        if (acceptor->is_open())
          accept();
      });
      return;
    }
    live.erase(std::remove_if(live.begin(), live.end(), [](auto& w) { return w.expired(); }), live.end());
    if (open.load() >= opt.max_connections || over_per_address_bound(socket)) {
      refuse(socket);
    } else {
      auto conn = std::make_shared<connection>(this, std::move(socket));
      conn->core_shared_ = self;
      live.push_back(conn);
      conn->start();
    }
    accept();
  });
}

server::server(server_options options) : core_(std::make_shared<server_core>()) {
  core_->opt = std::move(options);
  core_->self = core_;
}

server::~server() { stop(); }

void server::route(std::string method, std::string path, handler h, bool needs_token) {
  std::lock_guard<std::mutex> lock(core_->mu);
  if (core_->started)
    throw std::logic_error("http::server::route called after start");
  core_->routes[std::move(path)][std::move(method)] = route_entry{std::move(h), needs_token};
}

std::uint16_t server::start() {
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (core_->started)
      throw std::logic_error("http::server::start called twice");
    core_->started = true;
  }
  beast::error_code ec;
  auto address = asio::ip::make_address(core_->opt.host, ec);
  if (ec)
    throw std::runtime_error("http server: bad listen address '" + core_->opt.host + "': " + ec.message());
  tcp::endpoint endpoint{address, core_->opt.port};
  core_->acceptor.emplace(core_->ioc);
  core_->acceptor->open(endpoint.protocol(), ec);
  if (!ec)
    core_->acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec)
    core_->acceptor->bind(endpoint, ec);
  if (!ec)
    core_->acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    throw std::runtime_error("http server: cannot listen on " + core_->opt.host + ":" +
                             std::to_string(core_->opt.port) + ": " + ec.message());
  auto port = core_->acceptor->local_endpoint().port();
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->running = true;
  }
  core_->accept();
  core_->io_thread = std::thread([core = core_.get()] { core->ioc.run(); });
  return port;
}

void server::stop() {
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (!core_->running)
      return;
    core_->running = false;
  }
  asio::post(core_->ioc, [core = core_.get()] {
    beast::error_code ec;
    core->acceptor->close(ec);
    for (auto& w : core->live)
      if (auto c = w.lock())
        c->close();
    // Runs after the completions the closes just queued.
    asio::post(core->ioc, [core] { core->ioc.stop(); });
  });
  if (core_->io_thread.joinable())
    core_->io_thread.join();
}

const server_options& server::options() const { return core_->opt; }

std::size_t server::connections() const { return core_->open.load(); }

std::size_t server::accept_failures() const { return core_->accept_failures.load(); }

} // namespace rlsync::http
