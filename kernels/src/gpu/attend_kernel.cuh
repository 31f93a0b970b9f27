// The sparse MLA attention kernel (docs/operator.md sections 4-6) on the tensor cores.
//
// One program owns (row, head block, split). It gathers 64-key tiles of its row's main then
// extra segment into shared memory with 16-byte asynchronous copies (the next tile in flight
// while the current one is used), dequantises fp8 tiles once into a bf16 tile shared by all its
// heads, and runs both dots with bf16 matrix products (mma_tile.h). Warp group g (4 warps)
// owns heads 16g..16g+15: for Q.K^T warp w takes keys 16w..16w+15 of the tile, for P.V output
// columns 128w..128w+127. Row maxima and sums cross the group through shared memory.
// Without split-K the epilogue (bf16 round, inverse RoPE, bf16 or MXFP8 store) and the LSE are
// written here; with it, the unnormalised partials go to the combine kernel.
#pragma once

#include <cstdint>

#include "gpu/grid_order.h"
#include "gpu/kernel_params.h"
#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/codec/mxfp8.h"
#include "smla/kernels/epilogue.h"
#include "smla/kernels/formats.h"
#include "smla/kernels/gpu/mma_tile.h"
#include "smla/kernels/gpu/primitives.h"

namespace smla::kernels::gpu {

// fp8_dsv4 scale bytes up to this fold the 2^120 rebias into the scale (one multiply per pair:
// E8m0PairTimes2p120 is a normal bf16 up to 2^127).
inline constexpr uint32_t kFoldMax = 134;

// The largest scale byte of an fp8_dsv4 scale record (its kDsv4Groups bytes; the pad byte is
// not a scale): the record folds when it is at most kFoldMax. Byte-parallel (one byte-wise max
// of the two words, then its four bytes): a loop over the seven bytes spills in the warpgroup
// program's loader.
static_assert(kDsv4Groups == 7, "scales in bytes 0-6 of the record, a pad byte in 7");
__device__ __forceinline__ uint32_t MaxScaleByte(uint2 rec) {
  const uint32_t both = MaxBytes4(rec.x, rec.y & 0x00ffffffu);
  return max(max(both & 0xffu, (both >> 8) & 0xffu), max((both >> 16) & 0xffu, both >> 24));
}

// Four e4m3 codes of a key to bf16: fp8_dsv4 codes times their group's scale byte (folded with
// the rebias where kFold), fp8_per_tensor codes as they are (their scale applies elsewhere).
template <bool kDsv4, bool kFold>
__device__ __forceinline__ uint2 E4m3x4ToBf16Keyed(uint32_t codes, uint32_t scale_byte) {
  if constexpr (!kDsv4) {
    return E4m3x4ToBf16(codes);
  } else if constexpr (kFold) {
    return E4m3x4ToBf16Times(codes, E8m0PairTimes2p120(scale_byte, scale_byte));
  } else {
    return E4m3x4ToBf16Scaled(codes, E8m0ToBf16x2(scale_byte));
  }
}

// kW warps per 16 heads: for Q.K^T warp w takes keys [w*K/kW, (w+1)*K/kW) of a K-key tile,
// for P.V output columns [w*512/kW, (w+1)*512/kW). 32-key tiles halve the shared memory of
// the stages and the dequantised tile so that two programs fit on an SM and overlap. kQInRegs keeps
// the group's Q fragments in registers for the whole program (no shared-memory re-reads of Q per
// tile).
template <int kQkWidth_, int kHeadBlock_, int kW_, bool kQInRegs_, int kKeys_, int kMinBlocks_>
struct AttendConfig {
  static constexpr int kKeys = kKeys_;  // keys per gathered tile (64, or 32 for occupancy)
  static constexpr int kMinBlocks = kMinBlocks_;  // programs per SM the registers are capped for
  static constexpr int kQkWidth = kQkWidth_;
  static constexpr int kHeadBlock = kHeadBlock_;
  static constexpr int kW = kW_;
  static constexpr bool kQInRegs = kQInRegs_;
  static constexpr int kGroups = kHeadBlock / 16;
  static constexpr int kWarps = kGroups * kW;
  static constexpr int kThreads = kWarps * kWarpSize;
  // Row strides padded by 16 bytes so that ldmatrix rows of one 8x8 matrix hit distinct banks.
  static constexpr int kQStride = kQkWidth + 8;   // bf16 elements
  static constexpr int kKvStride = kQkWidth + 8;  // bf16 elements
  static constexpr int kPStride = kKeys + 8;      // bf16 elements
  static constexpr int kKSteps = kQkWidth / MmaTile::kK;
  static constexpr int kKeysPerWarp = kKeys / kW;             // 16 or 8
  static constexpr int kSTiles = kKeysPerWarp / MmaTile::kN;  // score n-tiles per warp
  static constexpr int kColsPerWarp = kValueWidth / kW;       // 128 or 64
  static constexpr int kNTiles = kColsPerWarp / MmaTile::kN;  // output n-tiles per warp
  // Output values per lane and row, and the MXFP8 groups (8 values of 4 lanes) among them.
  static constexpr int kRowValues = kNTiles * MmaTile::kColsPerRow;
  static constexpr int kGatherKeysPerWarp = kKeys / kWarps;
  static constexpr int kSub = kTileKeys / kKeys;  // tiles per 64-key plan tile

  static_assert(kQkWidth == 512 || kQkWidth == 576, "QK width is 512 or 576 (docs/operator.md 2)");
  static_assert(kHeadBlock == 16 || kHeadBlock == 32 || kHeadBlock == 64,
                "head block must be 16, 32 or 64 heads");
  static_assert(kW == 4 || kW == 8, "a 16-head group has 4 or 8 warps");
  static_assert(kKeys == 32 || kKeys == 64, "tiles hold 32 or 64 keys");
  static_assert(kKeysPerWarp % MmaTile::kN == 0 && kSTiles <= 2,
                "a warp scores one or two n-tiles of keys");
  static_assert(((kPStride * 2 / 16) % 2) == 1, "P row stride: odd number of 16-byte units");
  static_assert(kW <= kMaxWarpsPer16Heads, "reduction arrays are sized for kMaxWarpsPer16Heads");
  static_assert(kColsPerWarp % kMxGroup == 0 && kRowValues % 8 == 0,
                "an MXFP8 group (32 columns) is 8 values of 4 lanes of one warp");
  static_assert(kKSteps % 2 == 0, "the 8-key score path loads two k-steps at a time");
  static_assert(kGatherKeysPerWarp >= 1 && kGatherKeysPerWarp <= kWarpSize,
                "each warp gathers between 1 and kWarpSize keys of a tile");
  static_assert(((kKvStride * 2 / 16) % 2) == 1,
                "KV row stride must be an odd number of 16-byte units (conflict-free ldmatrix)");
  static_assert(kThreads <= 1024, "too many threads per program");
};

// Shared-memory layout, in bytes from the dynamic base.
template <class C>
struct AttendSmem {
  static constexpr int kQ = 0;
  static constexpr int kQBytes = C::kHeadBlock * C::kQStride * 2;
  static constexpr int kP = kQ + kQBytes;
  static constexpr int kPBytes = C::kHeadBlock * C::kPStride * 2;
  static constexpr int kRedMax = kP + kPBytes;
  static constexpr int kRedSum = kRedMax + C::kHeadBlock * kMaxWarpsPer16Heads * 4;
  static constexpr int kValid = kRedSum + C::kHeadBlock * kMaxWarpsPer16Heads * 4;
  static constexpr int kStages = kValid + kMaxStages * C::kKeys * 4;  // then the stages, the tile
  static_assert(kStages % 16 == 0, "stages must start 16-byte aligned");
};

__device__ __forceinline__ int32_t RowStrideBytes(int format, int qk_width) {
  switch (format) {
    case static_cast<int>(KvFormat::kBf16):
      return (qk_width + 8) * 2;  // staged directly in the padded tile layout
    case static_cast<int>(KvFormat::kFp8PerTensor):
      return qk_width;
    case static_cast<int>(KvFormat::kFp8DsMla):
      return kDsMlaRowBytes;
    default:
      return kDsv4DataBytes;
  }
}

// Each warp gathers keys warp, warp + kWarps, ...; lane j holds the slot of the warp's j-th key.
// Loaded one tile ahead so that the index latency hides under the current tile's work.
template <class C>
__device__ __forceinline__ int32_t LoadTileSlot(const SegmentArgs& s, int begin, int len,
                                                int key0) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  int32_t slot = -1;
  if (lane < C::kGatherKeysPerWarp) {
    const int key = key0 + warp + lane * C::kWarps;
    if (key < len) slot = __ldg(s.indices + begin + key);
  }
  return slot;
}

// Issues the asynchronous gather of one tile into stage memory; invalid keys (past the row's
// end, sentinels, out of range) are zero-filled and never read. Records per-key validity.
// Lane j of each warp computes the address of the warp's j-th key once; the warp then copies
// that row with consecutive 16-byte chunks per lane.
// Rows land `stride` bytes apart; fp8_dsv4 scale records start `rec_offset` bytes into the stage.
template <class C>
__device__ __forceinline__ void IssueTileStrided(const SegmentArgs& s, int32_t my_slot,
                                                 uint8_t* stage, int32_t* valid, int stride,
                                                 int rec_offset) {
  // Unhoisted: the lane's destination offsets are recomputed per tile; held across the tile
  // loop they cost gfx950's 1024-thread programs (128 VGPRs) scratch.
  const unsigned tid = Unhoisted(threadIdx.x);
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  const int format = s.format;
  const bool dsv4 = format == static_cast<int>(KvFormat::kFp8Dsv4);
  const int data_bytes = format == static_cast<int>(KvFormat::kBf16)       ? 2 * C::kQkWidth
                         : dsv4                                            ? kDsv4DataBytes
                         : format == static_cast<int>(KvFormat::kFp8DsMla) ? kDsMlaRowBytes
                                                                           : C::kQkWidth;
  const int chunks = data_bytes / 16;  // 32..72
  const bool my_ok = my_slot >= 0 && my_slot < s.num_slots;
  // The owning lane computes its key's row address (and fp8_dsv4 scale-record address) once.
  const uint8_t* my_src = s.base;
  const uint8_t* my_rec = s.base;
  if (my_ok) {
    const uint8_t* page = s.base + (int64_t{my_slot} >> s.rows_per_page_log2) * s.pitch;
    const int row = my_slot & (s.rows_per_page - 1);
    my_src = page + row * data_bytes;
    my_rec = page + s.rows_per_page * kDsv4DataBytes + row * kDsv4ScaleBytes;
  }
  if (lane < C::kGatherKeysPerWarp) valid[warp + lane * C::kWarps] = my_ok ? 1 : 0;
  const LaneMask ok_mask = WarpBallot(my_ok);
  const uint32_t dst0 = SharedAddress(stage) + warp * stride + 16 * lane;
  const uint32_t rec0 = SharedAddress(stage) + rec_offset + warp * kDsv4ScaleBytes;
#pragma unroll
  for (int j = 0; j < C::kGatherKeysPerWarp; ++j) {
    const bool ok = (ok_mask >> j) & 1u;
    const uint8_t* src = WarpShufflePtr(my_src, j) + 16 * lane;
    const uint32_t dst = dst0 + j * C::kWarps * stride;
    // 32..72 chunks per row: every lane of a 32-lane warp copies one, then at most two more
    // rounds by the first lanes.
    if (kWarpSize <= 32 || lane < chunks) AsyncCopy16(dst, src, ok);
    if (lane + kWarpSize < chunks) AsyncCopy16(dst + 16 * kWarpSize, src + 16 * kWarpSize, ok);
    if (lane + 2 * kWarpSize < chunks) {
      AsyncCopy16(dst + 32 * kWarpSize, src + 32 * kWarpSize, ok);
    }
    if (dsv4) {
      const uint8_t* rec = WarpShufflePtr(my_rec, j);
      if (lane == kWarpSize - 1) {
        AsyncCopy8(rec0 + j * C::kWarps * kDsv4ScaleBytes, rec, ok);
      }
    }
  }
}

template <class C>
__device__ __forceinline__ void IssueTile(const SegmentArgs& s, int32_t my_slot, uint8_t* stage,
                                          int32_t* valid) {
  IssueTileStrided<C>(s, my_slot, stage, valid, RowStrideBytes(s.format, C::kQkWidth),
                      C::kKeys * kDsv4DataBytes);
}

// Dequantises a gathered fp8 stage into the bf16 tile (docs/operator.md section 3). One loop per
// format, 8 values per step: fp8_per_tensor stages raw codes (its scale is folded into the
// score and P), fp8_dsv4 multiplies by its power-of-two scale in bf16 (exact rounding of the
// f32 product), fp8_ds_mla rounds the f32 product with its f32 scale.
template <class C, int kFormat>
__device__ __forceinline__ void ConvertTileAs(const uint8_t* stage, uint16_t* tile) {
  constexpr int kUnits = C::kQkWidth / 8;
  constexpr bool kFixedColumn =
      C::kThreads % kUnits == 0 && kFormat != static_cast<int>(KvFormat::kFp8DsMla);
  if constexpr (kFixedColumn) {
    // Each thread keeps one 8-value column for every key it visits: no per-step index math or
    // branch (the rope columns of fp8_dsv4 take their own loop).
    constexpr bool kDsv4 = kFormat == static_cast<int>(KvFormat::kFp8Dsv4);
    constexpr int kRowsPerPass = C::kThreads / kUnits;
    constexpr int kSrcStride = kDsv4 ? kDsv4DataBytes : C::kQkWidth;
    const unsigned tid = Unhoisted(threadIdx.x);  // as in IssueTileStrided
    const int c = tid % kUnits;
    const int k0 = tid / kUnits;
    const int e0 = c * 8;
    uint16_t* dst = tile + k0 * C::kKvStride + e0;
    if (kDsv4 && e0 >= kNopeWidth) {
      const uint8_t* src = stage + k0 * kDsv4DataBytes + kNopeWidth + (e0 - kNopeWidth) * 2;
#pragma unroll 4
      for (int k = k0; k < C::kKeys; k += kRowsPerPass) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        src += kRowsPerPass * kDsv4DataBytes;
        dst += kRowsPerPass * C::kKvStride;
      }
      return;
    }
    const uint8_t* src = stage + k0 * kSrcStride + e0;
    const uint8_t* scale = stage + C::kKeys * kDsv4DataBytes + k0 * kDsv4ScaleBytes + e0 / 64;
#pragma unroll 4
    for (int k = k0; k < C::kKeys; k += kRowsPerPass) {
      KvScale sc = UnitKvScale();
      if constexpr (kDsv4) {
        sc = E8m0ToBf16x2(*scale);
        scale += kRowsPerPass * kDsv4ScaleBytes;
      }
      const uint2 c8 = *reinterpret_cast<const uint2*>(src);
      const uint2 a = E4m3x4ToBf16Scaled(c8.x, sc);
      const uint2 b = E4m3x4ToBf16Scaled(c8.y, sc);
      *reinterpret_cast<uint4*>(dst) = make_uint4(a.x, a.y, b.x, b.y);
      src += kRowsPerPass * kSrcStride;
      dst += kRowsPerPass * C::kKvStride;
    }
    return;
  }
  // 1024-thread programs (64 heads in wavefronts) leave the last pass partly idle.
  constexpr int kTotal = C::kKeys * kUnits;
  constexpr int kPerThread = (kTotal + C::kThreads - 1) / C::kThreads;
#pragma unroll 4
  for (int i = 0; i < kPerThread; ++i) {
    const int u = threadIdx.x + i * C::kThreads;
    if (kTotal % C::kThreads != 0 && u >= kTotal) break;
    const int k = u / kUnits;
    const int e0 = (u % kUnits) * 8;
    uint4 out;
    if constexpr (kFormat == static_cast<int>(KvFormat::kFp8PerTensor)) {
      const uint2 c8 = *reinterpret_cast<const uint2*>(stage + k * C::kQkWidth + e0);
      const KvScale one = UnitKvScale();
      const uint2 a = E4m3x4ToBf16Scaled(c8.x, one);
      const uint2 b = E4m3x4ToBf16Scaled(c8.y, one);
      out = make_uint4(a.x, a.y, b.x, b.y);
    } else if constexpr (kFormat == static_cast<int>(KvFormat::kFp8Dsv4)) {
      const uint8_t* row = stage + k * kDsv4DataBytes;
      if (e0 >= kNopeWidth) {
        out = *reinterpret_cast<const uint4*>(row + kNopeWidth + (e0 - kNopeWidth) * 2);
      } else {
        const uint32_t byte = stage[C::kKeys * kDsv4DataBytes + k * kDsv4ScaleBytes + e0 / 64];
        const KvScale sc = E8m0ToBf16x2(byte);
        const uint2 c8 = *reinterpret_cast<const uint2*>(row + e0);
        const uint2 a = E4m3x4ToBf16Scaled(c8.x, sc);
        const uint2 b = E4m3x4ToBf16Scaled(c8.y, sc);
        out = make_uint4(a.x, a.y, b.x, b.y);
      }
    } else {  // fp8_ds_mla
      const uint8_t* row = stage + k * kDsMlaRowBytes;
      if (e0 >= 512) {
        out = *reinterpret_cast<const uint4*>(row + 528 + (e0 - 512) * 2);
      } else {
        const float scale = *reinterpret_cast<const float*>(row + 512 + 4 * (e0 / 128));
        const uint2 c8 = *reinterpret_cast<const uint2*>(row + e0);
        uint32_t w[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint32_t word = q < 2 ? c8.x : c8.y;
          const float2 f = E4m3x2ToFloat2(static_cast<uint16_t>(word >> (16 * (q & 1))));
          w[q] = PackBf16(f.x * scale, f.y * scale);
        }
        out = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    *reinterpret_cast<uint4*>(tile + k * C::kKvStride + e0) = out;
  }
}

template <class C>
__device__ __forceinline__ void ConvertTile(int format, const uint8_t* stage, uint16_t* tile) {
  switch (format) {
    case static_cast<int>(KvFormat::kFp8PerTensor):
      ConvertTileAs<C, static_cast<int>(KvFormat::kFp8PerTensor)>(stage, tile);
      return;
    case static_cast<int>(KvFormat::kFp8Dsv4):
      ConvertTileAs<C, static_cast<int>(KvFormat::kFp8Dsv4)>(stage, tile);
      return;
    default:
      ConvertTileAs<C, static_cast<int>(KvFormat::kFp8DsMla)>(stage, tile);
      return;
  }
}

// A program's row, head block and split: head block fastest, then split, then row (plan.h,
// WorkOrder::kRowMajor).
struct ProgramIndex {
  int row = 0, hb = 0, split = 0;
};
__device__ __forceinline__ ProgramIndex ProgramOf(const AttendKernelParams& p,
                                                  int64_t pid = blockIdx.x) {
  ProgramIndex w;
  w.hb = static_cast<int>(pid % p.head_blocks);
  w.split = static_cast<int>((pid / p.head_blocks) % p.splits);
  w.row = static_cast<int>(pid / (int64_t{p.head_blocks} * p.splits));
  return w;
}

// A row's keys: its range of each segment, and their 64-key tiles (main tiles, then extra).
struct RowKeys {
  int begin0 = 0, len0 = 0, begin1 = 0, len1 = 0, tiles0 = 0, tiles1 = 0;
};
__device__ __forceinline__ RowKeys RowKeysOf(const AttendKernelParams& p, int row) {
  RowKeys k;
  k.begin0 = p.seg[0].indptr[row];
  k.len0 = p.seg[0].indptr[row + 1] - k.begin0;
  if (p.num_segments > 1) {
    k.begin1 = p.seg[1].indptr[row];
    k.len1 = p.seg[1].indptr[row + 1] - k.begin1;
  }
  k.tiles0 = (k.len0 + kTileKeys - 1) / kTileKeys;
  k.tiles1 = (k.len1 + kTileKeys - 1) / kTileKeys;
  return k;
}

// A unit's keys (AttendKernelParams::paired): the union of rows g unit .. g unit + g - 1 (g =
// union_rows) in each segment, written by the row-union kernel from the first row's start.
__device__ __forceinline__ RowKeys UnitKeysOf(const AttendKernelParams& p, int unit) {
  RowKeys k;
  const int row = unit * p.union_rows;
  k.begin0 = p.seg[0].indptr[row];
  k.len0 = p.seg[0].union_count[unit];
  if (p.num_segments > 1) {
    k.begin1 = p.seg[1].indptr[row];
    k.len1 = p.seg[1].union_count[unit];
  }
  k.tiles0 = (k.len0 + kTileKeys - 1) / kTileKeys;
  k.tiles1 = (k.len1 + kTileKeys - 1) / kTileKeys;
  return k;
}

// Values e0 .. e0 + 7 of a head's query as bf16 (fp8 queries converted exactly), zero past H.
__device__ __forceinline__ uint4 LoadQueryUnit(const AttendKernelParams& p, int qk_width, int row,
                                               int head, int e0) {
  if (head >= p.num_heads) return make_uint4(0, 0, 0, 0);
  const int64_t off = (int64_t{row} * p.num_heads + head) * qk_width + e0;
  if (!p.q_fp8) return *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.q) + off);
  const uint2 c8 = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(p.q) + off);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = i < 2 ? c8.x : c8.y;
    const float2 f = E4m3x2ToFloat2(static_cast<uint16_t>(word >> (16 * (i & 1))));
    w[i] = PackBf16(f.x, f.y);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Which query a program's head slot h holds: head head0 + h of row `row` (one row's heads).
struct QuerySlots {
  int row = 0, head0 = 0;
  __device__ int Row(int) const { return row; }
  __device__ int Head(int h) const { return head0 + h; }
  __device__ bool Live(int) const { return true; }
};

// The same for a unit of rows (a warpgroup program over a row group, attend_wgmma_kernel.cuh):
// head h % 2^heads_log2 of row row + h / 2^heads_log2, for the unit's first `rows` rows (slots
// past them are empty).
struct RowGroupSlots {
  int row = 0, heads_log2 = 0, rows = 1;
  __device__ int Row(int h) const { return row + (h >> heads_log2); }
  __device__ int Head(int h) const { return h & ((1 << heads_log2) - 1); }
  __device__ bool Live(int h) const { return (h >> heads_log2) < rows; }
};

// Stages a head block's queries in shared memory: values e0 .. e0 + 7 of head slot h at byte
// at(h, e0) of q_s (heads past H and empty slots are zero and never stored), by threads tid = 0 ..
// kStagers - 1. Each thread issues kBatch loads before storing any, so a batch costs one memory
// latency rather than one per unit (docs/gpu.md, "What makes the operator fast on Hopper").
template <class C, int kStagers = C::kThreads, int kBatch = 4, class Slots, class At>
__device__ __forceinline__ void StageQueries(const AttendKernelParams& p, Slots slots, uint8_t* q_s,
                                             At at, int tid = threadIdx.x) {
  constexpr int kUnits = C::kQkWidth / 8;
  constexpr int kTotal = C::kHeadBlock * kUnits;
  constexpr int kPerThread = (kTotal + kStagers - 1) / kStagers;
#pragma unroll 1
  for (int i0 = 0; i0 < kPerThread; i0 += kBatch) {
    uint4 v[kBatch];
    int unit[kBatch];  // the unit of load i, or -1 past the last
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int u = tid + (i0 + i) * kStagers;
      unit[i] = i0 + i < kPerThread && u < kTotal ? u : -1;
      if (unit[i] >= 0) {
        const int h = u / kUnits;
        v[i] = slots.Live(h)
                   ? LoadQueryUnit(p, C::kQkWidth, slots.Row(h), slots.Head(h), (u % kUnits) * 8)
                   : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int u = unit[i];
      if (u >= 0) *reinterpret_cast<uint4*>(q_s + at(u / kUnits, (u % kUnits) * 8)) = v[i];
    }
  }
}

// Waits for the oldest of n gather stages in flight (one commit group per tile).
__device__ __forceinline__ void WaitForOldestStage(int n) {
  if (n == 3) {
    AsyncWait<2>();
  } else if (n == 2) {
    AsyncWait<1>();
  } else {
    AsyncWait<0>();
  }
}

// How a row's unnormalised accumulator becomes its output (the sink joins here, as in
// CombinePartials): multiply by w, then by inv; and its LSE. An empty row gives w = inv = 0.
struct RowScale {
  float w = 0.0f, inv = 0.0f, lse = -INFINITY;
};
__device__ __forceinline__ RowScale FinalRowScale(const AttendKernelParams& p, float m_run,
                                                  float l_run, int head, bool live) {
  const bool has_sink = p.sink != nullptr;
  const float sink2 = has_sink && live ? p.sink[head] * kLog2e : -INFINITY;
  const float m = fmaxf(m_run, sink2);
  RowScale r;
  if (m != -INFINITY) {
    r.w = exp2f(m_run - m);
    const float z = l_run * r.w + (has_sink ? exp2f(sink2 - m) : 0.0f);
    r.inv = 1.0f / z;
    r.lse = (m + log2f(z)) * kLn2;
  }
  return r;
}

// The inverse RoPE of output columns col (even, at least kNopeWidth) and col + 1, whose bf16
// values are e and o, with cos_sin row cs.
__device__ __forceinline__ void InverseRopePair(const float* cs, int col, float& e, float& o) {
  const int k = (col - kNopeWidth) / 2;
  const float c = cs[k], sn = cs[32 + k];
  const float e0 = e, o0 = o;
  // + 0 turns the -0 a rotation of zeros can give into +0 (empty rows are exactly +0).
  e = (e0 * c + o0 * sn) + 0.0f;
  o = (o0 * c - e0 * sn) + 0.0f;
}

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    SparseMlaAttendKernel(const __grid_constant__ AttendKernelParams p) {
  EnterGrid();  // grid_order.h: before any access to memory
  using S = AttendSmem<C>;
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem + S::kQ);
  uint16_t* p_s = reinterpret_cast<uint16_t*>(smem + S::kP);
  float* red_max = reinterpret_cast<float*>(smem + S::kRedMax);
  float* red_sum = reinterpret_cast<float*>(smem + S::kRedSum);
  int32_t* valid_s = reinterpret_cast<int32_t*>(smem + S::kValid);
  uint8_t* stages = smem + S::kStages;
  uint16_t* tile = reinterpret_cast<uint16_t*>(stages + p.num_stages * p.stage_bytes);

  const auto [row, hb, split] = ProgramOf(p);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int group = warp / C::kW;
  const int wg = warp % C::kW;
  const int head0 = hb * C::kHeadBlock;

  StageQueries<C>(p, QuerySlots{row, head0}, reinterpret_cast<uint8_t*>(q_s),
                  [](int h, int e0) { return 2 * (h * C::kQStride + e0); });

  // This program's tiles: main tiles then extra tiles, split evenly by the longest row.
  const auto [begin0, len0, begin1, len1, tiles0, tiles1] = RowKeysOf(p, row);
  const int t_begin = split * p.tiles_per_split;
  const int t_end = min(t_begin + p.tiles_per_split, tiles0 + tiles1);

  // Tiles of C::kKeys keys: u = plan tile * kSub + part.
  const int u_begin = t_begin * C::kSub;
  const int u_end = t_end * C::kSub;
  auto seg_of = [&](int u) { return u / C::kSub < tiles0 ? 0 : 1; };
  auto key0_of = [&](int u) {
    const int t = u / C::kSub;
    return (t < tiles0 ? t : t - tiles0) * kTileKeys + (u % C::kSub) * C::kKeys;
  };
  auto load_slot = [&](int u) -> int32_t {
    if (u >= u_end) return -1;
    if (seg_of(u) == 0) return LoadTileSlot<C>(p.seg[0], begin0, len0, key0_of(u));
    return LoadTileSlot<C>(p.seg[1], begin1, len1, key0_of(u));
  };
  auto issue = [&](int u, int32_t slot, int stage) {
    IssueTile<C>(seg_of(u) == 0 ? p.seg[0] : p.seg[1], slot, stages + stage * p.stage_bytes,
                 valid_s + stage * C::kKeys);
  };

  using T = MmaTile;
  constexpr int kRows = T::kRowsPerLane;
  constexpr int kCols = T::kColsPerRow;
  float acc[C::kNTiles][4];
#pragma unroll
  for (int j = 0; j < C::kNTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  float m_run[kRows];  // rows T::Row(qrow, lane, r) of the block, base 2
  float l_run[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) m_run[r] = -INFINITY, l_run[r] = 0.0f;
  const int qrow = 16 * group;  // first head (in the block) of this warp's group

  // N gather stages (1-3, as many as fit in shared memory): tiles u+1 .. u+N-1 are in flight
  // while tile u is used, one commit group per tile. Slots are loaded one issue ahead.
  const int n_stages = p.num_stages;
  int32_t next_slot = load_slot(u_begin);
  for (int v = u_begin; v < u_begin + n_stages - 1; ++v) {
    if (v < u_end) {
      issue(v, next_slot, v - u_begin);
      next_slot = load_slot(v + 1);
    }
    AsyncCommit();
  }
  __syncthreads();  // Q staged

  // Q fragments of this warp's group, kept in registers when the config says so.
  AFrag qf[C::kQInRegs ? C::kKSteps : 1];
  if constexpr (C::kQInRegs) {
    const uint16_t* a_row = FragRowPtr(q_s, qrow, C::kQStride, lane);
#pragma unroll
    for (int kk = 0; kk < C::kKSteps; ++kk) LoadA(qf[kk], a_row + kk * T::kK);
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
    __syncthreads();
    const SegmentArgs& s = seg_of(u) == 0 ? p.seg[0] : p.seg[1];
    const uint16_t* kv = reinterpret_cast<const uint16_t*>(stages + stage * p.stage_bytes);
    if (s.format != static_cast<int>(KvFormat::kBf16)) {
      ConvertTile<C>(s.format, stages + stage * p.stage_bytes, tile);
      __syncthreads();
      kv = tile;
    }
    const int32_t* valid = valid_s + stage * C::kKeys;

    // S = Q K^T for 16 heads x this warp's keys.
    float sc[C::kSTiles][4];
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
    {
      const uint16_t* a_row = FragRowPtr(q_s, qrow, C::kQStride, lane);
      auto a_frag = [&](int kk, AFrag& a) {
        if constexpr (C::kQInRegs) {
          a = qf[kk];
        } else {
          LoadA(a, a_row + kk * T::kK);
        }
      };
      // Two accumulator sets (even and odd k-steps) halve the dependent chain of products.
      float sc2[C::kSTiles][4];
#pragma unroll
      for (int j = 0; j < C::kSTiles; ++j) sc2[j][0] = sc2[j][1] = sc2[j][2] = sc2[j][3] = 0.0f;
      const int key0 = C::kKeysPerWarp * wg;
      if constexpr (C::kSTiles == 2) {
        const uint16_t* b_row = KeyB2NPtr(kv, key0, C::kKvStride, lane);
#pragma unroll
        for (int kk = 0; kk < C::kKSteps; ++kk) {
          AFrag a;
          BFrag b[2];
          a_frag(kk, a);
          LoadKeyB2N(b, b_row + kk * T::kK, C::kKvStride);
          if (kk % 2 == 0) {
            Mma(sc[0], a, b[0]);
            Mma(sc[C::kSTiles - 1], a, b[1]);
          } else {
            Mma(sc2[0], a, b[0]);
            Mma(sc2[C::kSTiles - 1], a, b[1]);
          }
        }
      } else {
        const uint16_t* b_row = KeyB2KPtr(kv, key0, C::kKvStride, lane);
#pragma unroll
        for (int kk = 0; kk < C::kKSteps; kk += 2) {
          AFrag a0, a1;
          BFrag b[2];
          a_frag(kk, a0);
          a_frag(kk + 1, a1);
          LoadKeyB2K(b, b_row + kk * T::kK);
          Mma(sc[0], a0, b[0]);
          Mma(sc2[0], a1, b[1]);
        }
      }
#pragma unroll
      for (int j = 0; j < C::kSTiles; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) sc[j][i] += sc2[j][i];
      }
    }
    // Scale, mask, and the tile's row maxima across the group.
    float tmax[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) tmax[r] = -INFINITY;
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = C::kKeysPerWarp * wg + T::kN * j + T::Col(lane, i % kCols);
        const float x = valid[key] ? sc[j][i] * s.score_scale2 : -INFINITY;
        sc[j][i] = x;
        tmax[i / kCols] = fmaxf(tmax[i / kCols], x);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) tmax[r] = RowGroupMax<T::kRowLanes>(tmax[r]);
    if (lane % T::kRowLanes == 0) {
      ForEachIndex<kRows>([&](auto r) { red_max[T::Row(qrow, lane, r) * C::kW + wg] = tmax[r]; });
    }
    __syncthreads();
    float m_new[kRows], m_use[kRows], alpha[kRows], psum[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      psum[r] = 0.0f;
      const float* rm = red_max + T::Row(qrow, lane, r) * C::kW;
      float tm = rm[0];
#pragma unroll
      for (int w = 1; w < C::kW; ++w) tm = fmaxf(tm, rm[w]);
      m_new[r] = fmaxf(m_run[r], tm);
      // A fully masked prefix keeps m = -inf; subtracting 0 then gives p = 0, not NaN.
      m_use[r] = m_new[r] == -INFINITY ? 0.0f : m_new[r];
      alpha[r] = exp2f(m_run[r] - m_use[r]);
    }
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j) {
      float pv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        pv[i] = exp2f(sc[j][i] - m_use[i / kCols]);
        psum[i / kCols] += pv[i];
      }
      const int key = C::kKeysPerWarp * wg + T::kN * j + T::Col(lane, 0);
      const float ps = s.p_scale;
      ForEachIndex<kRows>([&](auto r) {
        uint16_t* dst = p_s + T::Row(qrow, lane, r) * C::kPStride + key;
        if constexpr (kCols == 2) {
          *reinterpret_cast<uint32_t*>(dst) =
              PackBf16(pv[T::CIndex(r, 0)] * ps, pv[T::CIndex(r, 1)] * ps);
        } else {
          *dst = static_cast<uint16_t>(PackBf16(pv[T::CIndex(r, 0)] * ps, 0.0f));
        }
      });
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) psum[r] = RowGroupSum<T::kRowLanes>(psum[r]);
    if (lane % T::kRowLanes == 0) {
      ForEachIndex<kRows>([&](auto r) { red_sum[T::Row(qrow, lane, r) * C::kW + wg] = psum[r]; });
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float* rs = red_sum + T::Row(qrow, lane, r) * C::kW;
      float ts = 0.0f;
#pragma unroll
      for (int w = 0; w < C::kW; ++w) ts += rs[w];
      l_run[r] = l_run[r] * alpha[r] + ts;
      m_run[r] = m_new[r];
    }
#pragma unroll
    for (int j = 0; j < C::kNTiles; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] *= alpha[i / kCols];
    }
    // O += P V over the tile's 64 keys, this warp's 128 output columns.
    {
      const uint16_t* a_row = FragRowPtr(p_s, qrow, C::kPStride, lane);
      const uint16_t* b_row = ValueB2NPtr(kv, wg * C::kColsPerWarp, C::kKvStride, lane);
#pragma unroll
      for (int ks = 0; ks < C::kKeys / T::kK; ++ks) {
        AFrag a;
        LoadA(a, a_row + ks * T::kK);
#pragma unroll
        for (int np = 0; np < C::kNTiles / 2; ++np) {
          BFrag b[2];
          LoadValueB2N(b, b_row + ks * T::kK * C::kKvStride, C::kKvStride, np);
          Mma(acc[2 * np], a, b[0]);
          Mma(acc[2 * np + 1], a, b[1]);
        }
      }
    }
    __syncthreads();  // the stage and tile are refilled next iteration
  }
  AsyncWait<0>();
  // The epilogue's lane indices, recomputed (Unhoisted) instead of held through the tile loop:
  // gfx950's 1024-thread programs have 128 VGPRs for everything the loop keeps.
  const unsigned e_tid = Unhoisted(threadIdx.x);
  const int e_warp = e_tid / kWarpSize;
  const int e_lane = e_tid % kWarpSize;
  const int e_wg = e_warp % C::kW;
  const int e_qrow = 16 * (e_warp / C::kW);

  // Value f of a lane's row is window column col_base + T::OutCol(0, f).
  const int col_base = e_wg * C::kColsPerWarp + T::OutCol(e_lane, 0);
  constexpr int kValues = C::kRowValues;
  if (p.splits > 1) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int head = T::Row(head0 + e_qrow, e_lane, r);
      if (head >= p.num_heads) continue;
      const int64_t ph = (int64_t{row} * p.num_heads + head) * p.splits + split;
      float* dst = p.part_acc + ph * kValueWidth;
#pragma unroll
      for (int f = 0; f < kValues; f += 2) {
        *reinterpret_cast<float2*>(dst + col_base + T::OutCol(0, f)) =
            make_float2(acc[f / kCols][T::CIndex(r, f % kCols)],
                        acc[(f + 1) / kCols][T::CIndex(r, (f + 1) % kCols)]);
      }
      if (e_wg == 0 && e_lane % T::kRowLanes == 0) {
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
  for (int r = 0; r < kRows; ++r) {
    const int head = T::Row(head0 + e_qrow, e_lane, r);
    const bool live = head < p.num_heads;
    const auto [w, inv, lse] = FinalRowScale(p, m_run[r], l_run[r], head, live);
    float x[kValues];
#pragma unroll
    for (int f = 0; f < kValues; f += 2) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float a = acc[(f + i) / kCols][T::CIndex(r, (f + i) % kCols)];
        x[f + i] = RoundToBf16Fast((a * w) * inv + 0.0f);
      }
      const int col = col_base + T::OutCol(0, f);
      if (cs != nullptr && col >= kNopeWidth) InverseRopePair(cs, col, x[f], x[f + 1]);
    }
    const int64_t out_row = int64_t{row} * p.num_heads + head;
    if (!p.out_mxfp8) {
      if (live) {
#pragma unroll
        for (int f = 0; f < kValues; f += 2) {
          *reinterpret_cast<uint32_t*>(p.out_bf16 + out_row * kValueWidth + col_base +
                                       T::OutCol(0, f)) = PackBf16(x[f], x[f + 1]);
        }
      }
    } else {
      // A 32-column MXFP8 group is 8 values of each of 4 neighbouring lanes.
#pragma unroll
      for (int q = 0; q < kValues / 8; ++q) {
        float amax = 0.0f;
#pragma unroll
        for (int f = 8 * q; f < 8 * q + 8; f += 2) {
          amax = fmaxf(amax, fmaxf(fabsf(x[f]), fabsf(x[f + 1])));
        }
        amax = WarpXorMax(amax, 1);
        amax = WarpXorMax(amax, 2);
        const uint8_t sb = MxScaleByte(amax);
        const float inv_scale = Pow2(127 - static_cast<int>(sb));
        if (live) {
#pragma unroll
          for (int f = 8 * q; f < 8 * q + 8; f += 2) {
            const uint16_t two = MxEncodePair(x[f], x[f + 1], inv_scale);
            *reinterpret_cast<uint16_t*>(p.mx_data + out_row * kValueWidth + col_base +
                                         T::OutCol(0, f)) = two;
          }
          if (e_lane % 4 == 0) {
            p.mx_scales[out_row * kMxGroupsPerHead + (e_wg * C::kColsPerWarp) / kMxGroup +
                        T::OutGroup(e_lane, q)] = sb;
          }
        }
      }
    }
    if (live && p.lse != nullptr && e_wg == 0 && e_lane % T::kRowLanes == 0) p.lse[out_row] = lse;
  }
}

}  // namespace smla::kernels::gpu
