#pragma once
// Allocation failures reported with what was being allocated and how much:
// a model too large for the host must say so, not print "std::bad_alloc".
#include <cstdint>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>

#include <unistd.h>

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

/// The host's physical memory in bytes (0 when unknown).
inline std::uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

/// "" when `bytes` fit in the host's physical memory, else the message
/// allocating() would throw: for a check before any work starts.
inline std::string beyond_host_memory(const std::string& what, std::uint64_t bytes) {
  const auto host = physical_memory_bytes();
  if (host == 0 || bytes <= host)
    return "";
  return allocation_message(what, bytes) + " (the host has " + std::to_string(host) + " bytes)";
}

/// Runs `allocate()`, turning std::bad_alloc (and std::length_error, what a
/// vector throws for a size beyond its maximum) into allocation_error. More
/// than the host's physical memory is refused before anything is allocated:
/// allocated piece by piece, it would not fail but swap or meet the OOM
/// killer.
template <class F>
decltype(auto) allocating(const std::string& what, std::uint64_t bytes, F&& allocate) {
  if (auto problem = beyond_host_memory(what, bytes); !problem.empty())
    throw allocation_error(problem);
  try {
    return allocate();
  } catch (const std::bad_alloc&) {
    throw allocation_error(allocation_message(what, bytes));
  } catch (const std::length_error&) {
    throw allocation_error(allocation_message(what, bytes));
  }
}

} // namespace rlsync
