#pragma once
// Internal to the ucx backend: producer addresses ("host:port",
// "[v6]:port") and the socket addresses UCX listens on and connects to.
#include <sys/socket.h>

#include <string>

namespace rlsync::transfer::ucx_detail {

struct host_port {
  std::string host;
  std::string port;
};

/// Throws std::invalid_argument for a malformed address or port.
host_port split_address(const std::string& address);
// Throws std::runtime_error when the name does not resolve.
sockaddr_storage resolve(const host_port& hp, socklen_t& len, bool passive);
/// "host:port", "[v6]:port", or "?" for another family.
std::string sockaddr_string(const sockaddr_storage& ss);

} // namespace rlsync::transfer::ucx_detail
