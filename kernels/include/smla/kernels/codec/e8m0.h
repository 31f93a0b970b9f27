// UE8M0 scale bytes (value 2^(byte-127)) and the exact ceil(log2(amax/448)) the writers and
// the MXFP8 epilogue use.
#pragma once

#include <cstdint>

#include "smla/kernels/codec/bits.h"

namespace smla::kernels {

// ceil(log2(amax / 448)) for a positive normal f32 amax, from its exponent and mantissa only:
// amax = M * 2^E with M in [1, 2), and 448 = 1.75 * 2^8, so the result is E - 8, plus one when
// M > 1.75 (mantissa bits above 0x600000).
SMLA_HD_INLINE int CeilLog2Over448(float amax) {
  const uint32_t u = FloatBits(amax);
  const int exponent = static_cast<int>((u >> 23) & 0xffu) - 127;
  const uint32_t mantissa = u & 0x7fffffu;
  return exponent - 8 + (mantissa > 0x600000u ? 1 : 0);
}

SMLA_HD_INLINE uint8_t E8m0FromExponent(int e) {
  const int b = e + 127;
  return static_cast<uint8_t>(b < 0 ? 0 : (b > 254 ? 254 : b));
}

SMLA_HD_INLINE float DecodeE8m0(uint8_t byte) { return Pow2(static_cast<int>(byte) - 127); }

}  // namespace smla::kernels
