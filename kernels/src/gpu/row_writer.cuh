// One bf16 row quantised into the pool (docs/operator.md section 3, "Writing rows") by 32 lanes
// (a warp; half a gfx950 wavefront), with no block barrier: any 32 lanes of a block can write a
// row, so the write-rows kernel and the checking kernel (which writes a step's rows as soon as
// its checks end) share it. Every value is encoded with the helpers EncodeRow uses on the CPU,
// and a scale group's amax is a maximum (the order does not change it), so both backends write
// identical bytes.
//
// Lane l holds values [16 l, 16 l + 16) of the quantised part: one lane's values lie in one scale
// group (of 64 or 128), whose amax is reduced over its 4 or 8 lanes. The row is loaded from L2
// (LoadRowWords): in the checking kernel other blocks wrote it during the same grid.
#pragma once

#include <cstdint>
#include <cstring>

#include "gpu/kernel_params.h"
#include "smla/kernels/codec/row_codec.h"
#include "smla/kernels/gpu/primitives.h"

namespace smla::kernels::gpu {

inline constexpr int kRowLanes = 32;
inline constexpr int kLaneValues = 16;  // 512 quantised values at most, over 32 lanes

// 16 bytes of a row, read where every block's writes of the grid are visible once ordered by a
// fence: L2 on NVIDIA (L1 is not coherent); on AMD the fence invalidates the vector cache.
__device__ __forceinline__ uint4 LoadRowWords(const uint4* p) {
#if defined(SMLA_DEVICE_CUDA)
  return __ldcg(p);
#else
  return *p;
#endif
}

// The larger of a and b, keeping a when b is NaN, as EncodeRow's serial loop does.
__device__ __forceinline__ float Larger(float a, float b) { return b > a ? b : a; }

// Writes row r of p with the lanes of one 32-lane group (lane in [0, 32)), which all take part
// (the reductions shuffle between them). With `skip` nothing is stored; the row is still read, so
// that a caller may decide after issuing the loads.
__device__ __forceinline__ void WriteRowLanes(const WriteRowsKernelParams& p, int64_t r, int lane,
                                              bool skip) {
  const auto f = static_cast<KvFormat>(p.format);
  const auto g = static_cast<Geometry>(p.geometry);
  const int width = QkWidth(g);
  const auto* in = reinterpret_cast<const uint4*>(p.rows + r * width);  // 8 values a word
  const int64_t slot = p.slots[r];
  uint8_t* data = p.base + SlotDataOffset(f, g, slot, p.rows_per_page, p.pitch);
  if (f == KvFormat::kBf16) {
    for (int i = lane; i < width / 8; i += kRowLanes) {
      const uint4 w = LoadRowWords(in + i);
      if (!skip) reinterpret_cast<uint4*>(data)[i] = w;
    }
    return;
  }
  // Two words: this lane's 16 values of chunk c (16 c .. 16 c + 15).
  // HIP's uint4 is not trivially copyable: words go through plain arrays.
  auto load = [&](int c, float(&x)[kLaneValues]) {
    const uint4 w0 = LoadRowWords(in + 2 * c), w1 = LoadRowWords(in + 2 * c + 1);
    const uint32_t words[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int k = 0; k < kLaneValues; ++k) {
      x[k] = Bf16BitsToF32(static_cast<uint16_t>(words[k / 2] >> (16 * (k % 2))));
    }
  };
  auto store = [&](int c, const float(&x)[kLaneValues], float inv) {
    uint8_t codes[kLaneValues];
#pragma unroll
    for (int k = 0; k < kLaneValues; ++k) {
      float v = x[k] * inv;
      v = v > kE4m3Max ? kE4m3Max : (v < -kE4m3Max ? -kE4m3Max : v);
      codes[k] = EncodeE4m3(v);
    }
    uint32_t words[4];
    memcpy(words, codes, 16);
    reinterpret_cast<uint4*>(data)[c] = make_uint4(words[0], words[1], words[2], words[3]);
  };
  float x[kLaneValues];
  if (f == KvFormat::kFp8PerTensor) {
    // EncodeRow divides by the scale; a multiply by its inverse could round differently.
    for (int c = lane; c < width / kLaneValues; c += kRowLanes) {
      load(c, x);
      if (skip) continue;
#pragma unroll
      for (int k = 0; k < kLaneValues; ++k) x[k] /= p.scale;
      store(c, x, 1.0f);
    }
    return;
  }
  const bool dsv4 = f == KvFormat::kFp8Dsv4;
  const int group = dsv4 ? 64 : 128;
  const int quantised = group * (dsv4 ? kDsv4Groups : kDsMlaGroups);  // 448 or 512
  const int lanes_per_group = group / kLaneValues;                    // 4 or 8
  const bool holds = lane * kLaneValues < quantised;
  if (holds) {
    load(lane, x);
  } else {
#pragma unroll
    for (int k = 0; k < kLaneValues; ++k) x[k] = 0.0f;
  }
  // EncodeRow's floor, NaN skipped; partial maxima are never NaN, so fmaxf combines them.
  float amax = 1e-4f;
#pragma unroll
  for (int k = 0; k < kLaneValues; ++k) amax = Larger(amax, AbsF(x[k]));
  for (int m = 1; m < lanes_per_group; m <<= 1) amax = WarpXorMax(amax, m);
  // The 64 rope values, copied as bf16 after the quantised part (at 448 or 528 bytes): 8 words.
  uint4 rope{};
  if (lane < kRopeWidth / 8) rope = LoadRowWords(in + quantised / 8 + lane);
  if (skip) return;
  if (holds) {
    const int e = CeilLog2Over448(amax);
    store(lane, x, Pow2(-e));
    const int gi = lane / lanes_per_group;
    if (lane % lanes_per_group == 0) {
      if (dsv4) {
        p.base[SlotScaleOffset(slot, p.rows_per_page, p.pitch) + gi] = E8m0FromExponent(e);
      } else {
        const float s = Pow2(e);
        memcpy(data + 512 + 4 * gi, &s, 4);
      }
    }
  }
  if (dsv4 && lane == 0) p.base[SlotScaleOffset(slot, p.rows_per_page, p.pitch) + 7] = 0;
  if (lane < kRopeWidth / 8) {
    reinterpret_cast<uint4*>(data + (dsv4 ? kNopeWidth : 512 + 16))[lane] = rope;
  }
}

}  // namespace smla::kernels::gpu
