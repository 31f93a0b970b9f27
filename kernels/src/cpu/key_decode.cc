#include "cpu/key_decode.h"

#include <cstring>

#include "cpu/hot.h"
#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/codec/bits.h"
#include "smla/kernels/codec/e8m0.h"

namespace smla::kernels::cpu {
namespace {

// n e4m3 codes times s, as f32 products (DecodeE4m3(code) * s) without a table lookup or a
// branch per value, so the loop vectorises. Moving a code's exponent and mantissa bits into f32
// position with exponent bias 120 gives its value for normal codes; for subnormal codes
// (exponent 0) it gives 2^-7 + m * 2^-10, from which m * 2^-9 follows exactly. NaN codes
// (0x7F / 0xFF) become a quiet NaN of their sign.
inline void E4m3Times(const uint8_t* __restrict codes, int n, float s, float* __restrict out) {
  for (int i = 0; i < n; ++i) {
    const uint32_t c = codes[i];
    const uint32_t mag = c & 0x7fu;
    const uint32_t sign = (c & 0x80u) << 24;
    const float biased = BitsFloat((mag << 20) + (120u << 23));
    const float sub = (biased - 0x1p-7f) * 2.0f;
    // Selections on bits, so that no float operation is conditional (which would stop the
    // vectoriser under the default -ftrapping-math).
    const uint32_t is_sub = 0u - static_cast<uint32_t>(mag < 8);
    const uint32_t is_nan = 0u - static_cast<uint32_t>(mag == 0x7fu);
    uint32_t bits = (FloatBits(sub) & is_sub) | (FloatBits(biased) & ~is_sub);
    bits = ((bits & ~is_nan) | (0x7fc00000u & is_nan)) | sign;
    out[i] = BitsFloat(bits) * s;
  }
}

inline void RoundAllToBf16(float* __restrict x, int n) {
  for (int i = 0; i < n; ++i) x[i] = RoundToBf16(x[i]);
}

inline void Bf16Lanes(const uint8_t* __restrict data, int n, float* __restrict out) {
  for (int i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, data + 2 * i, 2);
    out[i] = Bf16BitsToF32(b);
  }
}

}  // namespace

SMLA_CPU_HOT void StageRow(KvFormat f, Geometry g, const uint8_t* data, const uint8_t* scale_record,
                           float* out) {
  const int width = QkWidth(g);
  switch (f) {
    case KvFormat::kBf16:
      Bf16Lanes(data, width, out);
      return;
    case KvFormat::kFp8PerTensor:
      E4m3Times(data, width, 1.0f, out);
      return;
    case KvFormat::kFp8DsMla:
      for (int gi = 0; gi < kDsMlaGroups; ++gi) {
        float s;
        std::memcpy(&s, data + 512 + 4 * gi, 4);
        E4m3Times(data + gi * 128, 128, s, out + gi * 128);
      }
      RoundAllToBf16(out, 512);
      Bf16Lanes(data + 528, kRopeWidth, out + 512);
      return;
    case KvFormat::kFp8Dsv4:
      for (int gi = 0; gi < kDsv4Groups; ++gi) {
        const uint8_t b = scale_record[gi];
        E4m3Times(data + gi * 64, 64, DecodeE8m0(b), out + gi * 64);
        // For bytes 3..246 every code times 2^(b-127) is a bf16 value (no bit below bf16's
        // smallest subnormal, no overflow), so the rounding would be the identity.
        if (b < 3 || b > 246) RoundAllToBf16(out + gi * 64, 64);
      }
      Bf16Lanes(data + kNopeWidth, kRopeWidth, out + kNopeWidth);
      return;
  }
}

}  // namespace smla::kernels::cpu
