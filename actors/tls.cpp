#include "actors/tls.hpp"

#include "actors/openssl_handles.hpp"
#include "runtime/base/printable.hpp"

#include <caf/openssl/manager.hpp>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace rlsync {

namespace {

// A PEM chain of a few certificates is a few kB; anything this large is not one.
constexpr off_t max_pem_bytes = 1 << 20;

using namespace openssl_handles;

std::runtime_error tls_error(const std::string& what, const std::string& file, const std::string& why) {
  return std::runtime_error("cluster.tls." + what + ": " + printable(file, 512) + ": " + why);
}

/// The last OpenSSL error as text (the queue is cleared).
std::string openssl_reason() {
  unsigned long code = 0, last = 0;
  while ((code = ERR_get_error()) != 0)
    last = code;
  if (last == 0)
    return "not PEM";
  char buf[256];
  ERR_error_string_n(last, buf, sizeof buf);
  return buf;
}

/// Opens `file` for reading after checking it is a non-empty regular file of sane size.
bio_ptr open_pem(const std::string& what, const std::string& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0)
    throw tls_error(what, file, "cannot read it (missing or not accessible)");
  if (!S_ISREG(st.st_mode))
    throw tls_error(what, file, "not a regular file");
  if (st.st_size == 0)
    throw tls_error(what, file, "is empty");
  if (st.st_size > max_pem_bytes)
    throw tls_error(what, file, "larger than " + std::to_string(max_pem_bytes) + " bytes: not a PEM file");
  bio_ptr bio(BIO_new_file(file.c_str(), "r"));
  if (!bio)
    throw tls_error(what, file, "cannot open it: " + openssl_reason());
  return bio;
}

/// Every certificate in a PEM file (at least one).
std::vector<x509_ptr> read_certificates(const std::string& what, const std::string& file) {
  auto bio = open_pem(what, file);
  std::vector<x509_ptr> out;
  ERR_clear_error();
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr))
    out.emplace_back(x);
  // The loop ends on "no start line" after the last certificate: expected.
  ERR_clear_error();
  if (out.empty())
    throw tls_error(what, file, "no PEM certificate in it");
  return out;
}

// An encrypted key would need a passphrase prompt; refuse instead of blocking.
int no_passphrase(char*, int, int, void*) { return -1; }

} // namespace

void check_tls_files(const tls_spec& files) {
  auto ca = read_certificates("ca", files.ca);
  auto chain = read_certificates("cert", files.cert);
  pkey_ptr key;
  {
    auto bio = open_pem("key", files.key);
    ERR_clear_error();
    key.reset(PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr));
    if (!key)
      throw tls_error("key", files.key, "no unencrypted PEM private key in it (" + openssl_reason() + ")");
  }
  X509* leaf = chain.front().get();
  if (X509_check_private_key(leaf, key.get()) != 1) {
    ERR_clear_error();
    throw tls_error("key", files.key, "does not belong to the certificate " + printable(files.cert, 512));
  }
  store_ptr store(X509_STORE_new());
  store_ctx_ptr ctx(X509_STORE_CTX_new());
  STACK_OF(X509)* intermediates = sk_X509_new_null();
  if (!store || !ctx || !intermediates) {
    sk_X509_free(intermediates);
    throw std::runtime_error("cluster.tls: out of memory checking the certificate chain");
  }
  for (auto& c : ca)
    X509_STORE_add_cert(store.get(), c.get());
  for (std::size_t i = 1; i < chain.size(); ++i)
    sk_X509_push(intermediates, chain[i].get());
  bool ok = X509_STORE_CTX_init(ctx.get(), store.get(), leaf, intermediates) == 1
            && X509_verify_cert(ctx.get()) == 1;
  std::string why = ok ? "" : X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()));
  sk_X509_free(intermediates); // the certificates themselves belong to `chain`
  ERR_clear_error();
  if (!ok)
    throw tls_error("cert", files.cert, "not signed by the CA " + printable(files.ca, 512) + " (" + why + ")");
}

namespace {

/// A sealed in-memory copy of `file` (checked as open_pem checks), as a
/// path: "/proc/self/fd/N". CAF reads its TLS files again for every
/// connection, and a file it cannot read then throws on its network thread,
/// where nothing catches it: a renewed or moved key would abort the node at
/// the next connection, anyone's. The descriptor stays open for the
/// process's life, one per distinct content: a process that sets up TLS
/// again (a Python rank retrying its join) reuses the copies it made.
std::string pinned_copy(const std::string& what, const std::string& file) {
  auto bio = open_pem(what, file); // the same checks and messages as the rest
  std::vector<char> bytes(static_cast<std::size_t>(max_pem_bytes) + 1);
  const int read = BIO_read(bio.get(), bytes.data(), static_cast<int>(bytes.size()));
  const std::size_t n = read > 0 ? static_cast<std::size_t>(read) : 0;
  if (n == 0 || n > static_cast<std::size_t>(max_pem_bytes))
    throw tls_error(what, file, "changed while being read");
  static std::mutex pinned_mutex;
  static std::map<std::string, std::string> pinned; // content -> its copy's path (never closed)
  std::lock_guard<std::mutex> lock(pinned_mutex);
  std::string content(bytes.data(), n);
  if (auto it = pinned.find(content); it != pinned.end())
    return it->second;
  const int fd = ::memfd_create(("rlsync-tls-" + what).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    throw tls_error(what, file, std::string("cannot keep a copy in memory: ") + std::strerror(errno));
  std::size_t written = 0;
  while (written < n) {
    const auto w = ::write(fd, bytes.data() + written, n - written);
    if (w <= 0) {
      ::close(fd);
      throw tls_error(what, file, "cannot keep a copy in memory");
    }
    written += static_cast<std::size_t>(w);
  }
  ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  return pinned.emplace(std::move(content), "/proc/self/fd/" + std::to_string(fd)).first->second;
}

} // namespace

void enable_tls(caf::actor_system_config& cfg, const tls_spec& files) {
  check_tls_files(files);
  tls_spec pinned{pinned_copy("ca", files.ca), pinned_copy("cert", files.cert), pinned_copy("key", files.key)};
  try {
    check_tls_files(pinned); // what CAF will read: the files could change between the checks and the copies
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("cluster.tls: the files changed while being read (") + e.what() + ")");
  }
  cfg.load<caf::openssl::manager>();
  cfg.openssl_cafile = pinned.ca;
  cfg.openssl_certificate = pinned.cert;
  cfg.openssl_key = pinned.key;
}

void configure_node_tls(caf::actor_system_config& cfg, const topology& t, const std::string& node) {
  if (t.cluster.tls)
    enable_tls(cfg, t.cluster.tls->for_node(node));
}

std::string insecure_network_warning(const topology& t) {
  if (t.cluster.tls || !t.others_join_the_head())
    return {};
  return "WARNING: INSECURE NETWORK: cluster.allow_insecure_network is set and cluster.tls is not.\n"
         "WARNING: traffic between nodes is plaintext: anyone who can reach a node's port can read it,\n"
         "WARNING: forge messages to any actor, pose as a member's node id, and make a node allocate\n"
         "WARNING: whatever a forged header announces. The cluster secret protects nothing here.\n"
         "WARNING: Use cluster.tls (rlsync certs make) on any network you do not fully control.\n";
}

bool uses_tls(const caf::actor_system& sys) {
  if (!sys.has_openssl_manager())
    return false;
  const auto& cfg = sys.config();
  if (cfg.openssl_cafile.empty() || cfg.openssl_certificate.empty() || cfg.openssl_key.empty())
    throw std::runtime_error("the openssl module is loaded without a CA, certificate and key: CAF would "
                             "accept unauthenticated peers (anonymous ECDH); refusing");
  return true;
}

} // namespace rlsync

// CAF 0.17's openssl module never clears OpenSSL's per-thread error queue
// (it drains it only inside log statements, compiled out in Debian's build),
// and SSL_get_error reads that queue first. So after one connection failed
// on CAF's I/O thread (a killed peer, an outsider's refused handshake), the
// next read there that merely had to wait for data looked failed too, and
// CAF dropped that connection: a member's link. OpenSSL wants the queue
// empty before each TLS I/O call; these definitions take precedence over
// libssl's in every executable linking this file (CAF's calls included),
// clear the queue and call libssl's.
namespace {

template <class Function>
Function libssl_function(const char* name) {
  void* f = ::dlsym(RTLD_NEXT, name);
  if (f == nullptr) {
    std::fprintf(stderr, "rlsync: cannot find OpenSSL's %s: %s\n", name, ::dlerror());
    std::abort();
  }
  return reinterpret_cast<Function>(f);
}

} // namespace

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static const auto libssl_read = libssl_function<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return libssl_read(ssl, buf, num);
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static const auto libssl_write = libssl_function<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return libssl_write(ssl, buf, num);
}

int SSL_accept(SSL* ssl) {
  static const auto libssl_accept = libssl_function<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return libssl_accept(ssl);
}

int SSL_connect(SSL* ssl) {
  static const auto libssl_connect = libssl_function<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return libssl_connect(ssl);
}

} // extern "C"
