#pragma once
// Mutual TLS between nodes over CAF's openssl module. CAF 0.17.6 turns
// authentication on only when a CA, certificate or key is configured; with
// none it silently falls back to anonymous ECDH (encrypted, unauthenticated,
// open to a man in the middle). So: the files are checked here with OpenSSL
// before CAF sees them, and publish_node / connect_node refuse to use the
// openssl module without a CA. Any certificate the CA signed is accepted
// for any peer (CAF does no name check): node identity is bound by the
// per-node secrets the gatekeeper checks, and the head's by its proof of
// the same secret in the join grant (gatekeeper.hpp).
#include "runtime/config/topology.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/openssl/remote_actor.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace rlsync {

/// Throws std::runtime_error naming the file when a file is missing, not a
/// regular file, empty, too large or not PEM; when the key does not belong
/// to the certificate; or when the CA did not sign the certificate.
void check_tls_files(const tls_spec& files);

/// check_tls_files, then loads CAF's openssl module on `cfg` with sealed
/// in-memory copies of these files (authentication on): CAF reads them at
/// every connection, and renewing or moving the files on disk must not make
/// a running node fail. Call before the actor system is made.
void enable_tls(caf::actor_system_config& cfg, const tls_spec& files);

/// The node's TLS files from the topology (cluster.tls with {node}
/// replaced), checked and set on `cfg`; nothing when the topology has no
/// TLS. Throws as check_tls_files does.
void configure_node_tls(caf::actor_system_config& cfg, const topology& t, const std::string& node);

/// The warning printed at every start of a multi-node topology that runs
/// without TLS (cluster.allow_insecure_network); empty when none is due.
std::string insecure_network_warning(const topology& t);

/// True when `sys` talks mutual TLS; throws when the openssl module is
/// loaded without a CA (CAF would fall back to anonymous ECDH).
bool uses_tls(const caf::actor_system& sys);

/// Publishes `whom` over TLS when the system has it, else plaintext.
template <class Handle>
caf::expected<std::uint16_t> publish_node(caf::actor_system& sys, const Handle& whom, std::uint16_t port,
                                          const std::string& address) {
  if (uses_tls(sys))
    return caf::openssl::publish(whom, port, address.c_str(), true);
  return sys.middleman().publish(whom, port, address.c_str(), true);
}

/// Connects to a node published with publish_node, the same way.
template <class Handle>
caf::expected<Handle> connect_node(caf::actor_system& sys, const std::string& host, std::uint16_t port) {
  if (uses_tls(sys))
    return caf::openssl::remote_actor<Handle>(sys, host, port);
  return sys.middleman().remote_actor<Handle>(host, port);
}

} // namespace rlsync
