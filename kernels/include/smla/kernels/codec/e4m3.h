// OCP e4m3 ("e4m3fn"): bias 7, max finite 448, no infinities, 0x7F/0xFF are NaN.
#pragma once

#include <cstdint>

#include "smla/kernels/codec/bits.h"

namespace smla::kernels {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr uint8_t kE4m3NaN = 0x7f;

// Round to nearest even, saturating at +-448 (infinities too); NaN -> 0x7F.
SMLA_HD_INLINE uint8_t EncodeE4m3(float x) {
  const uint32_t u = FloatBits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return kE4m3NaN;
  if (mag >= 0x43e00000u) return sign | 0x7e;  // |x| >= 448
  if (mag < 0x3c800000u) {                     // |x| < 2^-6: subnormal steps of 2^-9
    // |x| * 2^9 < 8 is exact; adding and removing 2^23 rounds it to an integer, ties to even.
    const float scaled = BitsFloat(mag) * 512.0f;
    const float rounded = (scaled + 8388608.0f) - 8388608.0f;
    return sign | static_cast<uint8_t>(rounded);
  }
  // Normal: keep 3 mantissa bits with round-to-nearest-even on the f32 bits; a carry moves
  // into the exponent, which is the right result. Rebias 127 -> 7.
  const uint32_t rounded = (mag + 0x7ffffu + ((mag >> 20) & 1u)) >> 20;
  const uint32_t code = rounded - (120u << 3);
  return sign | static_cast<uint8_t>(code > 0x7eu ? 0x7eu : code);
}

// Exact value of a code as f32 (NaN for 0x7F/0xFF).
SMLA_HD_INLINE float DecodeE4m3(uint8_t c) {
  const uint32_t e = (c >> 3) & 0xfu;
  const uint32_t m = c & 7u;
  float v;
  if (e == 15 && m == 7) {
    v = BitsFloat(0x7fc00000u);
  } else if (e == 0) {
    v = static_cast<float>(m) * Pow2(-9);
  } else {
    v = BitsFloat(((e + 120u) << 23) | (m << 20));
  }
  return (c & 0x80u) ? -v : v;
}

}  // namespace smla::kernels
