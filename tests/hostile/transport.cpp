#include "tests/hostile/transport.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace rlsync::hostile {

namespace {

std::string openssl_errors() {
  std::string out;
  while (auto code = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(code, buf, sizeof buf);
    out += (out.empty() ? "" : "; ") + std::string(buf);
  }
  return out.empty() ? "no OpenSSL error recorded" : out;
}

int remaining_ms(time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()).count();
  if (left <= 0)
    return 0;
  return left > 60'000 ? 60'000 : static_cast<int>(left) + 1;
}

/// Waits for `events` on `fd`; false when the deadline passed first.
bool wait_for(int fd, short events, time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0)
      return true;
    if (n < 0 && errno == EINTR)
      continue;
    if (n == 0 && clock_type::now() < deadline)
      continue; // remaining_ms capped a long wait
    return false;
  }
}

} // namespace

endpoint parse_endpoint(const std::string& text) {
  endpoint e;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      throw std::invalid_argument("'" + text + "': expected [V6]:PORT");
    e.host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw std::invalid_argument("'" + text + "': expected HOST:PORT");
    e.host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    throw std::invalid_argument("'" + text + "': the port is not a number");
  auto p = std::stoul(port);
  if (p == 0 || p > 65535)
    throw std::invalid_argument("'" + text + "': port outside 1..65535");
  e.port = static_cast<std::uint16_t>(p);
  in6_addr a6;
  in_addr a4;
  if (inet_pton(AF_INET, e.host.c_str(), &a4) != 1 && inet_pton(AF_INET6, e.host.c_str(), &a6) != 1)
    throw std::invalid_argument("'" + text + "': the host is not a numeric IPv4 or IPv6 address");
  return e;
}

std::string to_string(const endpoint& e) {
  return (e.host.find(':') != std::string::npos ? "[" + e.host + "]" : e.host) + ":" + std::to_string(e.port);
}

const char* to_string(io_status s) {
  switch (s) {
    case io_status::ok: return "ok";
    case io_status::timeout: return "timeout";
    case io_status::closed: return "closed by the peer";
    default: return "failed";
  }
}

connection::connection(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}

connection::~connection() {
  if (ssl_)
    SSL_free(ssl_); // no shutdown alert: a hostile client just goes away
  ::close(fd_);
}

io_status connection::write_all(const char* data, std::size_t n, time_point deadline) {
  while (n > 0) {
    short want = POLLOUT;
    long done = 0;
    if (ssl_) {
      ERR_clear_error();
      int chunk = n > (1u << 30) ? (1 << 30) : static_cast<int>(n);
      int r = SSL_write(ssl_, data, chunk);
      if (r > 0) {
        done = r;
      } else {
        int e = SSL_get_error(ssl_, r);
        if (e == SSL_ERROR_WANT_READ)
          want = POLLIN;
        else if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && (errno == EPIPE || errno == ECONNRESET)))
          return io_status::closed;
        else if (e != SSL_ERROR_WANT_WRITE)
          return problem_ = "TLS write: " + openssl_errors(), io_status::failed;
      }
    } else {
      auto r = ::send(fd_, data, n, MSG_NOSIGNAL);
      if (r > 0)
        done = r;
      else if (r < 0 && errno == EINTR)
        continue;
      else if (r < 0 && (errno == EPIPE || errno == ECONNRESET))
        return io_status::closed;
      else if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
        return problem_ = std::string("send: ") + std::strerror(errno), io_status::failed;
    }
    if (done > 0) {
      data += done;
      n -= static_cast<std::size_t>(done);
      continue;
    }
    if (!wait_for(fd_, want, deadline))
      return io_status::timeout;
  }
  return io_status::ok;
}

io_status connection::read_some(std::vector<char>& into, std::size_t max_bytes, time_point deadline) {
  if (max_bytes == 0)
    return io_status::ok;
  std::size_t chunk = max_bytes < 65536 ? max_bytes : 65536;
  char buf[65536];
  for (;;) {
    short want = POLLIN;
    if (ssl_) {
      ERR_clear_error();
      int r = SSL_read(ssl_, buf, static_cast<int>(chunk));
      if (r > 0) {
        into.insert(into.end(), buf, buf + r);
        return io_status::ok;
      }
      int e = SSL_get_error(ssl_, r);
      if (e == SSL_ERROR_WANT_WRITE)
        want = POLLOUT;
      else if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && (r == 0 || errno == ECONNRESET)))
        return io_status::closed;
      else if (e != SSL_ERROR_WANT_READ)
        return problem_ = "TLS read: " + openssl_errors(), io_status::failed;
    } else {
      auto r = ::recv(fd_, buf, chunk, 0);
      if (r > 0) {
        into.insert(into.end(), buf, buf + r);
        return io_status::ok;
      }
      if (r == 0 || (r < 0 && errno == ECONNRESET))
        return io_status::closed;
      if (r < 0 && errno == EINTR)
        continue;
      if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
        return problem_ = std::string("recv: ") + std::strerror(errno), io_status::failed;
    }
    if (clock_type::now() >= deadline || !wait_for(fd_, want, deadline))
      return io_status::timeout;
  }
}

std::shared_ptr<SSL_CTX> make_tls_context(const tls_options& o) {
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  if (!ctx)
    throw std::runtime_error("TLS: cannot make a context: " + openssl_errors());
  if (o.anonymous) {
    // What CAF's openssl module speaks when no certificate is configured:
    // anonymous ECDH, which exists only up to TLS 1.2.
    SSL_CTX_set_max_proto_version(ctx.get(), TLS1_2_VERSION);
    if (SSL_CTX_set_cipher_list(ctx.get(), "AECDH-AES256-SHA@SECLEVEL=0") != 1)
      throw std::runtime_error("TLS: anonymous cipher refused: " + openssl_errors());
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
    return ctx;
  }
  if (o.cert.empty() != o.key.empty())
    throw std::runtime_error("TLS: --tls-cert and --tls-key go together");
  if (!o.cert.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx.get(), o.cert.c_str()) != 1)
      throw std::runtime_error("TLS: " + o.cert + ": " + openssl_errors());
    if (SSL_CTX_use_PrivateKey_file(ctx.get(), o.key.c_str(), SSL_FILETYPE_PEM) != 1)
      throw std::runtime_error("TLS: " + o.key + ": " + openssl_errors());
    if (SSL_CTX_check_private_key(ctx.get()) != 1)
      throw std::runtime_error("TLS: " + o.key + " does not match " + o.cert);
  }
  if (!o.ca.empty()) {
    if (SSL_CTX_load_verify_locations(ctx.get(), o.ca.c_str(), nullptr) != 1)
      throw std::runtime_error("TLS: " + o.ca + ": " + openssl_errors());
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  } else {
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr); // an attacker does not care who answers
  }
  SSL_CTX_set_cipher_list(ctx.get(), "HIGH:!aNULL:!MD5");
  return ctx;
}

opened open_connection(const endpoint& to, SSL_CTX* tls, time_point deadline) {
  opened out;
  sockaddr_storage addr{};
  socklen_t len = 0;
  auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (inet_pton(AF_INET, to.host.c_str(), &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons(to.port);
    len = sizeof *a4;
  } else if (inet_pton(AF_INET6, to.host.c_str(), &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(to.port);
    len = sizeof *a6;
  } else {
    out.problem = "not a numeric address: " + to.host;
    return out;
  }
  int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    out.problem = std::string("socket: ") + std::strerror(errno);
    return out;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    if (errno != EINPROGRESS) {
      out.problem = std::string("connect: ") + std::strerror(errno);
      ::close(fd);
      return out;
    }
    if (!wait_for(fd, POLLOUT, deadline)) {
      out.problem = "connect: no answer by the deadline";
      ::close(fd);
      return out;
    }
    int err = 0;
    socklen_t elen = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
    if (err != 0) {
      out.problem = std::string("connect: ") + std::strerror(err);
      ::close(fd);
      return out;
    }
  }
  if (!tls) {
    out.status = open_status::ok;
    out.conn = std::make_unique<connection>(fd, nullptr);
    return out;
  }
  SSL* ssl = SSL_new(tls);
  if (!ssl) {
    out.problem = "TLS: " + openssl_errors();
    ::close(fd);
    return out;
  }
  SSL_set_fd(ssl, fd);
  out.conn = std::make_unique<connection>(fd, ssl); // owns fd and ssl from here
  for (;;) {
    ERR_clear_error();
    int r = SSL_connect(ssl);
    if (r == 1) {
      out.status = open_status::ok;
      return out;
    }
    int e = SSL_get_error(ssl, r);
    short want = e == SSL_ERROR_WANT_READ ? POLLIN : e == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
    if (want == 0) {
      out.status = open_status::tls_refused;
      out.problem = "TLS handshake: " + openssl_errors();
      out.conn.reset();
      return out;
    }
    if (!wait_for(fd, want, deadline)) {
      out.status = open_status::tls_refused;
      out.problem = "TLS handshake: not completed by the deadline";
      out.conn.reset();
      return out;
    }
  }
}

} // namespace rlsync::hostile
