#include "runtime/transfer/ucx/address.hpp"

#include "runtime/transfer/ucx/ucx_transfer.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
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

namespace rlsync::transfer {

std::string ucx_net_device_for(const std::string& address, std::string* why) {
  auto fail = [&](const std::string& reason) {
    if (why)
      *why = reason;
    return std::string();
  };
  if (address.empty() || address == "0.0.0.0" || address == "::")
    return fail("'" + address + "' is a wildcard address: every interface is meant");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(address.c_str(), nullptr, &hints, &found); rc != 0)
    return fail("'" + address + "' does not resolve: " + gai_strerror(rc));
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) {
    freeaddrinfo(found);
    return fail(std::string("cannot list this machine's interfaces: ") + std::strerror(errno));
  }
  std::string device;
  for (const addrinfo* a = found; a && device.empty(); a = a->ai_next)
    for (const ifaddrs* i = ifs; i && device.empty(); i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != a->ai_addr->sa_family)
        continue;
      if (a->ai_family == AF_INET) {
        const auto* x = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
        const auto* y = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
        // 127.0.0.0/8 is all on lo, whichever of its addresses lo lists.
        const bool loopback = (ntohl(x->sin_addr.s_addr) >> 24) == 127 && (i->ifa_flags & IFF_LOOPBACK);
        if (loopback || x->sin_addr.s_addr == y->sin_addr.s_addr)
          device = i->ifa_name;
      } else if (a->ai_family == AF_INET6) {
        const auto* x = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
        const auto* y = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
        if (std::memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0)
          device = i->ifa_name;
      }
    }
  freeifaddrs(ifs);
  freeaddrinfo(found);
  if (device.empty())
    return fail("'" + address + "' belongs to no interface of this machine");
  return device;
}

} // namespace rlsync::transfer
