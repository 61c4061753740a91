#pragma once
// Owning handles for the OpenSSL objects the TLS checks and `rlsync certs`
// create, so that every early return frees what it made.
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <memory>

namespace rlsync::openssl_handles {

struct bio_free {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct x509_free {
  void operator()(X509* x) const { X509_free(x); }
};
struct pkey_free {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct store_free {
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
};
struct store_ctx_free {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};
using bio_ptr = std::unique_ptr<BIO, bio_free>;
using x509_ptr = std::unique_ptr<X509, x509_free>;
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_free>;
using store_ptr = std::unique_ptr<X509_STORE, store_free>;
using store_ctx_ptr = std::unique_ptr<X509_STORE_CTX, store_ctx_free>;

} // namespace rlsync::openssl_handles
