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
  // The offsets of SlotDataOffset / SlotScaleOffset with shifts, as rows_per_page is a power of
  // two (validated).
  int page_shift = 0;
  int64_t row_stride = 0;     // bytes between data rows of a page
  int64_t scale_offset = -1;  // fp8_dsv4: where a page's scale records start; else -1

  static SegmentLayout Of(const CacheView& c) {
    SegmentLayout s;
    s.base = static_cast<const uint8_t*>(c.base);
    s.format = c.format;
    s.geometry = c.geometry;
    s.rows_per_page = c.rows_per_page;
    s.pitch = c.pitch_bytes;
    s.num_slots = c.num_slots();
    s.sigma = c.format == KvFormat::kFp8PerTensor ? c.scale : 1.0f;
    while ((int64_t{1} << s.page_shift) < c.rows_per_page) ++s.page_shift;
    s.row_stride = c.format == KvFormat::kFp8Dsv4 ? kDsv4DataBytes : RowBytes(c.format, c.geometry);
    if (c.format == KvFormat::kFp8Dsv4) s.scale_offset = int64_t{c.rows_per_page} * kDsv4DataBytes;
    return s;
  }
  const uint8_t* Data(int64_t slot) const {
    return base + (slot >> page_shift) * pitch + (slot & (rows_per_page - 1)) * row_stride;
  }
  const uint8_t* Scales(int64_t slot) const {
    if (scale_offset < 0) return nullptr;
    return base + (slot >> page_shift) * pitch + scale_offset +
           (slot & (rows_per_page - 1)) * kDsv4ScaleBytes;
  }
};

// Writes the QkWidth staged values of one row to out, bit-identical to DecodeRow
// (codec/row_codec.h) but written so the compiler vectorises it.
void StageRow(KvFormat f, Geometry g, const uint8_t* data, const uint8_t* scale_record, float* out);

}  // namespace smla::kernels::cpu
