#include "cpu/attend_tile.h"

#include <cmath>

#include "cpu/hot.h"
#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/formats.h"

namespace smla::kernels::cpu {
namespace {

constexpr int kLanes = 16;  // independent partial sums per dot product (vector width)

// Dots of q with four keys. The lane partials are summed in a fixed order.
inline void Dot4(const float* __restrict q, const float* __restrict k0, const float* __restrict k1,
                 const float* __restrict k2, const float* __restrict k3, int width, float* out) {
  float a0[kLanes] = {}, a1[kLanes] = {}, a2[kLanes] = {}, a3[kLanes] = {};
  for (int i = 0; i < width; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float qv = q[i + l];
      a0[l] += qv * k0[i + l];
      a1[l] += qv * k1[i + l];
      a2[l] += qv * k2[i + l];
      a3[l] += qv * k3[i + l];
    }
  }
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (int l = 0; l < kLanes; ++l) {
    s0 += a0[l];
    s1 += a1[l];
    s2 += a2[l];
    s3 += a3[l];
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
  out[3] = s3;
}

inline float Dot1(const float* __restrict q, const float* __restrict k, int width) {
  float a[kLanes] = {};
  for (int i = 0; i < width; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) a[l] += q[i + l] * k[i + l];
  }
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += a[l];
  return s;
}

}  // namespace

SMLA_CPU_HOT void AccumulateTile(const TileArgs& a) {
  const int n = a.n;
  const int w = a.width;
  float scores[kTileKeys];
  float probs[kTileKeys];
  for (int h = 0; h < a.heads; ++h) {
    const float* q = a.q + h * w;
    int j = 0;
    for (; j + 4 <= n; j += 4) {
      const float* k = a.keys + j * w;
      Dot4(q, k, k + w, k + 2 * w, k + 3 * w, w, scores + j);
    }
    for (; j < n; ++j) scores[j] = Dot1(q, a.keys + j * w, w);

    const float m_old = a.m[h];
    float m_new = m_old;
    for (j = 0; j < n; ++j) {
      scores[j] *= a.score_scale[j];
      m_new = scores[j] > m_new ? scores[j] : m_new;
    }
    // Every score is -inf (or NaN): nothing this tile can add.
    if (m_new == -INFINITY || std::isnan(m_new)) continue;
    const float alpha = exp2f(m_old - m_new);  // 0 for the first tile (m_old = -inf)
    float sum = 0.0f;
    for (j = 0; j < n; ++j) {
      const float p = exp2f(scores[j] - m_new);
      sum += p;
      probs[j] = RoundToBf16(p * a.sigma[j]);
    }
    a.l[h] = a.l[h] * alpha + sum;
    a.m[h] = m_new;

    float* __restrict acc = a.acc + h * kValueWidth;
    if (alpha != 1.0f) {
      for (int i = 0; i < kValueWidth; ++i) acc[i] *= alpha;
    }
    for (j = 0; j + 4 <= n; j += 4) {
      const float p0 = probs[j], p1 = probs[j + 1], p2 = probs[j + 2], p3 = probs[j + 3];
      const float* __restrict v0 = a.keys + j * w;
      const float* __restrict v1 = v0 + w;
      const float* __restrict v2 = v1 + w;
      const float* __restrict v3 = v2 + w;
      for (int i = 0; i < kValueWidth; ++i) {
        acc[i] += ((p0 * v0[i] + p1 * v1[i]) + (p2 * v2[i] + p3 * v3[i]));
      }
    }
    for (; j < n; ++j) {
      const float p = probs[j];
      const float* __restrict v = a.keys + j * w;
      for (int i = 0; i < kValueWidth; ++i) acc[i] += p * v[i];
    }
  }
}

}  // namespace smla::kernels::cpu
