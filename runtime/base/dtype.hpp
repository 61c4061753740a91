#pragma once
// Element types of weights as checkpoints store them.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rlsync {

enum class dtype : std::uint8_t { bf16, f16, f32 };

/// Bytes per element.
constexpr std::size_t dtype_size(dtype t) { return t == dtype::f32 ? 4 : 2; }

/// The safetensors spelling: "BF16", "F16", "F32".
std::string_view safetensors_name(dtype t);
/// The lower-case spelling used in YAML and on the CLI: "bf16", "f16", "f32".
std::string_view short_name(dtype t);

/// Parses either spelling (case-sensitive per format); nullopt if unknown.
std::optional<dtype> parse_safetensors_dtype(std::string_view s);
std::optional<dtype> parse_short_dtype(std::string_view s);

/// bf16/f16 <-> f32 conversions (round-to-nearest-even; NaN stays NaN).
float bf16_to_f32(std::uint16_t bits);
std::uint16_t f32_to_bf16(float value);
float f16_to_f32(std::uint16_t bits);
std::uint16_t f32_to_f16(float value);

/// Converts `count` elements of type `from` at `src` to fp32 at `dst`.
void convert_to_f32(dtype from, const void* src, float* dst, std::size_t count);
/// Converts `count` fp32 elements at `src` to type `to` at `dst`.
void convert_from_f32(dtype to, const float* src, void* dst, std::size_t count);

} // namespace rlsync
