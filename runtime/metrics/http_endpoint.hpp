#pragma once
// GET /metrics (Prometheus text format 0.0.4) and GET /health on an HTTP
// server: mounted on a server that serves other routes too (`rlsync serve`),
// or on a node's own metrics port (metrics_server).
#include "runtime/http/server.hpp"
#include "runtime/metrics/registry.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace rlsync::metrics {

/// Mounts GET /metrics, rendering `r` (it needs the bearer token when the
/// server has one). Call before srv.start().
void mount_metrics(http::server& srv, std::shared_ptr<const registry> r);

/// A node's metrics port: /metrics and /health (which never needs the token).
class metrics_server {
public:
  /// Binds `host:port` (0: ephemeral) with the token when one is given.
  /// Throws std::runtime_error naming the address when it cannot bind.
  metrics_server(std::shared_ptr<const registry> r, const std::string& host, std::uint16_t port,
                 std::optional<std::string> bearer_token);
  ~metrics_server();
  metrics_server(const metrics_server&) = delete;
  metrics_server& operator=(const metrics_server&) = delete;

  std::uint16_t port() const { return port_; }
  /// "http://host:port/metrics"
  std::string url() const;

private:
  std::string host_;
  std::unique_ptr<http::server> server_;
  std::uint16_t port_ = 0;
};

/// The bearer token in `file` (its first line, surrounding blanks removed);
/// throws std::runtime_error naming the key (`key`, the topology's field)
/// and the file when it cannot be read or is empty.
std::string read_api_key_file(const std::string& file, const std::string& key = "cluster.http_api_key_file");

} // namespace rlsync::metrics
