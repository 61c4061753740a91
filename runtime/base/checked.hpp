#pragma once
// Overflow-checked integer arithmetic for sizes that come from outside
// (topologies, config.json, checkpoints, flags): a wrapped product must be
// refused, never used.
#include <cstdint>
#include <optional>
#include <type_traits>

namespace rlsync {

template <class T>
std::optional<T> checked_mul(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T out{};
  if (__builtin_mul_overflow(a, b, &out))
    return std::nullopt;
  return out;
}

template <class T>
std::optional<T> checked_add(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T out{};
  if (__builtin_add_overflow(a, b, &out))
    return std::nullopt;
  return out;
}

} // namespace rlsync
