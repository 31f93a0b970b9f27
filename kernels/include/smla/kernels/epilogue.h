// The output epilogue of docs/operator.md section 6 for one (row, head) 512-wide vector, and the
// split-K combine of section 5. Host and device code share these so every backend finishes a
// row the same way.
#pragma once

#include <cmath>
#include <cstdint>

#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/codec/mxfp8.h"
#include "smla/kernels/formats.h"

namespace smla::kernels {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Steps 1-2: round to bf16, then (when cos_sin_row is not null) inverse GPT-J RoPE on lanes
// 448..511 with cos = cos_sin_row[k], sin = cos_sin_row[32 + k]. Adding +0 keeps an empty
// row's zeros positive (0*c - 0*s is -0 for negative c).
SMLA_HD_INLINE void EpilogueRoundAndRotate(float* x, const float* cos_sin_row) {
  for (int i = 0; i < kValueWidth; ++i) x[i] = RoundToBf16(x[i]);
  if (cos_sin_row == nullptr) return;
  for (int k = 0; k < 32; ++k) {
    const float e = x[kNopeWidth + 2 * k];
    const float o = x[kNopeWidth + 2 * k + 1];
    const float c = cos_sin_row[k];
    const float s = cos_sin_row[32 + k];
    x[kNopeWidth + 2 * k] = (e * c + o * s) + 0.0f;
    x[kNopeWidth + 2 * k + 1] = (o * c - e * s) + 0.0f;
  }
}

// Step 3, bf16: 512 lanes, round to nearest even.
SMLA_HD_INLINE void StoreBf16(const float* x, uint16_t* out) {
  for (int i = 0; i < kValueWidth; ++i) out[i] = F32ToBf16Bits(x[i]);
}

// Step 3, MXFP8: 512 lanes into 512 codes and 16 scale bytes.
SMLA_HD_INLINE void StoreMxfp8(const float* x, uint8_t* codes, uint8_t* scales) {
  EncodeMxfp8(x, kValueWidth, codes, scales);
}

// Online-softmax state of one (row, head) over some keys, base 2: m = max of s*log2e,
// l = sum of 2^(s*log2e - m), acc = sum of 2^(s*log2e - m) * v (unnormalised).
// A split that saw no key has m = -inf, l = 0.
struct SoftmaxPartial {
  float m;
  float l;
  const float* acc;  // [512]
};

// Combines partials (a single one without split-K) with the optional sink into the normalised
// output (f32, before the epilogue) and the natural-log LSE. Empty rows give +0 and
// lse = sink (with a sink) or -inf (without); never NaN.
SMLA_HD_INLINE void CombinePartials(const SoftmaxPartial* parts, int num_parts, bool has_sink,
                                    float sink, float* out, float* lse) {
  const float neg_inf = -INFINITY;
  float m = neg_inf;
  for (int s = 0; s < num_parts; ++s) m = parts[s].m > m ? parts[s].m : m;
  const float sink2 = sink * kLog2e;
  if (has_sink && sink2 > m) m = sink2;
  if (m == neg_inf) {
    for (int i = 0; i < kValueWidth; ++i) out[i] = 0.0f;
    *lse = neg_inf;
    return;
  }
  float z = has_sink ? exp2f(sink2 - m) : 0.0f;
  for (int i = 0; i < kValueWidth; ++i) out[i] = 0.0f;
  for (int s = 0; s < num_parts; ++s) {
    if (parts[s].m == neg_inf) continue;
    const float w = exp2f(parts[s].m - m);
    z += parts[s].l * w;
    for (int i = 0; i < kValueWidth; ++i) out[i] += parts[s].acc[i] * w;
  }
  const float inv = 1.0f / z;
  for (int i = 0; i < kValueWidth; ++i) out[i] = out[i] * inv + 0.0f;  // -0 -> +0
  *lse = (m + log2f(z)) * kLn2;
}

}  // namespace smla::kernels
