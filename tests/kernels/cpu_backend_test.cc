// The CPU backend against the f64 oracle across docs/operator.md section 7's matrix.
#include "smla/kernels/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "attend_case.h"
#include "gtest/gtest.h"
#include "smla/base/strings.h"
#include "smla/kernels/formats.h"

namespace smla::testing {
namespace {

using kernels::AttendParams;
using kernels::BackendOptions;
using kernels::CreateCpuBackend;
using kernels::FormatSupports;
using kernels::GeometryName;
using kernels::KvFormatName;

std::unique_ptr<Backend> MakeBackend(int threads = 2) {
  BackendOptions o;
  o.cpu_threads = threads;
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateCpuBackend(o);
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(*b);
}

std::string Describe(const CaseSpec& s) {
  std::string d = absl::StrFormat("%s/%s H=%d T=%d", Sv(GeometryName(s.geometry)),
                                  Sv(KvFormatName(s.main.format)), s.num_heads, s.num_rows);
  if (s.has_extra) d += absl::StrFormat(" extra=%s", Sv(KvFormatName(s.extra.format)));
  if (s.sink) d += " sink";
  if (s.q_type == QType::kFp8) d += " fp8-q";
  return d + absl::StrFormat(" seed=%d", s.seed);
}

// Runs a case with bf16 output (with and without positions where legal) and MXFP8 output, and
// checks all of them; returns the case's max relative error.
double RunAndCheck(const CaseSpec& spec, double tolerance = 2e-2, Backend* shared = nullptr) {
  SCOPED_TRACE(Describe(spec));
  std::unique_ptr<Backend> own;
  Backend* backend = shared;
  if (backend == nullptr) {
    own = MakeBackend();
    backend = own.get();
  }
  AttendCase c(*backend, spec);
  EXPECT_TRUE(c.status().ok()) << c.status();
  if (!c.status().ok()) return 0;
  const oracle::Output ref = oracle::Attend(c.OracleInput());

  absl::StatusOr<RunResult> plain = c.Run({});
  EXPECT_TRUE(plain.ok()) << plain.status();
  if (!plain.ok()) return 0;
  double worst = CheckBf16AgainstOracle(spec, *plain, ref, tolerance, true, nullptr);

  const bool rope = spec.geometry == Geometry::kRopeInside;
  if (rope) {
    RunOptions o;
    o.positions = true;
    absl::StatusOr<RunResult> rotated = c.Run(o);
    EXPECT_TRUE(rotated.ok()) << rotated.status();
    if (rotated.ok()) {
      worst = std::max(worst, CheckBf16AgainstOracle(spec, *rotated, ref, tolerance, true, &c));
    }
  }
  RunOptions mo;
  mo.format = OutputFormat::kMxfp8;
  mo.positions = rope;
  absl::StatusOr<RunResult> mx = c.Run(mo);
  EXPECT_TRUE(mx.ok()) << mx.status();
  if (mx.ok()) CheckMxfp8(spec, *plain, *mx, rope ? &c : nullptr);
  std::printf("[ case ] %-60s max rel err %.3e\n", Describe(spec).c_str(), worst);
  ::testing::Test::RecordProperty("max_rel_err", absl::StrFormat("%.3e", worst));
  return worst;
}

// ---- The format x geometry x heads matrix -----------------------------------------------

using MatrixParam = std::tuple<KvFormat, Geometry, int>;

class MatrixTest : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(MatrixTest, MatchesOracle) {
  const auto [format, geometry, heads] = GetParam();
  CaseSpec s;
  s.geometry = geometry;
  s.num_heads = heads;
  s.num_rows = 5;
  s.seed = 1000 + static_cast<int>(format) * 100 + static_cast<int>(geometry) * 10 + heads;
  s.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kernels::QkWidth(geometry)));
  s.main.format = format;
  s.main.scale = 0.01f;
  s.main.lengths = {129, 64, 0, 65, 1};
  s.main.duplicates = true;
  s.has_extra = true;
  s.extra.format = format;
  s.extra.scale = 0.03f;
  s.extra.rows_per_page = 64;
  s.extra.num_pages = 16;
  s.extra.lengths = {63, 128, 0, 200, 17};
  s.extra.every_other_sentinel = true;
  s.sink = heads == 16 || heads == 64;
  RunAndCheck(s);
}

std::vector<MatrixParam> LegalMatrix() {
  std::vector<MatrixParam> v;
  for (KvFormat f :
       {KvFormat::kBf16, KvFormat::kFp8PerTensor, KvFormat::kFp8DsMla, KvFormat::kFp8Dsv4}) {
    for (Geometry g : {Geometry::kRopeInside, Geometry::kRopeAppended, Geometry::kRopeFree}) {
      if (!FormatSupports(f, g)) continue;
      for (int h : {8, 16, 32, 64, 128}) v.emplace_back(f, g, h);
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllLegal, MatrixTest, ::testing::ValuesIn(LegalMatrix()),
                         [](const ::testing::TestParamInfo<MatrixParam>& i) {
                           return absl::StrFormat(
                               "%s_%s_H%d", Sv(KvFormatName(std::get<0>(i.param))),
                               Sv(GeometryName(std::get<1>(i.param))), std::get<2>(i.param));
                         });

// ---- Targeted cases ------------------------------------------------------------------------

CaseSpec Dsv4Spec(int rows, int heads, uint64_t seed) {
  CaseSpec s;
  s.geometry = Geometry::kRopeInside;
  s.num_rows = rows;
  s.num_heads = heads;
  s.seed = seed;
  s.main.format = KvFormat::kFp8Dsv4;
  s.main.rows_per_page = 64;
  s.main.num_pages = 8;
  s.main.lengths.assign(rows, 128);
  return s;
}

TEST(CpuBackendTest, RaggedLengthsAcrossTileEdges) {
  CaseSpec s = Dsv4Spec(12, 16, 21);
  s.main.lengths = {1, 63, 64, 65, 127, 128, 129, 191, 192, 193, 0, 256};
  s.has_extra = true;
  s.extra.format = KvFormat::kFp8Dsv4;
  s.extra.rows_per_page = 32;
  s.extra.num_pages = 32;
  s.extra.lengths = {256, 0, 193, 192, 191, 129, 128, 127, 65, 64, 63, 1};
  s.sink = true;
  RunAndCheck(s);
}

TEST(CpuBackendTest, SentinelsInLeadingTilesAndEveryOtherEntry) {
  CaseSpec s = Dsv4Spec(4, 32, 22);
  s.main.lengths = {128, 129, 200, 320};
  s.main.leading_sentinels = 128;  // row 0 is all sentinels in main
  s.has_extra = true;
  s.extra.format = KvFormat::kFp8Dsv4;
  s.extra.lengths = {0, 64, 130, 257};
  s.extra.every_other_sentinel = true;
  RunAndCheck(s);
}

TEST(CpuBackendTest, EmptyRowsWithAndWithoutSink) {
  for (bool sink : {false, true}) {
    CaseSpec s = Dsv4Spec(5, 16, 23 + sink);
    s.main.lengths = {0, 64, 3, 0, 130};
    s.main.leading_sentinels = 64;  // rows 1 and 2: only sentinels
    s.has_extra = true;
    s.extra.format = KvFormat::kBf16;
    s.extra.lengths = {0, 0, 0, 0, 5};
    s.sink = sink;
    RunAndCheck(s);
    // The exact values: +0 everywhere and lse = sink or -inf, in every output format.
    std::unique_ptr<Backend> b = MakeBackend();
    AttendCase c(*b, s);
    ASSERT_TRUE(c.status().ok());
    for (OutputFormat f : {OutputFormat::kBf16, OutputFormat::kMxfp8}) {
      RunOptions o;
      o.format = f;
      o.positions = true;
      absl::StatusOr<RunResult> r = c.Run(o);
      ASSERT_TRUE(r.ok()) << r.status();
      for (int t : {0, 1, 2, 3}) {
        for (int h = 0; h < 16; ++h) {
          const size_t th = static_cast<size_t>(t) * 16 + h;
          for (int i = 0; i < 512; ++i) {
            if (f == OutputFormat::kBf16) {
              ASSERT_EQ(r->bf16[th * 512 + i], 0) << "row " << t << " head " << h;
            } else {
              ASSERT_EQ(r->mx_data[th * 512 + i], 0) << "row " << t << " head " << h;
            }
          }
          if (sink) {
            EXPECT_NEAR(r->lse[th], c.OracleInput().sink[h], 1e-6);
          } else {
            EXPECT_TRUE(std::isinf(r->lse[th]) && r->lse[th] < 0) << r->lse[th];
          }
        }
      }
    }
  }
}

TEST(CpuBackendTest, DuplicatedIdsCountTwice) {
  CaseSpec s = Dsv4Spec(3, 16, 25);
  s.main.lengths = {300, 64, 17};
  s.main.duplicates = true;
  s.main.num_pages = 1;  // 64 slots, about 32 written: ids repeat a lot
  RunAndCheck(s);
}

TEST(CpuBackendTest, TwoSegmentsWithDifferentPerTensorScales) {
  for (Geometry g : {Geometry::kRopeFree, Geometry::kRopeAppended, Geometry::kRopeInside}) {
    CaseSpec s;
    s.geometry = g;
    s.num_rows = 4;
    s.num_heads = 32;
    s.seed = 26 + static_cast<int>(g);
    s.value_scale = 2.0;
    s.main.format = KvFormat::kFp8PerTensor;
    s.main.scale = 0.01f;
    s.main.lengths = {100, 0, 64, 129};
    s.has_extra = true;
    s.extra.format = KvFormat::kFp8PerTensor;
    s.extra.scale = 0.07f;
    s.extra.lengths = {33, 70, 0, 128};
    s.sink = true;
    RunAndCheck(s);
  }
}

TEST(CpuBackendTest, SegmentsOfDifferentFormats) {
  CaseSpec s = Dsv4Spec(4, 16, 29);
  s.main.lengths = {128, 1, 0, 77};
  s.has_extra = true;
  s.extra.format = KvFormat::kFp8PerTensor;
  s.extra.scale = 0.02f;
  s.extra.lengths = {512, 65, 0, 3};
  RunAndCheck(s);
  CaseSpec a;
  a.geometry = Geometry::kRopeAppended;
  a.num_rows = 3;
  a.num_heads = 64;
  a.seed = 30;
  a.main.format = KvFormat::kBf16;
  a.main.lengths = {128, 64, 1};
  a.has_extra = true;
  a.extra.format = KvFormat::kFp8DsMla;
  a.extra.lengths = {256, 0, 100};
  RunAndCheck(a);
}

TEST(CpuBackendTest, DsMlaNonPowerOfTwoScales) {
  CaseSpec s;
  s.geometry = Geometry::kRopeAppended;
  s.num_rows = 4;
  s.num_heads = 16;
  s.seed = 31;
  s.main.format = KvFormat::kFp8DsMla;
  s.main.raw_ds_mla_scales = true;
  s.main.lengths = {128, 200, 1, 64};
  s.has_extra = true;
  s.extra.format = KvFormat::kFp8DsMla;
  s.extra.raw_ds_mla_scales = true;
  s.extra.lengths = {512, 0, 63, 65};
  s.sink = true;
  RunAndCheck(s);
}

TEST(CpuBackendTest, TinyAndLargeValues) {
  // Tiny bf16 values: outputs near 1e-36 get MXFP8 exponents near the bottom of the range.
  for (double scale : {1e-36, 3e-3, 1e4}) {
    for (KvFormat f : {KvFormat::kBf16, KvFormat::kFp8Dsv4, KvFormat::kFp8PerTensor}) {
      CaseSpec s = Dsv4Spec(3, 16, 32 + static_cast<int>(f));
      s.main.format = f;
      s.main.scale = static_cast<float>(scale * 0.01);
      s.main.lengths = {130, 64, 7};
      s.value_scale = scale;
      // Keep the scores in a sane range whatever the magnitude of the keys.
      s.softmax_scale = static_cast<float>(0.05 / std::max(scale, 1.0));
      s.sink = true;
      RunAndCheck(s);
    }
  }
}

// The accepted range of KV values (|x| <= 2^64, formats.h kKvMaxLog2) at both ends against the
// f64 oracle, on every format: KV near the bound with tiny queries, and KV near bf16's smallest
// normals (2^-122) with huge queries, the scores O(1) (fp8_per_tensor's cache scale carries
// its magnitude and stays a normal f32).
TEST(CpuBackendTest, KvMagnitudesAtBothEndsOfTheAcceptedRange) {
  uint64_t seed = 70;
  for (int end : {60, -122}) {
    for (KvFormat f :
         {KvFormat::kBf16, KvFormat::kFp8PerTensor, KvFormat::kFp8DsMla, KvFormat::kFp8Dsv4}) {
      CaseSpec s = Dsv4Spec(3, 16, seed++);
      s.geometry = f == KvFormat::kFp8DsMla ? Geometry::kRopeAppended : Geometry::kRopeInside;
      s.main.format = f;
      s.main.lengths = {130, 64, 7};
      const int kv = f == KvFormat::kFp8PerTensor ? std::max(end, -94) : end;
      s.value_scale = std::ldexp(1.0, kv);
      s.q_value_scale = std::ldexp(1.0, -kv);
      s.main.scale = std::ldexp(1.0f, kv - 6);
      s.sink = true;
      RunAndCheck(s);
    }
  }
}

// 4096 keys at the bound (lanes of +-2^64) with equal scores: the f32 sum of P-weighted values
// (2^76) stays finite, and every format returns the keys' values exactly.
TEST(CpuBackendTest, ManyKeysAtTheBoundWithEqualScores) {
  std::unique_ptr<Backend> b = MakeBackend();
  std::unique_ptr<kernels::Stream> stream = *b->CreateStream();
  constexpr int kKeys = 4096, kHeads = 16;
  for (KvFormat f :
       {KvFormat::kBf16, KvFormat::kFp8PerTensor, KvFormat::kFp8DsMla, KvFormat::kFp8Dsv4}) {
    SCOPED_TRACE(std::string(KvFormatName(f)));
    const Geometry g = f == KvFormat::kFp8DsMla ? Geometry::kRopeAppended : Geometry::kRopeInside;
    const int w = kernels::QkWidth(g);
    const uint16_t kTop = (127 + kernels::kKvMaxLog2) << 7;  // 2^64
    kernels::MutableCacheView cache{nullptr, f, g, kKeys / 64, 64, kernels::ServingPitch(f, g, 64)};
    if (f == KvFormat::kFp8PerTensor) cache.scale = std::ldexp(1.0f, kernels::kKvMaxLog2 - 8);
    kernels::Buffer pool = *b->Allocate(cache.pitch_bytes * cache.num_pages);
    cache.base = pool.data();
    std::vector<uint16_t> rows(size_t{kKeys} * w);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = kTop | ((i % w) % 3 == 0 ? 0x8000 : 0);
    std::vector<int64_t> slots(kKeys);
    std::vector<int32_t> indices(kKeys);
    for (int k = 0; k < kKeys; ++k) slots[k] = indices[k] = k;
    kernels::WriteRowsParams wp;
    wp.cache = cache;
    wp.slots = slots;
    wp.rows = rows.data();
    ASSERT_TRUE(b->WriteRows(wp, *stream).ok());
    const std::vector<uint16_t> q(size_t{kHeads} * w, 0);  // every score 0
    const std::vector<int32_t> indptr = {0, kKeys};
    std::vector<uint16_t> out(size_t{kHeads} * kernels::kValueWidth, 0xffff);
    std::vector<float> lse(kHeads, NAN);
    AttendParams p;
    p.num_rows = 1;
    p.num_heads = kHeads;
    p.geometry = g;
    p.q = q.data();
    p.softmax_scale = 0.0625f;
    p.main = {cache.view(), indptr, indices};
    p.out.bf16 = out.data();
    p.out.lse = lse.data();
    ASSERT_TRUE(b->Attend(p, *stream).ok());
    ASSERT_TRUE(b->Synchronize(*stream).ok());
    for (int h = 0; h < kHeads; ++h) {
      for (int i = 0; i < kernels::kValueWidth; ++i) {
        ASSERT_EQ(out[h * kernels::kValueWidth + i], rows[i]) << "head " << h << " lane " << i;
      }
      EXPECT_NEAR(lse[h], std::log(static_cast<float>(kKeys)), 1e-5f) << "head " << h;
    }
  }
}

TEST(CpuBackendTest, PageSizesFromOneRowUp) {
  for (int32_t rows_per_page : {1, 2, 128}) {
    for (KvFormat f : {KvFormat::kFp8Dsv4, KvFormat::kBf16}) {
      CaseSpec s = Dsv4Spec(3, 16, 50 + rows_per_page + static_cast<int>(f));
      s.main.format = f;
      s.main.rows_per_page = rows_per_page;
      s.main.num_pages = 512 / rows_per_page;
      s.main.lengths = {128, 1, 70};
      s.has_extra = true;
      s.extra.format = KvFormat::kFp8Dsv4;
      s.extra.rows_per_page = rows_per_page;
      s.extra.num_pages = 256 / rows_per_page;
      s.extra.lengths = {64, 0, 129};
      RunAndCheck(s);
    }
  }
}

TEST(CpuBackendTest, Fp8QueriesWithScale) {
  for (KvFormat f : {KvFormat::kFp8Dsv4, KvFormat::kBf16}) {
    CaseSpec s = Dsv4Spec(4, 32, 40 + static_cast<int>(f));
    s.main.format = f;
    s.main.lengths = {128, 65, 0, 1};
    s.q_type = QType::kFp8;
    s.q_scale = 0.05f;
    s.has_extra = true;
    s.extra.format = KvFormat::kFp8Dsv4;
    s.extra.lengths = {512, 3, 0, 64};
    s.sink = true;
    RunAndCheck(s, 7e-2);
  }
}

TEST(CpuBackendTest, RequestingLseNeverChangesOutput) {
  CaseSpec s = Dsv4Spec(4, 64, 45);
  s.main.lengths = {128, 0, 77, 129};
  s.sink = true;
  std::unique_ptr<Backend> b = MakeBackend();
  AttendCase c(*b, s);
  ASSERT_TRUE(c.status().ok());
  for (OutputFormat f : {OutputFormat::kBf16, OutputFormat::kMxfp8}) {
    RunOptions with, without;
    with.format = without.format = f;
    with.positions = without.positions = true;
    without.lse = false;
    absl::StatusOr<RunResult> a = c.Run(with);
    absl::StatusOr<RunResult> n = c.Run(without);
    ASSERT_TRUE(a.ok() && n.ok());
    EXPECT_EQ(a->bf16, n->bf16);
    EXPECT_EQ(a->mx_data, n->mx_data);
    EXPECT_EQ(a->mx_scales, n->mx_scales);
    // Not requested: the poison is still there.
    for (float v : n->lse) ASSERT_TRUE(std::isnan(v));
  }
}

TEST(CpuBackendTest, PoisonedOutputsAreAllOverwritten) {
  CaseSpec s = Dsv4Spec(6, 128, 46);
  s.main.lengths = {0, 1, 64, 65, 128, 3};
  s.main.every_other_sentinel = true;
  std::unique_ptr<Backend> b = MakeBackend();
  AttendCase c(*b, s);
  ASSERT_TRUE(c.status().ok());
  RunOptions o;
  o.positions = true;
  absl::StatusOr<RunResult> r = c.Run(o);
  ASSERT_TRUE(r.ok());
  for (uint16_t v : r->bf16) ASSERT_NE(v, 0xffff);
  for (float v : r->lse) ASSERT_FALSE(std::isnan(v));
  o.format = OutputFormat::kMxfp8;
  r = c.Run(o);
  ASSERT_TRUE(r.ok());
  for (uint8_t v : r->mx_data) ASSERT_NE(v & 0x7f, 0x7f);  // 0xFF poison is an e4m3 NaN
  for (uint8_t v : r->mx_scales) ASSERT_NE(v, 0xff);
}

TEST(CpuBackendTest, ForcedSplitsAgreeWithinRounding) {
  CaseSpec s = Dsv4Spec(5, 32, 47);
  s.main.lengths = {128, 0, 5, 64, 128};
  s.main.leading_sentinels = 64;  // row 2: empty; row 4: the first splits see nothing
  s.has_extra = true;
  s.extra.format = KvFormat::kFp8Dsv4;
  s.extra.rows_per_page = 64;
  s.extra.num_pages = 16;
  s.extra.lengths = {512, 0, 0, 1, 300};
  s.sink = true;
  std::unique_ptr<Backend> b = MakeBackend();
  AttendCase c(*b, s);
  ASSERT_TRUE(c.status().ok());
  const oracle::Output ref = oracle::Attend(c.OracleInput());
  absl::StatusOr<RunResult> base = c.Run({});
  ASSERT_TRUE(base.ok());
  for (int splits : {1, 2, 3, 4, 7, 10, 64}) {
    SCOPED_TRACE(absl::StrFormat("force_splits=%d", splits));
    RunOptions o;
    o.force_splits = splits;
    absl::StatusOr<RunResult> r = c.Run(o);
    ASSERT_TRUE(r.ok()) << r.status();
    const double err = CheckBf16AgainstOracle(s, *r, ref, 2e-2, true, nullptr);
    // Against the unsplit result, per (row, head) vector: splits round P against their own
    // maxima, so outputs may move by about a bf16 step, no more.
    double worst = 0;
    for (size_t v = 0; v < r->bf16.size() / 512; ++v) {
      double max_base = 0, max_diff = 0;
      for (size_t i = v * 512; i < v * 512 + 512; ++i) {
        const double a = oracle::Bf16Value(r->bf16[i]);
        const double z = oracle::Bf16Value(base->bf16[i]);
        max_base = std::max(max_base, std::fabs(z));
        max_diff = std::max(max_diff, std::isnan(a) ? INFINITY : std::fabs(a - z));
      }
      if (max_base == 0) {
        EXPECT_EQ(max_diff, 0) << "vector " << v;
      } else {
        worst = std::max(worst, max_diff / max_base);
      }
    }
    EXPECT_LE(worst, 1e-2) << "split result drifts from the unsplit one";
    for (size_t i = 0; i < r->lse.size(); ++i) {
      if (std::isinf(base->lse[i])) {
        EXPECT_EQ(r->lse[i], base->lse[i]);
      } else {
        EXPECT_NEAR(r->lse[i], base->lse[i], 1e-4 * std::max(1.0f, std::fabs(base->lse[i])));
      }
    }
    if (splits == 1) {
      EXPECT_EQ(r->bf16, base->bf16);
    }
    std::printf("[ case ] splits=%-2d max rel err vs oracle %.3e, vs unsplit %.3e\n", splits, err,
                worst);
  }
}

TEST(CpuBackendTest, ResultIndependentOfHeadBlockAndThreads) {
  CaseSpec s = Dsv4Spec(4, 128, 48);
  s.main.lengths = {128, 65, 0, 200};
  s.sink = true;
  std::unique_ptr<Backend> b = MakeBackend(2);
  AttendCase c(*b, s);
  ASSERT_TRUE(c.status().ok());
  absl::StatusOr<RunResult> base = c.Run({});
  ASSERT_TRUE(base.ok());
  for (int hb : {16, 32, 64}) {
    RunOptions o;
    o.force_head_block = hb;
    absl::StatusOr<RunResult> r = c.Run(o);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->bf16, base->bf16) << "head block " << hb;
    EXPECT_EQ(r->lse, base->lse) << "head block " << hb;
  }
  for (int threads : {1, 3}) {
    std::unique_ptr<Backend> other = MakeBackend(threads);
    AttendCase c2(*other, s);  // same seed: same inputs
    ASSERT_TRUE(c2.status().ok());
    absl::StatusOr<RunResult> r = c2.Run({});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->bf16, base->bf16) << threads << " threads";
  }
}

// The service relies on this: a row's result is bit-identical whether it is computed alone or
// inside any batch.
TEST(CpuBackendTest, RowAloneEqualsRowInBatch) {
  CaseSpec s = Dsv4Spec(6, 16, 49);
  s.main.lengths = {128, 128, 128, 5, 0, 128};
  s.has_extra = true;
  s.extra.format = KvFormat::kFp8Dsv4;
  s.extra.rows_per_page = 64;
  s.extra.num_pages = 64;
  s.extra.lengths = {512, 2048, 300, 0, 0, 1};
  s.sink = true;
  std::unique_ptr<Backend> b = MakeBackend();
  AttendCase c(*b, s);
  ASSERT_TRUE(c.status().ok());
  RunOptions o;
  o.positions = true;
  o.format = OutputFormat::kMxfp8;
  AttendParams batch = c.Params(o);
  absl::StatusOr<RunResult> all = c.Run(o);
  ASSERT_TRUE(all.ok());
  std::unique_ptr<kernels::Stream> stream = *b->CreateStream();
  const int H = s.num_heads;
  for (int t = 0; t < s.num_rows; ++t) {
    AttendParams p = batch;
    p.num_rows = 1;
    p.q = static_cast<const uint16_t*>(batch.q) + static_cast<size_t>(t) * H * 512;
    std::vector<int32_t> mi = {0, batch.main.indptr[t + 1] - batch.main.indptr[t]};
    std::vector<int32_t> ei = {0, batch.extra.indptr[t + 1] - batch.extra.indptr[t]};
    p.main.indptr = mi;
    p.main.indices = batch.main.indices.subspan(batch.main.indptr[t], mi[1]);
    p.extra.indptr = ei;
    p.extra.indices = batch.extra.indices.subspan(batch.extra.indptr[t], ei[1]);
    p.epilogue.positions = batch.epilogue.positions.subspan(t, 1);
    std::vector<uint8_t> data(H * 512), scales(H * 16);
    std::vector<float> lse(H);
    p.out.mx_data = data.data();
    p.out.mx_scales = scales.data();
    p.out.lse = lse.data();
    ASSERT_TRUE(b->Attend(p, *stream).ok());
    EXPECT_TRUE(std::equal(data.begin(), data.end(), all->mx_data.begin() + t * H * 512))
        << "row " << t;
    EXPECT_TRUE(std::equal(scales.begin(), scales.end(), all->mx_scales.begin() + t * H * 16));
    EXPECT_EQ(0, std::memcmp(lse.data(), all->lse.data() + t * H, H * 4)) << "row " << t;
  }
}

TEST(CpuBackendTest, ZeroRowsIsANoOp) {
  std::unique_ptr<Backend> b = MakeBackend();
  std::unique_ptr<kernels::Stream> stream = *b->CreateStream();
  std::vector<uint8_t> pool(1024 * 16, 0);
  AttendParams p;
  p.num_rows = 0;
  p.num_heads = 16;
  p.main.cache = {pool.data(), KvFormat::kBf16, Geometry::kRopeInside, 16, 1, 1024, 1.0f};
  const std::vector<int32_t> indptr = {0};
  p.main.indptr = indptr;
  EXPECT_TRUE(b->Attend(p, *stream).ok());
}

}  // namespace
}  // namespace smla::testing
