// IEEE half and bfloat16 conversions (exact; round-to-nearest-even on the way down).
#ifndef TANDEM_ENGINE_KERNELS_HALF_H_
#define TANDEM_ENGINE_KERNELS_HALF_H_

#include <cstdint>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace tandem::kernels {

inline float Bits2Float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint32_t Float2Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// Software conversion; exact for every half value (F16C gives the same bits
// for all non-NaN inputs and is used where available).
inline float HalfToFloatPortable(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    if (mantissa == 0) return Bits2Float(sign);
    // Subnormal half: normalise into a float.
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ffu;
    return Bits2Float(sign | static_cast<uint32_t>(127 - 15 + 1 - shift) << 23 | mantissa << 13);
  }
  if (exponent == 0x1f) return Bits2Float(sign | 0x7f800000u | mantissa << 13);
  return Bits2Float(sign | (exponent + 127 - 15) << 23 | mantissa << 13);
}

inline float HalfToFloat(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return HalfToFloatPortable(h);
#endif
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t bits = Float2Bits(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow
  if (abs < 0x38800000u) {                                               // subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((abs - 0x38000000u) >> 13);
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

inline float Bf16ToFloat(uint16_t b) { return Bits2Float(static_cast<uint32_t>(b) << 16); }

// Round to nearest even; a NaN stays a (quiet) NaN, infinities stay infinite.
inline uint16_t FloatToBf16(float f) {
  const uint32_t bits = Float2Bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace tandem::kernels

#endif  // TANDEM_ENGINE_KERNELS_HALF_H_
