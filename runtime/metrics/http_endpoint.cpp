#include "runtime/metrics/http_endpoint.hpp"

#include "runtime/base/regular_file.hpp"

#include <stdexcept>
#include <sys/stat.h>

namespace rlsync::metrics {

void mount_metrics(http::server& srv, std::shared_ptr<const registry> r) {
  srv.route(
    "GET", "/metrics",
    [r](const http::request&, std::shared_ptr<http::responder> out) {
      out->reply({200, exposition_content_type, r->render(), {}});
    },
    true);
}

metrics_server::metrics_server(std::shared_ptr<const registry> r, const std::string& host, std::uint16_t port,
                               std::optional<std::string> bearer_token)
  : host_(host) {
  http::server_options o;
  o.host = host;
  o.port = port;
  o.bearer_token = std::move(bearer_token);
  // Scrapers send small requests and hold few connections; one address
  // holding them all would keep every scraper out.
  o.max_connections = 16;
  o.max_connections_per_address = 4;
  o.max_body_bytes = 4096;
  server_ = std::make_unique<http::server>(o);
  mount_metrics(*server_, std::move(r));
  server_->route(
    "GET", "/health",
    [](const http::request&, std::shared_ptr<http::responder> out) { out->reply({200, "application/json", "", {}}); },
    false);
  try {
    port_ = server_->start();
  } catch (const std::exception& e) {
    throw std::runtime_error("metrics port " + host + ":" + std::to_string(port) + ": " + e.what());
  }
}

metrics_server::~metrics_server() {
  if (server_)
    server_->stop();
}

std::string metrics_server::url() const {
  auto host = host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_; // IPv6
  return "http://" + host + ":" + std::to_string(port_) + "/metrics";
}

std::string read_api_key_file(const std::string& file, const std::string& key) {
  const std::string what = key + " " + file;
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0)
    throw std::runtime_error(what + ": cannot be read");
  // As for the cluster secret: a token others can read or replace is no token.
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
    throw std::runtime_error(what + ": accessible by group or others; chmod 600 it");
  auto text = read_regular_file(file, 4096, what); // a token, not a document
  auto line = text.substr(0, text.find('\n'));
  auto begin = line.find_first_not_of(" \t\r");
  auto end = line.find_last_not_of(" \t\r");
  if (begin == std::string::npos)
    throw std::runtime_error(what + ": the first line is empty");
  return line.substr(begin, end - begin + 1);
}

} // namespace rlsync::metrics
