#pragma once
// A peer posing as the head: it answers hello and admits anyone, granting
// handles of its own, but it cannot prove the node's secret. Members
// (join_cluster) and `rlsync status` (fetch_fleet) must refuse its grant.
#include "actors/gatekeeper.hpp"

namespace rlsync::test {

inline gatekeeper_actor::behavior_type impostor_gate(gatekeeper_actor::pointer) {
  return {
    [](hello_atom, const std::string&, const std::string&) { return join_nonce(); },
    [](admit_atom, const std::string&, const std::string&, const std::string& nonce) {
      join_grant g;
      g.head_proof = nonce; // whatever it sends, it is not HMAC(the node's secret, ...)
      return g;
    },
  };
}

} // namespace rlsync::test
