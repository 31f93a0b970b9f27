// Bad inputs: each is rejected before any work with the right code and a message naming the
// problem, and the outputs stay untouched.
#include "smla/kernels/validate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "attend_case.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "smla/kernels/cpu_backend.h"

namespace smla::testing {
namespace {

using kernels::AttendParams;
using kernels::CacheView;
using ::testing::HasSubstr;

class ValidateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = *kernels::CreateCpuBackend({.cpu_threads = 2, .device_ordinal = 0});
    stream_ = *backend_->CreateStream();
    CaseSpec s;
    s.geometry = Geometry::kRopeInside;
    s.num_rows = 4;
    s.num_heads = 16;
    s.seed = 7;
    s.main.format = KvFormat::kFp8Dsv4;
    s.main.rows_per_page = 32;
    s.main.num_pages = 128;  // 4096 slots
    s.main.lengths = {10, 20, 0, 30};
    s.has_extra = true;
    s.extra.format = KvFormat::kBf16;
    s.extra.lengths = {5, 5, 5, 5};
    s.sink = true;
    case_ = std::make_unique<AttendCase>(*backend_, s);
    ASSERT_TRUE(case_->status().ok()) << case_->status();
  }

  RunOptions Options() const {
    RunOptions o;
    o.positions = true;
    return o;
  }

  // Runs a modified call on poisoned outputs: returns its status and checks nothing was
  // written.
  absl::Status Call(AttendParams p) {
    const size_t th = 4 * 16;
    std::vector<uint16_t> out(th * 512, 0xabcd);
    std::vector<uint8_t> data(th * 512, 0xab), scales(th * 16, 0xab);
    std::vector<float> lse(th, 12345.0f);
    p.out.bf16 = p.out.bf16 == nullptr ? nullptr : out.data();
    if (p.out.mx_data != nullptr) p.out.mx_data = data.data();
    if (p.out.mx_scales != nullptr) p.out.mx_scales = scales.data();
    p.out.lse = lse.data();
    const absl::Status s = backend_->Attend(p, *stream_);
    for (uint16_t v : out) EXPECT_EQ(v, 0xabcd);
    for (uint8_t v : data) EXPECT_EQ(v, 0xab);
    for (uint8_t v : scales) EXPECT_EQ(v, 0xab);
    for (float v : lse) EXPECT_EQ(v, 12345.0f);
    // The shared validator agrees with the backend.
    EXPECT_EQ(kernels::ValidateAttend(p).code(), s.code());
    return s;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<kernels::Stream> stream_;
  std::unique_ptr<AttendCase> case_;
};

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& text) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(text));
}

TEST_F(ValidateTest, TheBaseCallIsValid) {
  EXPECT_TRUE(kernels::ValidateAttend(case_->Params(Options())).ok());
  EXPECT_TRUE(case_->Run(Options()).ok());
}

TEST_F(ValidateTest, IdOutOfRangeNamesSegmentRowAndId) {
  AttendParams p = case_->Params(Options());
  std::vector<int32_t> idx(p.main.indices.begin(), p.main.indices.end());
  idx[35] = 4096;  // row 3 (entries 30..59)
  p.main.indices = idx;
  const absl::Status s = Call(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "main segment, row 3: index 4096 out of range (pool has 4096 slots)");

  p = case_->Params(Options());
  std::vector<int32_t> ext(p.extra.indices.begin(), p.extra.indices.end());
  const int64_t slots = p.extra.cache.num_slots();
  ext[7] = static_cast<int32_t>(slots) + 5;  // row 1
  p.extra.indices = ext;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument,
              absl::StrFormat("extra segment, row 1: index %d out of range (pool has %d slots)",
                              slots + 5, slots));
}

// A caller that vouches for its ids (AttendParams::ids_in_range) skips only the per-id check:
// the CSR's shape is still checked, and the same call without the flag is still refused.
TEST_F(ValidateTest, VouchedIdsSkipOnlyTheRangeCheck) {
  AttendParams p = case_->Params(Options());
  p.ids_in_range = true;
  EXPECT_TRUE(kernels::ValidateAttend(p).ok());
  std::vector<int32_t> idx(p.main.indices.begin(), p.main.indices.end());
  idx[35] = 4096;
  p.main.indices = idx;
  EXPECT_TRUE(kernels::ValidateAttend(p).ok());
  p.ids_in_range = false;
  EXPECT_EQ(kernels::ValidateAttend(p).code(), absl::StatusCode::kInvalidArgument);

  p = case_->Params(Options());
  p.ids_in_range = true;
  p.extra.indices = p.extra.indices.first(p.extra.indices.size() - 1);
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument,
              "extra segment: indptr[T] = 20 but indices has 19 entries");
}

TEST_F(ValidateTest, CsrShapeMismatches) {
  AttendParams p = case_->Params(Options());
  std::vector<int32_t> short_ptr(p.main.indptr.begin(), p.main.indptr.end() - 1);
  p.main.indptr = short_ptr;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "main segment: indptr has 4 entries");

  p = case_->Params(Options());
  std::vector<int32_t> dec(p.main.indptr.begin(), p.main.indptr.end());
  dec[2] = 5;  // 10 then 5
  p.main.indptr = dec;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "main segment, row 1: indptr decreases");

  p = case_->Params(Options());
  std::vector<int32_t> nz(p.extra.indptr.begin(), p.extra.indptr.end());
  nz[0] = 1;
  p.extra.indptr = nz;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "extra segment: indptr[0] is 1");

  p = case_->Params(Options());
  p.extra.indices = p.extra.indices.first(p.extra.indices.size() - 1);
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument,
              "extra segment: indptr[T] = 20 but indices has 19 entries");
}

TEST_F(ValidateTest, HeadsAndQ) {
  AttendParams p = case_->Params(Options());
  p.num_heads = 24;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "heads must be one of");
  p = case_->Params(Options());
  p.q_scale = 0.5f;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "q_scale 0.5 given with bf16 q");
  p = case_->Params(Options());
  p.q_type = QType::kFp8;
  p.q_scale = std::numeric_limits<float>::infinity();
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "fp8 q needs a finite positive q_scale");
  p = case_->Params(Options());
  p.q = nullptr;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "q is null");
}

TEST_F(ValidateTest, CacheViewProblems) {
  AttendParams p = case_->Params(Options());
  p.main.cache.rows_per_page = 24;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument,
              "main segment cache: rows per page 24 is not a power of two");
  p = case_->Params(Options());
  p.main.cache.pitch_bytes = 1000;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument,
              "main segment cache: pitch 1000 too small for 32 rows of fp8_dsv4 (needs 18688)");
  p = case_->Params(Options());
  p.main.cache.pitch_bytes = 18688 + 8;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "is not a multiple of 16");
  p = case_->Params(Options());
  p.extra.cache.base = nullptr;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "extra segment cache: null base");
  p = case_->Params(Options());
  p.extra.cache.format = KvFormat::kFp8PerTensor;
  p.extra.cache.pitch_bytes = 512 * 16;
  p.extra.cache.scale = 0.0f;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "scale must be finite and positive");
}

TEST_F(ValidateTest, UnsupportedCombinationIsUnimplemented) {
  AttendParams p = case_->Params({});
  p.geometry = Geometry::kRopeAppended;
  p.main.cache.geometry = Geometry::kRopeAppended;
  p.extra.cache.geometry = Geometry::kRopeAppended;
  ExpectError(Call(p), absl::StatusCode::kUnimplemented,
              "format fp8_dsv4 does not support geometry rope_appended");
  p = case_->Params({});
  p.extra.cache.format = KvFormat::kFp8DsMla;
  p.extra.cache.pitch_bytes = 656 * 16;
  ExpectError(Call(p), absl::StatusCode::kUnimplemented,
              "format fp8_ds_mla does not support geometry rope_inside");
}

TEST_F(ValidateTest, SegmentsMustShareTheGeometry) {
  AttendParams p = case_->Params({});
  p.extra.cache.geometry = Geometry::kRopeFree;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "both segments share the geometry");
}

TEST_F(ValidateTest, PositionsProblems) {
  // Positions with another geometry: a rope_free call over bf16 caches.
  AttendParams p = case_->Params(Options());
  p.geometry = Geometry::kRopeFree;
  p.main.cache.format = KvFormat::kBf16;
  p.main.cache.geometry = Geometry::kRopeFree;
  p.main.cache.pitch_bytes = 1024 * 32;
  p.extra.cache.geometry = Geometry::kRopeFree;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument,
              "positions given with geometry rope_free");

  p = case_->Params(Options());
  std::vector<int32_t> pos(case_->positions());
  pos[2] = 97;
  p.epilogue.positions = pos;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument,
              "epilogue, row 2: position 97 out of range [0, 97)");
  pos[2] = -1;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "epilogue, row 2: position -1");

  p = case_->Params(Options());
  p.epilogue.positions = p.epilogue.positions.first(3);
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "positions has 3 entries");
  p = case_->Params(Options());
  p.epilogue.cos_sin = nullptr;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "cos_sin is null");
}

TEST_F(ValidateTest, SinkProblems) {
  AttendParams p = case_->Params(Options());
  std::vector<float> sink(p.sink.begin(), p.sink.end());
  sink[5] = std::numeric_limits<float>::quiet_NaN();
  p.sink = sink;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "sink[5] is not finite");
  sink[5] = std::numeric_limits<float>::infinity();
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "sink[5] is not finite");
  p.sink = std::span<const float>(sink).first(8);
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "sink has 8 entries, expected H = 16");
}

TEST_F(ValidateTest, OutputPointers) {
  AttendParams p = case_->Params(Options());
  p.out.bf16 = nullptr;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "bf16 pointer is null");
  RunOptions mx = Options();
  mx.format = OutputFormat::kMxfp8;
  p = case_->Params(mx);
  p.out.mx_scales = nullptr;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "mxfp8 format needs both");
  // Off the 16-byte grid of the GPU kernels' stores: refused on every backend, nothing written.
  for (const int shift : {2, 8}) {
    p = case_->Params(Options());
    std::vector<uint16_t> out(4 * 16 * 512 + 8, 0xabcd);
    p.out.bf16 = out.data() + shift / 2;
    ExpectError(backend_->Attend(p, *stream_), absl::StatusCode::kInvalidArgument,
                "16-byte aligned");
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint16_t v) { return v == 0xabcd; }));
  }
}

TEST_F(ValidateTest, TuningOverrides) {
  AttendParams p = case_->Params(Options());
  p.force_head_block = 8;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "force_head_block");
  p = case_->Params(Options());
  p.force_splits = -1;
  ExpectError(Call(p), absl::StatusCode::kInvalidArgument, "force_splits");
}

TEST(ValidateWriteRowsTest, SlotsAndView) {
  std::unique_ptr<Backend> b = *kernels::CreateCpuBackend();
  std::unique_ptr<kernels::Stream> stream = *b->CreateStream();
  std::vector<uint8_t> pool(64 * 1024, 0x5a);
  std::vector<uint16_t> rows(3 * 512, 0x3f80);
  const std::vector<int64_t> slots = {0, 63, 64};
  kernels::WriteRowsParams p;
  p.cache = {pool.data(), KvFormat::kBf16, Geometry::kRopeInside, 4, 16, 16 * 1024, 1.0f};
  p.slots = slots;
  p.rows = rows.data();
  absl::Status s = b->WriteRows(p, *stream);
  ExpectError(s, absl::StatusCode::kInvalidArgument,
              "slots[2] = 64 out of range (pool has 64 slots)");
  for (uint8_t v : pool) ASSERT_EQ(v, 0x5a);  // all-or-nothing
  const std::vector<int64_t> negative = {-3};
  p.slots = negative;
  ExpectError(b->WriteRows(p, *stream), absl::StatusCode::kInvalidArgument, "slots[0] = -3");
  p.slots = std::span<const int64_t>(slots).first(2);
  p.rows = nullptr;
  ExpectError(b->WriteRows(p, *stream), absl::StatusCode::kInvalidArgument, "rows is null");
  p.rows = rows.data();
  p.cache.rows_per_page = 12;
  ExpectError(b->WriteRows(p, *stream), absl::StatusCode::kInvalidArgument, "not a power of two");
  p.cache.rows_per_page = 16;
  p.cache.format = KvFormat::kFp8Dsv4;
  p.cache.geometry = Geometry::kRopeFree;
  ExpectError(b->WriteRows(p, *stream), absl::StatusCode::kUnimplemented,
              "fp8_dsv4 does not support geometry rope_free");
  p.cache.format = KvFormat::kBf16;
  p.cache.geometry = Geometry::kRopeInside;
  EXPECT_TRUE(b->WriteRows(p, *stream).ok());
}

// A host array is found in a caller's mirror only when it lies wholly inside it, at the same
// offset; the GPU backend uploads every other array itself.
TEST(HostMirrorTest, FindsArraysWhollyInside) {
  std::vector<int32_t> host(16);
  std::vector<int32_t> device(16);
  const kernels::HostMirror mirror{reinterpret_cast<const uint8_t*>(host.data()),
                                   reinterpret_cast<const uint8_t*>(device.data()), 8 * 4};
  const std::span<const int32_t> all(host);
  EXPECT_EQ(mirror.Find(all.subspan(2, 6)), device.data() + 2);
  EXPECT_EQ(mirror.Find(all.subspan(0, 8)), device.data());
  EXPECT_EQ(mirror.Find(all.subspan(4, 5)), nullptr);  // runs past the mirror
  EXPECT_EQ(mirror.Find(all.subspan(8, 2)), nullptr);  // after it
  EXPECT_EQ(mirror.Find(all.subspan(2, 0)), nullptr);  // empty
  const std::vector<int32_t> other(4);
  EXPECT_EQ(mirror.Find(std::span<const int32_t>(other)), nullptr);
  EXPECT_EQ(kernels::HostMirror{}.Find(all), nullptr);
}

}  // namespace
}  // namespace smla::testing
