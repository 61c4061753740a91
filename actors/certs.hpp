#pragma once
// `rlsync certs make`: a cluster's credentials, made with OpenSSL's library.
//   ca.pem, ca.key         the cluster's CA (EC P-256, self-signed)
//   NODE.pem, NODE.key     per node: a certificate the CA signed (client and
//                          server use), and its key
//   NODE.secret            per node: 32 random bytes as hex, what the node
//                          proves to the gatekeeper (cluster.secret_file
//                          with {node})
// Keys and secrets are written 0600. Existing files are never overwritten
// unless `force`.
#include <string>
#include <vector>

namespace rlsync {

struct certs_options {
  std::string out_dir;            ///< made (0700) when missing
  std::vector<std::string> nodes; ///< topology node names, no repeats
  long days = 365;                ///< validity of every certificate, 1..36500
  bool force = false;             ///< overwrite existing files
};

constexpr long max_cert_days = 36500;

/// Makes the files; returns their paths in the order written. Throws
/// std::runtime_error naming the problem (a bad node name, an existing
/// file, a write that failed) before anything is written where it can.
std::vector<std::string> make_certs(const certs_options& o);

} // namespace rlsync
