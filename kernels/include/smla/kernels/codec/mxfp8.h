// MXFP8 groups of 32 lanes: one E8M0 scale byte and 32 e4m3 codes (docs/operator.md section 6).
#pragma once

#include <cstdint>

#include "smla/kernels/codec/e4m3.h"
#include "smla/kernels/codec/e8m0.h"

namespace smla::kernels {

inline constexpr float kMxMinAmax = 1.17549435e-38f;  // 2^-126

// Scale byte for a group whose largest magnitude is amax (any value; clamped to 2^-126).
SMLA_HD_INLINE uint8_t MxScaleByte(float amax) {
  const float a = amax > kMxMinAmax ? amax : kMxMinAmax;
  return E8m0FromExponent(CeilLog2Over448(a));
}

// Code of one lane under a group's scale byte: e4m3_rne(x * 2^(127 - E)).
SMLA_HD_INLINE uint8_t MxEncodeLane(float x, uint8_t scale_byte) {
  return EncodeE4m3(x * Pow2(127 - static_cast<int>(scale_byte)));
}

// Encodes n lanes (a multiple of 32) of x into codes and n/32 scale bytes.
SMLA_HD_INLINE void EncodeMxfp8(const float* x, int n, uint8_t* codes, uint8_t* scales) {
  for (int g = 0; g < n / 32; ++g) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) {
      const float a = x[g * 32 + i] < 0 ? -x[g * 32 + i] : x[g * 32 + i];
      amax = a > amax ? a : amax;
    }
    const uint8_t s = MxScaleByte(amax);
    scales[g] = s;
    for (int i = 0; i < 32; ++i) codes[g * 32 + i] = MxEncodeLane(x[g * 32 + i], s);
  }
}

SMLA_HD_INLINE float MxDecodeLane(uint8_t code, uint8_t scale_byte) {
  return DecodeE4m3(code) * DecodeE8m0(scale_byte);
}

}  // namespace smla::kernels
