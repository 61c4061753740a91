#include "runtime/transfer/ucx/ucx_transfer.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

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
