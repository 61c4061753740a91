// Scalar widening of each stored dtype to fp32 (exact), included by each
// kernel build inside its own namespace (so that no instruction set leaks
// from one build into the other through a shared inline function).
inline float widen1(float x) { return x; }
inline float widen1(bf16_t x) { // the top half of an fp32
  const std::uint32_t u = std::uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float widen1(f16_t x) { return rlsync::f16_to_f32(x.bits); }
inline float widen1(std::int8_t x) { return static_cast<float>(x); }
