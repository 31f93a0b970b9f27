// The MXFP8 query codec (codec/mxfp8_query.h) against an f64 oracle, and the CPU backend's
// ExpandMxfp8Query against the same oracle.
#include "smla/kernels/codec/mxfp8_query.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "smla/kernels/backend.h"
#include "smla/kernels/cpu_backend.h"

namespace smla::kernels {
namespace {

// e4m3 code -> value in f64, from the OCP definition (bias 7, subnormals m * 2^-9).
double E4m3Value(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (c & 0x80) ? -v : v;
}

// f64 -> bf16 bits, round to nearest even (the product is exact in f64), +-inf at 2^128. In
// bf16's normal range the value must be a bf16 value already: `exact` says whether it was.
uint16_t OracleBf16(double v, bool* exact) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  *exact = true;
  if (a == 0) return sign;
  if (a >= std::ldexp(1.0, 128)) return sign | 0x7f80;
  if (a < std::ldexp(1.0, -126)) {
    const double units = a * std::ldexp(1.0, 133);  // subnormal steps of 2^-133
    const double r = std::nearbyint(units);         // default mode: ties to even
    *exact = r == units;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(r));
  }
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const double frac = m * 256;         // 1.xxxxxxx as an 8-bit integer
  *exact = frac == std::floor(frac);
  return static_cast<uint16_t>(sign | ((e - 1 + 127) << 7) | (static_cast<int>(frac) - 128));
}

uint16_t OracleDecode(uint8_t code, uint8_t scale, bool* exact) {
  return OracleBf16(std::ldexp(E4m3Value(code), scale - 127), exact);
}

TEST(Mxfp8QueryCodec, DecodeMatchesTheF64OracleForEveryPair) {
  int rounded = 0;
  for (int s = 0; s < 255; ++s) {
    for (int c = 0; c < 256; ++c) {
      if (c == 0x7f || c == 0xff) continue;
      bool exact = false;
      const uint16_t want = OracleDecode(c, s, &exact);
      ASSERT_EQ(Mxfp8ToBf16Bits(c, s), want) << "code " << c << " scale " << s;
      // Rounding happens only below bf16's subnormal step, with the smallest scale bytes.
      if (!exact) {
        ++rounded;
        EXPECT_LT(s, 6) << "code " << c;
      }
      // Products of bf16's normal range and above are exact or +-inf.
      if (s >= 6 && (want & 0x7f80) != 0x7f80) {
        EXPECT_TRUE(exact) << c << " " << s;
      }
    }
  }
  EXPECT_GT(rounded, 0);                          // the rounding branch was exercised
  EXPECT_EQ(Mxfp8ToBf16Bits(0x7e, 254), 0x7f80);  // 448 * 2^127: +inf
  EXPECT_EQ(Mxfp8ToBf16Bits(0xfe, 254), 0xff80);
  EXPECT_EQ(Mxfp8ToBf16Bits(0x38, 127), 0x3f80);  // 1.0
  EXPECT_EQ(Mxfp8ToBf16Bits(0x01, 0), 0x0000);    // 2^-136: rounds to +0
  EXPECT_EQ(Mxfp8ToBf16Bits(0x81, 0), 0x8000);    // to -0
  EXPECT_EQ(Mxfp8ToBf16Bits(0x01, 3), 0x0001);    // 2^-9 * 2^-124 = 2^-133, the smallest step
}

TEST(Mxfp8QueryCodec, NaNCodesAndTheNaNScaleByte) {
  for (int c = 0; c < 256; ++c) {
    EXPECT_EQ(E4m3IsNaN(c), c == 0x7f || c == 0xff) << c;
    EXPECT_EQ(E8m0IsNaN(c), c == 0xff) << c;
    // A NaN scale makes every lane NaN.
    EXPECT_EQ(Mxfp8ToBf16Bits(c, 0xff) & 0x7fff, 0x7fc0) << c;
  }
  for (int s = 0; s < 256; ++s) {
    EXPECT_EQ(Mxfp8ToBf16Bits(0x7f, s), 0x7fc0) << s;
    EXPECT_EQ(Mxfp8ToBf16Bits(0xff, s), 0xffc0) << s;
  }
}

// The exponent rule: E = clamp(ceil(log2(max(amax, 2^-126) / 448)) + 127, 0, 254), then each
// lane the nearest e4m3 to x * 2^(127 - E) (ties to the even code).
uint8_t OracleScale(double amax) {
  const double a = std::max(amax, std::ldexp(1.0, -126));
  const int e = static_cast<int>(std::ceil(std::log2(a / 448.0)));
  return static_cast<uint8_t>(std::clamp(e + 127, 0, 254));
}

uint8_t OracleCode(double y) {
  const uint8_t sign = std::signbit(y) ? 0x80 : 0;
  const double a = std::min(std::fabs(y), 448.0);
  uint8_t best = 0;
  double best_d = INFINITY;
  for (int c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(E4m3Value(c) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_d = d;
    }
  }
  return sign | best;
}

double Bf16Value(uint16_t b) { return Bf16BitsToF32(b); }

void ExpectEncodesLikeTheOracle(const std::vector<uint16_t>& lanes, const char* what) {
  std::vector<uint8_t> codes(lanes.size()), scales(lanes.size() / 32);
  EncodeMxfp8Query(lanes.data(), static_cast<int64_t>(lanes.size()), codes.data(), scales.data());
  for (size_t g = 0; g < scales.size(); ++g) {
    double amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(Bf16Value(lanes[g * 32 + i])));
    const uint8_t s = OracleScale(amax);
    ASSERT_EQ(scales[g], s) << what << " group " << g << " amax " << amax;
    for (int i = 0; i < 32; ++i) {
      const double y = std::ldexp(Bf16Value(lanes[g * 32 + i]), 127 - s);
      ASSERT_EQ(codes[g * 32 + i], OracleCode(y))
          << what << " group " << g << " lane " << i << " x " << Bf16Value(lanes[g * 32 + i]);
    }
  }
}

TEST(Mxfp8QueryCodec, EncodeFollowsTheExponentRule) {
  std::mt19937 rng(3);
  std::vector<uint16_t> lanes;
  // Ordinary groups at magnitudes from 2^-140 to 2^124, so tiny groups (bf16 subnormals, the
  // 2^-126 floor, scale byte 0) and huge ones (the largest scale bytes) are both covered.
  for (int e = -140; e <= 124; e += 3) {
    std::normal_distribution<float> nd(0.0f, std::ldexp(1.0f, e));
    for (int i = 0; i < 32; ++i) lanes.push_back(F32ToBf16Bits(nd(rng)));
  }
  // All zeros; the smallest subnormal; bf16's largest finite below 1.875 * 2^127; an amax of
  // exactly 448 * 2^k (the boundary of the ceiling) and one just above it.
  for (uint16_t v : {uint16_t{0x0000}, uint16_t{0x0001}, uint16_t{0x7f6f}, uint16_t{0x43e0},
                     uint16_t{0x43e1}, uint16_t{0xc3e0}}) {
    for (int i = 0; i < 32; ++i) lanes.push_back(i == 5 ? v : F32ToBf16Bits(0.01f * i));
  }
  ExpectEncodesLikeTheOracle(lanes, "mixed");
}

TEST(Mxfp8QueryCodec, DecodingAnEncodingIsExactAndClose) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<uint16_t> lanes(32 * 64);
  for (uint16_t& b : lanes) b = F32ToBf16Bits(nd(rng));
  std::vector<uint8_t> codes(lanes.size()), scales(lanes.size() / 32);
  EncodeMxfp8Query(lanes.data(), static_cast<int64_t>(lanes.size()), codes.data(), scales.data());
  std::vector<uint16_t> back(lanes.size());
  DecodeMxfp8Query(codes.data(), scales.data(), static_cast<int64_t>(lanes.size()), back.data());
  for (size_t i = 0; i < lanes.size(); ++i) {
    bool exact = false;
    ASSERT_EQ(back[i], OracleDecode(codes[i], scales[i / 32], &exact));
    EXPECT_TRUE(exact);
    // Within half an e4m3 step of the group's scale: 2^-4 relative to 448 * 2^(E-127).
    const double step = std::ldexp(448.0, scales[i / 32] - 127) / 16;
    EXPECT_LE(std::fabs(Bf16Value(back[i]) - Bf16Value(lanes[i])), step) << i;
  }
}

TEST(Mxfp8QueryCodec, EncodeMarksNaNLanesAndSaturatesInfinities) {
  std::vector<uint16_t> lanes(32, F32ToBf16Bits(1.0f));
  lanes[3] = 0x7fc0;  // NaN
  lanes[4] = 0xff80;  // -inf
  std::vector<uint8_t> codes(32), scales(1);
  EncodeMxfp8Query(lanes.data(), 32, codes.data(), scales.data());
  EXPECT_TRUE(E4m3IsNaN(codes[3]));  // the server rejects it
  EXPECT_EQ(codes[4], 0xfe);         // -448 * scale
  EXPECT_FALSE(E8m0IsNaN(scales[0]));
}

TEST(CpuExpandMxfp8Query, EveryPairMatchesTheOracle) {
  auto backend = CreateCpuBackend(BackendOptions{2, 0});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto stream = (*backend)->CreateStream();
  ASSERT_TRUE(stream.ok());
  for (int width : {512, 576}) {
    // Every (scale byte, code) pair that is not NaN, over enough vectors for the parallel path.
    const int64_t pairs = 255 * 256;
    const int64_t vectors = std::max<int64_t>((pairs + width - 1) / width, 1100);
    std::vector<uint8_t> codes(vectors * width), scales(vectors * width / 32);
    for (int64_t i = 0; i < static_cast<int64_t>(codes.size()); ++i) {
      codes[i] = static_cast<uint8_t>(i % 256);
      if (E4m3IsNaN(codes[i])) codes[i] = 0x38;
    }
    for (int64_t g = 0; g < static_cast<int64_t>(scales.size()); ++g) {
      scales[g] = static_cast<uint8_t>((g / 8) % 255);
    }
    std::vector<uint16_t> out(codes.size(), 0xa5a5);
    const ExpandQueryParams p{codes.data(), scales.data(), out.data(), vectors, width};
    ASSERT_TRUE((*backend)->ExpandMxfp8Query(p, **stream).ok());
    for (size_t i = 0; i < out.size(); ++i) {
      bool exact = false;
      ASSERT_EQ(out[i], OracleDecode(codes[i], scales[i / 32], &exact))
          << "width " << width << " lane " << i;
    }
  }
}

TEST(CpuExpandMxfp8Query, RejectsBadCalls) {
  auto backend = CreateCpuBackend();
  ASSERT_TRUE(backend.ok());
  auto stream = (*backend)->CreateStream();
  ASSERT_TRUE(stream.ok());
  std::vector<uint8_t> codes(64), scales(2);
  std::vector<uint16_t> out(64);
  ExpandQueryParams p{codes.data(), scales.data(), out.data(), 1, 48};
  EXPECT_EQ((*backend)->ExpandMxfp8Query(p, **stream).code(), absl::StatusCode::kInvalidArgument);
  p.width = 64;
  p.scales = nullptr;
  EXPECT_EQ((*backend)->ExpandMxfp8Query(p, **stream).code(), absl::StatusCode::kInvalidArgument);
  p.vectors = 0;  // no work: null pointers are fine
  EXPECT_TRUE((*backend)->ExpandMxfp8Query(p, **stream).ok());
}

}  // namespace
}  // namespace smla::kernels
