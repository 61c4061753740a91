#include "runtime/transfer/ucx/address.hpp"

#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace rlsync::transfer::ucx_detail {

host_port split_address(const std::string& address) {
  host_port hp;
  if (!address.empty() && address.front() == '[') {
    const auto close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':')
      throw std::invalid_argument("ucx: malformed address '" + address + "' (expected [v6]:port)");
    hp.host = address.substr(1, close - 1);
    hp.port = address.substr(close + 2);
  } else {
    const auto colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw std::invalid_argument("ucx: malformed address '" + address + "' (expected host:port)");
    hp.host = address.substr(0, colon);
    hp.port = address.substr(colon + 1);
  }
  if (hp.port.empty() || hp.port.size() > 5 || !std::all_of(hp.port.begin(), hp.port.end(), ::isdigit)
      || std::stoul(hp.port) == 0 || std::stoul(hp.port) > 65535)
    throw std::invalid_argument("ucx: malformed port in address '" + address + "'");
  return hp;
}

sockaddr_storage resolve(const host_port& hp, socklen_t& len, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(hp.host.empty() ? nullptr : hp.host.c_str(), hp.port.c_str(), &hints, &res);
  if (rc != 0 || !res)
    throw std::runtime_error("cannot resolve '" + hp.host + "': " + gai_strerror(rc));
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  len = res->ai_addrlen;
  freeaddrinfo(res);
  return ss;
}

std::string sockaddr_string(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  std::uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return "?";
}

} // namespace rlsync::transfer::ucx_detail
