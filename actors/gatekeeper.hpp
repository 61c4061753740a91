#pragma once
// Cluster membership is authenticated: a joining node must prove it holds
// its secret before any of its actors is accepted.
//
//   node                     gatekeeper (head node, the only published actor)
//    │ hello(name, wire) ─────►  a fresh 32-byte challenge, one use, bound to
//    │ ◄──────────── challenge    the asking peer's CAF node id and to `name`
//    │ admit(name, HMAC-SHA256(secret of name, challenge | name), nonce) ──►
//    │                           checked only against that peer's challenges
//    │ ◄──────────── join_grant{coordinator, trainer, router,   and the sender's
//    │                 HMAC-SHA256(secret of name,
//    │                   head | challenge | name | nonce)}
//    │                                                        node id joins the
//    │                                                        admitted set, which the
//    │                                                        coordinator checks on
//    │                                                        every registration
//
// The proof goes both ways: the node checks the grant's head proof over its
// own fresh nonce before it takes any handle from it, so with per-node
// secrets a peer that answers in the head's place (another member with a
// certificate the CA signed) cannot give a member its orders. It proves the
// grant, not the connection: a peer on the path that relays to the real
// head is not caught (CAF 0.17 exposes no TLS channel binding).
//
// Each node may have a secret of its own (cluster.secret_file with {node}):
// the head checks each name against that name's secret, so one member's
// secret cannot admit another name. Only names the topology gives to member
// nodes (not the head, hosting engines) get a challenge.
//
// `wire` is the node's build's wire fingerprint (runtime/base/version.hpp):
// a node whose messages this head would misread is refused at hello, with
// both fingerprints named, rather than failing later on a message neither
// side can decode.
//
// Bounded work before admission: every hello and admit first spends a token
// of the peer's bucket (before any HMAC); a peer holds a few challenges at
// most, all peers together a small number, each expiring; a wrong answer
// burns only that peer's challenges for that name. A refusal is an error
// reply (errc::unauthenticated, errc::queue_full to retry later, or
// errc::malformed) and a rate-limited log line; nothing else changes.
#include "actors/interfaces.hpp"
#include "runtime/base/rate_limited_log.hpp"
#include "runtime/base/version.hpp"
#include "runtime/config/topology.hpp"

#include <caf/node_id.hpp>
#include <caf/scoped_actor.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

namespace rlsync {

/// The node ids the gatekeeper admitted, each with the node name it proved
/// the secret of; shared with the coordinator.
class admitted_nodes {
public:
  void add(const caf::node_id& n, const std::string& name);
  bool contains(const caf::node_id& n) const;
  /// The name `n` proved; nullopt when `n` was not admitted.
  std::optional<std::string> name_of(const caf::node_id& n) const;

private:
  mutable std::mutex mutex_;
  std::map<caf::node_id, std::string> nodes_;
};

struct admission_limits {
  std::size_t max_pending_per_peer = 4; ///< a peer's own oldest challenge goes beyond this
  std::size_t max_pending = 64;         ///< all peers together; beyond: refused (retry later)
  std::chrono::milliseconds challenge_ttl{30000};
  std::size_t burst = 8;                ///< per peer: messages at once ...
  double per_second = 2.0;              ///< ... and refilled at this rate
  std::size_t max_peers = 1024;         ///< buckets kept; the least recently seen go first
};

enum class admission_verdict {
  ok,
  malformed,     ///< an empty or overlong name or proof
  unknown_node,  ///< not a member node of the topology
  rate_limited,  ///< the peer's bucket is empty
  busy,          ///< every challenge slot is taken
  no_challenge,  ///< no challenge of this peer for this name
  wrong_proof,   ///< the HMAC matches none of them (they are burnt)
  other_build,   ///< the node's wire fingerprint differs from this build's
};

std::string to_string(admission_verdict v);

/// The gatekeeper's bookkeeping, apart from the actor so that tests can
/// drive it as any peer with any clock. Every call does bounded work: at most
/// max_pending challenges are scanned and max_pending_per_peer HMACs computed.
class admission_control {
public:
  using clock = std::chrono::steady_clock;

  /// `secrets`: member node name -> the secret it proves; only these names are admitted.
  /// `wire`: the fingerprint a node's hello must carry (this build's).
  admission_control(std::map<std::string, std::string> secrets, admission_limits limits,
                    std::function<clock::time_point()> now = [] { return clock::now(); },
                    std::string wire = wire_fingerprint());

  /// A fresh challenge for `node`, whose build's wire fingerprint is
  /// `wire`, asked by `peer`, or the verdict that refuses it.
  admission_verdict hello(const std::string& peer, const std::string& node, const std::string& wire,
                          std::string& challenge);
  const std::string& wire() const { return wire_; }
  /// Whether `proof` answers one of `peer`'s challenges for `node` (that one
  /// is used up, and copied to `answered` when given).
  admission_verdict admit(const std::string& peer, const std::string& node, const std::string& proof,
                          std::string* answered = nullptr);
  /// The head's proof for `node` (a member name) over `challenge` and the node's `nonce`.
  std::string head_proof(const std::string& node, const std::string& challenge, const std::string& nonce) const;

  std::size_t pending() const { return pending_.size(); }
  std::size_t pending_of(const std::string& peer) const;

private:
  struct challenge_entry {
    std::string peer, node, challenge;
    clock::time_point issued;
  };
  struct bucket {
    double tokens;
    clock::time_point last;
    std::list<std::string>::iterator lru;
  };
  bool take_token(const std::string& peer, clock::time_point t);
  void expire(clock::time_point t);

  std::map<std::string, std::string> secrets_;
  admission_limits limits_;
  std::function<clock::time_point()> now_;
  std::string wire_;
  std::deque<challenge_entry> pending_; ///< oldest first; at most limits_.max_pending
  std::map<std::string, bucket> buckets_;
  std::list<std::string> lru_; ///< peers, most recently seen first
};

/// The names the gatekeeper admits, each with its secret: every node but
/// the head's that hosts something (engines, trainer ranks, the router), and
/// every node hosting an external trainer rank (trainer.source: external),
/// the head's too: that rank's own process proves its node's secret.
/// With per-node secrets (secret_file with {node}) each is read from that
/// node's file, else every name gets `shared_secret`. Throws as read_cluster_secret does.
std::map<std::string, std::string> member_secrets(const topology& t, const std::string& head,
                                                  const std::string& shared_secret,
                                                  const std::string& secret_file_override = {});

struct gatekeeper_config {
  /// Member node name -> its secret (empty strings in a cluster without a
  /// secret: then anyone can compute every proof, the head's too).
  std::map<std::string, std::string> secrets;
  join_grant grant;
  /// The router registered since, when grant.router is empty (the topology
  /// places it on a member node): the grant names it once there is one, so
  /// that a node joining later (`rlsync status` too) reaches it. May be empty.
  std::function<router_actor()> current_router;
  std::shared_ptr<admitted_nodes> admitted;
  std::function<void(const std::string&)> log;
  admission_limits limits;
  std::function<admission_control::clock::time_point()> now = [] { return admission_control::clock::now(); };
  /// The fingerprint nodes must carry: this build's (tests pretend others).
  std::string wire = wire_fingerprint();
};

struct gatekeeper_state {
  std::optional<admission_control> control;
  std::shared_ptr<admitted_nodes> admitted;
  join_grant grant;
  std::shared_ptr<rate_limited_log> log;
  static inline const char* name = "gatekeeper";
};

// CAF 0.17 cannot bound an actor's mailbox: what keeps a flood cheap is that
// each message costs O(1) here (a bucket lookup, then at most a few HMACs)
// and refusals log through a rate-limited log.
gatekeeper_actor::behavior_type gatekeeper(gatekeeper_actor::stateful_pointer<gatekeeper_state> self,
                                           gatekeeper_config cfg);

/// HMAC-SHA256(secret, challenge | node) as lower-case hex: what a node answers.
std::string join_proof(const std::string& secret, const std::string& challenge, const std::string& node);

/// A node's fresh nonce for its admit: 32 random bytes as hex.
std::string join_nonce();

/// A nonce the gatekeeper takes: 32 to 128 hex digits.
bool valid_join_nonce(const std::string& nonce);

/// HMAC-SHA256(secret, "head" | challenge | node | nonce) as lower-case
/// hex: what the head answers a node's nonce with (the prefix keeps it from
/// ever equalling a node's own proof).
std::string head_proof(const std::string& secret, const std::string& challenge, const std::string& node,
                       const std::string& nonce);

/// Whether `proof` is head_proof(secret, challenge, node, nonce), compared in constant time.
bool head_proved(const std::string& secret, const std::string& challenge, const std::string& node,
                 const std::string& nonce, const std::string& proof);

/// How one admission attempt ended, on the node's side.
struct admission_answer {
  /// Set only once the head proved it holds the node's secret.
  std::optional<join_grant> grant;
  /// Why not, when the gatekeeper refused or did not answer in time.
  caf::error error;
  /// Which request that was: "hello" or "admission".
  const char* step = "hello";
  /// A grant came without a valid head proof: whoever answered is not the
  /// head, and none of its handles may be used.
  bool unproved = false;
};

/// The node's side of the exchange drawn above, once: hello, then admit
/// with the proof and a fresh nonce, then the grant's head proof checked
/// before the grant is returned. Both requests end by `give_up`.
admission_answer ask_admission(caf::scoped_actor& self, const gatekeeper_actor& gate, const std::string& node,
                               const std::string& secret, std::chrono::steady_clock::time_point give_up);

/// Reads the cluster secret from a file (trailing newlines dropped) or an
/// environment variable. Throws std::runtime_error naming the file or the
/// variable when it is missing, unreadable, empty, not a regular file, or
/// (a file) readable or writable by group or others.
std::string read_cluster_secret(const std::string& secret_file, const std::string& secret_env);

} // namespace rlsync
