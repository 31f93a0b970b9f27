// The 64-head sparse MLA attention program on sm_90a's warpgroup products (docs/operator.md
// 4-6; docs/gpu.md, "Tensor cores"). One program of two warpgroups owns (row, 64-head block,
// split): each key of its tiles is gathered and dequantised once for all 64 heads, where 16- and
// 32-head programs gather and convert it two to four times.
//
// Tiles of 64 keys are gathered as in attend_kernel.cuh (asynchronous copies, the next tiles in
// flight; rows 16 bytes longer than the data, WgmmaStride) and dequantised into a bf16 tile in
// the products' canonical layout (ConvertWgmmaTile). Both
// warpgroups score the whole tile, S = Q.K^T for 64 heads x 64 keys (32 k-steps of m64n64k16,
// Q and K from shared memory), so that each holds its rows' every score and the softmax needs
// no exchange between them; warpgroup g then multiplies P (from registers) by value columns
// 256g .. 256g + 255 of the same tile (four m64n64 accumulators). The doubled Q.K^T costs
// products; what it saves is a shared-memory round trip and two block barriers per tile. The
// epilogue is the tile kernel's, over the accumulators' fragment map (warpgroup_mma.h).
#pragma once

#include <cstdint>

#include "gpu/attend_kernel.cuh"
#include "gpu/grid_order.h"
#include "gpu/kernel_params.h"
#include "smla/kernels/codec/mxfp8.h"
#include "smla/kernels/epilogue.h"
#include "smla/kernels/formats.h"
#include "smla/kernels/gpu/primitives.h"
#include "smla/kernels/gpu/warpgroup_mma.h"

namespace smla::kernels::gpu {

template <int kQkWidth_>
struct WgmmaConfig {
  static constexpr int kQkWidth = kQkWidth_;
  static constexpr int kHeadBlock = 64;  // one m64 product's rows
  static constexpr int kKeys = 64;
  static constexpr int kWarps = 8;  // two warpgroups
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kMinBlocks = 1;
  static constexpr int kGatherKeysPerWarp = kKeys / kWarps;
  static constexpr int kKSteps = kQkWidth / 16;       // of Q.K^T
  static constexpr int kGroupCols = kValueWidth / 2;  // output columns of a warpgroup
  static constexpr int kColBlocks = kGroupCols / 64;  // its m64n64 accumulators
  static constexpr int kPvSteps = kKeys / 16;         // k-steps of P.V

  static_assert(kQkWidth == 512, "the dequantised tile and Q take 128 KB at width 512");
  static_assert(kGatherKeysPerWarp <= kWarpSize, "each warp gathers at most a warp of keys");
};

// Shared-memory layout, in bytes from the dynamic base: Q and the tile in the canonical layout,
// the keys' validity per stage, then the gather stages.
template <class C>
struct WgmmaSmem {
  static constexpr int kQ = 0;
  static constexpr int kTile = kQ + C::kHeadBlock * C::kQkWidth * 2;
  static constexpr int kValid = kTile + C::kKeys * C::kQkWidth * 2;
  static constexpr int kStages = kValid + kMaxStages * C::kKeys * 4;
  static_assert(kTile % 128 == 0 && kStages % 16 == 0, "operands and stages aligned");
};

// A gathered key's row pitch in a stage: its data plus 16 bytes, so that the 8 keys a converting
// warp reads at once (ConvertWgmmaTile) start in distinct banks. fp8 formats only.
__host__ __device__ constexpr int32_t WgmmaStride(int format) {
  return (format == static_cast<int>(KvFormat::kFp8Dsv4) ? kDsv4DataBytes : 512) + 16;
}

// Dequantises a gathered fp8 stage (rows WgmmaStride apart, fp8_dsv4's scale records after them)
// into the bf16 tile in the canonical layout, with the tile kernel's rounding (ConvertTileAs).
// Thread t converts 8-value column units c = t / 8 and c + 32 of keys t % 8 + 8 m: the 8 lanes of
// one column write one 128-byte core, and read 8 rows whose pitch spreads them over the banks.
template <class C, int kFormat>
__device__ __forceinline__ void ConvertWgmmaTileAs(const uint8_t* stage, uint8_t* tile) {
  static_assert(C::kThreads == 256 && C::kKeys == 64 && C::kQkWidth == 512, "the mapping below");
  constexpr bool kDsv4 = kFormat == static_cast<int>(KvFormat::kFp8Dsv4);
  constexpr int kStride = WgmmaStride(kFormat);
  const int k_lo = static_cast<int>(threadIdx.x) % 8;
  const int c0 = static_cast<int>(threadIdx.x) / 8;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int e0 = 8 * (c0 + 32 * half);
    if (kDsv4 && e0 >= kNopeWidth) {  // the bf16 rope lanes: whole warps 6 and 7, second half
#pragma unroll 4
      for (int m = 0; m < C::kKeys / 8; ++m) {
        const int k = 8 * m + k_lo;
        const uint8_t* src = stage + k * kStride + kNopeWidth + (e0 - kNopeWidth) * 2;
        *reinterpret_cast<uint4*>(tile + wgmma::TileOffset(k, e0, C::kQkWidth)) =
            *reinterpret_cast<const uint4*>(src);
      }
      continue;
    }
#pragma unroll 4
    for (int m = 0; m < C::kKeys / 8; ++m) {
      const int k = 8 * m + k_lo;
      KvScale sc = UnitKvScale();
      if constexpr (kDsv4) {
        sc = E8m0ToBf16x2(stage[C::kKeys * kStride + k * kDsv4ScaleBytes + e0 / 64]);
      }
      const uint2 c8 = *reinterpret_cast<const uint2*>(stage + k * kStride + e0);
      const uint2 a = E4m3x4ToBf16Scaled(c8.x, sc);
      const uint2 b = E4m3x4ToBf16Scaled(c8.y, sc);
      *reinterpret_cast<uint4*>(tile + wgmma::TileOffset(k, e0, C::kQkWidth)) =
          make_uint4(a.x, a.y, b.x, b.y);
    }
  }
}

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    SparseMlaAttendWgmmaKernel(const __grid_constant__ AttendKernelParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  EnterGrid();  // grid_order.h: before any access to memory
  using S = WgmmaSmem<C>;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* q_s = smem + S::kQ;
  uint8_t* tile_s = smem + S::kTile;
  int32_t* valid_s = reinterpret_cast<int32_t*>(smem + S::kValid);
  uint8_t* stages = smem + S::kStages;

  const auto [row, hb, split] = ProgramOf(p);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int group = warp / 4;  // warpgroup
  const int gw = warp % 4;     // warp within it
  const int head0 = hb * C::kHeadBlock;

  // Q in the canonical layout.
  StageQueries<C>(p, row, head0, q_s,
                  [](int h, int e0) { return wgmma::TileOffset(h, e0, C::kQkWidth); });

  // This program's tiles: main tiles then extra tiles, split evenly by the longest row.
  const auto [begin0, len0, begin1, len1, tiles0, tiles1] = RowKeysOf(p, row);
  const int u_begin = split * p.tiles_per_split;
  const int u_end = min(u_begin + p.tiles_per_split, tiles0 + tiles1);
  auto seg_of = [&](int u) { return u < tiles0 ? 0 : 1; };
  auto load_slot = [&](int u) -> int32_t {
    if (u >= u_end) return -1;
    if (u < tiles0) return LoadTileSlot<C>(p.seg[0], begin0, len0, u * kTileKeys);
    return LoadTileSlot<C>(p.seg[1], begin1, len1, (u - tiles0) * kTileKeys);
  };
  auto issue = [&](int u, int32_t slot, int stage) {
    const SegmentArgs& s = seg_of(u) == 0 ? p.seg[0] : p.seg[1];
    const int stride = WgmmaStride(s.format);
    IssueTileStrided<C>(s, slot, stages + stage * p.stage_bytes, valid_s + stage * C::kKeys, stride,
                        C::kKeys * stride);
  };

  // This lane's accumulator rows: r = 0 is row 16 gw + lane / 4, r = 1 eight rows down.
  float o[C::kColBlocks][32];
#pragma unroll
  for (int cb = 0; cb < C::kColBlocks; ++cb) {
#pragma unroll
    for (int i = 0; i < 32; ++i) o[cb][i] = 0.0f;
  }
  float m_run[2] = {-INFINITY, -INFINITY};  // base 2
  float l_lane[2] = {0.0f, 0.0f};           // this lane's share of the row sums

  // Gather stages as in the tile kernel: tiles u+1 .. u+n-1 in flight while tile u is used.
  const int n_stages = p.num_stages;
  int32_t next_slot = load_slot(u_begin);
  for (int v = u_begin; v < u_begin + n_stages - 1; ++v) {
    if (v < u_end) {
      issue(v, next_slot, v - u_begin);
      next_slot = load_slot(v + 1);
    }
    AsyncCommit();
  }

  for (int u = u_begin; u < u_end; ++u) {
    const int stage = (u - u_begin) % n_stages;
    const int v = u + n_stages - 1;  // the stage it refills held tile u-1, done last iteration
    if (v < u_end) {
      issue(v, next_slot, (v - u_begin) % n_stages);
      next_slot = load_slot(v + 1);
    }
    AsyncCommit();
    WaitForOldestStage(n_stages);
    __syncthreads();  // the stage has landed (and, the first time, Q is staged)
    const SegmentArgs& s = seg_of(u) == 0 ? p.seg[0] : p.seg[1];
    if (s.format == static_cast<int>(KvFormat::kFp8Dsv4)) {
      ConvertWgmmaTileAs<C, static_cast<int>(KvFormat::kFp8Dsv4)>(stages + stage * p.stage_bytes,
                                                                  tile_s);
    } else {
      ConvertWgmmaTileAs<C, static_cast<int>(KvFormat::kFp8PerTensor)>(
          stages + stage * p.stage_bytes, tile_s);
    }
    wgmma::FenceOperands();  // the tile's and Q's stores, before the products read them
    __syncthreads();
    const int32_t* valid = valid_s + stage * C::kKeys;

    // S = Q K^T: 64 heads x 64 keys, in this warpgroup's accumulators.
    float sc[32];
    wgmma::Arrive();
#pragma unroll
    for (int ks = 0; ks < C::kKSteps; ++ks) {
      wgmma::Mma64x64x16(sc, wgmma::KMajorDescriptor(q_s + 256 * ks, C::kQkWidth),
                         wgmma::KMajorDescriptor(tile_s + 256 * ks, C::kQkWidth), ks > 0);
    }
    wgmma::Commit();
    wgmma::Wait<0>();
    wgmma::FenceAccumulators(sc);

    // Scale and mask; row maxima over the 4 lanes that hold a row's 64 columns.
    float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const float x = valid[wgmma::AccCol(lane, i)] ? sc[i] * s.score_scale2 : -INFINITY;
      sc[i] = x;
      tmax[(i % 4) / 2] = fmaxf(tmax[(i % 4) / 2], x);
    }
    float alpha[2], m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tmax[r] = RowGroupMax<4>(tmax[r]);
      const float m_new = fmaxf(m_run[r], tmax[r]);
      // A fully masked prefix keeps m = -inf; subtracting 0 then gives p = 0, not NaN.
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
      alpha[r] = exp2f(m_run[r] - m_use[r]);
      m_run[r] = m_new;
      l_lane[r] *= alpha[r];
    }
#pragma unroll
    for (int cb = 0; cb < C::kColBlocks; ++cb) {
#pragma unroll
      for (int i = 0; i < 32; ++i) o[cb][i] *= alpha[(i % 4) / 2];
    }
    // P as the A fragments of P.V's k-steps: k-step ks holds keys 16 ks .. 16 ks + 15
    // (wgmma::AccumulatorOfA).
    uint32_t pf[C::kPvSteps][4];
#pragma unroll
    for (int ks = 0; ks < C::kPvSteps; ++ks) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i0 = wgmma::AccumulatorOfA(ks, j);
        const float p0 = exp2f(sc[i0] - m_use[j % 2]);
        const float p1 = exp2f(sc[i0 + 1] - m_use[j % 2]);
        l_lane[j % 2] += p0 + p1;
        pf[ks][j] = PackBf16(p0 * s.p_scale, p1 * s.p_scale);
      }
    }

    // O += P V: this warpgroup's 256 value columns of the tile (its keys' first 512 lanes).
    wgmma::Arrive();
#pragma unroll
    for (int ks = 0; ks < C::kPvSteps; ++ks) {
#pragma unroll
      for (int cb = 0; cb < C::kColBlocks; ++cb) {
        const uint32_t at =
            wgmma::TileOffset(16 * ks, C::kGroupCols * group + 64 * cb, C::kQkWidth);
        wgmma::Mma64x64x16RegA(o[cb], pf[ks], wgmma::SharedKvDescriptor(tile_s + at, C::kQkWidth),
                               true);
      }
    }
    wgmma::Commit();
    wgmma::Wait<0>();
#pragma unroll
    for (int cb = 0; cb < C::kColBlocks; ++cb) wgmma::FenceAccumulators(o[cb]);
    __syncthreads();  // the tile and the stage are rewritten next iteration
  }
  AsyncWait<0>();

  // Each row's sum across its 4 lanes.
  float l_run[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) l_run[r] = RowGroupSum<4>(l_lane[r]);
  // Column of accumulator i of block cb: col_base + 64 cb + AccCol's block part.
  const int col_base = C::kGroupCols * group;
  if (p.splits > 1) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int head = head0 + 16 * gw + lane / 4 + 8 * r;
      if (head >= p.num_heads) continue;
      const int64_t ph = (int64_t{row} * p.num_heads + head) * p.splits + split;
      float* dst = p.part_acc + ph * kValueWidth + col_base;
#pragma unroll
      for (int cb = 0; cb < C::kColBlocks; ++cb) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int i = 4 * j + 2 * r;
          *reinterpret_cast<float2*>(dst + 64 * cb + wgmma::AccCol(lane, i)) =
              make_float2(o[cb][i], o[cb][i + 1]);
        }
      }
      if (group == 0 && lane % 4 == 0) {
        p.part_ml[2 * ph] = m_run[r];
        p.part_ml[2 * ph + 1] = l_run[r];
      }
    }
    return;
  }

  // Final store: normalise with the sink (as CombinePartials), then the epilogue.
  const float* cs = nullptr;
  if (p.positions != nullptr) cs = p.cos_sin + int64_t{p.positions[row]} * 64;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int head = head0 + 16 * gw + lane / 4 + 8 * r;
    const bool live = head < p.num_heads;
    const auto [w, inv, lse] = FinalRowScale(p, m_run[r], l_run[r], head, live);
    const int64_t out_row = int64_t{row} * p.num_heads + head;
#pragma unroll
    for (int cb = 0; cb < C::kColBlocks; ++cb) {
      // The block's 64 columns: 8 pairs of this lane, x[2 j + 0..1] at 8 j + 2 (lane % 4).
      float x[16];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int i = 4 * j + 2 * r;
#pragma unroll
        for (int k = 0; k < 2; ++k) x[2 * j + k] = RoundToBf16Fast((o[cb][i + k] * w) * inv + 0.0f);
        const int col = col_base + 64 * cb + wgmma::AccCol(lane, i);
        if (cs != nullptr && col >= kNopeWidth) InverseRopePair(cs, col, x[2 * j], x[2 * j + 1]);
      }
      const int64_t at = out_row * kValueWidth + col_base + 64 * cb;
      if (!p.out_mxfp8) {
        if (live) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            *reinterpret_cast<uint32_t*>(p.out_bf16 + at + wgmma::AccCol(lane, 4 * j)) =
                PackBf16(x[2 * j], x[2 * j + 1]);
          }
        }
      } else {
        // A 32-column MXFP8 group is 4 pairs of each of the 4 lanes of a row.
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          float amax = 0.0f;
#pragma unroll
          for (int f = 8 * q; f < 8 * q + 8; ++f) amax = fmaxf(amax, fabsf(x[f]));
          amax = RowGroupMax<4>(amax);
          const uint8_t sb = MxScaleByte(amax);
          const float inv_scale = Pow2(127 - static_cast<int>(sb));
          if (live) {
#pragma unroll
            for (int j = 4 * q; j < 4 * q + 4; ++j) {
              *reinterpret_cast<uint16_t*>(p.mx_data + at + wgmma::AccCol(lane, 4 * j)) =
                  MxEncodePair(x[2 * j], x[2 * j + 1], inv_scale);
            }
            if (lane % 4 == 0) {
              p.mx_scales[out_row * kMxGroupsPerHead + (col_base + 64 * cb) / kMxGroup + q] = sb;
            }
          }
        }
      }
    }
    if (live && p.lse != nullptr && group == 0 && lane % 4 == 0) p.lse[out_row] = lse;
  }
#endif
}

}  // namespace smla::kernels::gpu
