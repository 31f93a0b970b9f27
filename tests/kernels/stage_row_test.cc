// The CPU backend's table-driven staging equals DecodeRow bit for bit, for every code and
// every scale byte (including the ones no writer produces).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/key_decode.h"
#include "gtest/gtest.h"
#include "smla/kernels/codec/row_codec.h"

namespace smla::kernels::cpu {
namespace {

void ExpectSameBits(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    ASSERT_EQ(x, y) << "lane " << i << ": " << a[i] << " vs " << b[i];
  }
}

TEST(StageRowTest, Dsv4EveryCodeAndScaleByte) {
  std::vector<uint8_t> data(576), scales(8);
  std::vector<float> fast(512), ref(512);
  std::mt19937 rng(3);
  for (int byte = 0; byte < 256; ++byte) {
    for (int rep = 0; rep < 4; ++rep) {
      for (int i = 0; i < 448; ++i) data[i] = static_cast<uint8_t>((i + rep * 448) % 256);
      for (int i = 448; i < 576; ++i) data[i] = static_cast<uint8_t>(rng());
      for (int g = 0; g < 7; ++g) scales[g] = static_cast<uint8_t>(byte + g * (rep == 3));
      StageRow(KvFormat::kFp8Dsv4, Geometry::kRopeInside, data.data(), scales.data(), fast.data());
      DecodeRow(KvFormat::kFp8Dsv4, Geometry::kRopeInside, data.data(), scales.data(), ref.data());
      ExpectSameBits(fast, ref);
    }
  }
}

TEST(StageRowTest, OtherFormats) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-30.0f, 30.0f);
  for (Geometry g : {Geometry::kRopeInside, Geometry::kRopeAppended, Geometry::kRopeFree}) {
    for (KvFormat f : {KvFormat::kBf16, KvFormat::kFp8PerTensor, KvFormat::kFp8DsMla}) {
      if (!FormatSupports(f, g)) continue;
      const int w = QkWidth(g);
      std::vector<float> fast(w), ref(w);
      for (int rep = 0; rep < 64; ++rep) {
        std::vector<uint8_t> data(RowBytes(f, g));
        for (auto& b : data) b = static_cast<uint8_t>(rng());
        if (f == KvFormat::kFp8DsMla) {
          for (int gi = 0; gi < 4; ++gi) {
            // Arbitrary positive scales, including ones whose products need rounding.
            const float s = std::exp2(u(rng)) * (1.0f + static_cast<float>(rng() % 1000) / 997.0f);
            std::memcpy(&data[512 + 4 * gi], &s, 4);
          }
        }
        StageRow(f, g, data.data(), nullptr, fast.data());
        DecodeRow(f, g, data.data(), nullptr, ref.data());
        ExpectSameBits(fast, ref);
      }
    }
  }
}

TEST(SegmentLayoutTest, OffsetsMatchTheSharedLayoutFunctions) {
  for (KvFormat f :
       {KvFormat::kBf16, KvFormat::kFp8PerTensor, KvFormat::kFp8DsMla, KvFormat::kFp8Dsv4}) {
    for (Geometry g : {Geometry::kRopeInside, Geometry::kRopeAppended, Geometry::kRopeFree}) {
      if (!FormatSupports(f, g)) continue;
      for (int32_t b : {1, 2, 32, 64, 128}) {
        CacheView v;
        // An address the layout functions only do arithmetic on; nothing is read there.
        // NOLINTNEXTLINE(performance-no-int-to-ptr)
        v.base = reinterpret_cast<const void*>(uintptr_t{1} << 20);
        v.format = f;
        v.geometry = g;
        v.num_pages = 100;
        v.rows_per_page = b;
        v.pitch_bytes = ServingPitch(f, g, b) + 32;
        const SegmentLayout s = SegmentLayout::Of(v);
        const uint8_t* base = static_cast<const uint8_t*>(v.base);
        for (int64_t slot : {int64_t{0}, int64_t{1}, int64_t{b - 1}, int64_t{b},
                             99 * int64_t{b} + b - 1, int64_t{37} * b / 3}) {
          ASSERT_EQ(s.Data(slot), base + SlotDataOffset(f, g, slot, b, v.pitch_bytes));
          if (f == KvFormat::kFp8Dsv4) {
            ASSERT_EQ(s.Scales(slot), base + SlotScaleOffset(slot, b, v.pitch_bytes));
          } else {
            ASSERT_EQ(s.Scales(slot), nullptr);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace smla::kernels::cpu
