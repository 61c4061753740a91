// Joining a cluster: the TCP probe that bounds CAF's blocking connect.
#include "actors/assembly/member_node.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

using namespace rlsync;
using namespace std::chrono_literals;

namespace {

using clock_type = std::chrono::steady_clock;

/// A TCP socket on 127.0.0.1 with a port of its own; listening with a
/// backlog of `backlog` when asked, else bound only (so connects are refused).
struct local_socket {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  std::uint16_t port = 0;
  explicit local_socket(std::optional<int> backlog) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port = ntohs(addr.sin_port);
    if (backlog)
      REQUIRE(::listen(fd, *backlog) == 0);
  }
  ~local_socket() { ::close(fd); }
};

/// A connection left pending or established without anyone accepting it.
int connect_without_waiting(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  return fd;
}

} // namespace

TEST_CASE("probe_tcp: an accepted connection, a refused one, and a host name looked up first") {
  local_socket listening(8);
  std::string reached;
  CHECK(probe_tcp("127.0.0.1", listening.port, clock_type::now() + 5s, {}, &reached).empty());
  CHECK(reached == "127.0.0.1");
  local_socket bound_only(std::nullopt);
  CHECK(probe_tcp("127.0.0.1", bound_only.port, clock_type::now() + 5s, {}) == "Connection refused");
  reached.clear();
  CHECK(probe_tcp("localhost", listening.port, clock_type::now() + 5s, {}, &reached).empty());
  CHECK(reached == "127.0.0.1"); // what CAF is then given: nothing left for it to resolve
  CHECK(probe_tcp("no-such-host.invalid", listening.port, clock_type::now() + 5s, {})
          .rfind("cannot resolve no-such-host.invalid", 0)
        == 0);
}

TEST_CASE("probe_tcp: a head that answers no SYN ends the probe at its deadline or at a stop") {
  // Nobody accepts and the accept queue is full: Linux drops further SYNs
  // (the client would retry for about two minutes), as in a partition.
  local_socket head(0);
  std::vector<int> queued;
  for (int i = 0; i < 4; ++i)
    queued.push_back(connect_without_waiting(head.port));
  std::this_thread::sleep_for(100ms); // the handshakes the queue takes complete
  CHECK(probe_tcp("127.0.0.1", head.port, clock_type::now() + 300ms, {})
        == "no answer to a TCP connection by the deadline");
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(200ms);
    stop = true;
  });
  CHECK(probe_tcp("127.0.0.1", head.port, clock_type::now() + 60s, [&] { return stop.load(); }) == "stopped");
  stopper.join();
  for (int fd : queued)
    ::close(fd);
}
