// MXFP8 queries (step.proto Span.q as DTYPE_E4M3 with Span.q_scales): each run of 32
// consecutive lanes of a query vector shares one UE8M0 scale byte, and a lane's value is
// e4m3(code) * 2^(byte - 127). The server expands them to the bf16 Q the operator reads.
//
// Decoding is exact wherever bf16 holds the product, which is everywhere except two ends:
// - where the product has bits below bf16's smallest subnormal step 2^-133 (scale bytes
//   below 6 with small codes) it is rounded to the nearest bf16, ties to even (possibly to a
//   signed zero); encoding bf16 values never gives such a pair;
// - at or above 2^128 (scale bytes of 247 and up with large codes) it is +-inf, as an f32 to
//   bf16 conversion would give; encoding gives that only for |x| > 1.875 * 2^127, which
//   rounds up to 2^128 in e4m3.
// An e4m3 product has 4 significant bits and bf16 has 8, so every other product is a bf16
// value exactly. NaN codes (0x7F, 0xFF) and the NaN scale byte (0xFF) are invalid on the wire;
// decoding them gives a quiet NaN.
//
// Encoding uses the MXFP8 output epilogue's rule (mxfp8.h): the group's scale is
// 2^ceil(log2(amax / 448)) (amax floored at 2^-126, byte clamped to [0, 254]) and each lane
// is e4m3_rne(x / scale). NaN lanes encode as 0x7F (which the server rejects) and +-inf
// saturate to +-448 * scale.
#pragma once

#include <cstdint>

#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/codec/mxfp8.h"

namespace smla::kernels {

inline constexpr int kMxQueryGroup = 32;  // lanes per scale byte

SMLA_HD_INLINE bool E4m3IsNaN(uint8_t code) { return (code & 0x7fu) == 0x7fu; }
SMLA_HD_INLINE bool E8m0IsNaN(uint8_t byte) { return byte == 0xffu; }

// bf16 bits of e4m3(code) * 2^(scale - 127), by the rule above. Integer arithmetic only, so
// every backend gets the same bits whatever its handling of subnormal floats.
SMLA_HD_INLINE uint16_t Mxfp8ToBf16Bits(uint8_t code, uint8_t scale) {
  const uint16_t sign = static_cast<uint16_t>((code & 0x80u) << 8);
  if (E4m3IsNaN(code) || E8m0IsNaN(scale)) return static_cast<uint16_t>(sign | 0x7fc0u);
  int e = (code >> 3) & 0xf;
  uint32_t sig = code & 7u;
  if (e == 0) {
    if (sig == 0) return sign;
    // Subnormal m * 2^-9: normalise to 1.mmm * 2^(e - 7) with e <= 0.
    e = 1;
    while (sig < 8u) {
      sig <<= 1;
      --e;
    }
  } else {
    sig |= 8u;
  }
  // The value is sig / 8 * 2^(biased - 127) with sig in [8, 15]: bf16's biased exponent.
  const int biased = e - 7 + static_cast<int>(scale);
  if (biased >= 255) return static_cast<uint16_t>(sign | 0x7f80u);
  if (biased >= 1) {
    return static_cast<uint16_t>(sign | (static_cast<uint32_t>(biased) << 7) | ((sig & 7u) << 4));
  }
  // Below bf16's normal range, in units of its subnormal step 2^-133: sig * 2^(biased + 3).
  const int shift = biased + 3;
  if (shift >= 0) return static_cast<uint16_t>(sign | (sig << shift));
  const int k = -shift;  // 1 .. 6
  uint32_t units = sig >> k;
  const uint32_t rest = sig & ((1u << k) - 1u);
  const uint32_t half = 1u << (k - 1);
  if (rest > half || (rest == half && (units & 1u) != 0)) ++units;
  return static_cast<uint16_t>(sign | units);
}

// Encodes `lanes` (a multiple of 32) bf16 values into codes and lanes/32 scale bytes.
inline void EncodeMxfp8Query(const uint16_t* bf16, int64_t lanes, uint8_t* codes, uint8_t* scales) {
  float group[kMxQueryGroup];
  for (int64_t g = 0; g < lanes / kMxQueryGroup; ++g) {
    for (int i = 0; i < kMxQueryGroup; ++i) group[i] = Bf16BitsToF32(bf16[g * kMxQueryGroup + i]);
    EncodeMxfp8(group, kMxQueryGroup, codes + g * kMxQueryGroup, scales + g);
  }
}

// Decodes `lanes` (a multiple of 32) lanes into bf16 bits (Mxfp8ToBf16Bits per lane).
inline void DecodeMxfp8Query(const uint8_t* codes, const uint8_t* scales, int64_t lanes,
                             uint16_t* bf16) {
  for (int64_t i = 0; i < lanes; ++i) {
    bf16[i] = Mxfp8ToBf16Bits(codes[i], scales[i / kMxQueryGroup]);
  }
}

}  // namespace smla::kernels
