#pragma once
// Allocation failures reported with what was being allocated and how much:
// a model too large for the host must say so, not print "std::bad_alloc".
#include <cstdint>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>

namespace rlsync {

struct allocation_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// "cannot allocate 2199023255552 bytes (2048.0 GiB) for <what>: not enough memory".
inline std::string allocation_message(const std::string& what, std::uint64_t bytes) {
  const double gib = static_cast<double>(bytes) / double(1 << 30);
  char size[64];
  std::snprintf(size, sizeof size, "%.1f GiB", gib);
  return "cannot allocate " + std::to_string(bytes) + " bytes (" + size + ") for " + what
         + ": not enough memory";
}

/// Runs `allocate()`, turning std::bad_alloc (and std::length_error, what a
/// vector throws for a size beyond its maximum) into allocation_error.
template <class F>
decltype(auto) allocating(const std::string& what, std::uint64_t bytes, F&& allocate) {
  try {
    return allocate();
  } catch (const std::bad_alloc&) {
    throw allocation_error(allocation_message(what, bytes));
  } catch (const std::length_error&) {
    throw allocation_error(allocation_message(what, bytes));
  }
}

} // namespace rlsync
