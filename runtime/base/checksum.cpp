// Thin wrappers over libxxhash's XXH3 64-bit functions. Their only failure
// is a null state, which the constructor rules out; they are checked anyway,
// so that a broken library cannot turn into silently wrong checksums.
#include "runtime/base/checksum.hpp"

#include <xxhash.h>

#include <cstdio>
#ifdef RLSYNC_XXH3_DISPATCH
// Renames XXH3_64bits_withSeed and XXH3_64bits_update to libxxhash's variants
// that pick AVX2 or AVX-512 at run time (the plain ones are built for SSE2).
// Same results; the digest and the state are shared.
#include <xxh_x86dispatch.h>
#endif

#include <new>
#include <stdexcept>
#include <string>

namespace rlsync {

namespace {

void check(XXH_errorcode rc, const char* what) {
  if (rc != XXH_OK)
    throw std::runtime_error(std::string("checksum: libxxhash ") + what + " failed");
}

} // namespace

std::uint64_t checksum64(const void* data, std::size_t size, std::uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}

void checksum64_stream::free_state::operator()(XXH3_state_s* s) const noexcept { XXH3_freeState(s); }

checksum64_stream::checksum64_stream(std::uint64_t seed) : state_(XXH3_createState()) {
  if (!state_)
    throw std::bad_alloc();
  reset(seed);
}

void checksum64_stream::reset(std::uint64_t seed) { check(XXH3_64bits_reset_withSeed(state_.get(), seed), "reset"); }

void checksum64_stream::update(const void* data, std::size_t size) {
  check(XXH3_64bits_update(state_.get(), data, size), "update");
}

std::uint64_t checksum64_stream::digest() const { return XXH3_64bits_digest(state_.get()); }

std::string checksum_hex(std::uint64_t x) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

} // namespace rlsync
