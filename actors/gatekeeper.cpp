#include "actors/gatekeeper.hpp"

#include "runtime/base/printable.hpp"
#include "runtime/base/regular_file.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace rlsync {

namespace {

// Longer names or proofs are malformed: a topology name is short and a
// proof is 64 hex digits. Checked before anything is stored or hashed.
constexpr std::size_t max_proof_bytes = 128;
// A secret file is a few bytes of hex; anything this large is a mistake.
constexpr std::size_t max_secret_bytes = 4096;

std::string hex(const unsigned char* p, std::size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

std::string fresh_challenge() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1)
    throw std::runtime_error("RAND_bytes failed");
  return hex(bytes, sizeof bytes);
}

/// Whether two proofs (hex HMACs) are equal, compared in constant time.
bool same_proof(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

} // namespace

void admitted_nodes::add(const caf::node_id& n, const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  nodes_[n] = name; // one name per node id: the gatekeeper refuses another before it gets here
}

bool admitted_nodes::contains(const caf::node_id& n) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return nodes_.count(n) > 0;
}

std::optional<std::string> admitted_nodes::name_of(const caf::node_id& n) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = nodes_.find(n);
  if (it == nodes_.end())
    return std::nullopt;
  return it->second;
}

std::string to_string(admission_verdict v) {
  switch (v) {
    case admission_verdict::ok:
      return "ok";
    case admission_verdict::malformed:
      return "malformed name or proof";
    case admission_verdict::unknown_node:
      return "not a member node of the topology";
    case admission_verdict::rate_limited:
      return "rate limited";
    case admission_verdict::busy:
      return "too many pending challenges";
    case admission_verdict::no_challenge:
      return "no challenge for this name from this peer";
    case admission_verdict::wrong_proof:
      return "wrong proof";
    case admission_verdict::other_build:
      return "another build's wire messages";
  }
  return "?";
}

admission_control::admission_control(std::map<std::string, std::string> secrets, admission_limits limits,
                                     std::function<clock::time_point()> now, std::string wire)
    : secrets_(std::move(secrets)), limits_(limits), now_(std::move(now)), wire_(std::move(wire)) {
  limits_.max_pending = std::max<std::size_t>(1, limits_.max_pending);
  limits_.max_pending_per_peer = std::clamp<std::size_t>(limits_.max_pending_per_peer, 1, limits_.max_pending);
  limits_.max_peers = std::max<std::size_t>(1, limits_.max_peers);
}

std::size_t admission_control::pending_of(const std::string& peer) const {
  return static_cast<std::size_t>(
    std::count_if(pending_.begin(), pending_.end(), [&](const challenge_entry& e) { return e.peer == peer; }));
}

bool admission_control::take_token(const std::string& peer, clock::time_point t) {
  auto it = buckets_.find(peer);
  if (it == buckets_.end()) {
    if (buckets_.size() >= limits_.max_peers) { // forget the least recently seen peer
      buckets_.erase(lru_.back());
      lru_.pop_back();
    }
    lru_.push_front(peer);
    it = buckets_.emplace(peer, bucket{static_cast<double>(limits_.burst), t, lru_.begin()}).first;
  } else {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    auto elapsed = std::chrono::duration<double>(t - it->second.last).count();
    if (elapsed > 0)
      it->second.tokens = std::min(static_cast<double>(limits_.burst), it->second.tokens + elapsed * limits_.per_second);
    it->second.last = std::max(it->second.last, t);
  }
  if (it->second.tokens < 1.0)
    return false;
  it->second.tokens -= 1.0;
  return true;
}

void admission_control::expire(clock::time_point t) {
  while (!pending_.empty() && t - pending_.front().issued >= limits_.challenge_ttl)
    pending_.pop_front();
}

admission_verdict admission_control::hello(const std::string& peer, const std::string& node, const std::string& wire,
                                           std::string& challenge) {
  auto t = now_();
  if (!take_token(peer, t))
    return admission_verdict::rate_limited;
  if (node.empty() || node.size() > max_name_bytes || wire.size() > max_name_bytes)
    return admission_verdict::malformed;
  if (secrets_.count(node) == 0)
    return admission_verdict::unknown_node;
  if (wire != wire_)
    return admission_verdict::other_build;
  expire(t);
  // A peer that asks again drops its own oldest challenge, never another peer's.
  if (pending_of(peer) >= limits_.max_pending_per_peer)
    pending_.erase(std::find_if(pending_.begin(), pending_.end(),
                                [&](const challenge_entry& e) { return e.peer == peer; }));
  if (pending_.size() >= limits_.max_pending)
    return admission_verdict::busy;
  challenge = fresh_challenge();
  pending_.push_back({peer, node, challenge, t});
  return admission_verdict::ok;
}

admission_verdict admission_control::admit(const std::string& peer, const std::string& node, const std::string& proof,
                                           std::string* answered) {
  auto t = now_();
  if (!take_token(peer, t)) // before any HMAC work
    return admission_verdict::rate_limited;
  if (node.empty() || node.size() > max_name_bytes || proof.empty() || proof.size() > max_proof_bytes)
    return admission_verdict::malformed;
  auto secret = secrets_.find(node);
  if (secret == secrets_.end())
    return admission_verdict::unknown_node;
  expire(t);
  bool any = false;
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it->peer != peer || it->node != node)
      continue;
    any = true;
    auto expected = join_proof(secret->second, it->challenge, node);
    if (same_proof(expected, proof)) {
      if (answered)
        *answered = it->challenge;
      pending_.erase(it);
      return admission_verdict::ok;
    }
  }
  if (!any)
    return admission_verdict::no_challenge;
  // A wrong answer burns this peer's challenges for the name: no guessing against one.
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [&](const challenge_entry& e) { return e.peer == peer && e.node == node; }),
                 pending_.end());
  return admission_verdict::wrong_proof;
}

std::map<std::string, std::string> member_secrets(const topology& t, const std::string& head,
                                                  const std::string& shared_secret,
                                                  const std::string& secret_file_override) {
  const std::string& file = secret_file_override.empty() ? t.cluster.secret_file : secret_file_override;
  bool per_node = file.find("{node}") != std::string::npos;
  std::map<std::string, std::string> out;
  const bool external = t.trainer.source == trainer_source::external;
  for (const auto& n : t.nodes) {
    const bool hosts_external_rank =
      external && std::any_of(t.trainer.ranks.begin(), t.trainer.ranks.end(),
                              [&](const trainer_rank& r) { return r.node == n.name; });
    // An external rank's process joins under its node's name, the head's too.
    if (n.name == head && !hosts_external_rank)
      continue;
    // A member is a node that hosts something: engines, trainer ranks or the router.
    bool hosts_actors =
      std::any_of(t.engines.begin(), t.engines.end(), [&](const engine_spec& e) { return e.node == n.name; })
      || std::any_of(t.trainer.ranks.begin(), t.trainer.ranks.end(), [&](const trainer_rank& r) { return r.node == n.name; })
      || t.router.node == n.name;
    if (!hosts_actors)
      continue;
    out[n.name] = per_node ? read_cluster_secret(with_node_name(file, n.name), "") : shared_secret;
  }
  return out;
}

std::string admission_control::head_proof(const std::string& node, const std::string& challenge,
                                          const std::string& nonce) const {
  return rlsync::head_proof(secrets_.at(node), challenge, node, nonce);
}

std::string join_nonce() { return fresh_challenge(); }

bool valid_join_nonce(const std::string& nonce) {
  return nonce.size() >= 32 && nonce.size() <= 128
         && std::all_of(nonce.begin(), nonce.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

std::string head_proof(const std::string& secret, const std::string& challenge, const std::string& node,
                       const std::string& nonce) {
  return join_proof(secret, "head|" + challenge + "|" + node, nonce);
}

bool head_proved(const std::string& secret, const std::string& challenge, const std::string& node,
                 const std::string& nonce, const std::string& proof) {
  return same_proof(head_proof(secret, challenge, node, nonce), proof);
}

admission_answer ask_admission(caf::scoped_actor& self, const gatekeeper_actor& gate, const std::string& node,
                               const std::string& secret, std::chrono::steady_clock::time_point give_up) {
  // What is left of the deadline; a floor keeps a late request well-formed.
  const auto left = [&] {
    return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(give_up - std::chrono::steady_clock::now()),
                    std::chrono::milliseconds(50));
  };
  admission_answer answer;
  const auto nonce = join_nonce();
  std::string challenge;
  self->request(gate, left(), hello_atom::value, node, wire_fingerprint())
    .receive([&](std::string& c) { challenge = std::move(c); }, [&](caf::error& err) { answer.error = std::move(err); });
  if (challenge.empty()) {
    if (!answer.error)
      answer.error = make_error(errc::malformed, "an empty challenge");
    return answer;
  }
  answer.step = "admission";
  std::optional<join_grant> grant;
  self->request(gate, left(), admit_atom::value, node, join_proof(secret, challenge, node), nonce)
    .receive([&](join_grant& g) { grant = std::move(g); }, [&](caf::error& err) { answer.error = std::move(err); });
  if (grant && !head_proved(secret, challenge, node, nonce, grant->head_proof))
    answer.unproved = true; // an impostor's handles are never handed on
  else
    answer.grant = std::move(grant);
  return answer;
}

std::string join_proof(const std::string& secret, const std::string& challenge, const std::string& node) {
  std::string message = challenge + "|" + node;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len);
  return hex(mac, len);
}

std::string read_cluster_secret(const std::string& secret_file, const std::string& secret_env) {
  std::string secret;
  if (!secret_file.empty()) {
    const std::string name = printable(secret_file, 512);
    struct stat st {};
    if (::stat(secret_file.c_str(), &st) != 0)
      throw std::runtime_error("cluster secret: cannot read " + name);
    if (!S_ISREG(st.st_mode))
      throw std::runtime_error("cluster secret: " + name + " is not a regular file");
    // As ssh refuses a private key others can read: a secret others can read
    // or replace is no secret.
    if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
      throw std::runtime_error("cluster secret: " + name + " is accessible by group or others (mode "
                               + std::to_string((st.st_mode >> 6) & 7) + std::to_string((st.st_mode >> 3) & 7)
                               + std::to_string(st.st_mode & 7) + "); chmod 600 it");
    // Bounded by the reader itself, before and while it reads.
    secret = read_regular_file(secret_file, max_secret_bytes, "cluster secret");
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r'))
      secret.pop_back();
    if (secret.empty())
      throw std::runtime_error("cluster secret: " + name + " is empty");
  } else if (!secret_env.empty()) {
    const char* v = std::getenv(secret_env.c_str());
    if (!v || !*v)
      throw std::runtime_error("cluster secret: environment variable " + secret_env + " is not set or empty");
    secret = v;
  }
  return secret;
}

gatekeeper_actor::behavior_type gatekeeper(gatekeeper_actor::stateful_pointer<gatekeeper_state> self,
                                           gatekeeper_config cfg) {
  auto& st = self->state;
  st.control.emplace(std::move(cfg.secrets), cfg.limits, cfg.now, cfg.wire);
  st.admitted = cfg.admitted;
  st.grant = cfg.grant;
  st.log = std::make_shared<rate_limited_log>(cfg.log, 10, std::chrono::seconds(10), cfg.now);
  // Anyone who completes the handshake reaches this actor. A message of
  // another shape is answered as CAF would, but logged rate-limited (CAF
  // prints one line per message); a stray error message is logged, not
  // obeyed (CAF's default ends the actor, and no member could join again).
  auto who_sent = [self] {
    auto s = self->current_sender();
    return s ? to_string(s->node()) : std::string("an anonymous sender");
  };
  self->set_default_handler([self, who_sent](caf::scheduled_actor*, caf::message_view&) -> caf::result<caf::message> {
    (*self->state.log)("gatekeeper: refused a message it does not take from " + who_sent());
    return caf::sec::unexpected_message;
  });
  self->set_error_handler([self, who_sent](caf::error& err) {
    (*self->state.log)("gatekeeper: ignored a stray error message from " + who_sent() + ": "
                       + printable(self->system().render(err), 160));
  });
  // The peer is the sender's CAF node id; a message without a sender has none.
  auto peer_of = [self]() -> std::optional<caf::node_id> {
    auto s = self->current_sender();
    if (!s)
      return std::nullopt;
    return s->node();
  };
  auto refuse = [self](const char* what, const std::string& node, const std::string& peer, admission_verdict v,
                       const std::string& wire = {}) -> caf::error {
    (*self->state.log)("gatekeeper: refused " + printable(node, 64) + " from " + peer + " (" + what + ": "
                       + to_string(v) + ")");
    switch (v) {
      case admission_verdict::rate_limited:
      case admission_verdict::busy:
        return make_error(errc::queue_full, to_string(v) + "; retry later");
      case admission_verdict::malformed:
        return make_error(errc::malformed, to_string(v));
      case admission_verdict::other_build:
        return make_error(errc::malformed, "node " + printable(node, 64) + " runs an rlsync build whose wire messages "
                                               "differ from the head's (its wire fingerprint "
                                               + printable(wire, 64) + ", the head's "
                                               + self->state.control->wire() + "): run one build on every node");
      default:
        return make_error(errc::unauthenticated, "node " + printable(node, 64) + ": " + to_string(v));
    }
  };
  return {
    [=](hello_atom, const std::string& node, const std::string& wire) -> caf::result<std::string> {
      auto peer = peer_of();
      if (!peer)
        return refuse("hello", node, "an anonymous sender", admission_verdict::malformed);
      auto peer_name = to_string(*peer);
      std::string challenge;
      auto v = self->state.control->hello(peer_name, node, wire, challenge);
      if (v != admission_verdict::ok)
        return refuse("hello", node, peer_name, v, wire);
      return challenge;
    },
    [=](admit_atom, const std::string& node, const std::string& proof,
        const std::string& nonce) -> caf::result<join_grant> {
      auto peer = peer_of();
      if (!peer)
        return refuse("admit", node, "an anonymous sender", admission_verdict::malformed);
      auto peer_name = to_string(*peer);
      if (!valid_join_nonce(nonce)) { // before the challenge is used up
        (*self->state.log)("gatekeeper: refused " + printable(node, 64) + " from " + peer_name
                           + " (admit: malformed nonce)");
        return make_error(errc::malformed, "malformed nonce: 32 to 128 hex digits");
      }
      // One CAF node, one name: the coordinator judges where engines and ranks
      // may register from by it (a shared secret still lets another process
      // of a member join under another name: per-node secrets bind names).
      if (auto was = self->state.admitted->name_of(*peer); was && *was != node) {
        (*self->state.log)("gatekeeper: refused " + printable(node, 64) + " from " + peer_name
                           + " (admitted as " + printable(*was, 64) + " already)");
        return make_error(errc::unauthenticated, "this node was admitted as " + printable(*was, 64)
                                                   + " already: one node joins under one name");
      }
      std::string challenge;
      auto v = self->state.control->admit(peer_name, node, proof, &challenge);
      if (v != admission_verdict::ok)
        return refuse("admit", node, peer_name, v);
      self->state.admitted->add(*peer, node);
      // Admissions are few (one per member join): logged in full, not rate-limited.
      if (cfg.log)
        cfg.log("gatekeeper: admitted " + node + " (" + peer_name + ")");
      auto grant = self->state.grant;
      if (!grant.router && cfg.current_router)
        grant.router = cfg.current_router();
      grant.head_proof = self->state.control->head_proof(node, challenge, nonce);
      return grant;
    },
  };
}

} // namespace rlsync
