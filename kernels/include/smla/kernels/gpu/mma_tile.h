// The warp-level matrix product the attention kernels are written against: the tile shape, which
// lane holds which accumulator rows and columns, the operand types, the shared-memory operand
// loads and the product. The kernels use only these names; CUDA's are m16n8k16 (mma.sync fed by
// ldmatrix), gfx950's the 16x16x32 MFMA of a 64-lane wavefront (primitives_hip.h).
//
// Accumulator c[4] of a lane: row slot r (0..kRowsPerLane-1), column slot i (0..kColsPerRow-1)
// is c[CIndex(r, i)], at row Row(row0, lane, r) of a tile whose first row is row0, and column
// Col(lane, i). The kRowLanes lanes
// holding one row are an aligned group, so row reductions are butterflies inside it.
//
// P.V output columns: the tile kernel's warp owns a window of output columns, kNTiles n-tiles of
// kN; value f (= j * kColsPerRow + i, n-tile j) of a lane's row sits at column OutCol(lane, f) of
// the window, and values f, f+1 (f even) are neighbouring columns, as the inverse RoPE pairs
// them. CUDA's columns are the hardware's; gfx950's are permuted (lane column r of n-tile j is
// window column 8r + j) so that a lane's values are 8 consecutive columns.
#pragma once

#include <cstdint>
#include <utility>

#include "smla/kernels/gpu/primitives.h"
#include "smla/kernels/hd.h"

namespace smla::kernels::gpu {

#if defined(__HIP__)

struct MmaTile {
  static constexpr int kM = 16;
  static constexpr int kN = 16;
  static constexpr int kK = 32;
  static constexpr int kRowsPerLane = 4;
  static constexpr int kColsPerRow = 1;
  static constexpr int kRowLanes = 16;
  SMLA_HD static constexpr int CIndex(int r, int i) { return r * kColsPerRow + i; }
  SMLA_HD static constexpr int Row(int row0, int lane, int r) {
    return row0 + Mfma16x16x32::CRow(lane, r);
  }
  SMLA_HD static constexpr int Col(int lane, int i) { return Mfma16x16x32::CCol(lane, i); }
  SMLA_HD static constexpr int OutCol(int lane, int f) { return 8 * (lane % 16) + f; }
  // The MXFP8 group (32 window columns) of a lane's value group q (values 8q..8q+7).
  SMLA_HD static constexpr int OutGroup(int lane, int q) { return (lane % 16) / 4 + q; }
};

struct AFrag {
  Bf16x8 v;
};
struct BFrag {
  Bf16x8 v;
};

__device__ __forceinline__ void Mma(float (&c)[4], const AFrag& a, const BFrag& b) {
  F32x4 t = {c[0], c[1], c[2], c[3]};
  MfmaBf16(t, a.v, b.v);
  c[0] = t[0], c[1] = t[1], c[2] = t[2], c[3] = t[3];
}

// This lane's first element of the 16-row operand at rows row0.. of a row-major tile (rows = M
// of A, or N of B stored n-major) with `stride` elements per row; + k0 selects the k-step.
__device__ __forceinline__ const uint16_t* FragRowPtr(const uint16_t* tile, int row0, int stride,
                                                      int lane) {
  return tile + (row0 + Mfma16x16x32::ARow(lane, 0)) * stride + Mfma16x16x32::ACol(lane, 0);
}
__device__ __forceinline__ void LoadA(AFrag& a, const uint16_t* p) {
  a.v = *reinterpret_cast<const Bf16x8*>(p);
}
// B of two n-tiles (keys 0-15, 16-31 of the pointer's tile) for one k-step, from FragRowPtr.
__device__ __forceinline__ const uint16_t* KeyB2NPtr(const uint16_t* tile, int key0, int stride,
                                                     int lane) {
  return FragRowPtr(tile, key0, stride, lane);
}
__device__ __forceinline__ void LoadKeyB2N(BFrag (&b)[2], const uint16_t* p, int stride) {
  b[0].v = *reinterpret_cast<const Bf16x8*>(p);
  b[1].v = *reinterpret_cast<const Bf16x8*>(p + MmaTile::kN * stride);
}
// B of one n-tile for two consecutive k-steps.
__device__ __forceinline__ const uint16_t* KeyB2KPtr(const uint16_t* tile, int key0, int stride,
                                                     int lane) {
  return FragRowPtr(tile, key0, stride, lane);
}
__device__ __forceinline__ void LoadKeyB2K(BFrag (&b)[2], const uint16_t* p) {
  b[0].v = *reinterpret_cast<const Bf16x8*>(p);
  b[1].v = *reinterpret_cast<const Bf16x8*>(p + MmaTile::kK);
}
// B of n-tiles 2np and 2np+1 of a k-major tile (rows = keys), window from column col0: lane
// (q, r) reads keys 8q..8q+7 of window column OutCol(lane, j).
__device__ __forceinline__ const uint16_t* ValueB2NPtr(const uint16_t* tile, int col0, int stride,
                                                       int lane) {
  return tile + Mfma16x16x32::BRow(lane, 0) * stride + col0 + MmaTile::OutCol(lane, 0);
}
__device__ __forceinline__ void LoadValueB2N(BFrag (&b)[2], const uint16_t* p, int stride, int np) {
#pragma unroll
  for (int t = 0; t < 2; ++t) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      b[t].v[e] = __builtin_bit_cast(__bf16, p[e * stride + 2 * np + t]);
    }
  }
}

#else

struct MmaTile {
  static constexpr int kM = 16;
  static constexpr int kN = 8;
  static constexpr int kK = 16;
  static constexpr int kRowsPerLane = 2;
  static constexpr int kColsPerRow = 2;
  static constexpr int kRowLanes = 4;
  SMLA_HD static constexpr int CIndex(int r, int i) { return r * kColsPerRow + i; }
  SMLA_HD static constexpr int Row(int row0, int lane, int r) { return row0 + lane / 4 + 8 * r; }
  SMLA_HD static constexpr int Col(int lane, int i) { return 2 * (lane % 4) + i; }
  SMLA_HD static constexpr int OutCol(int lane, int f) {
    return 2 * (lane % 4) + 8 * (f / 2) + f % 2;
  }
  SMLA_HD static constexpr int OutGroup(int lane, int q) { return (void)lane, q; }
};

struct AFrag {
  uint32_t r[4];
};
struct BFrag {
  uint32_t lo, hi;
};

__device__ __forceinline__ void Mma(float (&c)[4], const AFrag& a, const BFrag& b) {
  MmaBf16(c, a.r, b.lo, b.hi);
}

// ldmatrix row addresses: lane l names row l % 16 of columns 8 (l / 16) .. of a 16x16 block.
__device__ __forceinline__ const uint16_t* FragRowPtr(const uint16_t* tile, int row0, int stride,
                                                      int lane) {
  return tile + (row0 + (lane % 16)) * stride + (lane / 16) * 8;
}
__device__ __forceinline__ void LoadA(AFrag& a, const uint16_t* p) { LoadMatrixX4(a.r, p); }
// 16 keys x 16 dims: matrices (keys 0-7 | 8-15) x (dims 0-7 | 8-15).
__device__ __forceinline__ const uint16_t* KeyB2NPtr(const uint16_t* tile, int key0, int stride,
                                                     int lane) {
  return tile + (key0 + (lane / 16) * 8 + (lane % 8)) * stride + ((lane / 8) % 2) * 8;
}
__device__ __forceinline__ void LoadKeyB2N(BFrag (&b)[2], const uint16_t* p, int stride) {
  (void)stride;
  uint32_t r[4];
  LoadMatrixX4(r, p);
  b[0] = {r[0], r[1]};
  b[1] = {r[2], r[3]};
}
// 8 keys x 32 dims: two k-steps at once.
__device__ __forceinline__ const uint16_t* KeyB2KPtr(const uint16_t* tile, int key0, int stride,
                                                     int lane) {
  return tile + (key0 + (lane % 8)) * stride + (lane / 8) * 8;
}
__device__ __forceinline__ void LoadKeyB2K(BFrag (&b)[2], const uint16_t* p) {
  uint32_t r[4];
  LoadMatrixX4(r, p);
  b[0] = {r[0], r[1]};
  b[1] = {r[2], r[3]};
}
// 16 keys x 16 columns of a k-major tile, transposed: n-tiles 2np and 2np+1.
__device__ __forceinline__ const uint16_t* ValueB2NPtr(const uint16_t* tile, int col0, int stride,
                                                       int lane) {
  return tile + (((lane / 8) % 2) * 8 + (lane % 8)) * stride + col0 + (lane / 16) * 8;
}
__device__ __forceinline__ void LoadValueB2N(BFrag (&b)[2], const uint16_t* p, int stride, int np) {
  (void)stride;
  uint32_t r[4];
  LoadMatrixX4Trans(r, p + np * 16);
  b[0] = {r[0], r[1]};
  b[1] = {r[2], r[3]};
}

#endif

static_assert(MmaTile::kM * MmaTile::kN == kWarpSize * 4 &&
                  MmaTile::kRowsPerLane * MmaTile::kColsPerRow == 4,
              "a lane holds 4 accumulators of the tile");
static_assert(MmaTile::kRowLanes * MmaTile::kColsPerRow == MmaTile::kN &&
                  kWarpSize / MmaTile::kRowLanes * MmaTile::kRowsPerLane == MmaTile::kM,
              "a row's lanes hold its kN columns; the lane groups hold the kM rows");

// f(integral_constant<int, i>) for i = 0..n-1 as straight-line code, not a loop unrolled late:
// the compiler then hoists the statements' address arithmetic as for hand-written ones.
template <class F, int... i>
__device__ __forceinline__ void ForEachIndex(F&& f, std::integer_sequence<int, i...>) {
  (f(std::integral_constant<int, i>{}), ...);
}
template <int n, class F>
__device__ __forceinline__ void ForEachIndex(F&& f) {
  ForEachIndex(f, std::make_integer_sequence<int, n>{});
}

// Ascending xor masks: the order (and so the rounding) of the kernels' row sums.
template <int kLanes>
__device__ __forceinline__ float RowGroupMax(float v) {
#pragma unroll
  for (int m = 1; m < kLanes; m *= 2) v = WarpXorMax(v, m);
  return v;
}
template <int kLanes>
__device__ __forceinline__ float RowGroupSum(float v) {
#pragma unroll
  for (int m = 1; m < kLanes; m *= 2) v = WarpXorSum(v, m);
  return v;
}

}  // namespace smla::kernels::gpu
