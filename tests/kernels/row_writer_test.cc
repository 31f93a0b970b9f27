// Row writers through the backend's WriteRows: the stored bytes equal docs/operator.md section 3's
// formulas computed by the oracle's own encoders, bit for bit, and DecodeRow returns exactly the
// spec's dequantised values.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "oracle.h"
#include "smla/kernels/codec/row_codec.h"
#include "smla/kernels/cpu_backend.h"

namespace smla::testing {
namespace {

using kernels::Geometry;
using kernels::KvFormat;

// Rows that exercise the writer: random magnitudes per 64-lane group, all-zero groups (amax
// clamped to 1e-4), groups whose amax sits exactly on 448 * 2^k and just around it, values
// that saturate, tiny values and the largest bf16.
std::vector<uint16_t> InterestingRows(int n, int width, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> exp_pick(-30, 30);
  std::vector<uint16_t> rows(static_cast<size_t>(n) * width);
  for (int r = 0; r < n; ++r) {
    uint16_t* row = &rows[static_cast<size_t>(r) * width];
    for (int g = 0; g < width / 64; ++g) {
      const int kind = (r + g) % 7;
      const double mag = std::ldexp(1.0, exp_pick(rng));
      for (int i = 0; i < 64; ++i) {
        double v = normal(rng) * mag;
        if (kind == 0) v = 0.0;
        if (kind == 1 && i == 5) v = 448.0 * std::ldexp(1.0, exp_pick(rng) / 3);
        if (kind == 2 && i == 9) v = std::nextafter(448.0f, 1e9f) * mag;  // just above
        if (kind == 3) v *= 1e-6;                                         // below the 1e-4 clamp
        if (kind == 4 && i == 0) v = 3.0e38;  // near the top of bf16 (2^128 would overflow)
        if (kind == 5 && i < 4) v = -1.5 * mag;
        row[g * 64 + i] = oracle::Bf16Bits(static_cast<float>(v));
      }
    }
  }
  return rows;
}

struct FormatCase {
  KvFormat format;
  Geometry geometry;
  float scale;
};

class RowWriterTest : public ::testing::TestWithParam<FormatCase> {};

TEST_P(RowWriterTest, BytesAndDequantisedValuesMatchTheSpec) {
  const FormatCase fc = GetParam();
  auto backend = *kernels::CreateCpuBackend();
  auto stream = *backend->CreateStream();
  const int width = kernels::QkWidth(fc.geometry);
  const int32_t rows_per_page = 8;
  const int64_t pages = 8;
  const int64_t pitch = kernels::ServingPitch(fc.format, fc.geometry, rows_per_page);
  std::vector<uint8_t> pool(pages * pitch, 0xcc);
  const int n = 40;
  std::vector<uint16_t> rows = InterestingRows(n, width, 99 + static_cast<int>(fc.format));
  if (fc.format == KvFormat::kFp8PerTensor) {
    // Per-tensor rows live within the scale's range (and some saturate past it).
    for (size_t i = 0; i < rows.size(); ++i) {
      rows[i] = oracle::Bf16Bits(static_cast<float>(
          oracle::Bf16Value(rows[i]) == 0 ? 0.0
                                          : std::sin(static_cast<double>(i)) * 500.0 * fc.scale));
    }
  }
  std::vector<int64_t> slots;
  for (int i = 0; i < n; ++i) slots.push_back((i * 37 + 3) % (rows_per_page * pages));
  kernels::WriteRowsParams p;
  p.cache = {pool.data(), fc.format, fc.geometry, pages, rows_per_page, pitch, fc.scale};
  p.slots = slots;
  p.rows = rows.data();
  ASSERT_TRUE(backend->WriteRows(p, *stream).ok());

  const oracle::Cache cache{pool.data(), fc.format, fc.geometry, rows_per_page, pitch, fc.scale};
  std::vector<uint8_t> want_data, want_scales;
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE(::testing::Message() << "row " << i << " slot " << slots[i]);
    oracle::QuantiseRow(fc.format, fc.geometry, &rows[static_cast<size_t>(i) * width], fc.scale,
                        want_data, want_scales);
    const int64_t off =
        kernels::SlotDataOffset(fc.format, fc.geometry, slots[i], rows_per_page, pitch);
    // The offsets themselves, from the spec's layout.
    const int64_t page = slots[i] / rows_per_page, r = slots[i] % rows_per_page;
    const int64_t stride =
        fc.format == KvFormat::kFp8Dsv4 ? 576 : kernels::RowBytes(fc.format, fc.geometry);
    ASSERT_EQ(off, page * pitch + r * stride);
    for (size_t b = 0; b < want_data.size(); ++b) {
      ASSERT_EQ(pool[off + b], want_data[b]) << "data byte " << b;
    }
    if (fc.format == KvFormat::kFp8Dsv4) {
      const int64_t soff = page * pitch + rows_per_page * 576 + r * 8;
      ASSERT_EQ(kernels::SlotScaleOffset(slots[i], rows_per_page, pitch), soff);
      for (int b = 0; b < 8; ++b) ASSERT_EQ(pool[soff + b], want_scales[b]) << "scale byte " << b;
      ASSERT_EQ(pool[soff + 7], 0) << "pad byte";
    }
    // DecodeRow (the staged values every backend uses) against the spec's formula.
    std::vector<float> staged(width);
    kernels::DecodeRow(fc.format, fc.geometry, pool.data() + off,
                       fc.format == KvFormat::kFp8Dsv4
                           ? pool.data() + kernels::SlotScaleOffset(slots[i], rows_per_page, pitch)
                           : nullptr,
                       staged.data());
    const std::vector<double> spec = oracle::DequantRow(cache, slots[i]);
    for (int c = 0; c < width; ++c) {
      // fp8_per_tensor stages raw codes: the scale is folded in later.
      const double staged_value = fc.format == KvFormat::kFp8PerTensor
                                      ? static_cast<double>(staged[c]) * fc.scale
                                      : staged[c];
      ASSERT_EQ(staged_value, spec[c]) << "lane " << c;
    }
  }
  // Slots nobody wrote keep their bytes.
  std::vector<bool> touched(pool.size(), false);
  for (int64_t s : slots) {
    const int64_t off = kernels::SlotDataOffset(fc.format, fc.geometry, s, rows_per_page, pitch);
    const int64_t len =
        fc.format == KvFormat::kFp8Dsv4 ? 576 : kernels::RowBytes(fc.format, fc.geometry);
    for (int64_t b = 0; b < len; ++b) touched[off + b] = true;
    if (fc.format == KvFormat::kFp8Dsv4) {
      for (int b = 0; b < 8; ++b)
        touched[kernels::SlotScaleOffset(s, rows_per_page, pitch) + b] = true;
    }
  }
  for (size_t b = 0; b < pool.size(); ++b) {
    if (!touched[b]) {
      ASSERT_EQ(pool[b], 0xcc) << "byte " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllFormats, RowWriterTest,
    ::testing::Values(FormatCase{KvFormat::kBf16, Geometry::kRopeInside, 1.0f},
                      FormatCase{KvFormat::kBf16, Geometry::kRopeAppended, 1.0f},
                      FormatCase{KvFormat::kFp8PerTensor, Geometry::kRopeFree, 0.0137f},
                      FormatCase{KvFormat::kFp8PerTensor, Geometry::kRopeAppended, 1.0f},
                      FormatCase{KvFormat::kFp8PerTensor, Geometry::kRopeInside, 3.0f},
                      FormatCase{KvFormat::kFp8DsMla, Geometry::kRopeAppended, 1.0f},
                      FormatCase{KvFormat::kFp8Dsv4, Geometry::kRopeInside, 1.0f}));

TEST(RowWriterTest, DuplicateSlotKeepsTheLastRow) {
  auto backend = *kernels::CreateCpuBackend();
  auto stream = *backend->CreateStream();
  std::vector<uint8_t> pool(1024 * 4, 0);
  std::vector<uint16_t> rows(2 * 512);
  for (int i = 0; i < 512; ++i) {
    rows[i] = 0x3f80;        // 1.0
    rows[512 + i] = 0x4000;  // 2.0
  }
  const std::vector<int64_t> slots = {1, 1};
  kernels::WriteRowsParams p;
  p.cache = {pool.data(), KvFormat::kBf16, Geometry::kRopeFree, 1, 4, 4096, 1.0f};
  p.slots = slots;
  p.rows = rows.data();
  ASSERT_TRUE(backend->WriteRows(p, *stream).ok());
  uint16_t v;
  std::memcpy(&v, pool.data() + 1024, 2);
  EXPECT_EQ(v, 0x4000);
}

TEST(RowWriterTest, ManyRowsWrittenInParallelMatchSequential) {
  auto backend = *kernels::CreateCpuBackend({.cpu_threads = 3, .device_ordinal = 0});
  auto stream = *backend->CreateStream();
  const int n = 1000;
  const int64_t pitch = kernels::ServingPitch(KvFormat::kFp8Dsv4, Geometry::kRopeInside, 64);
  std::vector<uint8_t> a(16 * pitch, 0), b(16 * pitch, 0);
  std::vector<uint16_t> rows = InterestingRows(n, 512, 5);
  std::vector<int64_t> slots(n);
  for (int i = 0; i < n; ++i) slots[i] = (i * 7) % 1024;
  kernels::WriteRowsParams p;
  p.cache = {a.data(), KvFormat::kFp8Dsv4, Geometry::kRopeInside, 16, 64, pitch, 1.0f};
  p.slots = slots;
  p.rows = rows.data();
  ASSERT_TRUE(backend->WriteRows(p, *stream).ok());
  std::vector<uint8_t> data, scales;
  for (int i = 0; i < n; ++i) {
    oracle::QuantiseRow(KvFormat::kFp8Dsv4, Geometry::kRopeInside, &rows[i * 512], 1.0f, data,
                        scales);
    const int64_t off =
        kernels::SlotDataOffset(KvFormat::kFp8Dsv4, Geometry::kRopeInside, slots[i], 64, pitch);
    ASSERT_EQ(0, std::memcmp(a.data() + off, data.data(), 576)) << "row " << i;
    ASSERT_EQ(
        0, std::memcmp(a.data() + kernels::SlotScaleOffset(slots[i], 64, pitch), scales.data(), 8));
  }
}

}  // namespace
}  // namespace smla::testing
