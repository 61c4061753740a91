#include "actors/certs.hpp"

#include "actors/openssl_handles.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/config/topology.hpp"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <stdexcept>

namespace rlsync {

namespace {

namespace fs = std::filesystem;

using namespace openssl_handles;

[[noreturn]] void fail(const std::string& what) {
  unsigned long code = ERR_get_error();
  std::string reason;
  if (code != 0) {
    char buf[256];
    ERR_error_string_n(code, buf, sizeof buf);
    reason = std::string(" (") + buf + ")";
  }
  ERR_clear_error();
  throw std::runtime_error("certs make: " + what + reason);
}

pkey_ptr new_key() {
  pkey_ptr key(EVP_EC_gen("P-256"));
  if (!key)
    fail("cannot generate an EC P-256 key");
  return key;
}

void add_extension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (!ext || X509_add_ext(cert, ext, -1) != 1) {
    X509_EXTENSION_free(ext);
    fail(std::string("cannot add the extension ") + value);
  }
  X509_EXTENSION_free(ext);
}

/// A certificate for `subject_key` named `common_name`, signed by
/// `issuer_key` (as `issuer`, or self-signed when issuer is null).
x509_ptr new_certificate(const std::string& common_name, EVP_PKEY* subject_key, X509* issuer, EVP_PKEY* issuer_key,
                         long days, bool is_ca) {
  x509_ptr cert(X509_new());
  if (!cert)
    fail("out of memory");
  X509_set_version(cert.get(), 2); // v3
  // A random 127-bit serial: unique without keeping a serial file.
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof serial) != 1)
    fail("RAND_bytes failed");
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  if (!bn || !BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()))) {
    BN_free(bn);
    fail("cannot set the serial number");
  }
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -60 * 60); // an hour of clock skew between hosts
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), days * 24 * 60 * 60);
  X509_set_pubkey(cert.get(), subject_key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("rlsync"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(common_name.c_str()),
                             -1, -1, 0);
  X509* signer = issuer ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  add_extension(cert.get(), signer, NID_subject_key_identifier, "hash");
  if (is_ca) {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
    add_extension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_extension(cert.get(), signer, NID_authority_key_identifier, "keyid:always");
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    add_extension(cert.get(), signer, NID_key_usage, "critical,digitalSignature");
    add_extension(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth");
    add_extension(cert.get(), signer, NID_subject_alt_name, ("DNS:" + common_name).c_str());
  }
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0)
    fail("cannot sign the certificate of " + common_name);
  return cert;
}

/// Writes `text` to `path` with `mode`: created fresh (O_EXCL) unless
/// `force`, then truncated and the mode set again (an old file may have had
/// a wider one). A symbolic link is never followed.
void write_file(const std::string& path, const std::string& text, mode_t mode, bool force) {
  int flags = O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | (force ? O_TRUNC : O_EXCL);
  int fd = ::open(path.c_str(), flags, mode);
  if (fd < 0)
    throw std::runtime_error("certs make: cannot write " + printable(path, 512) + ": " + std::strerror(errno));
  bool ok = ::fchmod(fd, mode) == 0;
  std::size_t done = 0;
  while (ok && done < text.size()) {
    auto n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    ok = n > 0;
    if (ok)
      done += static_cast<std::size_t>(n);
  }
  int err = errno;
  ok = (::close(fd) == 0) && ok;
  if (!ok)
    throw std::runtime_error("certs make: cannot write " + printable(path, 512) + ": " + std::strerror(err));
}

std::string pem_of(X509* cert) {
  bio_ptr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1)
    fail("cannot encode a certificate");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(n));
}

std::string pem_of(EVP_PKEY* key) {
  bio_ptr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1)
    fail("cannot encode a key");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(n));
}

std::string fresh_secret_hex() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1)
    fail("RAND_bytes failed");
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out + "\n";
}

} // namespace

std::vector<std::string> make_certs(const certs_options& o) {
  if (o.out_dir.empty())
    throw std::runtime_error("certs make: --out must name a directory");
  if (o.nodes.empty())
    throw std::runtime_error("certs make: --nodes must name at least one node");
  if (o.days < 1 || o.days > max_cert_days)
    throw std::runtime_error("certs make: --days must be between 1 and " + std::to_string(max_cert_days) + ", got "
                             + std::to_string(o.days));
  std::set<std::string> seen;
  for (const auto& n : o.nodes) {
    if (!is_topology_name(n))
      throw std::runtime_error("certs make: node name '" + printable(n)
                               + "' must be non-empty and use only letters, digits, '.', '_' and '-'");
    if (n == "ca")
      throw std::runtime_error("certs make: a node cannot be named 'ca' (its files would be the CA's)");
    if (!seen.insert(n).second)
      throw std::runtime_error("certs make: node '" + n + "' is listed twice");
  }
  const fs::path dir(o.out_dir);
  std::vector<std::pair<std::string, mode_t>> targets = {{"ca.pem", 0644}, {"ca.key", 0600}};
  for (const auto& n : o.nodes)
    for (auto [suffix, mode] : {std::pair<const char*, mode_t>{".pem", 0644}, {".key", 0600}, {".secret", 0600}})
      targets.push_back({n + suffix, mode});
  std::error_code ec;
  if (!o.force)
    for (const auto& [name, mode] : targets)
      if (fs::symlink_status(dir / name, ec).type() != fs::file_type::not_found)
        throw std::runtime_error("certs make: " + printable((dir / name).string(), 512)
                                 + " exists; refusing to overwrite it (--force to replace every file)");
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec)
      throw std::runtime_error("certs make: cannot create " + printable(o.out_dir, 512) + ": " + ec.message());
    fs::permissions(dir, fs::perms::owner_all, ec);
  } else if (!fs::is_directory(dir, ec)) {
    throw std::runtime_error("certs make: " + printable(o.out_dir, 512) + " is not a directory");
  }

  auto ca_key = new_key();
  auto ca_cert = new_certificate("rlsync cluster CA", ca_key.get(), nullptr, ca_key.get(), o.days, true);
  std::vector<std::string> written;
  auto write = [&](const std::string& name, const std::string& text, mode_t mode) {
    auto path = (dir / name).string();
    write_file(path, text, mode, o.force);
    written.push_back(path);
  };
  write("ca.pem", pem_of(ca_cert.get()), 0644);
  write("ca.key", pem_of(ca_key.get()), 0600);
  for (const auto& n : o.nodes) {
    auto key = new_key();
    auto cert = new_certificate(n, key.get(), ca_cert.get(), ca_key.get(), o.days, false);
    write(n + ".pem", pem_of(cert.get()), 0644);
    write(n + ".key", pem_of(key.get()), 0600);
    write(n + ".secret", fresh_secret_hex(), 0600);
  }
  return written;
}

} // namespace rlsync
