// The 64-head sparse MLA attention program on sm_90a's warpgroup products (docs/operator.md
// 4-6; docs/gpu.md, "Tensor cores"). One program of three warpgroups owns (row, 64-head block,
// split); each key of its tiles is read and dequantised once for all 64 heads. The grouped
// variant (PairMode::kRowGroups, H <= 32) owns (unit, split) instead: its 64 product rows are
// the H heads of each of a unit's g rows (g H <= 64) over the union of their keys
// (row_union_kernel.cu), each key read once for every row and masked per row.
//
// The warpgroups specialise (warpgroup_sync.h):
// - the loader (warpgroup 2) reads each 64-key tile's fp8 rows from the pool into registers,
//   waits until one of the two bf16 tile buffers is free, dequantises into it in the products'
//   layout and marks it ready: the next tile is read while the products run on this one;
// - the scorer (warpgroup 0) computes S = Q.K^T for 64 heads x 64 keys (32 k-steps of
//   m64n64k16, Q and K from shared memory), the online softmax, writes P and the rows' rescale
//   factors to shared memory for its partner, then O[:, 0:256] += P.V with P from registers
//   (four k-steps of m64n256k16);
// - the partner (warpgroup 1) rescales its accumulators and computes O[:, 256:512] += P.V with
//   P from shared memory.
// Every shared operand (Q, the key tiles, P) lies in the 128-byte swizzled layout.
// A buffer is free again when both consumers' products on it have completed. Registers move
// from the loader to the scorer, which holds scores, P and half of O at once. The epilogue is
// the tile kernel's (shared helpers), each consumer over its 256 columns. With split keys a
// program writes its partial state for the combine kernel; where only some units split
// (AttendKernelParams::whole_units), the whole ones write their outputs.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gpu/attend_kernel.cuh"
#include "gpu/grid_order.h"
#include "gpu/kernel_params.h"
#include "gpu/query_tensor_map.h"
#include "gpu/staged_rows.cuh"
#include "smla/kernels/codec/mxfp8.h"
#include "smla/kernels/epilogue.h"
#include "smla/kernels/formats.h"
#include "smla/kernels/gpu/primitives.h"
#include "smla/kernels/gpu/tensor_copy.h"
#include "smla/kernels/gpu/warpgroup_mma.h"
#include "smla/kernels/gpu/warpgroup_sync.h"

namespace smla::kernels::gpu {

template <int kQkWidth_, bool kGrouped_ = false, bool kQTensorMap_ = false,
          bool kStagedRows_ = false>
struct WgmmaConfig {
  static constexpr int kQkWidth = kQkWidth_;
  // The final rows through shared memory (StoreRows; AttendKernelParams::staged_rows): a build
  // of its own, as a run-time choice between both ways slowed the whole program
  // (docs/results/kbench-h200.md, "Final rows through shared memory").
  static constexpr bool kStagedRows = kStagedRows_;
  // Q by the tensor copy engine, the epilogue's cos / sin rows staged while it arrives
  // (docs/gpu.md, "Queries by the tensor copy engine"); else Q staged by the consumers' loads.
  static constexpr bool kQTensorMap = kQTensorMap_;
  static constexpr int kHeadBlock = 64;  // one m64 product's rows
  // Grouped: product row h is head h % H of the unit's row h / H (AttendKernelParams::union_rows,
  // row_heads_log2).
  static constexpr bool kGrouped = kGrouped_;
  using Slots = std::conditional_t<kGrouped, RowGroupSlots, QuerySlots>;
  static constexpr int kKeys = 64;
  static constexpr int kGroupThreads = 128;
  static constexpr int kThreads = 3 * kGroupThreads;  // scorer, partner, loader
  static constexpr int kConsumerThreads = 2 * kGroupThreads;
  static constexpr int kMinBlocks = 1;
  static constexpr int kKSteps = kQkWidth / 16;       // of Q.K^T
  static constexpr int kGroupCols = kValueWidth / 2;  // output columns of a consumer
  static constexpr int kColBlocks = kGroupCols / 64;  // its m64n64 accumulators
  static constexpr int kPvSteps = kKeys / 16;         // k-steps of P.V
  static constexpr int kBuffers = 2;                  // bf16 tile buffers
  // Registers per thread after the split (the launch gives each 65536 / 384 = 168, rounded
  // down to 8): the scorer holds 32 scores, 16 P fragments and 128 accumulators.
  static constexpr int kScorerRegs = 208;
  static constexpr int kPartnerRegs = 160;
  static constexpr int kLoaderRegs = 136;
  // Each loader thread reads two keys of a tile, 16-byte chunks lane / 8 + 4 j of their rows.
  static constexpr int kKeysPerLoader = kKeys * 4 / kGroupThreads;

  static_assert(kQkWidth == 512, "Q and two dequantised tiles take 192 KB at width 512");
  static_assert(kScorerRegs + kPartnerRegs + kLoaderRegs <= 3 * 168, "the block's registers");
  static_assert(kKeysPerLoader == 2, "the loader's mapping below");
};

// Named barriers between the consumers (0 is __syncthreads').
enum WgmmaBarrier : int {
  kPReady = 1,    // the scorer wrote P and the rescale factors of a tile
  kPFree = 2,     // the partner's product on them has completed
  kRowsDone = 3,  // the scorer wrote the rows' final maxima and sums
  kQReady = 4,    // the consumers staged Q
  kStaged = 5,    // 5 + consumer: its epilogue's rows are in shared memory (StoreRows)
};

// Shared-memory layout, in bytes from the dynamic base.
template <class C>
struct WgmmaSmem {
  static constexpr int kTileBytes = C::kKeys * C::kQkWidth * 2;
  static constexpr int kQ = 0;
  static constexpr int kTiles = kQ + C::kHeadBlock * C::kQkWidth * 2;
  static constexpr int kP = kTiles + C::kBuffers * kTileBytes;  // 64 heads x 64 keys bf16
  static constexpr int kAlpha = kP + C::kHeadBlock * C::kKeys * 2;
  static constexpr int kRowMax = kAlpha + C::kHeadBlock * 4;
  static constexpr int kRowSum = kRowMax + C::kHeadBlock * 4;
  static constexpr int kValid = kRowSum + C::kHeadBlock * 4;
  static constexpr int kReady = kValid + C::kBuffers * C::kKeys * 4;  // mbarriers
  static constexpr int kFree = kReady + C::kBuffers * 8;
  // kQTensorMap: a barrier for Q's bulk copies, and the cos / sin row of each query row of the
  // program, read while Q arrives.
  static constexpr int kQFull = kFree + C::kBuffers * 8;
  static constexpr int kRope = kQFull + 8;
  static constexpr int kEpilogueEnd = C::kQTensorMap ? kRope + kMaxUnionRows * 64 * 4 : kQFull;
  // Each loader thread's staging for its first key of the next tile (cp.async): up to 9
  // 16-byte chunks and the 8-byte scale record.
  static constexpr int kStageStride = 160;
  static constexpr int kStage = (kEpilogueEnd + 15) / 16 * 16;
  static constexpr int kBytes = kStage + C::kGroupThreads * kStageStride;
  // Swizzled operands start on 1 KB (wgmma::SwizzledOffset).
  static_assert(kTiles % 1024 == 0 && kP % 1024 == 0 && kTileBytes % 1024 == 0 && kReady % 8 == 0,
                "operands aligned");
  // Q arrives as boxes of 64 values of every product row, one 128-byte swizzled column block each.
  static_assert(kQueryBoxVectors == C::kHeadBlock && kQueryBoxValues == 64 &&
                    C::kHeadBlock * 128 % 1024 == 0,
                "Q's boxes are its column blocks");
  static_assert(kBytes <= 227 * 1024, "an sm_90 block's shared memory");
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

// What the three roles share: the row's tiles and where things lie in shared memory.
struct WgmmaProgram {
  int row = 0, head0 = 0, split = 0;  // row: the first query row (g i when grouped)
  int heads_log2 = 0, rows = 1;       // grouped: the head slots' rows (RowGroupSlots)
  int splits = 1;                     // the splits of this program's unit
  int u_begin = 0, u_end = 0;         // this split's tiles: main tiles, then extra
  int tiles0 = 0;
  int begin0 = 0, len0 = 0, begin1 = 0, len1 = 0;  // the row's range of each segment
  uint8_t* q = nullptr;
  uint8_t* tiles = nullptr;
  uint8_t* p = nullptr;
  float* alpha = nullptr;
  float* row_max = nullptr;
  float* row_sum = nullptr;
  int32_t* valid = nullptr;  // per key: bit r set where query row row + r attends it
  uint64_t* ready = nullptr;
  uint64_t* free = nullptr;
  uint64_t* q_full = nullptr;
  float* rope = nullptr;     // [rows][64] cos / sin of each query row (with positions)
  uint8_t* stage = nullptr;  // this loader thread's staging

  // Tile u's segment (selected, not indexed: a run-time index into the parameter or this struct
  // goes through local memory).
  __device__ const SegmentArgs& SegmentOf(const AttendKernelParams& p, int u) const {
    return u < tiles0 ? p.seg[0] : p.seg[1];
  }
};

// This thread's warp within its warpgroup (its accumulator rows are 16 from 16 times it).
template <class C>
__device__ __forceinline__ int GroupWarp() {
  return (static_cast<int>(threadIdx.x) % C::kGroupThreads) / kWarpSize;
}

// Which query each of the program's 64 product rows holds.
template <class C>
__device__ __forceinline__ typename C::Slots SlotsOf(const WgmmaProgram& w) {
  if constexpr (C::kGrouped) {
    return RowGroupSlots{w.row, w.heads_log2, w.rows};
  } else {
    return QuerySlots{w.row, w.head0};
  }
}

// Key `key` of tile u: its slot (-1 past the row's keys) and the query rows that attend it
// (bit r: row w.row + r; the union's row mask when grouped).
struct LoaderKey {
  int32_t slot = -1;
  int32_t rows = 0;
};
template <class C>
__device__ __forceinline__ LoaderKey LoaderKeyOf(const AttendKernelParams& p, const WgmmaProgram& w,
                                                 int u, int key) {
  if (u >= w.u_end) return {};
  const bool main = u < w.tiles0;
  const int k = (main ? u : u - w.tiles0) * kTileKeys + key;
  if (k >= (main ? w.len0 : w.len1)) return {};
  const SegmentArgs& s = w.SegmentOf(p, u);
  const int at = (main ? w.begin0 : w.begin1) + k;
  if constexpr (C::kGrouped) return {__ldg(s.union_indices + at), __ldg(s.union_mask + at)};
  return {__ldg(s.indices + at), 1};
}

// The loader: keys k0 = 8 (warp) + lane % 8 and k0 + 32 of each tile; of each key's row the
// 16-byte chunks lane / 8 + 4 j (the 8 lanes of one chunk then store one 128-byte core, and a
// key's fp8_dsv4 chunk j takes scale j). Invalid keys (sentinels, out of range, past the row)
// are zero and marked invalid. Key k0 of the next tile is copied into the thread's staging
// (cp.async) while this tile is converted, so half of a tile's bytes are in flight for a whole
// tile's time; key k0 + 32 is read into registers at the start of its tile.
template <int kFormat>
struct KeyShare {
  static constexpr bool kDsv4 = kFormat == static_cast<int>(KvFormat::kFp8Dsv4);
  static constexpr int kCodeChunks = (kDsv4 ? kNopeWidth : 512) / 64;  // 7 or 8
  static constexpr int kRowBytes = kDsv4 ? kDsv4DataBytes : 512;
  uint4 codes[kCodeChunks];
  uint4 rope[2];
  uint2 scales;
};

// Where this thread's share of key `slot`'s row lies.
struct KeyRow {
  const uint8_t* src = nullptr;  // its first chunk
  const uint8_t* rec = nullptr;  // the fp8_dsv4 scale record
  bool ok = false;
};
template <int kFormat>
__device__ __forceinline__ KeyRow RowOf(const SegmentArgs& s, int32_t slot) {
  KeyRow k;
  k.ok = slot >= 0 && slot < s.num_slots;
  const uint8_t* page = s.base;
  int r = 0;
  if (k.ok) {
    page = s.base + (int64_t{slot} >> s.rows_per_page_log2) * s.pitch;
    r = slot & (s.rows_per_page - 1);
  }
  k.src = page + r * KeyShare<kFormat>::kRowBytes + 16 * (LaneId() / 8);
  k.rec = page + s.rows_per_page * kDsv4DataBytes + r * kDsv4ScaleBytes;
  return k;
}

template <int kFormat>
__device__ __forceinline__ KeyShare<kFormat> LoadShare(const KeyRow& k) {
  using K = KeyShare<kFormat>;
  K v;
#pragma unroll
  for (int j = 0; j < K::kCodeChunks; ++j) {
    v.codes[j] =
        k.ok ? __ldg(reinterpret_cast<const uint4*>(k.src + 64 * j)) : make_uint4(0, 0, 0, 0);
  }
  if constexpr (K::kDsv4) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      v.rope[j] = k.ok ? __ldg(reinterpret_cast<const uint4*>(k.src + kNopeWidth + 64 * j))
                       : make_uint4(0, 0, 0, 0);
    }
    v.scales = k.ok ? __ldg(reinterpret_cast<const uint2*>(k.rec)) : make_uint2(0, 0);
  }
  return v;
}

// The same bytes into the thread's staging, asynchronously (zeros for an invalid key); one
// committed group.
template <int kFormat>
__device__ __forceinline__ void StageShare(const KeyRow& k, uint8_t* stage) {
  using K = KeyShare<kFormat>;
  const uint32_t at = SharedAddress(stage);
#pragma unroll
  for (int j = 0; j < K::kCodeChunks; ++j) AsyncCopy16(at + 16 * j, k.src + 64 * j, k.ok);
  if constexpr (K::kDsv4) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      AsyncCopy16(at + 16 * (K::kCodeChunks + j), k.src + kNopeWidth + 64 * j, k.ok);
    }
    AsyncCopy8(at + 16 * (K::kCodeChunks + 2), k.rec, k.ok);
  }
  AsyncCommit();
}

template <int kFormat>
__device__ __forceinline__ KeyShare<kFormat> ReadShare(const uint8_t* stage) {
  using K = KeyShare<kFormat>;
  K v;
#pragma unroll
  for (int j = 0; j < K::kCodeChunks; ++j) v.codes[j] = reinterpret_cast<const uint4*>(stage)[j];
  if constexpr (K::kDsv4) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
      v.rope[j] = reinterpret_cast<const uint4*>(stage)[K::kCodeChunks + j];
    v.scales = *reinterpret_cast<const uint2*>(stage + 16 * (K::kCodeChunks + 2));
  }
  return v;
}

// Converts one key's share into the bf16 tile in the products' swizzled layout and records the
// query rows that attend it (`rows`, 0 for an invalid key). kFold: every fp8_dsv4 scale byte of
// the warp's shares is at most kFoldMax (E4m3x4ToBf16Keyed).
template <class C, int kFormat, bool kFold>
__device__ __forceinline__ void StoreShareAs(const KeyShare<kFormat>& v, int32_t rows,
                                             uint8_t* tile, int key, int buf,
                                             const WgmmaProgram& w) {
  using K = KeyShare<kFormat>;
  const int q = LaneId() / 8;
#pragma unroll
  for (int j = 0; j < K::kCodeChunks; ++j) {
    const uint32_t byte = ((j < 4 ? v.scales.x : v.scales.y) >> (8 * (j % 4))) & 0xff;
    auto convert = [&](uint32_t codes) { return E4m3x4ToBf16Keyed<K::kDsv4, kFold>(codes, byte); };
    const int e0 = 16 * q + 64 * j;
    const uint2 a = convert(v.codes[j].x);
    const uint2 b = convert(v.codes[j].y);
    const uint2 c = convert(v.codes[j].z);
    const uint2 d = convert(v.codes[j].w);
    *reinterpret_cast<uint4*>(tile + wgmma::SwizzledOffset(key, e0, C::kKeys)) =
        make_uint4(a.x, a.y, b.x, b.y);
    *reinterpret_cast<uint4*>(tile + wgmma::SwizzledOffset(key, e0 + 8, C::kKeys)) =
        make_uint4(c.x, c.y, d.x, d.y);
  }
  if constexpr (K::kDsv4) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      *reinterpret_cast<uint4*>(
          tile + wgmma::SwizzledOffset(key, kNopeWidth + 8 * q + 32 * j, C::kKeys)) = v.rope[j];
    }
  }
  if (q == 0) w.valid[buf * C::kKeys + key] = rows;
}

// StoreShareAs, folded where the whole warp's scale bytes allow it (the usual case; a record
// past kFoldMax is a scale above 2^7).
template <class C, int kFormat>
__device__ __forceinline__ void StoreShare(const KeyShare<kFormat>& v, int32_t rows, uint8_t* tile,
                                           int key, int buf, const WgmmaProgram& w) {
  if constexpr (KeyShare<kFormat>::kDsv4) {
    if (WarpAll(MaxScaleByte(v.scales) <= kFoldMax)) {
      StoreShareAs<C, kFormat, true>(v, rows, tile, key, buf, w);
      return;
    }
  }
  StoreShareAs<C, kFormat, false>(v, rows, tile, key, buf, w);
}

// Calls f with the loader's key format as a compile-time constant (fp8_dsv4 or fp8_per_tensor).
template <class F>
__device__ __forceinline__ decltype(auto) WithLoaderFormat(int format, F&& f) {
  constexpr int kDsv4 = static_cast<int>(KvFormat::kFp8Dsv4);
  constexpr int kPerTensor = static_cast<int>(KvFormat::kFp8PerTensor);
  if (format == kDsv4) return f(std::integral_constant<int, kDsv4>{});
  return f(std::integral_constant<int, kPerTensor>{});
}

// Stages key `key` of tile u (its segment's format); returns the query rows that attend it (0
// for an invalid key).
template <class C>
__device__ __forceinline__ int32_t StageKey(const AttendKernelParams& p, const WgmmaProgram& w,
                                            int u, LoaderKey key) {
  const SegmentArgs& s = w.SegmentOf(p, u);
  return WithLoaderFormat(s.format, [&](auto format) {
    const KeyRow k = RowOf<decltype(format)::value>(s, key.slot);
    StageShare<decltype(format)::value>(k, w.stage);
    return k.ok ? key.rows : 0;
  });
}

// Tile t (buffer buf): key k0 from the staging (its rows: rows_a), key k0 + 32 (key_b) from
// registers; `stage_next` stages the next tile's key k0 once this one's has been read.
template <class C, int kFormat, class StageNext>
__device__ __forceinline__ void LoadTile(const SegmentArgs& s, LoaderKey key_b, int32_t rows_a,
                                         int k0, const WgmmaProgram& w, int buf, int t,
                                         StageNext&& stage_next) {
  const KeyRow b = RowOf<kFormat>(s, key_b.slot);
  const KeyShare<kFormat> regs_b = LoadShare<kFormat>(b);
  AsyncWait<0>();
  asm volatile("" ::: "memory");  // the staging's loads below stay after the wait
  const KeyShare<kFormat> regs_a = ReadShare<kFormat>(w.stage);

  // The buffer held tile t - 2: wait until both consumers' products on it have completed.
  if (t >= C::kBuffers) {
    wgsync::Wait(w.free + buf, static_cast<uint32_t>((t / C::kBuffers - 1) & 1));
  }
  uint8_t* tile = w.tiles + buf * WgmmaSmem<C>::kTileBytes;
  StoreShare<C, kFormat>(regs_a, rows_a, tile, k0, buf, w);
  stage_next();  // regs_a's values are used above: the staging's reads have completed
  StoreShare<C, kFormat>(regs_b, b.ok ? key_b.rows : 0, tile, k0 + 32, buf, w);
  wgmma::FenceOperands();  // the tile's stores, before the products read it
  wgsync::Arrive(w.ready + buf);
}

template <class C>
__device__ __forceinline__ void RunLoader(const AttendKernelParams& p, const WgmmaProgram& w) {
  const int k0 = 8 * GroupWarp<C>() + LaneId() % 8;  // LoadTile's keys k0 and k0 + 32
  // Ids ahead of their use: key k0's one tile earlier than key k0 + 32's, as it is staged a
  // tile earlier.
  LoaderKey key_b = LoaderKeyOf<C>(p, w, w.u_begin, k0 + 32);
  LoaderKey next_a = LoaderKeyOf<C>(p, w, w.u_begin + 1, k0);
  int32_t rows_a =
      w.u_begin < w.u_end ? StageKey<C>(p, w, w.u_begin, LoaderKeyOf<C>(p, w, w.u_begin, k0)) : 0;
  for (int u = w.u_begin; u < w.u_end; ++u) {
    const LoaderKey after_a = LoaderKeyOf<C>(p, w, u + 2, k0);
    const LoaderKey next_b = LoaderKeyOf<C>(p, w, u + 1, k0 + 32);
    const int t = u - w.u_begin;
    const int32_t rows = rows_a;
    auto stage_next = [&] {
      if (u + 1 < w.u_end) rows_a = StageKey<C>(p, w, u + 1, next_a);
    };
    const SegmentArgs& s = w.SegmentOf(p, u);
    WithLoaderFormat(s.format, [&](auto format) {
      LoadTile<C, decltype(format)::value>(s, key_b, rows, k0, w, t % C::kBuffers, t, stage_next);
    });
    key_b = next_b;
    next_a = after_a;
  }
}

// O (+)= P.V over one consumer's 256 value columns (from col0) of tile buffer `tile`:
// mma(o, ks, v) issues k-step ks (an m64n256 product) with value descriptor v, P coming from
// the scorer's registers or from shared memory.
template <class C, class Mma>
__device__ __forceinline__ void WeighValues(float (&o)[C::kColBlocks][32], const uint8_t* tile,
                                            int col0, Mma mma) {
  static_assert(C::kColBlocks == 4, "one m64n256 product a k-step");
  const uint64_t v_desc = wgmma::SwizzledValues(tile, C::kKeys, 0, col0);
  wgmma::Arrive();
#pragma unroll
  for (int ks = 0; ks < C::kPvSteps; ++ks) {
    mma(o, ks, v_desc + wgmma::SwizzledValuesAdvance(C::kKeys, ks, 0));
  }
  wgmma::Commit();
  wgmma::Wait<0>();
#pragma unroll
  for (int cb = 0; cb < C::kColBlocks; ++cb) wgmma::FenceAccumulators(o[cb]);
}

// O's rows times their factors (this lane's rows r = 0, 1: alpha[r]); skipped where every row of
// the warp kept its maximum, whose factor 1 would leave O as it is.
template <class C>
__device__ __forceinline__ void RescaleRows(float (&o)[C::kColBlocks][32],
                                            const float (&alpha)[2]) {
  if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
  for (int cb = 0; cb < C::kColBlocks; ++cb) {
#pragma unroll
    for (int i = 0; i < 32; ++i) o[cb][i] *= alpha[(i % 4) / 2];
  }
}

// The scorer: per tile S = Q.K^T, the online softmax (maxima in m_run, this lane's share of the
// sums in l_lane), P and the rescale factors to shared memory, then its half of P.V.
template <class C>
__device__ __forceinline__ void RunScorer(const AttendKernelParams& p, const WgmmaProgram& w,
                                          float (&o)[C::kColBlocks][32], float (&m_run)[2],
                                          float (&l_lane)[2]) {
  const int lane = LaneId();
  const int gw = GroupWarp<C>();
  // This lane's accumulator rows' query rows (from the program's first): their bits of a key's
  // rows.
  int row_bit[2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
    row_bit[r] = SlotsOf<C>(w).Row(wgmma::AccRow(gw, lane, 2 * r)) - w.row;
  const uint64_t q_desc = wgmma::SwizzledKStep(w.q, C::kHeadBlock, 0);
  for (int u = w.u_begin; u < w.u_end; ++u) {
    const int t = u - w.u_begin;
    const int buf = t % C::kBuffers;
    const uint8_t* tile = w.tiles + buf * WgmmaSmem<C>::kTileBytes;
    const uint64_t k_desc = wgmma::SwizzledKStep(tile, C::kKeys, 0);
    const SegmentArgs& s = w.SegmentOf(p, u);
    wgsync::Wait(w.ready + buf, static_cast<uint32_t>((t / C::kBuffers) & 1));

    float sc[32];
    wgmma::Arrive();
#pragma unroll
    for (int ks = 0; ks < C::kKSteps; ++ks) {
      wgmma::Mma64x64x16(sc, q_desc + wgmma::SwizzledKStepAdvance(C::kHeadBlock, ks),
                         k_desc + wgmma::SwizzledKStepAdvance(C::kKeys, ks), ks > 0);
    }
    wgmma::Commit();
    wgmma::Wait<0>();
    wgmma::FenceAccumulators(sc);

    // Scale and mask (each accumulator row's bit of a key's rows); row maxima over the 4 lanes
    // that hold a row's 64 columns.
    const int32_t* valid = w.valid + buf * C::kKeys;
    float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const bool live = (valid[wgmma::AccCol(lane, i)] >> row_bit[(i % 4) / 2]) & 1;
      const float x = live ? sc[i] * s.score_scale2 : -INFINITY;
      sc[i] = x;
      tmax[(i % 4) / 2] = fmaxf(tmax[(i % 4) / 2], x);
    }
    float alpha[2], m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tmax[r] = RowGroupMax<4>(tmax[r]);
      // The maximum moves only past the slack (SegmentArgs::rescale_slack): most tiles then
      // leave every factor 1, and both consumers skip O's rescale.
      const float m_new = tmax[r] > m_run[r] + s.rescale_slack ? tmax[r] : m_run[r];
      // A fully masked prefix keeps m = -inf; subtracting 0 then gives p = 0, not NaN.
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
      alpha[r] = Exp2Ftz(m_run[r] - m_use[r]);
      m_run[r] = m_new;
      l_lane[r] *= alpha[r];
    }
    RescaleRows<C>(o, alpha);
    // P as the A fragments of P.V's k-steps (wgmma::AccumulatorOfA): k-step ks holds keys
    // 16 ks .. 16 ks + 15.
    uint32_t pf[C::kPvSteps][4];
#pragma unroll
    for (int ks = 0; ks < C::kPvSteps; ++ks) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i0 = wgmma::AccumulatorOfA(ks, j);
        const float p0 = Exp2Ftz(sc[i0] - m_use[j % 2]);
        const float p1 = Exp2Ftz(sc[i0 + 1] - m_use[j % 2]);
        l_lane[j % 2] += p0 + p1;
        pf[ks][j] = PackBf16(p0 * s.p_scale, p1 * s.p_scale);
      }
    }

    // The partner's copy: wait until its product on the last tile's P has completed.
    if (t > 0) wgsync::NamedSync(kPFree, C::kConsumerThreads);
#pragma unroll
    for (int ks = 0; ks < C::kPvSteps; ++ks)
      wgmma::StoreA(w.p, C::kHeadBlock, gw, lane, ks, pf[ks]);
    if (lane % 4 == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) w.alpha[wgmma::AccRow(gw, lane, 2 * r)] = alpha[r];
    }
    wgmma::FenceOperands();  // P's stores, before the partner's products read them
    // Both sides wait at kPReady and kPFree (neither only arrives): the partner is idle there
    // anyway, and racecheck then sees the factors' stores and loads ordered (docs/gpu.md).
    wgsync::NamedSync(kPReady, C::kConsumerThreads);

    WeighValues<C>(o, tile, 0, [&](float(&d)[C::kColBlocks][32], int ks, uint64_t v) {
      wgmma::Mma64x256x16RegA(d, pf[ks], v, true);
    });
    wgsync::Arrive(w.free + buf);
  }
}

// The partner: per tile, rescale by the scorer's factors, then O[:, 256:512] += P.V.
template <class C>
__device__ __forceinline__ void RunPartner(const WgmmaProgram& w, float (&o)[C::kColBlocks][32]) {
  const int lane = LaneId();
  const int gw = GroupWarp<C>();
  const uint64_t p_desc = wgmma::SwizzledKStep(w.p, C::kHeadBlock, 0);
  for (int u = w.u_begin; u < w.u_end; ++u) {
    const int t = u - w.u_begin;
    const int buf = t % C::kBuffers;
    wgsync::NamedSync(kPReady, C::kConsumerThreads);
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) alpha[r] = w.alpha[wgmma::AccRow(gw, lane, 2 * r)];
    RescaleRows<C>(o, alpha);
    WeighValues<C>(o, w.tiles + buf * WgmmaSmem<C>::kTileBytes, C::kGroupCols,
                   [&](float(&d)[C::kColBlocks][32], int ks, uint64_t v) {
                     wgmma::Mma64x256x16TransB(
                         d, p_desc + wgmma::SwizzledKStepAdvance(C::kHeadBlock, ks), v, true);
                   });
    wgsync::Arrive(w.free + buf);
    if (u + 1 < w.u_end) wgsync::NamedSync(kPFree, C::kConsumerThreads);
  }
}

// A consumer's epilogue over its 256 columns: split-K partials, or the final outputs (the sink,
// bf16 rounding, inverse RoPE, bf16 or MXFP8) and, by the scorer, the LSE. In the kStagedRows
// build the final rows go through `stage` (64 KB of shared memory no product reads any more)
// and out whole (StagedRows); the fp32 partials always go straight out, as their stores already
// fill whole sectors.
template <class C>
__device__ __forceinline__ void StoreRows(const AttendKernelParams& p, const WgmmaProgram& w,
                                          const float (&o)[C::kColBlocks][32],
                                          const float (&m_run)[2], const float (&l_run)[2],
                                          int group, uint8_t* stage) {
  const int lane = LaneId();
  const int gw = GroupWarp<C>();
  static_assert(StagedRows<C::kHeadBlock, C::kGroupCols * 2>::kBytes <= WgmmaSmem<C>::kTileBytes &&
                    WgmmaSmem<C>::kTileBytes <= WgmmaSmem<C>::kTiles - WgmmaSmem<C>::kQ,
                "a consumer's bf16 rows fit in Q's space and in a tile buffer");
  const typename C::Slots slots = SlotsOf<C>(w);
  auto live_slot = [&](int slot) { return slots.Live(slot) && slots.Head(slot) < p.num_heads; };
  auto out_row = [&](int slot) {
    return int64_t{slots.Row(slot)} * p.num_heads + slots.Head(slot);
  };
  // Column of accumulator i of block cb: col_base + 64 cb + AccCol(lane, i).
  const int col_base = C::kGroupCols * group;
  if (w.splits > 1) {
    // Partials straight from the accumulators: each warp store writes whole 32-byte sectors.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int slot = wgmma::AccRow(gw, lane, 2 * r);
      if (!live_slot(slot)) continue;
      const int64_t ph = out_row(slot) * p.splits + w.split;
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

  // Final store: normalise with the sink (as CombinePartials), then the epilogue. The inverse
  // RoPE's row of cos / sin: the program's one query row's, or each accumulator row's when
  // grouped; from shared memory where PreloadRopeRows staged them (kQTensorMap).
  auto rope_row = [&](int row) {
    return p.positions == nullptr ? nullptr : p.cos_sin + int64_t{p.positions[row]} * 64;
  };
  const float* cs_program = C::kGrouped || C::kQTensorMap ? nullptr : rope_row(w.row);
  constexpr bool staged = C::kStagedRows;
  const StagedRows<C::kHeadBlock, C::kGroupCols * 2> bf16_rows{stage};
  const StagedRows<C::kHeadBlock, C::kGroupCols> mx_rows{stage};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int slot = wgmma::AccRow(gw, lane, 2 * r);
    const int row = slots.Row(slot);
    const int head = slots.Head(slot);
    const bool live = live_slot(slot);
    const float* cs =
        C::kQTensorMap ? (p.positions == nullptr || !live ? nullptr : w.rope + (row - w.row) * 64)
        : C::kGrouped  ? (live ? rope_row(row) : nullptr)
                       : cs_program;
    const auto [scale, inv, lse] = FinalRowScale(p, m_run[r], l_run[r], head, live);
    const int64_t at_row = out_row(slot);
#pragma unroll
    for (int cb = 0; cb < C::kColBlocks; ++cb) {
      // The block's 64 columns: 8 pairs of this lane, x[2 j + 0..1] at 8 j + 2 (lane % 4).
      float x[16];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int i = 4 * j + 2 * r;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          x[2 * j + k] = RoundToBf16Fast((o[cb][i + k] * scale) * inv + 0.0f);
        }
        const int col = col_base + 64 * cb + wgmma::AccCol(lane, i);
        if (cs != nullptr && col >= kNopeWidth) InverseRopePair(cs, col, x[2 * j], x[2 * j + 1]);
      }
      // The row's outputs of this consumer from `at`; c below is a pair's column among its 256.
      const int64_t at = at_row * kValueWidth + col_base;
      if (!p.out_mxfp8) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int c = 64 * cb + wgmma::AccCol(lane, 4 * j);
          const uint32_t v = PackBf16(x[2 * j], x[2 * j + 1]);
          if constexpr (staged) {
            bf16_rows.template At<uint32_t>(slot, 2 * c) = v;
          } else if (live) {
            *reinterpret_cast<uint32_t*>(p.out_bf16 + at + c) = v;
          }
        }
      } else {
        // A 32-column MXFP8 group is 4 pairs of each of the 4 lanes of a row.
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          float amax = 0.0f;
#pragma unroll
          for (int f = 8 * g; f < 8 * g + 8; ++f) amax = fmaxf(amax, fabsf(x[f]));
          amax = RowGroupMax<4>(amax);
          const uint8_t sb = MxScaleByte(amax);
          const float inv_scale = Pow2(127 - static_cast<int>(sb));
#pragma unroll
          for (int j = 4 * g; j < 4 * g + 4; ++j) {
            const int c = 64 * cb + wgmma::AccCol(lane, 4 * j);
            const uint16_t v = MxEncodePair(x[2 * j], x[2 * j + 1], inv_scale);
            if constexpr (staged) {
              mx_rows.template At<uint16_t>(slot, c) = v;
            } else if (live) {
              *reinterpret_cast<uint16_t*>(p.mx_data + at + c) = v;
            }
          }
          if (live && lane % 4 == 0) {
            p.mx_scales[at_row * kMxGroupsPerHead + (col_base + 64 * cb) / kMxGroup + g] = sb;
          }
        }
      }
    }
    if (live && p.lse != nullptr && group == 0 && lane % 4 == 0) p.lse[at_row] = lse;
  }
  if constexpr (staged) {
    // Each live row's outputs of this consumer, in the output array `out`.
    auto copy_out = [&](const auto& rows, auto* out) {
      rows.CopyOut(
          [&](int slot) {
            return live_slot(slot)
                       ? reinterpret_cast<uint8_t*>(out + out_row(slot) * kValueWidth + col_base)
                       : nullptr;
          },
          static_cast<int>(threadIdx.x) % C::kGroupThreads, C::kGroupThreads, kStaged + group);
    };
    if (!p.out_mxfp8) {
      copy_out(bf16_rows, p.out_bf16);
    } else {
      copy_out(mx_rows, p.mx_data);
    }
  }
}

// The cos / sin rows of the program's query rows, staged in shared memory by the consumers at
// its start (WgmmaSmem::kRope), so that the epilogue's inverse RoPE waits on no dependent global
// loads (position, then row). Visible to both consumers after kQReady.
template <class C>
__device__ __forceinline__ void PreloadRopeRows(const AttendKernelParams& p, const WgmmaProgram& w,
                                                int tid) {
  if (p.positions == nullptr) return;
  const int rows = C::kGrouped ? w.rows : 1;
  for (int i = tid; i < rows * 64; i += C::kConsumerThreads) {
    w.rope[i] = p.cos_sin[int64_t{p.positions[w.row + i / 64]} * 64 + i % 64];
  }
}

// Q by the tensor copy engine: eight boxes of 64 values of the program's 64 product rows
// (query vectors row * H + head0 onwards; when grouped, vectors past the unit's are other rows'
// or zeros past the batch, in product rows that no key's mask admits), one 128-byte swizzled
// column block each. By one thread; completes on w.q_full.
template <class C>
__device__ __forceinline__ void CopyQueries(const AttendKernelParams& p, const QueryTensorMap& map,
                                            const WgmmaProgram& w) {
  constexpr int kBlocks = C::kQkWidth / kQueryBoxValues;
  constexpr uint32_t kBlockBytes = C::kHeadBlock * kQueryBoxValues * 2;
  wgsync::ArriveExpectBytes(w.q_full, kBlocks * kBlockBytes);
  const int vector = w.row * p.num_heads + w.head0;
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) {
    tensor_copy::LoadBox2d(w.q + b * kBlockBytes, &map, b * kQueryBoxValues, vector, w.q_full);
  }
}

// The consumers' whole programs, each within its own register budget: accumulators, the tile
// loop, the rows' maxima and sums handed from the scorer to the partner, the epilogue. This
// lane's accumulator rows r = 0, 1 are wgmma::AccRow(gw, lane, 2 r): 16 gw + lane / 4 and 8 below.
template <class C>
__device__ __forceinline__ void RunScorerProgram(const AttendKernelParams& p,
                                                 const WgmmaProgram& w) {
  const int lane = LaneId();
  const int gw = GroupWarp<C>();
  float o[C::kColBlocks][32] = {};
  float m_run[2] = {-INFINITY, -INFINITY};  // base 2
  float l_lane[2] = {0.0f, 0.0f};           // this lane's share of the row sums
  RunScorer<C>(p, w, o, m_run, l_lane);
  float l_run[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] = RowGroupSum<4>(l_lane[r]);
    if (lane % 4 == 0) {
      w.row_max[wgmma::AccRow(gw, lane, 2 * r)] = m_run[r];
      w.row_sum[wgmma::AccRow(gw, lane, 2 * r)] = l_run[r];
    }
  }
  wgsync::NamedArrive(kRowsDone, C::kConsumerThreads);
  StoreRows<C>(p, w, o, m_run, l_run, 0, w.q);  // the partner never reads Q
}

template <class C>
__device__ __forceinline__ void RunPartnerProgram(const AttendKernelParams& p,
                                                  const WgmmaProgram& w) {
  const int lane = LaneId();
  const int gw = GroupWarp<C>();
  float o[C::kColBlocks][32] = {};
  RunPartner<C>(w, o);
  wgsync::NamedSync(kRowsDone, C::kConsumerThreads);
  float m_run[2], l_run[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    m_run[r] = w.row_max[wgmma::AccRow(gw, lane, 2 * r)];
    l_run[r] = w.row_sum[wgmma::AccRow(gw, lane, 2 * r)];
  }
  // Past kRowsDone both consumers' products have completed: the tile buffers are free.
  StoreRows<C>(p, w, o, m_run, l_run, 1, w.tiles);
}

#endif

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    SparseMlaAttendWgmmaKernel(const __grid_constant__ AttendKernelParams p,
                               const __grid_constant__ QueryTensorMap q_map) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  EnterGrid();  // grid_order.h: before any access to memory
  using S = WgmmaSmem<C>;
  extern __shared__ __align__(1024) uint8_t smem[];
  WgmmaProgram w;
  w.q = smem + S::kQ;
  w.tiles = smem + S::kTiles;
  w.p = smem + S::kP;
  w.alpha = reinterpret_cast<float*>(smem + S::kAlpha);
  w.row_max = reinterpret_cast<float*>(smem + S::kRowMax);
  w.row_sum = reinterpret_cast<float*>(smem + S::kRowSum);
  w.valid = reinterpret_cast<int32_t*>(smem + S::kValid);
  w.ready = reinterpret_cast<uint64_t*>(smem + S::kReady);
  w.free = reinterpret_cast<uint64_t*>(smem + S::kFree);
  if constexpr (C::kQTensorMap) {  // the loads build has neither: its staging starts there
    w.q_full = reinterpret_cast<uint64_t*>(smem + S::kQFull);
    w.rope = reinterpret_cast<float*>(smem + S::kRope);
  }
  w.stage = smem + S::kStage + (threadIdx.x % C::kGroupThreads) * S::kStageStride;

  // Grouped: the program's "row" is a unit of rows, which takes an even share of its union's
  // tiles (known only here). Whole units (unsplit) come first in the grid.
  ProgramIndex at;
  if (static_cast<int>(blockIdx.x) < p.whole_units) {
    at.row = static_cast<int>(blockIdx.x);  // head_blocks is 1 with whole units
  } else {
    at = ProgramOf(p, blockIdx.x - p.whole_units);
    at.row += p.whole_units;
    w.splits = p.splits;
  }
  const auto [row, hb, split] = at;
  w.row = C::kGrouped ? row * p.union_rows : row;
  w.split = split;
  w.head0 = hb * C::kHeadBlock;  // 0 when grouped (one head block)
  if constexpr (C::kGrouped) {
    w.heads_log2 = p.row_heads_log2;
    w.rows = p.union_rows;
  }
  const RowKeys keys = C::kGrouped ? UnitKeysOf(p, row) : RowKeysOf(p, row);
  w.begin0 = keys.begin0;
  w.len0 = keys.len0;
  w.begin1 = keys.begin1;
  w.len1 = keys.len1;
  w.tiles0 = keys.tiles0;
  const int tiles = keys.tiles0 + keys.tiles1;
  const int per_split = w.splits == 1                  ? tiles
                        : C::kGrouped || p.whole_units ? (tiles + p.splits - 1) / p.splits
                                                       : p.tiles_per_split;
  w.u_begin = split * per_split;
  w.u_end = min(w.u_begin + per_split, tiles);

  if (threadIdx.x == 0) {
    // The swizzle is applied to absolute shared addresses: a base off 1 KB would read garbage.
    if ((SharedAddress(smem) & 1023u) != 0) __trap();
    for (int b = 0; b < C::kBuffers; ++b) {
      wgsync::InitBarrier(w.ready + b, C::kGroupThreads);  // the loader's threads
      wgsync::InitBarrier(w.free + b, C::kConsumerThreads);
    }
    if constexpr (C::kQTensorMap) {
      wgsync::InitBarrier(w.q_full, 1);
      wgsync::FenceBarrierInit();
      CopyQueries<C>(p, q_map, w);
    }
  }
  __syncthreads();  // the barriers' initialisation

  // Warp-uniform for the compiler: the role branches hold setmaxnreg.
  const int group = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / C::kGroupThreads, 0);
  if (group == 2) {
    wgsync::LowerRegisters<C::kLoaderRegs>();
    RunLoader<C>(p, w);
    return;
  }

  // Q in the swizzled layout while the loader reads the first tiles: by the tensor copy engine
  // (bf16 queries the map could describe), else by the consumers in batches of four loads
  // (docs/gpu.md, "Queries by the tensor copy engine").
  if constexpr (C::kQTensorMap) {
    PreloadRopeRows<C>(p, w, static_cast<int>(threadIdx.x));
    wgsync::Wait(w.q_full, 0);
  } else {
    StageQueries<C, C::kConsumerThreads>(
        p, SlotsOf<C>(w), w.q,
        [](int h, int e0) { return wgmma::SwizzledOffset(h, e0, C::kHeadBlock); },
        static_cast<int>(threadIdx.x));
    wgmma::FenceOperands();
  }
  wgsync::NamedSync(kQReady, C::kConsumerThreads);
  if (group == 0) {
    wgsync::RaiseRegisters<C::kScorerRegs>();
    RunScorerProgram<C>(p, w);
  } else {
    wgsync::LowerRegisters<C::kPartnerRegs>();
    RunPartnerProgram<C>(p, w);
  }
#endif
}

}  // namespace smla::kernels::gpu
