#include "cpu/attend_tile.h"

#include <cmath>

#include "cpu/hot.h"
#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/formats.h"

namespace smla::kernels::cpu {
namespace {

constexpr int kLanes = 8;  // independent partial sums per dot product (one AVX register)
// The helpers below are forced inline so that each clone of AccumulateTile compiles them for
// its own target.

// Dots of G heads' q with four consecutive keys (stride w). Each dot keeps kLanes partial sums
// summed in a fixed order, so a head's scores do not depend on which heads it is paired with.
template <int G>
[[gnu::always_inline]] inline void Dots4(const float* __restrict q, const float* __restrict k,
                                         int w, float* scores) {
  float acc[G][4][kLanes] = {};
  for (int i = 0; i < w; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float k0 = k[i + l], k1 = k[w + i + l], k2 = k[2 * w + i + l], k3 = k[3 * w + i + l];
      for (int g = 0; g < G; ++g) {
        const float qv = q[g * w + i + l];
        acc[g][0][l] += qv * k0;
        acc[g][1][l] += qv * k1;
        acc[g][2][l] += qv * k2;
        acc[g][3][l] += qv * k3;
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int j = 0; j < 4; ++j) {
      float s = 0;
      for (int l = 0; l < kLanes; ++l) s += acc[g][j][l];
      scores[g * kKeyTile + j] = s;
    }
  }
}

// The same arithmetic as one column of Dots4.
[[gnu::always_inline]] inline float Dot1(const float* __restrict q, const float* __restrict k,
                                         int w) {
  float acc[kLanes] = {};
  for (int i = 0; i < w; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += q[i + l] * k[i + l];
  }
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// acc[g] += sum_j probs[g][j] * v_j over the first 512 lanes of n keys (stride w); per head the
// same expression whatever G is.
template <int G>
[[gnu::always_inline]] inline void AccumulatePv(float* __restrict acc,
                                                const float* __restrict probs,
                                                const float* __restrict v, int w, int n) {
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    const float* __restrict v0 = v + j * w;
    const float* __restrict v1 = v0 + w;
    const float* __restrict v2 = v1 + w;
    const float* __restrict v3 = v2 + w;
    for (int i = 0; i < kValueWidth; ++i) {
      for (int g = 0; g < G; ++g) {
        const float* p = probs + g * kKeyTile + j;
        acc[g * kValueWidth + i] += ((p[0] * v0[i] + p[1] * v1[i]) + (p[2] * v2[i] + p[3] * v3[i]));
      }
    }
  }
  for (; j < n; ++j) {
    const float* __restrict vj = v + j * w;
    for (int i = 0; i < kValueWidth; ++i) {
      for (int g = 0; g < G; ++g) acc[g * kValueWidth + i] += probs[g * kKeyTile + j] * vj[i];
    }
  }
}

// Online-softmax update of one head from its raw dots: scales the scores, moves the running
// max, rescales l and acc, and leaves the bf16-rounded probabilities (sigma folded in) in probs.
// Returns false when the tile adds nothing (every score -inf or NaN).
[[gnu::always_inline]] inline bool SoftmaxStep(const TileArgs& a, float* scores, float* probs,
                                               float& m, float& l, float* __restrict acc) {
  const int n = a.n;
  const float m_old = m;
  float m_new = m_old;
  for (int j = 0; j < n; ++j) {
    scores[j] *= a.score_scale[j];
    m_new = scores[j] > m_new ? scores[j] : m_new;
  }
  if (m_new == -INFINITY || std::isnan(m_new)) {
    for (int j = 0; j < n; ++j) probs[j] = 0.0f;
    return false;
  }
  const float alpha = exp2f(m_old - m_new);  // 0 for the first tile (m_old = -inf)
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float p = exp2f(scores[j] - m_new);
    sum += p;
    probs[j] = RoundToBf16(p * a.sigma[j]);
  }
  l = l * alpha + sum;
  m = m_new;
  if (alpha != 1.0f) {
    for (int i = 0; i < kValueWidth; ++i) acc[i] *= alpha;
  }
  return true;
}

template <int G>
[[gnu::always_inline]] inline void HeadGroup(const TileArgs& a, int h) {
  const int n = a.n;
  const int w = a.width;
  float scores[G * kKeyTile];
  float probs[G * kKeyTile];
  const float* q = a.q + h * w;
  int j = 0;
  for (; j + 4 <= n; j += 4) Dots4<G>(q, a.keys + j * w, w, scores + j);
  for (; j < n; ++j) {
    for (int g = 0; g < G; ++g) scores[g * kKeyTile + j] = Dot1(q + g * w, a.keys + j * w, w);
  }
  bool any = false;
  for (int g = 0; g < G; ++g) {
    any |= SoftmaxStep(a, scores + g * kKeyTile, probs + g * kKeyTile, a.m[h + g], a.l[h + g],
                       a.acc + (h + g) * kValueWidth);
  }
  // A head whose tile added nothing has all-zero probabilities: adding them changes nothing.
  if (any) AccumulatePv<G>(a.acc + h * kValueWidth, probs, a.keys, w, n);
}

}  // namespace

SMLA_CPU_HOT void AccumulateTile(const TileArgs& a) {
  int h = 0;
  for (; h + 2 <= a.heads; h += 2) HeadGroup<2>(a, h);
  for (; h < a.heads; ++h) HeadGroup<1>(a, h);
}

}  // namespace smla::kernels::cpu
