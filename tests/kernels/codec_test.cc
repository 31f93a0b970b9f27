// Codec edge cases, each checked against a straightforward reference written here: nearest
// representable value by exhaustive search, exponents by doubling, no shared bit tricks.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "smla/kernels/codec/bf16.h"
#include "smla/kernels/codec/e4m3.h"
#include "smla/kernels/codec/e8m0.h"
#include "smla/kernels/codec/mxfp8.h"

namespace smla::kernels {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Value of an e4m3 code from its definition: bias 7, subnormals at exponent field 0.
double E4m3Value(int code) {
  const int sign = code >> 7, e = (code >> 3) & 15, m = code & 7;
  const double mag = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return sign ? -mag : mag;
}

// Nearest finite e4m3 code, ties to the even code, saturating at +-448.
uint8_t ReferenceE4m3(double x) {
  if (std::isnan(x)) return 0x7f;
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(x);
  if (a >= 448.0) return sign | 0x7e;
  int best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7e; ++c) {
    const double err = std::fabs(E4m3Value(c) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return sign | best;
}

// Smallest e with 448 * 2^e >= amax, i.e. ceil(log2(amax / 448)), by exact doubling.
int ReferenceCeilLog2Over448(double amax) {
  int e = -200;
  while (448.0 * std::ldexp(1.0, e) < amax) ++e;
  return e;
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16Bits(FromBits(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(F32ToBf16Bits(FromBits(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(F32ToBf16Bits(FromBits(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(F32ToBf16Bits(FromBits(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(F32ToBf16Bits(FromBits(0x7f7fffffu)), 0x7f80);  // max f32 rounds to +inf
  EXPECT_EQ(F32ToBf16Bits(-0.0f), 0x8000);
  EXPECT_EQ(F32ToBf16Bits(FromBits(0x00000001u)), 0x0000);  // smallest subnormal -> 0
  EXPECT_EQ(F32ToBf16Bits(FromBits(0x00008000u)), 0x0000);  // subnormal tie to even
  EXPECT_EQ(F32ToBf16Bits(FromBits(0x00018000u)), 0x0002);
}

TEST(Bf16, NanStaysQuietNanAndInfStaysInf) {
  EXPECT_TRUE(std::isnan(Bf16BitsToF32(F32ToBf16Bits(std::numeric_limits<float>::quiet_NaN()))));
  // A signalling NaN whose payload sits only in the low bits must not become infinity.
  EXPECT_TRUE(std::isnan(Bf16BitsToF32(F32ToBf16Bits(FromBits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(Bf16BitsToF32(F32ToBf16Bits(FromBits(0xff800001u)))));
  EXPECT_EQ(F32ToBf16Bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(F32ToBf16Bits(-std::numeric_limits<float>::infinity()), 0xff80);
}

TEST(Bf16, MatchesNearestNeighbourOnRandomValues) {
  std::mt19937 rng(1);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = rng() % 0x7f7f0000u;  // positive, below the bf16 overflow edge
    const float f = FromBits(u);
    const float lo = FromBits(u & 0xffff0000u);
    const float hi = FromBits((u & 0xffff0000u) + 0x10000u);
    const double dlo = double(f) - lo, dhi = double(hi) - f;
    uint16_t want = static_cast<uint16_t>(u >> 16);
    if (dhi < dlo || (dhi == dlo && (want & 1))) ++want;
    ASSERT_EQ(F32ToBf16Bits(f), want) << std::hex << u;
  }
}

TEST(E4m3, DecodeMatchesDefinitionForEveryCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(DecodeE4m3(static_cast<uint8_t>(c))));
    } else {
      EXPECT_EQ(double(DecodeE4m3(static_cast<uint8_t>(c))), E4m3Value(c)) << c;
    }
  }
  EXPECT_EQ(DecodeE4m3(0x7e), 448.0f);
  EXPECT_EQ(DecodeE4m3(0x01), std::ldexp(1.0f, -9));
}

TEST(E4m3, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(EncodeE4m3(DecodeE4m3(static_cast<uint8_t>(c))), c) << c;
  }
}

TEST(E4m3, TiesGoToEven) {
  EXPECT_EQ(EncodeE4m3(1.0625f), 0x38);  // between 1.0 (m=0) and 1.125 (m=1)
  EXPECT_EQ(EncodeE4m3(1.1875f), 0x3a);  // between 1.125 (m=1) and 1.25 (m=2)
  EXPECT_EQ(EncodeE4m3(-1.0625f), 0xb8);
  EXPECT_EQ(EncodeE4m3(15.5f), 0x58);                 // between 15 (0x57, m=7) and 16 (0x58, m=0)
  EXPECT_EQ(EncodeE4m3(std::ldexp(0.5f, -9)), 0x00);  // subnormal tie 0 / 2^-9
  EXPECT_EQ(EncodeE4m3(std::ldexp(1.5f, -9)), 0x02);  // subnormal tie 1 / 2 -> 2
  EXPECT_EQ(EncodeE4m3(std::ldexp(2.5f, -9)), 0x02);  // subnormal tie 2 / 3 -> 2
  EXPECT_EQ(EncodeE4m3(std::ldexp(7.5f, -9)), 0x08);  // top subnormal tie -> min normal
}

TEST(E4m3, SaturatesAt448) {
  EXPECT_EQ(EncodeE4m3(448.0f), 0x7e);
  EXPECT_EQ(EncodeE4m3(463.99f), 0x7e);
  EXPECT_EQ(EncodeE4m3(464.0f), 0x7e);  // the would-be tie with 480 (NaN code) saturates
  EXPECT_EQ(EncodeE4m3(1e30f), 0x7e);
  EXPECT_EQ(EncodeE4m3(-1e30f), 0xfe);
  EXPECT_EQ(EncodeE4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(EncodeE4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(EncodeE4m3(416.0f), 0x7d);
  EXPECT_EQ(EncodeE4m3(432.0f), 0x7e);  // tie 416 (m=5) / 448 (m=6) -> 448
}

TEST(E4m3, NanMapsTo0x7F) {
  EXPECT_EQ(EncodeE4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(EncodeE4m3(-std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(EncodeE4m3(FromBits(0x7f800001u)), 0x7f);
}

TEST(E4m3, SubnormalsAndTinyValues) {
  EXPECT_EQ(EncodeE4m3(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(EncodeE4m3(std::ldexp(7.0f, -9)), 0x07);
  EXPECT_EQ(EncodeE4m3(std::ldexp(1.0f, -6)), 0x08);
  EXPECT_EQ(EncodeE4m3(std::ldexp(1.0f, -11)), 0x00);
  EXPECT_EQ(EncodeE4m3(-std::ldexp(1.0f, -11)), 0x80);  // sign kept on underflow
  EXPECT_EQ(EncodeE4m3(FromBits(1)), 0x00);             // f32 subnormal input
}

TEST(E4m3, MatchesExhaustiveNearestOnRandomValues) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> exponent(-14.0f, 10.0f);
  for (int i = 0; i < 100000; ++i) {
    float x = std::exp2(exponent(rng));
    if (rng() & 1) x = -x;
    ASSERT_EQ(EncodeE4m3(x), ReferenceE4m3(x)) << x;
  }
  // Every midpoint between neighbouring codes, and one f32 ulp either side of it.
  for (int c = 0; c < 0x7e; ++c) {
    const float mid = static_cast<float>((E4m3Value(c) + E4m3Value(c + 1)) / 2);
    for (float x : {std::nextafter(mid, 0.0f), mid, std::nextafter(mid, 1000.0f)}) {
      ASSERT_EQ(EncodeE4m3(x), ReferenceE4m3(x)) << x;
      ASSERT_EQ(EncodeE4m3(-x), ReferenceE4m3(-x)) << -x;
    }
  }
}

TEST(E8m0, CeilLog2Over448AtAndAroundPowersOfTwo) {
  for (int k = -130; k <= 119; ++k) {
    const float exact = std::ldexp(448.0f, k);
    if (!std::isnormal(exact)) continue;
    EXPECT_EQ(CeilLog2Over448(exact), k) << k;
    EXPECT_EQ(CeilLog2Over448(std::nextafter(exact, 0.0f)), k) << k;
    EXPECT_EQ(CeilLog2Over448(std::nextafter(exact, INFINITY)), k + 1) << k;
    const float pow2 = std::ldexp(1.0f, k);  // M = 1: well inside a binade
    if (std::isnormal(pow2)) {
      EXPECT_EQ(CeilLog2Over448(pow2), ReferenceCeilLog2Over448(pow2));
    }
  }
}

TEST(E8m0, CeilLog2Over448MatchesDoublingOnRandomValues) {
  std::mt19937 rng(3);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t u = (rng() % (0x7f000000u - 0x00800000u)) + 0x00800000u;  // positive normal
    const float a = FromBits(u);
    ASSERT_EQ(CeilLog2Over448(a), ReferenceCeilLog2Over448(a)) << std::hex << u;
  }
}

TEST(E8m0, BytesClampAndDecode) {
  EXPECT_EQ(E8m0FromExponent(0), 127);
  EXPECT_EQ(E8m0FromExponent(-127), 0);
  EXPECT_EQ(E8m0FromExponent(-200), 0);
  EXPECT_EQ(E8m0FromExponent(127), 254);
  EXPECT_EQ(E8m0FromExponent(300), 254);
  EXPECT_EQ(DecodeE8m0(127), 1.0f);
  EXPECT_EQ(DecodeE8m0(0), std::ldexp(1.0f, -127));  // an f32 subnormal, exactly
  EXPECT_EQ(DecodeE8m0(254), std::ldexp(1.0f, 127));
  EXPECT_EQ(DecodeE8m0(120), 1.0f / 128);
}

// MXFP8 of one 32-lane group from the definition, in doubles.
void ReferenceMxGroup(const float* x, uint8_t* codes, uint8_t* scale) {
  double amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(double(x[i])));
  amax = std::max(amax, std::ldexp(1.0, -126));
  const int e = std::clamp(ReferenceCeilLog2Over448(amax) + 127, 0, 254);
  *scale = static_cast<uint8_t>(e);
  for (int i = 0; i < 32; ++i) codes[i] = ReferenceE4m3(double(x[i]) * std::ldexp(1.0, 127 - e));
}

TEST(Mxfp8, MatchesReferenceBitExact) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> exponent(-130.0f, 120.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(512);
  std::vector<uint8_t> codes(512), scales(16), ref_codes(512), ref_scales(16);
  for (int trial = 0; trial < 2000; ++trial) {
    const float magnitude = std::exp2(exponent(rng));
    for (int i = 0; i < 512; ++i) x[i] = RoundToBf16(normal(rng) * magnitude);
    if (trial % 7 == 0) x[trial % 512] = 0.0f;
    if (trial % 11 == 0) std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero group
    if (trial % 13 == 0) x[5] = std::ldexp(448.0f, trial % 50 - 25);       // amax exactly 448*2^k
    EncodeMxfp8(x.data(), 512, codes.data(), scales.data());
    for (int g = 0; g < 16; ++g) ReferenceMxGroup(&x[g * 32], &ref_codes[g * 32], &ref_scales[g]);
    ASSERT_EQ(scales, ref_scales) << "trial " << trial;
    ASSERT_EQ(codes, ref_codes) << "trial " << trial;
  }
}

TEST(Mxfp8, TinyOutputsGetTheirOwnExponent) {
  // 1e-36 is a normal f32 and a valid bf16; its group must not collapse to scale 0 / code 0.
  float x[32] = {};
  x[0] = RoundToBf16(1e-36f);
  uint8_t codes[32], scale;
  EncodeMxfp8(x, 32, codes, &scale);
  uint8_t ref_codes[32], ref_scale;
  ReferenceMxGroup(x, ref_codes, &ref_scale);
  EXPECT_EQ(scale, ref_scale);
  EXPECT_NE(codes[0], 0);
  EXPECT_NEAR(MxDecodeLane(codes[0], scale), x[0], x[0] / 8);
  // An all-zero group: amax clamps to 2^-126, E = ceil(log2(2^-126/448)) + 127 = 0.
  float zeros[32] = {};
  EncodeMxfp8(zeros, 32, codes, &scale);
  EXPECT_EQ(scale, 0);
  for (uint8_t c : codes) EXPECT_EQ(c, 0);
}

TEST(Pow2, ExactIncludingSubnormals) {
  for (int e = -149; e <= 127; ++e) EXPECT_EQ(Pow2(e), std::ldexp(1.0f, e)) << e;
  EXPECT_EQ(Pow2(-150), 0.0f);
  EXPECT_TRUE(std::isinf(Pow2(128)));
}

}  // namespace
}  // namespace smla::kernels
