// Bit-level helpers shared by the codecs: exact casts and powers of two without libm.
#pragma once

#include <cstdint>
#include <cstring>

#include "smla/kernels/hd.h"

namespace smla::kernels {

SMLA_HD_INLINE uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

SMLA_HD_INLINE float BitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// 2^e exactly for e in [-149, 127], including f32 subnormals; 0 below, +inf above.
SMLA_HD_INLINE float Pow2(int e) {
  if (e > 127) return BitsFloat(0x7f800000u);
  if (e >= -126) return BitsFloat(static_cast<uint32_t>(e + 127) << 23);
  if (e >= -149) return BitsFloat(1u << (e + 149));
  return 0.0f;
}

}  // namespace smla::kernels
