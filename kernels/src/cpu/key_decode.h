// Staging of key rows for the CPU backend: where a slot's bytes are, and the values DecodeRow
// (codec/row_codec.h) defines for them.
#pragma once

#include <cstdint>

#include "smla/kernels/codec/row_codec.h"
#include "smla/kernels/formats.h"
#include "smla/kernels/params.h"

namespace smla::kernels::cpu {

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

// Writes the QkWidth staged values of one row to out, bit-identical to DecodeRow
// (codec/row_codec.h) but written so the compiler vectorises it.
void StageRow(KvFormat f, Geometry g, const uint8_t* data, const uint8_t* scale_record, float* out);

}  // namespace smla::kernels::cpu
