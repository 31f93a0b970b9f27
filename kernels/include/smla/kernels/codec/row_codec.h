// Where a slot's bytes live in a page, and how one bf16 row is written into / read out of each
// pool format (docs/operator.md section 3). Host and device code share these.
#pragma once

#include <cstdint>

#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/codec/e4m3.h"
#include "smla/kernels/codec/e8m0.h"
#include "smla/kernels/formats.h"

namespace smla::kernels {

// Bytes of a slot's data row: the whole row, but for fp8_dsv4, whose scale record lies apart.
SMLA_HD_INLINE constexpr int64_t SlotDataBytes(KvFormat f, Geometry g) {
  return f == KvFormat::kFp8Dsv4 ? kDsv4DataBytes : RowBytes(f, g);
}

// Byte offset of slot s's data row inside the pool.
SMLA_HD_INLINE int64_t SlotDataOffset(KvFormat f, Geometry g, int64_t slot, int32_t rows_per_page,
                                      int64_t pitch) {
  const int64_t page = slot / rows_per_page;
  const int64_t row = slot % rows_per_page;
  return page * pitch + row * SlotDataBytes(f, g);
}

// Byte offset of slot s's fp8_dsv4 scale record (the page trailer after the B data rows).
SMLA_HD_INLINE int64_t SlotScaleOffset(int64_t slot, int32_t rows_per_page, int64_t pitch) {
  const int64_t page = slot / rows_per_page;
  const int64_t row = slot % rows_per_page;
  return page * pitch + int64_t{rows_per_page} * kDsv4DataBytes + row * kDsv4ScaleBytes;
}

// Where slot s's bytes lie in a pool: its data row, then, for fp8_dsv4, its scale record apart
// (RowBytes in all, in the order RowWrites::old keeps them). Returns how many parts: 1 or 2.
struct SlotPart {
  int64_t offset = 0;
  int64_t bytes = 0;
};
SMLA_HD_INLINE int SlotParts(KvFormat f, Geometry g, int64_t slot, int32_t rows_per_page,
                             int64_t pitch, SlotPart (&parts)[2]) {
  parts[0] = {SlotDataOffset(f, g, slot, rows_per_page, pitch), SlotDataBytes(f, g)};
  if (f != KvFormat::kFp8Dsv4) return 1;
  parts[1] = {SlotScaleOffset(slot, rows_per_page, pitch), kDsv4ScaleBytes};
  return 2;
}

SMLA_HD_INLINE float AbsF(float x) { return x < 0 ? -x : x; }

// Quantises one row of QkWidth(g) bf16 values. `scale_record` is only used by fp8_dsv4;
// `tensor_scale` only by fp8_per_tensor.
SMLA_HD_INLINE void EncodeRow(KvFormat f, Geometry g, const uint16_t* in, uint8_t* data,
                              uint8_t* scale_record, float tensor_scale) {
  const int width = QkWidth(g);
  switch (f) {
    case KvFormat::kBf16: {
      uint16_t* out = reinterpret_cast<uint16_t*>(data);
      for (int i = 0; i < width; ++i) out[i] = in[i];
      return;
    }
    case KvFormat::kFp8PerTensor:
      for (int i = 0; i < width; ++i) {
        float v = Bf16BitsToF32(in[i]) / tensor_scale;
        v = v > kE4m3Max ? kE4m3Max : (v < -kE4m3Max ? -kE4m3Max : v);
        data[i] = EncodeE4m3(v);
      }
      return;
    case KvFormat::kFp8DsMla:
    case KvFormat::kFp8Dsv4: {
      const bool dsv4 = f == KvFormat::kFp8Dsv4;
      const int group = dsv4 ? 64 : 128;
      const int groups = dsv4 ? kDsv4Groups : kDsMlaGroups;
      const int quantised = group * groups;  // 448 or 512
      for (int gi = 0; gi < groups; ++gi) {
        float amax = 1e-4f;
        for (int i = 0; i < group; ++i) {
          const float a = AbsF(Bf16BitsToF32(in[gi * group + i]));
          amax = a > amax ? a : amax;
        }
        const int e = CeilLog2Over448(amax);
        const float inv = Pow2(-e);
        for (int i = 0; i < group; ++i) {
          float v = Bf16BitsToF32(in[gi * group + i]) * inv;
          v = v > kE4m3Max ? kE4m3Max : (v < -kE4m3Max ? -kE4m3Max : v);
          data[gi * group + i] = EncodeE4m3(v);
        }
        if (dsv4) {
          scale_record[gi] = E8m0FromExponent(e);
        } else {
          const float s = Pow2(e);
          memcpy(data + 512 + 4 * gi, &s, 4);
        }
      }
      if (dsv4) scale_record[7] = 0;
      // The 64 rope values are copied as bf16 after the quantised part (at 448 or 528 bytes).
      uint8_t* rope = data + (dsv4 ? kNopeWidth : 512 + 16);
      memcpy(rope, in + quantised, kRopeWidth * 2);
      return;
    }
  }
}

// Reads one row as the values the operator stages in bf16 (docs/operator.md section 5), written as
// f32. fp8_per_tensor yields the raw code values: the caller folds the tensor scale into the
// score and the probabilities.
SMLA_HD_INLINE void DecodeRow(KvFormat f, Geometry g, const uint8_t* data,
                              const uint8_t* scale_record, float* out) {
  const int width = QkWidth(g);
  switch (f) {
    case KvFormat::kBf16: {
      const uint16_t* in = reinterpret_cast<const uint16_t*>(data);
      for (int i = 0; i < width; ++i) out[i] = Bf16BitsToF32(in[i]);
      return;
    }
    case KvFormat::kFp8PerTensor:
      for (int i = 0; i < width; ++i) out[i] = DecodeE4m3(data[i]);
      return;
    case KvFormat::kFp8DsMla: {
      for (int gi = 0; gi < kDsMlaGroups; ++gi) {
        float s;
        memcpy(&s, data + 512 + 4 * gi, 4);
        for (int i = 0; i < 128; ++i)
          out[gi * 128 + i] = RoundToBf16(DecodeE4m3(data[gi * 128 + i]) * s);
      }
      const uint16_t* rope = reinterpret_cast<const uint16_t*>(data + 528);
      for (int i = 0; i < kRopeWidth; ++i) out[512 + i] = Bf16BitsToF32(rope[i]);
      return;
    }
    case KvFormat::kFp8Dsv4: {
      for (int gi = 0; gi < kDsv4Groups; ++gi) {
        const float s = DecodeE8m0(scale_record[gi]);
        for (int i = 0; i < 64; ++i)
          out[gi * 64 + i] = RoundToBf16(DecodeE4m3(data[gi * 64 + i]) * s);
      }
      const uint16_t* rope = reinterpret_cast<const uint16_t*>(data + kNopeWidth);
      for (int i = 0; i < kRopeWidth; ++i) out[kNopeWidth + i] = Bf16BitsToF32(rope[i]);
      return;
    }
  }
}

}  // namespace smla::kernels
