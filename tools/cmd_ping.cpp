// rlsync ping: a heartbeat round trip between two processes over CAF's
// middleman, with rlsync's registered message types. Checks that two hosts
// (or network namespaces) can reach each other before a cluster is started.
#include "actors/interfaces.hpp"
#include "actors/system_config.hpp"
#include "actors/tls.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <thread>

namespace rlsync::tools {

namespace {

using clock_type = std::chrono::steady_clock;

std::pair<std::string, std::uint16_t> split_host_port(const std::string& text, const std::string& flag) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw cli::usage_error(flag + ": expected HOST:PORT, got '" + text + "'");
  auto port = cli::parse_count(text.substr(colon + 1), flag + " port");
  if (port > 65535)
    throw cli::usage_error(flag + ": port out of range, got '" + text + "'");
  return {text.substr(0, colon), static_cast<std::uint16_t>(port)};
}

struct responder_state {
  std::uint64_t served = 0;
};

heartbeat_actor::behavior_type responder(heartbeat_actor::stateful_pointer<responder_state> self,
                                         std::uint64_t count) {
  return {
    [=](heartbeat_atom, const heartbeat& hb) -> heartbeat {
      if (++self->state.served >= count)
        self->quit();
      return {"ping-listener", hb.seq};
    },
  };
}

int listen(caf::actor_system& sys, const std::string& where, std::uint64_t count,
           std::chrono::milliseconds deadline) {
  auto [host, port] = split_host_port(where, "--listen");
  auto actor = sys.spawn(responder, count);
  auto bound = publish_node(sys, actor, port, host);
  if (!bound) {
    std::cerr << "rlsync ping: cannot listen on " << where << ": " << sys.render(bound.error()) << "\n";
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    return 1;
  }
  std::cout << "listening on " << host << ":" << *bound << std::endl;
  caf::scoped_actor self{sys};
  self->monitor(actor);
  bool done = false;
  self->receive([&](caf::down_msg&) { done = true; },
                caf::after(deadline) >> [&] {});
  sys.middleman().close(*bound);
  if (!done) {
    std::cerr << "rlsync ping: " << count << " pings not received within " << deadline.count()
              << " ms\n";
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    return 1;
  }
  std::cout << "served " << count << " pings" << std::endl;
  return 0;
}

int connect(caf::actor_system& sys, const std::string& where, std::uint64_t count,
            std::chrono::milliseconds deadline) {
  auto [host, port] = split_host_port(where, "--connect");
  auto give_up = clock_type::now() + deadline;
  auto backoff = std::chrono::milliseconds(20);
  caf::expected<heartbeat_actor> peer{caf::error{}};
  for (int attempt = 1;; ++attempt) {
    peer = connect_node<heartbeat_actor>(sys, host, port);
    if (peer)
      break;
    if (clock_type::now() + backoff >= give_up) {
      std::cerr << "rlsync ping: cannot reach " << where << " after " << attempt
                << " attempts: " << sys.render(peer.error()) << "\n";
      return 1;
    }
    std::this_thread::sleep_for(backoff); // backoff between connection attempts
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  caf::scoped_actor self{sys};
  std::vector<double> rtt_ms;
  for (std::uint64_t seq = 1; seq <= count; ++seq) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - clock_type::now());
    if (left.count() <= 0) {
      std::cerr << "rlsync ping: deadline passed after " << (seq - 1) << " pings to " << where << "\n";
      return 1;
    }
    auto t0 = clock_type::now();
    bool ok = false;
    self->request(*peer, left, heartbeat_atom::value, heartbeat{"ping", seq})
      .receive(
        [&](const heartbeat& hb) {
          ok = hb.seq == seq;
          if (!ok)
            std::cerr << "rlsync ping: " << where << " answered seq " << hb.seq << " to " << seq << "\n";
        },
        [&](caf::error& err) {
          std::cerr << "rlsync ping: " << where << ": " << sys.render(err) << "\n";
        });
    if (!ok)
      return 1;
    rtt_ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
  }
  std::sort(rtt_ms.begin(), rtt_ms.end());
  std::cout << count << " pings to " << where << ": rtt min " << rtt_ms.front() << " ms, median "
            << rtt_ms[rtt_ms.size() / 2] << " ms, max " << rtt_ms.back() << " ms" << std::endl;
  return 0;
}

} // namespace

int cmd_ping(const arg_list& argv) {
  CLI::App app("A heartbeat round trip between two processes over CAF's middleman.\n"
               "The listener exits after serving N pings; both sides give up after the deadline.\n"
               "With --ca/--cert/--key both sides talk mutual TLS, as nodes with cluster.tls do.",
               "rlsync ping");
  cli::configure(app);
  std::string listen_at, connect_to;
  std::uint64_t count = 3, deadline_ms = 10000;
  auto listen_flag =
    app.add_option("--listen", listen_at, "serve pings on HOST:PORT (or --connect)")->type_name("HOST:PORT");
  auto connect_flag =
    app.add_option("--connect", connect_to, "ping HOST:PORT (or --listen)")->type_name("HOST:PORT");
  cli::add_count(app, "--count", count, "pings to serve or send")->default_val(count);
  cli::add_count(app, "--deadline-ms", deadline_ms, "give up after this long")->default_val(deadline_ms);
  tls_spec tls;
  auto ca_flag = app.add_option("--ca", tls.ca, "mutual TLS: the CA's certificate (PEM); needs --cert and --key")
                   ->type_name("FILE");
  auto cert_flag = app.add_option("--cert", tls.cert, "mutual TLS: this side's certificate (PEM)")->type_name("FILE");
  auto key_flag = app.add_option("--key", tls.key, "mutual TLS: this side's key (PEM)")->type_name("FILE");
  if (!cli::parse(app, argv))
    return 0;
  const auto tls_flags = ca_flag->count() + cert_flag->count() + key_flag->count();
  if (tls_flags != 0 && tls_flags != 3)
    throw cli::usage_error("--ca, --cert and --key go together");
  if ((listen_flag->count() > 0) == (connect_flag->count() > 0)) {
    std::cout << app.help();
    return 2;
  }
  // Bounded: the round trips are kept for the median, and the deadline is
  // added to the clock.
  if (count == 0 || count > 1'000'000)
    throw cli::usage_error("--count: must be in 1..1000000, got " + std::to_string(count));
  if (deadline_ms == 0 || deadline_ms > 86'400'000)
    throw cli::usage_error("--deadline-ms: must be in 1..86400000 (a day), got " + std::to_string(deadline_ms));
  auto deadline = std::chrono::milliseconds(deadline_ms);
  system_config cfg;
  if (tls_flags == 3) {
    try {
      enable_tls(cfg, tls);
    } catch (const std::exception& e) {
      std::cerr << "rlsync ping: " << e.what() << "\n";
      return 1;
    }
  }
  caf::actor_system sys{cfg};
  return listen_flag->count() > 0 ? listen(sys, listen_at, count, deadline)
                                  : connect(sys, connect_to, count, deadline);
}

} // namespace rlsync::tools
