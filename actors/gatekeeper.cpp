#include "actors/gatekeeper.hpp"

#include "runtime/base/regular_file.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace rlsync {

namespace {

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

} // namespace

void admitted_nodes::add(const caf::node_id& n) {
  std::lock_guard<std::mutex> lock(mutex_);
  nodes_.insert(n);
}

bool admitted_nodes::contains(const caf::node_id& n) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return nodes_.count(n) > 0;
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
    // A secret is a line of text; the bound keeps a wrong file from being read whole.
    secret = read_regular_file(secret_file, 64 << 10, "cluster secret");
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r'))
      secret.pop_back();
    if (secret.empty())
      throw std::runtime_error("cluster secret: " + secret_file + " is empty");
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
  self->state.cfg = std::move(cfg);
  auto log = [self](const std::string& line) {
    if (self->state.cfg.log)
      self->state.cfg.log(line);
  };
  auto peer = [self] {
    auto s = self->current_sender();
    return s ? to_string(s->node()) : std::string("an anonymous sender");
  };
  return {
    [=](hello_atom, const std::string& node) -> caf::result<std::string> {
      auto& st = self->state;
      if (node.empty() || node.size() > 256)
        return make_error(errc::malformed, "hello: bad node name");
      auto challenge = fresh_challenge();
      st.pending.emplace(challenge, node);
      st.order.push_back(challenge);
      while (st.order.size() > st.cfg.max_pending) { // bounded: a flood drops the oldest
        st.pending.erase(st.order.front());
        st.order.pop_front();
      }
      return challenge;
    },
    [=](admit_atom, const std::string& node, const std::string& proof) -> caf::result<join_grant> {
      auto& st = self->state;
      // Find the challenge this node was given; each is good for one answer.
      std::string challenge;
      for (auto it = st.pending.begin(); it != st.pending.end(); ++it)
        if (it->second == node) {
          auto expected = join_proof(st.cfg.secret, it->first, node);
          bool match = expected.size() == proof.size()
                       && CRYPTO_memcmp(expected.data(), proof.data(), expected.size()) == 0;
          if (match) {
            challenge = it->first;
            break;
          }
        }
      if (challenge.empty()) {
        // A wrong answer burns the node's challenges: no guessing against one.
        for (auto it = st.pending.begin(); it != st.pending.end();)
          if (it->second == node) {
            st.order.erase(std::find(st.order.begin(), st.order.end(), it->first));
            it = st.pending.erase(it);
          } else {
            ++it;
          }
        log("gatekeeper: refused " + node + " from " + peer() + ": wrong proof or no challenge");
        return make_error(errc::unauthenticated, "node " + node + ": proof does not match a challenge");
      }
      st.pending.erase(challenge);
      st.order.erase(std::find(st.order.begin(), st.order.end(), challenge));
      if (auto s = self->current_sender())
        st.cfg.admitted->add(s->node());
      log("gatekeeper: admitted " + node + " (" + peer() + ")");
      return st.cfg.grant;
    },
  };
}

} // namespace rlsync
