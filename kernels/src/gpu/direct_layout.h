// Which lane holds which row, column and key of the matrix fragments in the direct attention
// kernel (attend_direct_kernel.cuh). Both dots sum over a dimension whose order is free, and the
// output columns may land anywhere the epilogue knows about, so the kernel permutes them to make
// each lane's operands contiguous bytes of one staged fp8 row. All the layout arithmetic lives
// here, one section per matrix instruction (mma_tile.h), under the same names; PvStep, the
// conversion of one k-step's V operands, is the part whose byte shuffles differ.
//
// In both: a lane feeds one key of Q.K^T (FragGroup) with 16 dims of each 64-dim chunk, read as
// two 8-byte runs (QkRun), and k-step s of the chunk takes its B operand from ScoreB; Q is
// staged so that position l of k-step s holds dim QkDim(s, l). For P.V a lane reads PvKeys keys
// (PvLaneKey) of 8 consecutive window columns starting at PvLaneColumn, and in C holds its row's
// output columns OutColumn(OutLane(lane), i, j) (i: column slot, j: n-tile).
#pragma once

#include <cstdint>

#include "smla/kernels/formats.h"
#include "smla/kernels/gpu/mma_tile.h"
#include "smla/kernels/gpu/primitives.h"

namespace smla::kernels::gpu::direct {

#if defined(__HIP__)

// MFMA 16x16x32 (64 lanes): r = lane % 16 is the A row, the B column and the C column;
// q = lane / 16 picks the k run 8q..8q+7 (A, B) and the C rows 4q..4q+3.
__host__ __device__ constexpr int FragGroup(int lane) { return lane % 16; }
__host__ __device__ constexpr int FragPair(int lane) { return lane / 16; }

// Two k-steps of 32 per chunk: lane q feeds dims [16q, 16q+16) of the chunk, k-step s the 8 of
// them at 16q + 8s, so its two runs are adjacent.
inline constexpr int kQkSteps = 2;
__host__ __device__ constexpr int QkDim(int s, int l) { return 16 * (l / 8) + 8 * s + l % 8; }
__host__ __device__ constexpr int QkRun(int c, int r) { return 16 * c + 8 * r; }
// Pair i of an 8-position unit of staged Q, relative to the unit's first dim.
__host__ __device__ constexpr int QkUnitOffset(int i) { return 2 * i; }
// Words 4s..4s+3 of the lane's 16 converted dims are k-step s's 8 values.
__device__ __forceinline__ BFrag ScoreB(const uint32_t (&b)[8], int s) {
  return BFrag{
      Bf16x8FromWords(make_uint2(b[4 * s], b[4 * s + 1]), make_uint2(b[4 * s + 2], b[4 * s + 3]))};
}

// P.V k-steps of 32 keys in natural order: lane q feeds keys 8q..8q+7.
inline constexpr int kPvKeys = 8;
__host__ __device__ constexpr int PvPosition(int k) { return k; }
__host__ __device__ constexpr int PvLaneKey(int c, int m) { return 8 * c + m; }

// C column r of n-tile j is window column 8r + j: a lane reads V columns [8r, 8r+8) and holds
// those 8 output columns of its rows.
inline constexpr int kOutValues = 8;
__host__ __device__ constexpr int OutLane(int lane) { return lane % 16; }
__host__ __device__ constexpr int PvLaneColumn(int lane) { return 8 * (lane % 16); }
__host__ __device__ constexpr int OutColumn(int c, int i, int j) { return 8 * c + i + j; }
// fp8_dsv4 scale group (64 dims) of the lane's columns, and whether they are the bf16 rope
// columns; a warp's 128 columns span two groups.
__host__ __device__ constexpr int ScaleGroup(int warp, int col) { return (void)warp, col / 64; }
__host__ __device__ constexpr bool RopeColumns(int warp_col0, int col) {
  return (void)warp_col0, col >= kNopeWidth;
}

// acc[gr][j] += P V for one k-step: keys key0 + 8q + m (m < 8) of window columns col .. col+7.
// fp8 codes of a key pair are interleaved per column pair (as E4m3x4ToBf16Scaled's scale pair
// wants), giving column j's B words for that pair of its 8 keys.
template <int kGroups, int kNTiles, bool kDsv4, bool kFold>
__device__ __forceinline__ void PvStep(const uint8_t* stage, int stride, const uint8_t* rec,
                                       int key0, int col, int c, bool bf16_cols,
                                       const AFrag (&a)[kGroups],
                                       float (&acc)[kGroups][kNTiles][4]) {
  static_assert(kNTiles == 8, "a lane converts 8 columns");
  int key[kPvKeys];
#pragma unroll
  for (int m = 0; m < kPvKeys; ++m) key[m] = key0 + PvLaneKey(c, m);
  uint32_t w[kNTiles][4];  // column j, key pair p
  if (bf16_cols) {
    uint4 v[kPvKeys];
#pragma unroll
    for (int m = 0; m < kPvKeys; ++m) {
      v[m] = *reinterpret_cast<const uint4*>(stage + key[m] * stride + kNopeWidth +
                                             2 * (col - kNopeWidth));
    }
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      const uint32_t sel = j % 2 == 0 ? 0x5410u : 0x7632u;
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        const uint32_t* w0 = &v[2 * p].x;
        const uint32_t* w1 = &v[2 * p + 1].x;
        w[j][p] = PermuteBytes(w0[j / 2], w1[j / 2], sel);
      }
    }
  } else {
    uint2 v[kPvKeys];
#pragma unroll
    for (int m = 0; m < kPvKeys; ++m) {
      v[m] = *reinterpret_cast<const uint2*>(stage + key[m] * stride + col);
    }
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      KvScale scale = UnitKvScale();
      if constexpr (kDsv4) {
        const uint32_t s0 = rec[key[2 * p] * kDsv4ScaleBytes];
        const uint32_t s1 = rec[key[2 * p + 1] * kDsv4ScaleBytes];
        scale = kFold ? E8m0PairTimes2p120(s0, s1) : E8m0PairToBf16x2(s0, s1);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t x0 = h == 0 ? v[2 * p].x : v[2 * p].y;
        const uint32_t x1 = h == 0 ? v[2 * p + 1].x : v[2 * p + 1].y;
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          // Codes (key0 col j, key1 col j, key0 col j+1, key1 col j+1), j = 4h + 2q.
          const uint32_t codes = PermuteBytes(x0, x1, q == 0 ? 0x5140u : 0x7362u);
          uint2 b;
          if constexpr (kDsv4 && kFold) {
            b = E4m3x4ToBf16Times(codes, scale);
          } else if constexpr (kDsv4) {
            b = E4m3x4ToBf16Scaled(codes, scale);
          } else {
            b = E4m3x4ToBf16(codes);
          }
          w[4 * h + 2 * q][p] = b.x;
          w[4 * h + 2 * q + 1][p] = b.y;
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    const BFrag b{Bf16x8FromWords(make_uint2(w[j][0], w[j][1]), make_uint2(w[j][2], w[j][3]))};
#pragma unroll
    for (int gr = 0; gr < kGroups; ++gr) Mma(acc[gr][j], a[gr], b);
  }
}

// gfx950 keeps bf16 operands for both dots: a wavefront's P.V product spans two fp8_dsv4 scale
// groups, so per-key scales cannot be folded into P (kF16Operands below). The f16 helpers are
// declared for the kernel's discarded branches and never instantiated.
inline constexpr bool kF16Operands = false;
template <int kGroups>
__device__ void ScoreChunkF16(const uint8_t* chunk, int c, const uint16_t* a_row, int gr_stride,
                              float (&t0)[kGroups][4], float (&t1)[kGroups][4]);
template <int kGroups, int kNTiles, int kMode>
__device__ void PvStepF16(const uint8_t* stage, int stride, const uint8_t* rec, int key0, int col,
                          int c, int eb, AFrag (&a)[kGroups], float (&acc)[kGroups][kNTiles][4]);

#else

// m16n8k16 (32 lanes): g = lane / 4 is the A/C row and the B column, c = lane % 4 picks the
// k (A, B) or n (C) pairs 2c, 2c+1 and 2c+8, 2c+9 (A, B) / 2c, 2c+1 (C).
__host__ __device__ constexpr int FragGroup(int lane) { return lane / 4; }
__host__ __device__ constexpr int FragPair(int lane) { return lane % 4; }

// Q.K^T runs over 64-dim chunks of 4 k-steps. Lane (g, c) feeds key g from two 8-byte runs of
// the chunk, dims [8c, 8c+8) and [32+8c, 32+8c+8): k-step s takes dims 8c+2s, +1 as its first
// B register and 32+8c+2s, +1 as its second. Q is staged in the matching order: position l
// (0..15) of k-step s holds this dim of the chunk.
inline constexpr int kQkSteps = 4;
__host__ __device__ constexpr int QkDim(int s, int l) {
  return (l < 8 ? 0 : 32) + 8 * ((l % 8) / 2) + 2 * s + l % 2;
}
// Byte offsets, inside a 64-dim chunk of e4m3 codes, of lane c's two 8-byte runs.
__host__ __device__ constexpr int QkRun(int c, int r) { return 32 * r + 8 * c; }
__host__ __device__ constexpr int QkUnitOffset(int i) { return QkDim(0, 2 * i) - QkDim(0, 0); }
__device__ __forceinline__ BFrag ScoreB(const uint32_t (&b)[8], int s) {
  return BFrag{b[s], b[4 + s]};
}

// P.V runs over k-steps of 16 keys. Lane (g, c) feeds keys c, c+4 (first B register) and
// c+8, c+12 (second), so position l (0..15) of P's k-step holds this key of the 16.
inline constexpr int kPvKeys = 4;
__host__ __device__ constexpr int PvKey(int l) { return (l / 8) * 8 + (l % 8) / 2 + 4 * (l % 2); }
// Inverse of PvKey: where key k (0..15) of the k-step sits in P's staged row.
__host__ __device__ constexpr int PvPosition(int k) {
  return (k / 8) * 8 + 2 * (k % 4) + (k % 8) / 4;
}
// The four keys (of the 16) lane c reads for one k-step, in B-register order.
__host__ __device__ constexpr int PvLaneKey(int c, int m) { return c + 4 * m; }

// Output n-tile j, C column n of a warp's 64 columns is column 8n + j: lane (g, c) reads
// columns [8g, 8g+8) of V as B, and holds output columns [16c, 16c+16) as C (value i of the
// C pair in tile j is column 16c + 8i + j).
inline constexpr int kOutValues = 16;
__host__ __device__ constexpr int OutLane(int lane) { return lane % 4; }
__host__ __device__ constexpr int PvLaneColumn(int lane) { return 8 * FragGroup(lane); }
__host__ __device__ constexpr int OutColumn(int c, int i, int j) { return 16 * c + 8 * i + j; }
// A warp's 64 columns are one fp8_dsv4 scale group, all rope or none.
__host__ __device__ constexpr int ScaleGroup(int warp, int col) { return (void)col, warp; }
__host__ __device__ constexpr bool RopeColumns(int warp_col0, int col) {
  return (void)col, warp_col0 >= kNopeWidth;
}

static_assert(QkDim(0, 0) == 0 && QkDim(0, 1) == 1 && QkDim(0, 8) == 32 && QkDim(3, 7) == 31 &&
                  QkDim(3, 15) == 63,
              "each chunk dim is used once");
static_assert(PvKey(PvPosition(13)) == 13 && PvPosition(PvKey(6)) == 6 && PvKey(1) == 4 &&
                  PvKey(9) == 12,
              "PvPosition inverts PvKey");

// acc[gr][j] += P V for one k-step (keys key0 + PvLaneKey(c, m)) of columns col .. col+7.
template <int kGroups, int kNTiles, bool kDsv4, bool kFold>
__device__ __forceinline__ void PvStep(const uint8_t* stage, int stride, const uint8_t* rec,
                                       int key0, int col, int c, bool bf16_cols,
                                       const AFrag (&a)[kGroups],
                                       float (&acc)[kGroups][kNTiles][4]) {
  int key[kPvKeys];
#pragma unroll
  for (int m = 0; m < kPvKeys; ++m) key[m] = key0 + PvLaneKey(c, m);
  if (bf16_cols) {
    // Rope columns stored as bf16: pair the same column of two keys.
    uint4 v[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      v[m] = *reinterpret_cast<const uint4*>(stage + key[m] * stride + kNopeWidth +
                                             2 * (col - kNopeWidth));
    }
    const uint32_t* w0 = &v[0].x;
    const uint32_t* w1 = &v[1].x;
    const uint32_t* w2 = &v[2].x;
    const uint32_t* w3 = &v[3].x;
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      const uint32_t sel = j % 2 == 0 ? 0x5410u : 0x7632u;
      const uint32_t b0 = PermuteBytes(w0[j / 2], w1[j / 2], sel);
      const uint32_t b1 = PermuteBytes(w2[j / 2], w3[j / 2], sel);
#pragma unroll
      for (int gr = 0; gr < kGroups; ++gr) MmaBf16(acc[gr][j], a[gr].r, b0, b1);
    }
  } else {
    uint2 v[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      v[m] = *reinterpret_cast<const uint2*>(stage + key[m] * stride + col);
    }
    KvScale sc01, sc23;
    if constexpr (kDsv4) {
      uint32_t sb[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) sb[m] = rec[key[m] * kDsv4ScaleBytes];
      sc01 = kFold ? E8m0PairTimes2p120(sb[0], sb[1]) : E8m0PairToBf16x2(sb[0], sb[1]);
      sc23 = kFold ? E8m0PairTimes2p120(sb[2], sb[3]) : E8m0PairToBf16x2(sb[2], sb[3]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t x0 = h == 0 ? v[0].x : v[0].y, x1 = h == 0 ? v[1].x : v[1].y;
      const uint32_t x2 = h == 0 ? v[2].x : v[2].y, x3 = h == 0 ? v[3].x : v[3].y;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        // Codes (key0 col j, key1 col j, key0 col j+1, key1 col j+1), j = 4h + 2q.
        const uint32_t sel = q == 0 ? 0x5140u : 0x7362u;
        const uint32_t c01 = PermuteBytes(x0, x1, sel);
        const uint32_t c23 = PermuteBytes(x2, x3, sel);
        uint2 b01, b23;
        if constexpr (kDsv4 && kFold) {
          b01 = E4m3x4ToBf16Times(c01, sc01);
          b23 = E4m3x4ToBf16Times(c23, sc23);
        } else if constexpr (kDsv4) {
          b01 = E4m3x4ToBf16Scaled(c01, sc01);
          b23 = E4m3x4ToBf16Scaled(c23, sc23);
        } else {
          b01 = E4m3x4ToBf16(c01);
          b23 = E4m3x4ToBf16(c23);
        }
        const int j = 4 * h + 2 * q;
#pragma unroll
        for (int gr = 0; gr < kGroups; ++gr) {
          MmaBf16(acc[gr][j], a[gr].r, b01.x, b23.x);
          MmaBf16(acc[gr][j + 1], a[gr].r, b01.y, b23.y);
        }
      }
    }
  }
}

// f16 operands for the fp8 codes (attend_direct_kernel.cuh): e4m3 -> f16 is one paired
// conversion instruction per two values and exact, so K and V enter the products as raw codes
// and the power-of-two scales are applied outside them: to each 64-dim chunk's partial score
// (Q.K^T) and to P per key (P.V, one scale group per warp's 64 columns). Values equal the bf16
// staging of docs/operator.md 5 (the scales are powers of two, the codes exact in both types).
inline constexpr bool kF16Operands = true;

// t0/t1 += Q16 K^T over one 64-dim chunk of fp8 codes (k-steps alternate between t0 and t1,
// which may be one array):
// `chunk` is the lane's key row at the chunk, `a_row` the lane's staged f16 Q (FragRowPtr) at
// the chunk, `gr_stride` the elements between 16-head groups.
template <int kGroups>
__device__ __forceinline__ void ScoreChunkF16(const uint8_t* chunk, int c, const uint16_t* a_row,
                                              int gr_stride, float (&t0)[kGroups][4],
                                              float (&t1)[kGroups][4]) {
  const uint2 x = *reinterpret_cast<const uint2*>(chunk + QkRun(c, 0));
  const uint2 y = *reinterpret_cast<const uint2*>(chunk + QkRun(c, 1));
  const uint2 w0 = E4m3x4ToF16(x.x), w1 = E4m3x4ToF16(x.y);
  const uint2 w2 = E4m3x4ToF16(y.x), w3 = E4m3x4ToF16(y.y);
  const uint32_t b[8] = {w0.x, w0.y, w1.x, w1.y, w2.x, w2.y, w3.x, w3.y};
#pragma unroll
  for (int gr = 0; gr < kGroups; ++gr) {
#pragma unroll
    for (int s = 0; s < kQkSteps; ++s) {
      AFrag a;
      LoadA(a, a_row + gr * gr_stride + MmaTile::kK * s);
      MmaF16(s % 2 == 0 ? t0[gr] : t1[gr], a.r, b[s], b[4 + s]);
    }
  }
}

// acc[gr][j] += P V for one k-step of fp8 columns col .. col+7 with codes as operands.
// With E = kF16CodeExp (f16 codes are code * 2^-E): kMode 0: `a` is f16 P times 2^(15-E), no
// per-key scale (fp8_per_tensor); acc is in units of 2^(2E-15). kMode 1: `a` is f16 P times
// 2^(15-E), multiplied per key by 2^(byte - eb + E) (a normal f16: the caller checked the tile's
// spread). kMode 2: `a` is bf16 P, multiplied per key by 2^(byte - eb + 15 - E) (flushed to 0
// below bf16's range), exact bf16 codes. Modes 1 and 2 give acc in units of 2^(eb + E - 142).
// Keys that are not valid have zero P and zero-filled rows.
template <int kGroups, int kNTiles, int kMode>
__device__ __forceinline__ void PvStepF16(const uint8_t* stage, int stride, const uint8_t* rec,
                                          int key0, int col, int c, int eb, AFrag (&a)[kGroups],
                                          float (&acc)[kGroups][kNTiles][4]) {
  int key[kPvKeys];
#pragma unroll
  for (int m = 0; m < kPvKeys; ++m) key[m] = key0 + PvLaneKey(c, m);
  uint2 v[4];
#pragma unroll
  for (int m = 0; m < 4; ++m) v[m] = *reinterpret_cast<const uint2*>(stage + key[m] * stride + col);
  if constexpr (kMode != 0) {
    // a.r[0], a.r[1]: keys key[0], key[1] (rows g, g+8); a.r[2], a.r[3]: keys key[2], key[3].
    uint32_t f[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int b = static_cast<int>(rec[key[m] * kDsv4ScaleBytes]);
      f[m] = static_cast<uint32_t>(
          max(b - eb + (kMode == 1 ? 15 + kF16CodeExp : 142 - kF16CodeExp), 0));
    }
    const int sh = kMode == 1 ? 10 : 7;
    const uint32_t f01 = (f[0] << sh) | (f[1] << (16 + sh));
    const uint32_t f23 = (f[2] << sh) | (f[3] << (16 + sh));
#pragma unroll
    for (int gr = 0; gr < kGroups; ++gr) {
      if constexpr (kMode == 1) {
        a[gr].r[0] = MulF16x2(a[gr].r[0], f01), a[gr].r[1] = MulF16x2(a[gr].r[1], f01);
        a[gr].r[2] = MulF16x2(a[gr].r[2], f23), a[gr].r[3] = MulF16x2(a[gr].r[3], f23);
      } else {
        a[gr].r[0] = MulBf16x2(a[gr].r[0], f01), a[gr].r[1] = MulBf16x2(a[gr].r[1], f01);
        a[gr].r[2] = MulBf16x2(a[gr].r[2], f23), a[gr].r[3] = MulBf16x2(a[gr].r[3], f23);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t x0 = h == 0 ? v[0].x : v[0].y, x1 = h == 0 ? v[1].x : v[1].y;
    const uint32_t x2 = h == 0 ? v[2].x : v[2].y, x3 = h == 0 ? v[3].x : v[3].y;
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      // Codes (key0 col j, key1 col j, key0 col j+1, key1 col j+1), j = 4h + 2q.
      const uint32_t sel = q == 0 ? 0x5140u : 0x7362u;
      const uint32_t c01 = PermuteBytes(x0, x1, sel);
      const uint32_t c23 = PermuteBytes(x2, x3, sel);
      const int j = 4 * h + 2 * q;
      if constexpr (kMode == 2) {
        const uint2 b01 = E4m3x4ToBf16(c01), b23 = E4m3x4ToBf16(c23);
#pragma unroll
        for (int gr = 0; gr < kGroups; ++gr) {
          MmaBf16(acc[gr][j], a[gr].r, b01.x, b23.x);
          MmaBf16(acc[gr][j + 1], a[gr].r, b01.y, b23.y);
        }
      } else {
        const uint2 b01 = E4m3x4ToF16(c01), b23 = E4m3x4ToF16(c23);
#pragma unroll
        for (int gr = 0; gr < kGroups; ++gr) {
          MmaF16(acc[gr][j], a[gr].r, b01.x, b23.x);
          MmaF16(acc[gr][j + 1], a[gr].r, b01.y, b23.y);
        }
      }
    }
  }
}

#endif

// Every dim of a 64-dim chunk is fed to Q.K^T exactly once.
constexpr bool QkDimsArePermutation() {
  bool seen[64] = {};
  for (int s = 0; s < kQkSteps; ++s) {
    for (int l = 0; l < 64 / kQkSteps; ++l) {
      const int d = QkDim(s, l);
      if (d < 0 || d >= 64 || seen[d]) return false;
      seen[d] = true;
    }
  }
  return true;
}
static_assert(kQkSteps * MmaTile::kK == 64 && QkDimsArePermutation(),
              "the k-steps of a chunk cover its 64 dims once");
static_assert(kPvKeys * (kWarpSize / MmaTile::kN) == MmaTile::kK,
              "a k-step's keys are split over the lanes of a column");

}  // namespace smla::kernels::gpu::direct
