// Staging of key rows for the CPU backend: the values DecodeRow (codec/row_codec.h) defines,
// computed with a 256-entry e4m3 table instead of per-value bit decoding.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/codec/e4m3.h"
#include "smla/kernels/codec/e8m0.h"
#include "smla/kernels/codec/row_codec.h"
#include "smla/kernels/formats.h"
#include "smla/kernels/params.h"

namespace smla::kernels::cpu {

// Exact f32 value of every e4m3 code (NaN for 0x7F / 0xFF).
inline const std::array<float, 256>& E4m3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = DecodeE4m3(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

// Where one cache's rows live and how to read them.
struct SegmentLayout {
  const uint8_t* base = nullptr;
  KvFormat format = KvFormat::kBf16;
  Geometry geometry = Geometry::kRopeInside;
  int32_t rows_per_page = 1;
  int64_t pitch = 0;
  int64_t num_slots = 0;
  float sigma = 1.0f;  // fp8_per_tensor scale folded into score and probabilities; else 1

  static SegmentLayout Of(const CacheView& c) {
    SegmentLayout s;
    s.base = static_cast<const uint8_t*>(c.base);
    s.format = c.format;
    s.geometry = c.geometry;
    s.rows_per_page = c.rows_per_page;
    s.pitch = c.pitch_bytes;
    s.num_slots = c.num_slots();
    s.sigma = c.format == KvFormat::kFp8PerTensor ? c.scale : 1.0f;
    return s;
  }
  const uint8_t* Data(int64_t slot) const {
    return base + SlotDataOffset(format, geometry, slot, rows_per_page, pitch);
  }
  const uint8_t* Scales(int64_t slot) const {
    return format == KvFormat::kFp8Dsv4 ? base + SlotScaleOffset(slot, rows_per_page, pitch)
                                        : nullptr;
  }
};

// Writes the QkWidth staged values of one row to out, bit-identical to DecodeRow.
inline void StageRow(KvFormat f, Geometry g, const uint8_t* data, const uint8_t* scale_record,
                     float* out) {
  const float* lut = E4m3Table().data();
  const int width = QkWidth(g);
  switch (f) {
    case KvFormat::kBf16: {
      uint16_t bits[576];
      memcpy(bits, data, 2 * width);
      for (int i = 0; i < width; ++i) out[i] = Bf16BitsToF32(bits[i]);
      return;
    }
    case KvFormat::kFp8PerTensor:
      for (int i = 0; i < width; ++i) out[i] = lut[data[i]];
      return;
    case KvFormat::kFp8DsMla: {
      for (int gi = 0; gi < kDsMlaGroups; ++gi) {
        float s;
        memcpy(&s, data + 512 + 4 * gi, 4);
        const uint8_t* c = data + gi * 128;
        float* o = out + gi * 128;
        for (int i = 0; i < 128; ++i) o[i] = RoundToBf16(lut[c[i]] * s);
      }
      uint16_t rope[kRopeWidth];
      memcpy(rope, data + 528, sizeof(rope));
      for (int i = 0; i < kRopeWidth; ++i) out[512 + i] = Bf16BitsToF32(rope[i]);
      return;
    }
    case KvFormat::kFp8Dsv4: {
      for (int gi = 0; gi < kDsv4Groups; ++gi) {
        const uint8_t b = scale_record[gi];
        const float s = DecodeE8m0(b);
        const uint8_t* c = data + gi * 64;
        float* o = out + gi * 64;
        // For bytes 3..246 every code times 2^(b-127) is a bf16 value (no bit below bf16's
        // smallest subnormal, no overflow), so the rounding is the identity.
        if (b >= 3 && b <= 246) {
          for (int i = 0; i < 64; ++i) o[i] = lut[c[i]] * s;
        } else {
          for (int i = 0; i < 64; ++i) o[i] = RoundToBf16(lut[c[i]] * s);
        }
      }
      uint16_t rope[kRopeWidth];
      memcpy(rope, data + kNopeWidth, sizeof(rope));
      for (int i = 0; i < kRopeWidth; ++i) out[kNopeWidth + i] = Bf16BitsToF32(rope[i]);
      return;
    }
  }
}

}  // namespace smla::kernels::cpu
