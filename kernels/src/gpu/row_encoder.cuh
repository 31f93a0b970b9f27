// A bf16 row quantised into a pool slot by kRowLanes threads of a block (docs/operator.md
// section 3, "Writing rows"), for the row-writing kernel and the checking kernel's row writes.
// Each scale group's amax is reduced across the lanes (a maximum, so the order does not change
// it) and every value is encoded with the helpers EncodeRow uses on the CPU, so both backends
// write identical bytes. Lane t holds value t of every 64-value chunk of the row: the row's loads
// are all in flight at once and one barrier publishes every chunk's maximum (a group at a time
// chained seven load-reduce rounds, most of a small launch's row-writing time).
#pragma once

#include <cstdint>
#include <cstring>  // memcpy

#include "smla/kernels/codec/row_codec.h"
#include "smla/kernels/gpu/primitives.h"
#include "smla/kernels/params.h"

namespace smla::kernels::gpu {

inline constexpr int kRowLanes = 64;
inline constexpr int kRowChunks = 576 / kRowLanes;  // values a lane holds of the widest row
inline constexpr int kRowSubgroup = 32;  // lanes of one shuffle reduction: a warp, half a wavefront
inline constexpr int kRowSubgroups = kRowLanes / kRowSubgroup;
static_assert(64 % kRowLanes == 0, "a chunk lies in one scale group (of 64 or 128 values)");

// One row's shared scratch: each subgroup's maximum of each chunk.
using RowScratch = float[kRowSubgroups][kRowChunks];

// The larger of a and b, keeping a when b is NaN, as EncodeRow's serial loop does.
__device__ __forceinline__ float Larger(float a, float b) { return b > a ? b : a; }

// Lane t's values of a row of `width` (512 or 576): x[k] = in[k * kRowLanes + t], 0 past it.
__device__ __forceinline__ void LoadRowValues(const uint16_t* in, int width, int t,
                                              uint16_t (&x)[kRowChunks]) {
#pragma unroll
  for (int k = 0; k < kRowChunks; ++k) x[k] = k * kRowLanes < width ? in[k * kRowLanes + t] : 0;
}

// Writes the row that lanes t = 0 .. kRowLanes-1 hold (LoadRowValues) into `slot` of pool c.
// Every thread of the block calls this equally often, since for fp8_dsv4 and fp8_ds_mla it holds
// two block barriers; a lane group with `write` false only takes the barriers. The format is the
// same for the whole block, so every thread takes the same branches.
__device__ __forceinline__ void EncodeRowValues(const MutableCacheView& c, int64_t slot,
                                                const uint16_t (&x)[kRowChunks], int t,
                                                RowScratch& amax_s, bool write) {
  const int width = QkWidth(c.geometry);
  uint8_t* data = static_cast<uint8_t*>(c.base) +
                  SlotDataOffset(c.format, c.geometry, slot, c.rows_per_page, c.pitch_bytes);
  if (c.format == KvFormat::kBf16) {
    if (!write) return;
    auto* out = reinterpret_cast<uint16_t*>(data);
#pragma unroll
    for (int k = 0; k < kRowChunks; ++k) {
      if (k * kRowLanes < width) out[k * kRowLanes + t] = x[k];
    }
    return;
  }
  if (c.format == KvFormat::kFp8PerTensor) {
    if (!write) return;
#pragma unroll
    for (int k = 0; k < kRowChunks; ++k) {
      if (k * kRowLanes >= width) continue;
      float v = Bf16BitsToF32(x[k]) / c.scale;
      v = v > kE4m3Max ? kE4m3Max : (v < -kE4m3Max ? -kE4m3Max : v);
      data[k * kRowLanes + t] = EncodeE4m3(v);
    }
    return;
  }
  const bool dsv4 = c.format == KvFormat::kFp8Dsv4;
  const int group = dsv4 ? 64 : 128;
  const int chunks = (dsv4 ? kNopeWidth : 512) / kRowLanes;  // quantised: 7 or 8, then the rope
  const int per_group = group / kRowLanes;                   // chunks per scale group: 1 or 2
#pragma unroll
  for (int k = 0; k < kRowChunks; ++k) {
    if (k >= chunks) continue;  // the rope has no scale
    // EncodeRow's floor, NaN skipped; partial maxima are never NaN, so Larger combines them.
    float a = Larger(1e-4f, AbsF(Bf16BitsToF32(x[k])));
    for (int m = kRowSubgroup / 2; m > 0; m >>= 1) a = WarpXorMax(a, m);
    if (t % kRowSubgroup == 0) amax_s[t / kRowSubgroup][k] = a;
  }
  __syncthreads();
  if (write) {
    uint8_t* rec =
        dsv4 ? static_cast<uint8_t*>(c.base) + SlotScaleOffset(slot, c.rows_per_page, c.pitch_bytes)
             : nullptr;
    // The 64 rope values are copied as bf16 after the quantised part (at 448 or 528 bytes).
    uint8_t* rope = data + (dsv4 ? kNopeWidth : 512 + 16);
#pragma unroll
    for (int k = 0; k < kRowChunks; ++k) {
      if (k == chunks) reinterpret_cast<uint16_t*>(rope)[t] = x[k];  // 2-byte aligned
      if (k >= chunks) continue;
      const int gi = k / per_group;
      float amax = 1e-4f;
      for (int j = gi * per_group; j < (gi + 1) * per_group; ++j) {
        for (int h = 0; h < kRowSubgroups; ++h) amax = Larger(amax, amax_s[h][j]);
      }
      const int e = CeilLog2Over448(amax);
      float v = Bf16BitsToF32(x[k]) * Pow2(-e);
      v = v > kE4m3Max ? kE4m3Max : (v < -kE4m3Max ? -kE4m3Max : v);
      data[k * kRowLanes + t] = EncodeE4m3(v);
      if (t == 0 && k % per_group == 0) {
        if (dsv4) {
          rec[gi] = E8m0FromExponent(e);
        } else {
          const float s = Pow2(e);
          memcpy(data + 512 + 4 * gi, &s, 4);
        }
      }
    }
    if (dsv4 && t == 0) rec[7] = 0;
  }
  __syncthreads();  // amax_s is rewritten by the lanes' next row
}

}  // namespace smla::kernels::gpu
