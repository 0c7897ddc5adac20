// float16 and bfloat16 conversions (round to nearest even), host only. Public so
// that SDK programs (ddprun bench's worker) fill and check 16-bit buffers with
// the SDK's own rounding; the names stay in ddp::detail.
#pragma once

#include <cstdint>
#include <cstring>

namespace ddp::detail {

inline float BitsToFloat(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint32_t FloatToBits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float BFloat16ToFloat(std::uint16_t h) { return BitsToFloat(std::uint32_t(h) << 16); }

inline std::uint16_t FloatToBFloat16(float f) {
  std::uint32_t u = FloatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}

inline float Float16ToFloat(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);
    // Subnormal: value = mant * 2^-24.
    float v = float(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

inline std::uint16_t FloatToFloat16(float f) {
  std::uint32_t u = FloatToBits(f);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (u < 0x38800000u) {                        // below 2^-14: subnormal or zero
    if (u < 0x33000000u) return sign;           // below 2^-25: rounds to zero
    const std::uint32_t exp = u >> 23;
    const std::uint32_t mant = (u & 0x7fffffu) | 0x800000u;
    const int shift = 126 - int(exp);  // 14 + 23 - (exp - 127) - 10 ... keeps 10 bits
    std::uint32_t v = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (v & 1u))) ++v;
    return sign | std::uint16_t(v);
  }
  // Normal: rebias the exponent, round the mantissa to 10 bits.
  std::uint32_t v = u - 0x38000000u;  // exponent - 112
  v += 0xfffu + ((v >> 13) & 1u);
  return sign | std::uint16_t(v >> 13);
}

}  // namespace ddp::detail
