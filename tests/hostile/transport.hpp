#pragma once
// The hostile peer's byte pipe: plain TCP, or TLS through OpenSSL (with a
// certificate, or anonymous as CAF's openssl module falls back to). Every
// call takes a deadline and returns by it: the client never hangs.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace rlsync::hostile {

using clock_type = std::chrono::steady_clock;
using time_point = clock_type::time_point;

inline time_point after(std::chrono::milliseconds d) { return clock_type::now() + d; }

struct endpoint {
  std::string host; ///< numeric address (v4, or v6 without brackets)
  std::uint16_t port = 0;
};

/// "HOST:PORT" or "[V6]:PORT"; throws std::invalid_argument naming the text.
endpoint parse_endpoint(const std::string& text);
std::string to_string(const endpoint& e);

struct tls_options {
  std::string ca, cert, key; ///< PEM files; cert and key go together
  bool anonymous = false;    ///< no certificate: anonymous ECDH, as CAF without settings
  bool enabled() const { return anonymous || !ca.empty() || !cert.empty() || !key.empty(); }
};

enum class io_status {
  ok,
  timeout, ///< the deadline passed
  closed,  ///< the peer closed (or reset) the connection
  failed,  ///< anything else (TLS alert, socket error)
};
const char* to_string(io_status s);

class connection {
public:
  connection(int fd, SSL* ssl);
  ~connection();
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  io_status write_all(const char* data, std::size_t n, time_point deadline);
  io_status write_all(const std::vector<char>& b, time_point deadline) { return write_all(b.data(), b.size(), deadline); }
  /// Appends what arrives to `into` (at most `max_bytes`); waits for at least
  /// one byte until `deadline`. A deadline in the past polls once.
  io_status read_some(std::vector<char>& into, std::size_t max_bytes, time_point deadline);
  int fd() const { return fd_; }
  /// What the last failure was (OpenSSL's error queue, errno).
  const std::string& problem() const { return problem_; }

private:
  int fd_;
  SSL* ssl_;
  std::string problem_;
};

enum class open_status {
  ok,
  unreachable,  ///< TCP connect failed or timed out: nothing was attacked
  tls_refused,  ///< TCP connected, the TLS handshake failed: the head refused us
};

struct opened {
  open_status status = open_status::unreachable;
  std::unique_ptr<connection> conn;
  std::string problem;
};

/// A TLS client context for `o`; throws std::runtime_error naming the file
/// OpenSSL refused. Shared by every connection of one run.
std::shared_ptr<SSL_CTX> make_tls_context(const tls_options& o);

/// Connects to `to` and, with `tls` non-null, completes a TLS handshake, all by `deadline`.
opened open_connection(const endpoint& to, SSL_CTX* tls, time_point deadline);

} // namespace rlsync::hostile
