// An independent f64 reference of docs/operator.md for the kernel tests. Written as plainly as
// possible from the document, reading cache bytes itself: it shares no code with the codecs or
// the backends (its e4m3, bf16 and exponent helpers are its own), so a bug in those cannot
// hide in both.
#pragma once

#include <cstdint>
#include <vector>

#include "smla/kernels/formats.h"

namespace smla::oracle {

using kernels::Geometry;
using kernels::KvFormat;

// Number formats, from their definitions.
double E4m3Value(uint8_t code);  // NaN for 0x7F / 0xFF
uint8_t E4m3Nearest(double x);   // round to nearest, ties to even code; saturates
double Bf16Value(uint16_t bits);
float RoundF32ToBf16(float x);  // nearest even; NaN stays NaN
uint16_t Bf16Bits(float x);
int CeilLog2Over448(double amax);  // smallest e with 448 * 2^e >= amax (amax > 0)

// A pool as raw bytes.
struct Cache {
  const uint8_t* bytes = nullptr;
  KvFormat format = KvFormat::kBf16;
  Geometry geometry = Geometry::kRopeInside;
  int32_t rows_per_page = 1;
  int64_t pitch = 0;
  float scale = 1.0f;  // fp8_per_tensor
};

// Dequantised value of one slot (QkWidth values), per docs/operator.md section 3; for
// fp8_per_tensor the cache scale is included.
std::vector<double> DequantRow(const Cache& cache, int64_t slot);

// One row quantised by the writer rules of section 3, as the bytes of a page row. `data` gets
// the format's data row (RowBytes, or the 576-byte data row for fp8_dsv4), `scales` the 8-byte
// fp8_dsv4 scale record. Values are bf16 bit patterns.
void QuantiseRow(KvFormat format, Geometry geometry, const uint16_t* values, float tensor_scale,
                 std::vector<uint8_t>& data, std::vector<uint8_t>& scales);

struct Segment {
  Cache cache;
  std::vector<int32_t> indptr;
  std::vector<int32_t> indices;
};

struct Input {
  int32_t num_rows = 0;
  int32_t num_heads = 0;
  Geometry geometry = Geometry::kRopeInside;
  std::vector<double> q;  // [T, H, QkWidth], q_scale applied
  double softmax_scale = 1.0;
  Segment main;
  bool has_extra = false;
  Segment extra;
  std::vector<double> sink;  // [H] or empty
};

struct Output {
  std::vector<double> out;  // [T, H, 512], before the epilogue
  std::vector<double> lse;  // [T, H]
  std::vector<bool> empty;  // [T]
};

Output Attend(const Input& in);

// Inverse GPT-J RoPE of lanes 448..511 in f64.
void InverseRope(double* x, const float* cos_sin_row);

// The MXFP8 store of section 6 applied to a 512-lane vector that is already bf16-rounded,
// rotated in f32 when cos_sin_row is given. `rope_scale_loose[g]` (g = 0, 1 for groups 14, 15)
// says where the scale byte may legitimately differ: amax/448 within 2 f32 ulps of a power
// of two.
void Mxfp8Reference(const float* x, const float* cos_sin_row, uint8_t* codes, uint8_t* scales,
                    bool rope_scale_loose[2], float* rotated = nullptr);

}  // namespace smla::oracle
