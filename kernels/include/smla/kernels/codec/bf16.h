// bf16 <-> f32 with round-to-nearest-even; NaN stays a quiet NaN of the same sign.
#pragma once

#include <cstdint>

#include "smla/kernels/codec/bits.h"

namespace smla::kernels {

SMLA_HD_INLINE uint16_t F32ToBf16Bits(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

SMLA_HD_INLINE float Bf16BitsToF32(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

// f32 -> nearest bf16 -> f32: the "as if stored" rounding of the operator.
SMLA_HD_INLINE float RoundToBf16(float f) { return Bf16BitsToF32(F32ToBf16Bits(f)); }

}  // namespace smla::kernels
