// The sparse MLA attention kernel for fp8 caches without a dequantised tile (docs/operator.md 4-6).
//
// One program of 256 threads owns (row, 16- or 32-head block, split). Tiles of 64 keys are
// gathered into shared memory as in attend_kernel.cuh, but the fp8 codes are never written back
// as bf16: each warp converts exactly the operands its own products read, straight into matrix
// registers (warp w scores one n-tile of keys, kN w .. kN w + kN - 1, over every dim, then
// multiplies P by its kColsPerWarp output columns over all 64 keys: 8 warps of 8 keys and 64
// columns on CUDA, 4 wavefronts of 16 keys and 128 columns on gfx950). The summation orders of
// both dots and the output columns are permuted (direct_layout.h) so that those operands are
// contiguous, conflict-free bytes of a stage row. Without the bf16 tile a program needs about
// 100 KB of shared memory, so two run per SM, and a tile costs three block barriers. Row sums
// stay per lane until the end; only the maxima cross the warps per tile.
//
// On CUDA (direct::kF16Operands) the fp8 codes enter both products as f16 (one paired
// conversion instruction per two codes, exact) instead of scaled bf16: Q is staged as f16 times
// a per-head power of two, fp8_dsv4's chunk scales multiply each chunk's partial score, and its
// per-key value scales multiply P per warp (each warp's 64 columns are one scale group), with a
// per-warp unit for acc. The values are those of docs/operator.md 5's bf16 staging (power-of-two
// scales, exact codes); a tile whose scale bytes spread too far for f16 P runs bf16 operands,
// and a program whose query values do not all convert to f16 exactly (lanes more than about
// 2^31 below their head's largest) stages Q in bf16 and runs every tile on bf16 operands.
// gfx950 keeps the bf16 operands (its P.V product spans two scale groups).
#pragma once

#include <cstdint>

#include "gpu/attend_kernel.cuh"
#include "gpu/direct_layout.h"
#include "gpu/grid_order.h"
#include "gpu/kernel_params.h"
#include "smla/kernels/codec/mxfp8.h"
#include "smla/kernels/epilogue.h"
#include "smla/kernels/formats.h"
#include "smla/kernels/gpu/mma_tile.h"
#include "smla/kernels/gpu/primitives.h"

namespace smla::kernels::gpu {

// kHalfPairs: a 16-head program of rows 2i and 2i+1's 8 heads each (PairMode::kHalves), a
// variant of its own so the one-row program keeps its registers.
template <int kQkWidth_, int kHeadBlock_, int kMinBlocks_, bool kHalfPairs_ = false>
struct DirectConfig {
  static constexpr int kQkWidth = kQkWidth_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kHeadBlock = kHeadBlock_;
  static constexpr bool kHalfPairs = kHalfPairs_;
  static constexpr int kGroups = kHeadBlock / 16;  // 16-head groups sharing each operand
  static constexpr int kKeys = 64;
  static constexpr int kWarps = kKeys / MmaTile::kN;  // one score n-tile each
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kGatherKeysPerWarp = kKeys / kWarps;
  static constexpr int kChunks = kQkWidth / 64;  // 64-dim chunks of Q.K^T
  static constexpr int kQStride = kQkWidth + 8;  // bf16 elements
  static constexpr int kPStride = kKeys + 8;     // bf16 elements
  static constexpr int kRopeStride = 64 + 8;     // bf16 elements of the rope chunk's Q copy
  static constexpr int kColsPerWarp = kValueWidth / kWarps;
  static constexpr int kNTiles = kColsPerWarp / MmaTile::kN;

  static_assert(kQkWidth == 512 || kQkWidth == 576, "QK width is 512 or 576 (docs/operator.md 2)");
  static_assert(kHeadBlock == 16 || kHeadBlock == 32, "16- or 32-head programs");
  static_assert(!kHalfPairs || kHeadBlock == 16, "half pairs fill a 16-head program");
  static_assert(kThreads == 256, "256 threads per program on both vendors");
  static_assert(kColsPerWarp == direct::kOutValues * MmaTile::kN / MmaTile::kColsPerRow &&
                    kNTiles == 8,
                "a warp owns 8 output n-tiles, a lane kOutValues columns of its rows");
  static_assert(64 % MmaTile::kK == 0 && kKeys % MmaTile::kK == 0, "k-steps tile chunks and keys");
  static_assert(((kQStride * 2 / 16) % 2) == 1 && ((kPStride * 2 / 16) % 2) == 1,
                "Q and P row strides: odd numbers of 16-byte units (conflict-free ldmatrix)");
};

// With f16 operands (direct::kF16Operands): Q is staged as f16 times a per-head power of two
// 2^kq (q_scale holds 2^-kq), with a bf16 copy of the rope chunk times the same 2^kq (the
// fp8_dsv4 rope keys are bf16); P is staged twice, bf16 and f16 times 2^15.
template <class C>
struct DirectSmem {
  static constexpr int kF16 = direct::kF16Operands ? 1 : 0;
  static constexpr int kQ = 0;
  static constexpr int kP = kQ + C::kHeadBlock * C::kQStride * 2;
  static constexpr int kP16 = kP + C::kHeadBlock * C::kPStride * 2;
  static constexpr int kQRope = kP16 + kF16 * C::kHeadBlock * C::kPStride * 2;
  static constexpr int kQScale = kQRope + kF16 * C::kHeadBlock * C::kRopeStride * 2;
  static constexpr int kRedMax = kQScale + kF16 * C::kHeadBlock * 4;
  static constexpr int kRedSum = kRedMax + C::kHeadBlock * C::kWarps * 4;
  static constexpr int kValid = kRedSum + C::kHeadBlock * C::kWarps * 4;
  static constexpr int kStages = kValid + kDirectMaxStages * C::kKeys * 4;
  static_assert(kStages % 16 == 0, "stages must start 16-byte aligned");
};

// Scores of the block's heads x this warp's keys (sc[group]: the accumulator of heads
// 16 group + MmaTile::Row, keys MmaTile::Col). Each converted operand feeds every group.
template <class C, int kFormat, bool kFold>
__device__ __forceinline__ void DirectScores(const uint8_t* stage, int stride, const uint16_t* q_s,
                                             float (&sc)[C::kGroups][4]) {
  constexpr bool kDsv4 = kFormat == static_cast<int>(KvFormat::kFp8Dsv4);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int c = direct::FragPair(lane);
  const int key = MmaTile::kN * warp + direct::FragGroup(lane);
  const uint8_t* row = stage + key * stride;
  uint2 rec = make_uint2(0, 0);
  if constexpr (kDsv4) {
    rec = *reinterpret_cast<const uint2*>(stage + C::kKeys * stride + key * kDsv4ScaleBytes);
  }
  const uint16_t* a_row = FragRowPtr(q_s, 0, C::kQStride, lane);
  float s0[C::kGroups][4], s1[C::kGroups][4];
#pragma unroll
  for (int gr = 0; gr < C::kGroups; ++gr) {
#pragma unroll
    for (int i = 0; i < 4; ++i) s0[gr][i] = s1[gr][i] = 0.0f;
  }
#pragma unroll
  for (int ch = 0; ch < C::kChunks; ++ch) {
    uint32_t b[8];
    if (kDsv4 && ch * 64 >= kNopeWidth) {
      // Rope dims, stored as bf16: the two runs are 16 bytes each.
      const uint8_t* src = row + kNopeWidth + 2 * (ch * 64 - kNopeWidth) + 2 * direct::QkRun(c, 0);
      const uint4 x = *reinterpret_cast<const uint4*>(src);
      const uint4 y = *reinterpret_cast<const uint4*>(src + 2 * direct::QkRun(0, 1));
      b[0] = x.x, b[1] = x.y, b[2] = x.z, b[3] = x.w;
      b[4] = y.x, b[5] = y.y, b[6] = y.z, b[7] = y.w;
    } else {
      const uint2 x = *reinterpret_cast<const uint2*>(row + ch * 64 + direct::QkRun(c, 0));
      const uint2 y = *reinterpret_cast<const uint2*>(row + ch * 64 + direct::QkRun(c, 1));
      const uint32_t byte = ((ch < 4 ? rec.x : rec.y) >> (8 * (ch % 4))) & 0xffu;
      const uint2 w[4] = {
          E4m3x4ToBf16Keyed<kDsv4, kFold>(x.x, byte), E4m3x4ToBf16Keyed<kDsv4, kFold>(x.y, byte),
          E4m3x4ToBf16Keyed<kDsv4, kFold>(y.x, byte), E4m3x4ToBf16Keyed<kDsv4, kFold>(y.y, byte)};
#pragma unroll
      for (int i = 0; i < 4; ++i) b[2 * i] = w[i].x, b[2 * i + 1] = w[i].y;
    }
#pragma unroll
    for (int gr = 0; gr < C::kGroups; ++gr) {
#pragma unroll
      for (int s = 0; s < direct::kQkSteps; ++s) {
        AFrag a;
        LoadA(a, a_row + 16 * gr * C::kQStride + ch * 64 + MmaTile::kK * s);
        Mma(s % 2 == 0 ? s0[gr] : s1[gr], a, direct::ScoreB(b, s));
      }
    }
  }
#pragma unroll
  for (int gr = 0; gr < C::kGroups; ++gr) {
#pragma unroll
    for (int i = 0; i < 4; ++i) sc[gr][i] = s0[gr][i] + s1[gr][i];
  }
}

// acc += P V for this warp's output columns over the tile's 64 keys.
template <class C, int kFormat, bool kFold>
__device__ __forceinline__ void DirectPv(const uint8_t* stage, int stride, const uint16_t* p_s,
                                         float (&acc)[C::kGroups][C::kNTiles][4]) {
  constexpr bool kDsv4 = kFormat == static_cast<int>(KvFormat::kFp8Dsv4);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int c = direct::FragPair(lane);
  const int col = C::kColsPerWarp * warp + direct::PvLaneColumn(lane);
  const uint16_t* a_row = FragRowPtr(p_s, 0, C::kPStride, lane);
  // This lane's scale group.
  const uint8_t* rec = stage + C::kKeys * stride + direct::ScaleGroup(warp, col);
  const bool bf16_cols = kDsv4 && direct::RopeColumns(C::kColsPerWarp * warp, col);
#pragma unroll
  for (int ks = 0; ks < C::kKeys / MmaTile::kK; ++ks) {
    AFrag a[C::kGroups];
#pragma unroll
    for (int gr = 0; gr < C::kGroups; ++gr) {
      LoadA(a[gr], a_row + 16 * gr * C::kPStride + MmaTile::kK * ks);
    }
    direct::PvStep<C::kGroups, C::kNTiles, kDsv4, kFold>(stage, stride, rec, MmaTile::kK * ks, col,
                                                         c, bf16_cols, a, acc);
  }
}

// One tile: scores, the shared row maxima, P, then P V. `m_run` is the same in every warp;
// `l_run` is this lane's share of the row sums (its own keys only). [gr][r]: head
// MmaTile::Row(16 gr, lane, r) of the block.
// This warp's row maxima of 16-head group `gr` (tmax, per lane) reduced over the row's lanes
// and published in red_max for the block-wide maximum.
template <class C>
__device__ __forceinline__ void PublishRowMax(float (&tmax)[MmaTile::kRowsPerLane], int gr,
                                              float* red_max) {
  using T = MmaTile;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int r = 0; r < T::kRowsPerLane; ++r) tmax[r] = RowGroupMax<T::kRowLanes>(tmax[r]);
  if (lane % T::kRowLanes == 0) {
    ForEachIndex<T::kRowsPerLane>(
        [&](auto r) { red_max[T::Row(16 * gr, lane, r) * C::kWarps + warp] = tmax[r]; });
  }
}

// The online-softmax step of group `gr` after red_max is complete: the new running maximum
// (m_run), the one to subtract (m_use) and the factor that rescales what came before (alpha).
template <class C>
__device__ __forceinline__ void MergeRowMax(const float* red_max, int gr,
                                            float (&m_run)[MmaTile::kRowsPerLane],
                                            float (&m_use)[MmaTile::kRowsPerLane],
                                            float (&alpha)[MmaTile::kRowsPerLane]) {
  using T = MmaTile;
  static_assert((C::kWarps & (C::kWarps - 1)) == 0, "a power-of-two number of warps");
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int r = 0; r < T::kRowsPerLane; ++r) {
    const float* rm = red_max + T::Row(16 * gr, lane, r) * C::kWarps;
    // A tree, so the chain every warp waits on before its P is log2(kWarps) deep.
    float tm[C::kWarps];
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) tm[w] = rm[w];
#pragma unroll
    for (int n = C::kWarps / 2; n >= 1; n /= 2) {
#pragma unroll
      for (int w = 0; w < n; ++w) tm[w] = fmaxf(tm[w], tm[w + n]);
    }
    const float m_new = fmaxf(m_run[r], tm[0]);
    // A fully masked prefix keeps m = -inf; subtracting 0 then gives p = 0, not NaN.
    m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
    alpha[r] = Exp2Ftz(m_run[r] - m_use[r]);
    m_run[r] = m_new;
  }
}

// p = 2^(score - m_use) for this lane's scores of group `gr`: added to the row sums (after
// rescaling them by alpha) and handed to store(index in P, p) at its place in the P tile.
template <class C, class Store>
__device__ __forceinline__ void ExpScores(const float (&sc)[4],
                                          const float (&m_use)[MmaTile::kRowsPerLane],
                                          const float (&alpha)[MmaTile::kRowsPerLane], int gr,
                                          float (&l_run)[MmaTile::kRowsPerLane], Store store) {
  using T = MmaTile;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = i / T::kColsPerRow;
    const float p = Exp2Ftz(sc[i] - m_use[r]);
    l_run[r] = (i % T::kColsPerRow) ? l_run[r] + p : l_run[r] * alpha[r] + p;
    const int key = T::kN * warp + T::Col(lane, i % T::kColsPerRow);
    const int pos = T::kK * (key / T::kK) + direct::PvPosition(key % T::kK);
    store(T::Row(16 * gr, lane, r) * C::kPStride + pos, p);
  }
}

// Rescales one group's output accumulators by its rows' alpha.
template <class C>
__device__ __forceinline__ void RescaleAcc(const float (&alpha)[MmaTile::kRowsPerLane],
                                           float (&acc)[C::kNTiles][4]) {
#pragma unroll
  for (int j = 0; j < C::kNTiles; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] *= alpha[i / MmaTile::kColsPerRow];
  }
}

// Whether the row of accumulator value i of 16-head group gr attends a key with row mask `mask`
// (IssueTileDirect's valid[]): bit gr, or with half pairs (C::kHalfPairs) the bit of the 8-head
// half its head slot lies in.
template <class C>
__device__ __forceinline__ bool RowAttends(int32_t mask, int gr, int i) {
  if constexpr (C::kHalfPairs) {
    const int lane = threadIdx.x % kWarpSize;
    return (mask >> (MmaTile::Row(0, lane, i / MmaTile::kColsPerRow) / 8)) & 1;
  } else {
    return (mask >> gr) & 1;
  }
}

template <class C, int kFormat, bool kFold>
__device__ __forceinline__ void DirectTile(const SegmentArgs& s, const uint8_t* stage,
                                           const int32_t* valid, const uint16_t* q_s, uint16_t* p_s,
                                           float* red_max, float (&acc)[C::kGroups][C::kNTiles][4],
                                           float (&m_run)[C::kGroups][MmaTile::kRowsPerLane],
                                           float (&l_run)[C::kGroups][MmaTile::kRowsPerLane]) {
  using T = MmaTile;
  constexpr int kRows = T::kRowsPerLane;
  constexpr int kCols = T::kColsPerRow;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int stride = DirectRowStride(kFormat, C::kQkWidth);
  float sc[C::kGroups][4];
  DirectScores<C, kFormat, kFold>(stage, stride, q_s, sc);
#pragma unroll
  for (int gr = 0; gr < C::kGroups; ++gr) {
    float tmax[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) tmax[r] = -INFINITY;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = T::kN * warp + T::Col(lane, i % kCols);
      const float x = RowAttends<C>(valid[key], gr, i) ? sc[gr][i] * s.score_scale2 : -INFINITY;
      sc[gr][i] = x;
      tmax[i / kCols] = fmaxf(tmax[i / kCols], x);
    }
    PublishRowMax<C>(tmax, gr, red_max);
  }
  __syncthreads();
  const float ps = s.p_scale;
#pragma unroll
  for (int gr = 0; gr < C::kGroups; ++gr) {
    float m_use[kRows], alpha[kRows];
    MergeRowMax<C>(red_max, gr, m_run[gr], m_use, alpha);
    ExpScores<C>(sc[gr], m_use, alpha, gr, l_run[gr],
                 [&](int at, float p) { p_s[at] = static_cast<uint16_t>(PackBf16(p * ps, 0.0f)); });
    RescaleAcc<C>(alpha, acc[gr]);
  }
  __syncthreads();  // P complete
  DirectPv<C, kFormat, kFold>(stage, stride, p_s, acc);
}

// Whether every scale byte of an fp8_dsv4 stage allows the folded conversion. Every warp reads
// the same 64 records, so the answer is the same for the whole program.
template <class C>
__device__ __forceinline__ bool DirectTileFolds(const uint8_t* stage) {
  constexpr int kPerLane = C::kKeys / kWarpSize;
  static_assert(C::kKeys % kWarpSize == 0, "each lane checks the same number of records");
  const int lane = threadIdx.x % kWarpSize;
  const int stride = DirectRowStride(static_cast<int>(KvFormat::kFp8Dsv4), C::kQkWidth);
  const uint8_t* rec = stage + C::kKeys * stride;
  uint32_t top = 0;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    top = max(top, MaxScaleByte(*reinterpret_cast<const uint2*>(rec + (lane + k * kWarpSize) *
                                                                          kDsv4ScaleBytes)));
  }
  return WarpAll(top <= kFoldMax);
}

// Issues the asynchronous gather of one tile (as IssueTileStrided, same stage layout): warp w's
// keys w + kWarps j (lane j holds key j's slot) are copied as one run of kRowChunks 16-byte
// chunks per key spread evenly over the lanes, so every lane issues the same number of copies
// and each copy's row comes from one shuffle; lane j copies key j's fp8_dsv4 scale record.
// valid[] gets each key's row mask (bit r: the pair's row 2i + r attends it, RowAttends; all
// bits when the program owns one row; 0 for keys that are no valid slot).
template <class C, int kRowChunks>
__device__ __forceinline__ void IssueTileDirect(const SegmentArgs& s, int32_t my_slot,
                                                int32_t my_mask, uint8_t* stage, int32_t* valid,
                                                int stride, int rec_offset, bool dsv4) {
  constexpr int kKeysPerWarp = C::kGatherKeysPerWarp;
  constexpr int kTotal = kKeysPerWarp * kRowChunks;
  static_assert(kTotal % kWarpSize == 0, "whole rounds of copies");
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const bool my_ok = my_slot >= 0 && my_slot < s.num_slots;
  const int slot = my_ok ? my_slot : 0;
  const uint64_t page = static_cast<uint64_t>(slot >> s.rows_per_page_log2) * s.pitch;
  const int row = slot & (s.rows_per_page - 1);
  const uint64_t my_off = page + static_cast<uint64_t>(row) * (16 * kRowChunks);
  if (lane < kKeysPerWarp) valid[warp + lane * C::kWarps] = my_ok ? my_mask : 0;
  const LaneMask ok_mask = WarpBallot(my_ok);
  const uint32_t st = SharedAddress(stage);
#pragma unroll
  for (int m = 0; m < kTotal / kWarpSize; ++m) {
    // Unhoisted: on gfx950 each round's part and row offsets (36-chunk rows) would otherwise
    // be held for the whole tile loop, past the 16-head programs' 256 VGPRs, in scratch.
    const int i = Unhoisted(lane + m * kWarpSize);
    const int j = i / kRowChunks;
    const int part = i - j * kRowChunks;
    const uint64_t off = WarpShuffle(my_off, j) + 16 * part;
    const bool ok = (ok_mask >> j) & 1u;
    AsyncCopy16(st + (warp + j * C::kWarps) * stride + 16 * part, s.base + off, ok);
  }
  if (dsv4 && lane < kKeysPerWarp) {
    const uint64_t rec_off = page + static_cast<uint64_t>(s.rows_per_page) * kDsv4DataBytes +
                             static_cast<uint64_t>(row) * kDsv4ScaleBytes;
    AsyncCopy8(st + rec_offset + (warp + lane * C::kWarps) * kDsv4ScaleBytes, s.base + rec_off,
               my_ok);
  }
}

// ---- f16 operands (direct::kF16Operands) ----

// Scores as DirectScores, with the fp8 chunks' codes as f16 operands: an fp8_dsv4 chunk's partial
// score is multiplied by its key's scale (C column Col(lane, i)); the rope chunk runs in bf16
// against the rope copy of Q. Scores are in units of 2^kq of the row's head (q_scale).
template <class C, int kFormat>
__device__ __forceinline__ void DirectScoresF16(const uint8_t* stage, int stride,
                                                const uint16_t* q16_s, const uint16_t* qrope_s,
                                                float (&sc)[C::kGroups][4]) {
  using T = MmaTile;
  constexpr bool kDsv4 = kFormat == static_cast<int>(KvFormat::kFp8Dsv4);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int c = direct::FragPair(lane);
  const int key = T::kN * warp + direct::FragGroup(lane);
  const uint8_t* row = stage + key * stride;
  const uint16_t* a_row = FragRowPtr(q16_s, 0, C::kQStride, lane);
  const uint16_t* r_row = FragRowPtr(qrope_s, 0, C::kRopeStride, lane);
  uint2 rec[T::kColsPerRow];
  if constexpr (kDsv4) {
#pragma unroll
    for (int i = 0; i < T::kColsPerRow; ++i) {
      rec[i] = *reinterpret_cast<const uint2*>(stage + C::kKeys * stride +
                                               (T::kN * warp + T::Col(lane, i)) * kDsv4ScaleBytes);
    }
  }
  float s0[C::kGroups][4], s1[C::kGroups][4];
#pragma unroll
  for (int gr = 0; gr < C::kGroups; ++gr) {
#pragma unroll
    for (int i = 0; i < 4; ++i) s0[gr][i] = s1[gr][i] = 0.0f;
  }
#pragma unroll
  for (int ch = 0; ch < C::kChunks; ++ch) {
    if (kDsv4 && ch * 64 >= kNopeWidth) {
      uint32_t b[8];
      const uint8_t* src = row + kNopeWidth + 2 * (ch * 64 - kNopeWidth) + 2 * direct::QkRun(c, 0);
      const uint4 x = *reinterpret_cast<const uint4*>(src);
      const uint4 y = *reinterpret_cast<const uint4*>(src + 2 * direct::QkRun(0, 1));
      b[0] = x.x, b[1] = x.y, b[2] = x.z, b[3] = x.w;
      b[4] = y.x, b[5] = y.y, b[6] = y.z, b[7] = y.w;
#pragma unroll
      for (int gr = 0; gr < C::kGroups; ++gr) {
#pragma unroll
        for (int s = 0; s < direct::kQkSteps; ++s) {
          AFrag a;
          LoadA(a, r_row + 16 * gr * C::kRopeStride + (ch * 64 - kNopeWidth) + MmaTile::kK * s);
          Mma(s % 2 == 0 ? s0[gr] : s1[gr], a, direct::ScoreB(b, s));
        }
      }
    } else if constexpr (kDsv4) {
      // One accumulator per chunk: its 4 products chain, the chunks run side by side.
      float t0[C::kGroups][4];
#pragma unroll
      for (int gr = 0; gr < C::kGroups; ++gr) {
#pragma unroll
        for (int i = 0; i < 4; ++i) t0[gr][i] = 0.0f;
      }
      direct::ScoreChunkF16<C::kGroups>(row + ch * 64, c, a_row + ch * 64, 16 * C::kQStride, t0,
                                        t0);
      float f[T::kColsPerRow];
#pragma unroll
      for (int i = 0; i < T::kColsPerRow; ++i) {
        const uint32_t word = ch < 4 ? rec[i].x : rec[i].y;
        f[i] = E8m0ToFloat((word >> (8 * (ch % 4))) & 0xffu) * static_cast<float>(1 << kF16CodeExp);
      }
#pragma unroll
      for (int gr = 0; gr < C::kGroups; ++gr) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s0[gr][i] += t0[gr][i] * f[i % T::kColsPerRow];
      }
    } else {
      direct::ScoreChunkF16<C::kGroups>(row + ch * 64, c, a_row + ch * 64, 16 * C::kQStride, s0,
                                        s1);
    }
  }
#pragma unroll
  for (int gr = 0; gr < C::kGroups; ++gr) {
#pragma unroll
    for (int i = 0; i < 4; ++i) sc[gr][i] = s0[gr][i] + s1[gr][i];
  }
}

// acc += P V over the tile's 64 keys for this warp's fp8 columns (direct::PvStepF16's kMode).
template <class C, int kMode>
__device__ __forceinline__ void DirectPvF16(const uint8_t* stage, int stride, const uint16_t* p_src,
                                            int eb, float (&acc)[C::kGroups][C::kNTiles][4]) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int c = direct::FragPair(lane);
  const int col = C::kColsPerWarp * warp + direct::PvLaneColumn(lane);
  const uint16_t* a_row = FragRowPtr(p_src, 0, C::kPStride, lane);
  const uint8_t* rec = stage + C::kKeys * stride + direct::ScaleGroup(warp, col);
#pragma unroll
  for (int ks = 0; ks < C::kKeys / MmaTile::kK; ++ks) {
    AFrag a[C::kGroups];
#pragma unroll
    for (int gr = 0; gr < C::kGroups; ++gr) {
      LoadA(a[gr], a_row + 16 * gr * C::kPStride + MmaTile::kK * ks);
    }
    direct::PvStepF16<C::kGroups, C::kNTiles, kMode>(stage, stride, rec, MmaTile::kK * ks, col, c,
                                                     eb, a, acc);
  }
}

// 2^(e - 127) as f32 for 0 <= e <= 254 + 127, exact (subnormal below e = 1).
__device__ __forceinline__ float Pow2Biased(int e) {
  return __uint_as_float(e >= 1 ? static_cast<uint32_t>(e) << 23 : 0x00400000u >> min(-e, 31));
}

// One tile with f16 operands. acc is kept per warp in units of `unit` (true = acc * unit): an
// fp8_dsv4 warp's unit is 2^(142 - eb) for the largest scale byte eb of its group seen so far,
// fp8_per_tensor's sigma * 2^-15, the bf16 rope columns' 1; a new unit rescales acc with alpha.
template <class C, int kFormat>
__device__ __forceinline__ void DirectTileF16(
    const SegmentArgs& s, const uint8_t* stage, const int32_t* valid, const uint16_t* q16_s,
    const uint16_t* qrope_s, const float* qscale_s, uint16_t* p_s, uint16_t* p16_s, float* red_max,
    float (&acc)[C::kGroups][C::kNTiles][4], float (&m_run)[C::kGroups][MmaTile::kRowsPerLane],
    float (&l_run)[C::kGroups][MmaTile::kRowsPerLane], float& unit, int& eb) {
  using T = MmaTile;
  constexpr int kRows = T::kRowsPerLane;
  constexpr int kCols = T::kColsPerRow;
  constexpr bool kDsv4 = kFormat == static_cast<int>(KvFormat::kFp8Dsv4);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int stride = DirectRowStride(kFormat, C::kQkWidth);
  float sc[C::kGroups][4];
  DirectScoresF16<C, kFormat>(stage, stride, q16_s, qrope_s, sc);
  // fp8_per_tensor scores are in units of 2^-kF16CodeExp too (fp8_dsv4's chunk scales hold it).
  const float score_scale =
      kDsv4 ? s.score_scale2 : s.score_scale2 * static_cast<float>(1 << kF16CodeExp);
#pragma unroll
  for (int gr = 0; gr < C::kGroups; ++gr) {
    float tmax[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) tmax[r] = -INFINITY;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = T::kN * warp + T::Col(lane, i % kCols);
      const float qs = qscale_s[T::Row(16 * gr, lane, i / kCols)];
      const float x = RowAttends<C>(valid[key], gr, i) ? sc[gr][i] * (score_scale * qs) : -INFINITY;
      sc[gr][i] = x;
      tmax[i / kCols] = fmaxf(tmax[i / kCols], x);
    }
    PublishRowMax<C>(tmax, gr, red_max);
  }

  // This warp's P.V operands and unit for the tile (warp-uniform).
  const int col0 = C::kColsPerWarp * warp;
  const bool rope_cols = kDsv4 && direct::RopeColumns(col0, col0);
  int mode = 0;
  constexpr int kE = kF16CodeExp;
  float unit_t = s.p_scale * Pow2Biased(2 * kE - 15 + 127);
  if (kDsv4 && rope_cols) {
    mode = 3;
    unit_t = 1.0f;
  } else if (kDsv4) {
    const uint8_t* rec = stage + C::kKeys * stride + direct::ScaleGroup(warp, col0);
    uint32_t bmax = 0, bmin = 255;
#pragma unroll
    for (int k = lane; k < C::kKeys; k += kWarpSize) {
      if (valid[k]) {
        const uint32_t b = rec[k * kDsv4ScaleBytes];
        bmax = max(bmax, b);
        bmin = min(bmin, b);
      }
    }
    bmax = WarpMaxU32(bmax);
    bmin = WarpMinU32(bmin);
    // The new unit never undercuts the one acc is in (after fp8_per_tensor tiles of a mixed
    // call), so the rescale below cannot overflow: 2^(eb - 142) >= unit.
    int floor_eb = 0;
    if (unit >= 1.17549435e-38f) {
      const uint32_t u = __float_as_uint(unit);
      floor_eb = static_cast<int>(u >> 23) + 15 - kE + ((u & 0x7fffffu) != 0 ? 1 : 0);
    }
    eb = min(max(max(eb, static_cast<int>(bmax)), floor_eb), 269 - kE);
    mode = eb - static_cast<int>(bmin) <= 14 + kE ? 1 : 2;
    unit_t = Pow2Biased(eb + kE - 15);
  }
  // acc's rescale to the new unit: usually none; a power of two within fp8_dsv4 (exact through
  // the reciprocal power of two while unit_t is normal); a division across formats.
  float ratio = 1.0f;
  if (unit != unit_t) {
    if (unit == 0.0f) {
      ratio = 0.0f;
    } else if (kDsv4 && !rope_cols && eb + kE - 15 >= 1) {
      ratio = unit * Pow2Biased(254 - (eb + kE - 15));
    } else {
      ratio = unit / unit_t;
    }
  }
  unit = unit_t;

  __syncthreads();
#pragma unroll
  for (int gr = 0; gr < C::kGroups; ++gr) {
    float m_use[kRows], alpha[kRows];
    MergeRowMax<C>(red_max, gr, m_run[gr], m_use, alpha);
    ExpScores<C>(sc[gr], m_use, alpha, gr, l_run[gr], [&](int at, float p) {
      const float pb = RoundToBf16Fast(p);
      p_s[at] = static_cast<uint16_t>(__float_as_uint(pb) >> 16);  // pb is a bf16 value
      p16_s[at] = F32ToF16Bits(pb * static_cast<float>(1 << (15 - kE)));
    });
#pragma unroll
    for (int r = 0; r < kRows; ++r) alpha[r] *= ratio;
    RescaleAcc<C>(alpha, acc[gr]);
  }
  __syncthreads();  // P complete
  switch (mode) {
    case 0:
      DirectPvF16<C, 0>(stage, stride, p16_s, eb, acc);
      break;
    case 1:
      DirectPvF16<C, 1>(stage, stride, p16_s, eb, acc);
      break;
    case 2:
      DirectPvF16<C, 2>(stage, stride, p_s, eb, acc);
      break;
    default:
      DirectPv<C, kFormat, false>(stage, stride, p_s, acc);
      break;
  }
}

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    SparseMlaAttendDirectKernel(const __grid_constant__ AttendKernelParams p) {
  // grid_order.h: the wait for the grid before precedes any access to memory it may write;
  // queries no earlier grid writes (q_before_launch) are staged before it, overlapping its end.
  LetNextGridStart();
  using S = DirectSmem<C>;
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem + S::kQ);
  uint16_t* q16_s = q_s;  // the f16 Q with direct::kF16Operands
  uint16_t* p_s = reinterpret_cast<uint16_t*>(smem + S::kP);
  uint16_t* p16_s = reinterpret_cast<uint16_t*>(smem + S::kP16);
  uint16_t* qrope_s = reinterpret_cast<uint16_t*>(smem + S::kQRope);
  float* qscale_s = reinterpret_cast<float*>(smem + S::kQScale);
  float* red_max = reinterpret_cast<float*>(smem + S::kRedMax);
  float* red_sum = reinterpret_cast<float*>(smem + S::kRedSum);
  int32_t* valid_s = reinterpret_cast<int32_t*>(smem + S::kValid);
  uint8_t* stages = smem + S::kStages;

  // Work order: head block fastest, then split, then row (plan.h, WorkOrder::kRowMajor). A
  // paired program (PairMode) owns rows 2 row and 2 row + 1 over the union of their keys: as
  // its 16-head groups 0 and 1, both for heads 16 hb .. 16 hb + 15 (32-head variants), or as
  // the two 8-head halves of its 16 head slots (the C::kHalfPairs variants, H <= 8).
  const int64_t pid = blockIdx.x;
  const int hb = static_cast<int>(pid % p.head_blocks);
  const int split = static_cast<int>((pid / p.head_blocks) % p.splits);
  const int row = static_cast<int>(pid / (int64_t{p.head_blocks} * p.splits));
  const bool group_pairs = C::kGroups == 2 && p.paired == static_cast<int>(PairMode::kGroups);
  constexpr bool half_pairs = C::kHalfPairs;
  const bool paired = group_pairs || half_pairs;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  using T = MmaTile;
  constexpr int kRows = T::kRowsPerLane;
  constexpr int kCols = T::kColsPerRow;
  constexpr int kOut = direct::kOutValues;
  // Query row and head of head slot h (0 .. kHeadBlock - 1).
  auto slot_row = [&](int h) {
    return group_pairs ? 2 * row + h / 16 : half_pairs ? 2 * row + h / 8 : row;
  };
  auto slot_head = [&](int h) {
    return group_pairs ? 16 * hb + h % 16 : half_pairs ? h % 8 : hb * C::kHeadBlock + h;
  };

  // Q in the permuted dim order of direct_layout.h (heads past H are zero and never stored).
  // Returns f16_q: whether the program runs f16 operands (DirectTileF16); otherwise Q is staged
  // in bf16 and every tile takes the bf16 operands of DirectTile.
  auto stage_q = [&]() -> bool {
    bool f16_q = false;
    if constexpr (direct::kF16Operands) {
      // One warp per head: f16 of q * 2^kq with kq such that the head's largest |q| lands in
      // [2^14, 2^15), so every bf16 (or e4m3) value of Q above 2^-31 of that maximum is exact.
      // f16's 40 binades are far fewer than bf16's: a head with smaller non-zero values (lanes
      // whose keys are as much larger, so that their products still count) would lose them, so
      // unless every value of the block converts exactly the program stages Q in bf16 instead.
      constexpr int kUnits = C::kQkWidth / 8;
      constexpr int kPer = (kUnits + kWarpSize - 1) / kWarpSize;
      constexpr int kHeadsPerWarp = C::kHeadBlock / C::kWarps;
      static_assert(C::kHeadBlock % C::kWarps == 0, "every warp stages the same number of heads");
      // Every load of the warp's heads is issued before any is used: one global round trip for
      // the prologue instead of one per load.
      uint32_t raw[kHeadsPerWarp][kPer][4];
#pragma unroll
      for (int j = 0; j < kHeadsPerWarp; ++j) {
        const int h = warp + j * C::kWarps;
        const int qhead = slot_head(h);
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const int u = lane + k * kWarpSize;
          const int p0 = (u % kUnits) * 8;
          const int base = (p0 / 64) * 64 + direct::QkDim((p0 % 64) / T::kK, p0 % T::kK);
          const int64_t off = (int64_t{slot_row(h)} * p.num_heads + qhead) * C::kQkWidth + base;
          const bool in = qhead < p.num_heads && u < kUnits;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            raw[j][k][i] = 0;
            if (in) {
              const uint8_t* at = static_cast<const uint8_t*>(p.q) +
                                  (off + direct::QkUnitOffset(i)) * (p.q_fp8 ? 1 : 2);
              raw[j][k][i] = p.q_fp8 ? uint32_t{*reinterpret_cast<const uint16_t*>(at)}
                                     : *reinterpret_cast<const uint32_t*>(at);
            }
          }
        }
      }
      // Values k-pair i of unit k of head j.
      auto q_pair = [&](int j, int k, int i) {
        const uint32_t w = raw[j][k][i];
        return p.q_fp8 ? E4m3x2ToFloat2(static_cast<uint16_t>(w))
                       : make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
      };
      float up[kHeadsPerWarp];  // 2^kq of head j
      bool exact = true;
#pragma unroll
      for (int j = 0; j < kHeadsPerWarp; ++j) {
        const int h = warp + j * C::kWarps;
        float amax = 0.0f;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 f = q_pair(j, k, i);
            amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
          }
        }
        amax = RowGroupMax<kWarpSize>(amax);
        const int ex = static_cast<int>((__float_as_uint(amax) >> 23) & 0xffu) - 127;
        const int kq = amax == 0.0f ? 0 : min(max(14 - ex, -113), 120);
        up[j] = __uint_as_float(static_cast<uint32_t>(kq + 127) << 23);
        if (lane == 0) qscale_s[h] = __uint_as_float(static_cast<uint32_t>(127 - kq) << 23);
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 f = q_pair(j, k, i);
            const float a = f.x * up[j], b = f.y * up[j];
            exact =
                exact && F16BitsToF32(F32ToF16Bits(a)) == a && F16BitsToF32(F32ToF16Bits(b)) == b;
          }
        }
      }
      f16_q = __syncthreads_and(exact) != 0;
#pragma unroll
      for (int j = 0; j < kHeadsPerWarp; ++j) {
        const int h = warp + j * C::kWarps;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const int u = lane + k * kWarpSize;
          if (u >= kUnits) continue;
          const int p0 = u * 8;
          uint32_t w[4], r[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 f = q_pair(j, k, i);
            const float a = f.x * up[j], b = f.y * up[j];
            w[i] = f16_q ? uint32_t{F32ToF16Bits(a)} | (uint32_t{F32ToF16Bits(b)} << 16)
                         : PackBf16(f.x, f.y);
            r[i] = PackBf16(a, b);
          }
          *reinterpret_cast<uint4*>(q16_s + h * C::kQStride + p0) =
              make_uint4(w[0], w[1], w[2], w[3]);
          if (f16_q && C::kQkWidth == kValueWidth && p0 >= kNopeWidth) {
            *reinterpret_cast<uint4*>(qrope_s + h * C::kRopeStride + (p0 - kNopeWidth)) =
                make_uint4(r[0], r[1], r[2], r[3]);
          }
        }
      }
    } else {
      constexpr int kUnits = C::kQkWidth / 8;
      for (int u = threadIdx.x; u < C::kHeadBlock * kUnits; u += C::kThreads) {
        const int h = u / kUnits;
        const int p0 = (u % kUnits) * 8;
        const int base = (p0 / 64) * 64 + direct::QkDim((p0 % 64) / T::kK, p0 % T::kK);
        uint32_t w[4] = {0, 0, 0, 0};
        const int qhead = slot_head(h);
        if (qhead < p.num_heads) {
          const int64_t off = (int64_t{slot_row(h)} * p.num_heads + qhead) * C::kQkWidth + base;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int64_t at = off + direct::QkUnitOffset(i);
            if (p.q_fp8) {
              const uint16_t two =
                  *reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(p.q) + at);
              const float2 f = E4m3x2ToFloat2(two);
              w[i] = PackBf16(f.x, f.y);
            } else {
              w[i] = *reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(p.q) + at);
            }
          }
        }
        *reinterpret_cast<uint4*>(q_s + h * C::kQStride + p0) = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    return f16_q;
  };
  bool f16_q = false;
  if (p.q_before_launch != 0) f16_q = stage_q();
  WaitForPriorGrid();

  // A paired program's row is a pair (union_rows 2).
  const auto [begin0, len0, begin1, len1, tiles0, tiles1] =
      paired ? UnitKeysOf(p, row) : RowKeysOf(p, row);
  // A paired program takes an even share of its pair's union tiles (known only here).
  const int per_split = paired ? (tiles0 + tiles1 + p.splits - 1) / p.splits : p.tiles_per_split;
  const int t_begin = split * per_split;
  const int t_end = min(t_begin + per_split, tiles0 + tiles1);
  // Lane j < kGatherKeysPerWarp: key j of the warp's share of tile t, and its row mask.
  auto load_slot = [&](int t) -> int2 {
    if (t >= t_end) return make_int2(-1, 0);
    const bool first = t < tiles0;
    const SegmentArgs& sg = first ? p.seg[0] : p.seg[1];
    const int begin = first ? begin0 : begin1;
    const int len = first ? len0 : len1;
    const int key0 = (first ? t : t - tiles0) * kTileKeys;
    if (!paired) return make_int2(LoadTileSlot<C>(sg, begin, len, key0), -1);
    int2 r = make_int2(-1, 0);
    if (lane < C::kGatherKeysPerWarp) {
      const int key = key0 + warp + lane * C::kWarps;
      if (key < len) {
        r.x = __ldg(sg.union_indices + begin + key);
        r.y = sg.union_mask[begin + key];
      }
    }
    return r;
  };
  auto issue = [&](int t, int2 slot, int stage) {
    const SegmentArgs& s = t < tiles0 ? p.seg[0] : p.seg[1];
    const int stride = DirectRowStride(s.format, C::kQkWidth);
    const bool dsv4 = s.format == static_cast<int>(KvFormat::kFp8Dsv4);
    uint8_t* st = stages + stage * p.stage_bytes;
    int32_t* v = valid_s + stage * C::kKeys;
    // Row bytes: 576 (fp8_dsv4 data, 576-wide fp8_per_tensor) or 512.
    if (C::kQkWidth == 576 || dsv4) {
      IssueTileDirect<C, 36>(s, slot.x, slot.y, st, v, stride, C::kKeys * stride, dsv4);
    } else {
      IssueTileDirect<C, 32>(s, slot.x, slot.y, st, v, stride, C::kKeys * stride, false);
    }
  };

  // Gather stages: tiles t+1 .. t+N-1 are in flight while tile t is used. A stage is refilled
  // right after the barrier that opens the next tile, so no barrier closes a tile.
  const int n_stages = p.num_stages;
  int2 next_slot = load_slot(t_begin);
  for (int t = t_begin; t < t_begin + n_stages - 1; ++t) {
    if (t < t_end) {
      issue(t, next_slot, t - t_begin);
      next_slot = load_slot(t + 1);
    }
    AsyncCommit();
  }
  if (p.q_before_launch == 0) f16_q = stage_q();

  float acc[C::kGroups][C::kNTiles][4];
  float m_run[C::kGroups][kRows];  // heads T::Row(16 gr, lane, r), base 2
  float l_run[C::kGroups][kRows];
#pragma unroll
  for (int gr = 0; gr < C::kGroups; ++gr) {
#pragma unroll
    for (int j = 0; j < C::kNTiles; ++j) {
      acc[gr][j][0] = acc[gr][j][1] = acc[gr][j][2] = acc[gr][j][3] = 0.0f;
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) m_run[gr][r] = -INFINITY, l_run[gr][r] = 0.0f;
  }

  // With f16 operands the true acc is acc * unit (DirectTileF16); bf16 operands keep true acc.
  float unit = f16_q ? 0.0f : 1.0f;
  int eb = 0;
  // Stage of tile t, rolled instead of (t - t_begin) % n_stages: n_stages is a launch value, and
  // a division per tile sits on every warp's path to the tile.
  int stage = 0;
  for (int t = t_begin; t < t_end; ++t) {
    switch (n_stages) {
      case 4:
        AsyncWait<2>();
        break;
      case 3:
        AsyncWait<1>();
        break;
      default:
        AsyncWait<0>();
        break;
    }
    __syncthreads();  // tile t landed everywhere; every warp is done with tile t-1
    const int v = t + n_stages - 1;
    if (v < t_end) {
      issue(v, next_slot, stage == 0 ? n_stages - 1 : stage - 1);  // the stage tile t-1 used
      next_slot = load_slot(v + 1);
    }
    AsyncCommit();
    const SegmentArgs& s = t < tiles0 ? p.seg[0] : p.seg[1];
    const uint8_t* st = stages + stage * p.stage_bytes;
    const int32_t* valid = valid_s + stage * C::kKeys;
    stage = stage + 1 == n_stages ? 0 : stage + 1;
    constexpr int kDsv4 = static_cast<int>(KvFormat::kFp8Dsv4);
    if constexpr (direct::kF16Operands) {
      if (f16_q) {
        if (s.format == kDsv4) {
          DirectTileF16<C, kDsv4>(s, st, valid, q16_s, qrope_s, qscale_s, p_s, p16_s, red_max, acc,
                                  m_run, l_run, unit, eb);
        } else {
          DirectTileF16<C, static_cast<int>(KvFormat::kFp8PerTensor)>(s, st, valid, q16_s, qrope_s,
                                                                      qscale_s, p_s, p16_s, red_max,
                                                                      acc, m_run, l_run, unit, eb);
        }
        continue;
      }
    }
    if (s.format == kDsv4) {
      // CUDA's bf16 fallback (f16_q false) leaves the fold out: one variant fewer in its code.
      if (!direct::kF16Operands && p.fold_scales && DirectTileFolds<C>(st)) {
        DirectTile<C, kDsv4, true>(s, st, valid, q_s, p_s, red_max, acc, m_run, l_run);
      } else {
        DirectTile<C, kDsv4, false>(s, st, valid, q_s, p_s, red_max, acc, m_run, l_run);
      }
    } else {
      DirectTile<C, static_cast<int>(KvFormat::kFp8PerTensor), false>(s, st, valid, q_s, p_s,
                                                                      red_max, acc, m_run, l_run);
    }
  }
  AsyncWait<0>();
  if constexpr (direct::kF16Operands) {
#pragma unroll
    for (int gr = 0; gr < C::kGroups; ++gr) {
#pragma unroll
      for (int j = 0; j < C::kNTiles; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[gr][j][i] *= unit;
      }
    }
  }

  // Row sums: the row's lanes, then the warps.
#pragma unroll
  for (int gr = 0; gr < C::kGroups; ++gr) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      l_run[gr][r] = RowGroupSum<T::kRowLanes>(l_run[gr][r]);
      if (lane % T::kRowLanes == 0)
        red_sum[T::Row(16 * gr, lane, r) * C::kWarps + warp] = l_run[gr][r];
    }
  }
  __syncthreads();
#pragma unroll
  for (int gr = 0; gr < C::kGroups; ++gr) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float l = 0.0f;
#pragma unroll
      for (int w = 0; w < C::kWarps; ++w) l += red_sum[T::Row(16 * gr, lane, r) * C::kWarps + w];
      l_run[gr][r] = l;
    }
  }

  // The lane holds output columns col_base .. col_base + kOut - 1 of its rows.
  const int col_base = C::kColsPerWarp * warp + direct::OutColumn(direct::OutLane(lane), 0, 0);
  if (p.splits > 1) {
#pragma unroll
    for (int gr = 0; gr < C::kGroups; ++gr) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int slot = T::Row(16 * gr, lane, r);
        const int head = slot_head(slot);
        if (head >= p.num_heads) continue;
        const int64_t ph = (int64_t{slot_row(slot)} * p.num_heads + head) * p.splits + split;
        float* dst = p.part_acc + ph * kValueWidth + col_base;
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
#pragma unroll
          for (int j = 0; j < C::kNTiles; j += 4) {
            const int e = T::CIndex(r, i);
            *reinterpret_cast<float4*>(dst + direct::OutColumn(0, i, j)) =
                make_float4(acc[gr][j][e], acc[gr][j + 1][e], acc[gr][j + 2][e], acc[gr][j + 3][e]);
          }
        }
        if (warp == 0 && lane % T::kRowLanes == 0) {
          p.part_ml[2 * ph] = m_run[gr][r];
          p.part_ml[2 * ph + 1] = l_run[gr][r];
        }
      }
    }
    return;
  }

  // Final store: normalise with the sink (as CombinePartials), then the epilogue.
#pragma unroll
  for (int gr = 0; gr < C::kGroups; ++gr) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int slot = T::Row(16 * gr, lane, r);
      const int out_t = slot_row(slot);
      const float* cs = nullptr;
      if (p.positions != nullptr) cs = p.cos_sin + int64_t{p.positions[out_t]} * 64;
      const int head = slot_head(slot);
      const bool live = head < p.num_heads;
      const bool has_sink = p.sink != nullptr;
      const float sink2 = has_sink && live ? p.sink[head] * kLog2e : -INFINITY;
      const float m = fmaxf(m_run[gr][r], sink2);
      float w = 0.0f, inv = 0.0f, lse = -INFINITY;
      if (m != -INFINITY) {
        w = exp2f(m_run[gr][r] - m);
        const float z = l_run[gr][r] * w + (has_sink ? exp2f(sink2 - m) : 0.0f);
        inv = 1.0f / z;
        lse = (m + log2f(z)) * kLn2;
      }
      // x[k]: column col_base + k.
      float x[kOut];
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
#pragma unroll
        for (int j = 0; j < C::kNTiles; ++j) {
          // fmaf(., inv, 0): the product's rounding, and a -0 turned into +0, in one step.
          x[direct::OutColumn(0, i, j)] =
              RoundToBf16Fast(fmaf(acc[gr][j][T::CIndex(r, i)] * w, inv, 0.0f));
        }
      }
      if (cs != nullptr && col_base >= kNopeWidth) {
#pragma unroll
        for (int k = 0; k < kOut; k += 2) {
          const int f = (col_base + k - kNopeWidth) / 2;
          const float co = cs[f], sn = cs[32 + f];
          const float e = x[k], o = x[k + 1];
          // + 0 turns the -0 a rotation of zeros can give into +0 (empty rows are exactly +0).
          x[k] = (e * co + o * sn) + 0.0f;
          x[k + 1] = (o * co - e * sn) + 0.0f;
        }
      }
      const int64_t out_row = int64_t{out_t} * p.num_heads + head;
      if (!p.out_mxfp8) {
        if (live) {
          uint32_t wds[kOut / 2];
#pragma unroll
          for (int k = 0; k < kOut / 2; ++k) wds[k] = PackBf16(x[2 * k], x[2 * k + 1]);
          uint4* dst = reinterpret_cast<uint4*>(p.out_bf16 + out_row * kValueWidth + col_base);
#pragma unroll
          for (int k = 0; k < kOut / 8; ++k) {
            dst[k] = make_uint4(wds[4 * k], wds[4 * k + 1], wds[4 * k + 2], wds[4 * k + 3]);
          }
        }
      } else {
        // A 32-column MXFP8 group is held by kMxLanes neighbouring lanes.
        constexpr int kMxLanes = kMxGroup / kOut;
        float amax = 0.0f;
#pragma unroll
        for (int k = 0; k < kOut; ++k) amax = fmaxf(amax, fabsf(x[k]));
        amax = RowGroupMax<kMxLanes>(amax);
        const uint8_t sb = MxScaleByte(amax);
        const float inv_scale = Pow2(127 - static_cast<int>(sb));
        if (live) {
          uint32_t wds[kOut / 4];
#pragma unroll
          for (int k = 0; k < kOut / 4; ++k) {
            wds[k] = uint32_t{MxEncodePair(x[4 * k], x[4 * k + 1], inv_scale)} |
                     (uint32_t{MxEncodePair(x[4 * k + 2], x[4 * k + 3], inv_scale)} << 16);
          }
          uint8_t* dst = p.mx_data + out_row * kValueWidth + col_base;
          if constexpr (kOut == 16) {
            *reinterpret_cast<uint4*>(dst) = make_uint4(wds[0], wds[1], wds[2], wds[3]);
          } else {
            *reinterpret_cast<uint2*>(dst) = make_uint2(wds[0], wds[1]);
          }
          if (direct::OutLane(lane) % kMxLanes == 0) {
            p.mx_scales[out_row * kMxGroupsPerHead + col_base / kMxGroup] = sb;
          }
        }
      }
      if (live && p.lse != nullptr && warp == 0 && lane % T::kRowLanes == 0) p.lse[out_row] = lse;
    }
  }
}

}  // namespace smla::kernels::gpu
