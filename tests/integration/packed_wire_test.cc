// Unit tests of the packed shared-memory request (StepRequest.packed) at the edge: parsing it
// against a real registered region gives the same per-span views as the per-span form, with
// one lookup per region and the top-k ids read in place; every misuse is INVALID_ARGUMENT (or
// NOT_FOUND / PERMISSION_DENIED for regions) naming the field. The packed-step decoder reads
// every request these tests parse to the same step and the same error as protobuf does, or
// declines it; it declines what it does not read, and any bytes it accepts, cut or changed,
// protobuf reads the same. A disabled test times reading and validating a C=32 decode step
// (run it with --gtest_also_run_disabled_tests).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "edge/id_limits.h"
#include "edge/packed_step_decoder.h"
#include "edge/shm_region.h"
#include "edge/step_view.h"
#include "edge/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "smla/base/strings.h"
#include "smla/client/shm.h"
#include "smla/client/tensor.h"
#include "smla/client/testing/workload.h"
#include "smla/server/model_profile.h"
#include "smla/server/step_validation.h"

namespace smla::server::edge {
namespace {

using ::testing::HasSubstr;
using Layout = client::ShmRegion::Layout;

constexpr uint64_t kRegionBytes = 16 << 20;
constexpr int32_t kSwaOnlyLayer = 0;
constexpr int32_t kTopkLayer = 2;  // SWA + top-512 of the 1/2 cache

// ServerInfo's description of a dsv4.1-flash rank with `heads` heads, as a client sees it.
v1::ModelInfo Describe(const ModelProfile& p, int32_t heads) {
  v1::ModelInfo m;
  m.set_profile(p.name);
  m.set_heads_per_rank(heads);
  m.set_qk_width(kernels::QkWidth(p.geometry));
  for (const LayerSpec& l : p.layers) {
    v1::LayerInfo* li = m.add_layers();
    li->set_kind(l.kind == LayerKind::kSwaOnly    ? v1::LAYER_KIND_SWA
                 : l.kind == LayerKind::kSwaTopK  ? v1::LAYER_KIND_SWA_TOPK
                 : l.kind == LayerKind::kSwaDense ? v1::LAYER_KIND_SWA_ALL_COMPRESSED
                                                  : v1::LAYER_KIND_TOPK);
    li->set_window(l.has_window() ? p.swa_window : 0);
    li->set_compression_ratio(l.ratio);
    li->set_topk(l.topk);
  }
  return m;
}

// Pads every span's top-k ids with -1 to `width` entries per row (packed spans share a width).
void PadTopk(v1::StepRequest* r, int32_t width) {
  for (v1::Span& s : *r->mutable_spans()) {
    if (!s.has_topk()) continue;
    const int64_t rows = s.topk().shape(0), k = s.topk().shape(1);
    std::vector<int32_t> ids(rows * width, -1);
    const std::string& d = s.topk().inline_data();
    for (int64_t t = 0; t < rows; ++t) std::memcpy(&ids[t * width], d.data() + t * k * 4, k * 4);
    *s.mutable_topk() = client::PackInt32(ids, {rows, width});
  }
}

std::string Describe(const RefView& r) {
  return r.set ? Cat("{'", r.region, "' ", r.offset, " ", r.size, "}") : "unset";
}

// Every field of a view, as text (equal views, equal text).
std::string Describe(const StepView& v) {
  std::string s = Cat("id '", v.request_id, "' model '", v.model, "' layer ", v.layer, " format ",
                      v.output_format, " rope ", v.inverse_rope, " timeout ", v.timeout_us, " lse ",
                      v.outputs.want_lse);
  for (const SpanView& span : v.spans) {
    s += Cat("\nspan '", span.sequence_id, "' ", span.first_position, " ", span.num_rows,
             " roles [", absl::StrJoin(span.roles, ","), "]");
  }
  const PackedView& p = v.packed;
  absl::StrAppend(&s, "\npacked ", p.set, " ", Describe(p.kv_rows), Describe(p.q),
                  Describe(p.compressed_rows), Describe(p.topk), Describe(p.q_scales), " ",
                  p.topk_width);
  absl::StrAppend(&s, "\noutputs ", Describe(v.outputs.out), Describe(v.outputs.mx_scales),
                  Describe(v.outputs.lse));
  return s;
}

template <typename T>
std::string Where(std::span<T> b) {
  return absl::StrCat(reinterpret_cast<uintptr_t>(b.data()), "+", b.size_bytes());
}

// Every field of a parsed step, views as address and size.
std::string Describe(const StepRequest& r) {
  std::string s =
      absl::StrCat("id '", r.request_id, "' model '", r.model, "' layer ", r.layer, " q ",
                   static_cast<int>(r.q_format), " out ", static_cast<int>(r.output_format),
                   " lse ", r.want_lse, " rope ", r.inverse_rope, " dst ", Where(r.destination.out),
                   " ", Where(r.destination.mx_scales), " ", Where(r.destination.lse));
  for (const SpanInput& span : r.spans) {
    std::string roles;
    for (RowRole role : span.roles) absl::StrAppend(&roles, static_cast<int>(role));
    absl::StrAppend(&s, "\nspan '", span.sequence_id, "' ", span.first_position, " ", span.num_rows,
                    " roles ", roles, " kv ", Where(span.kv_rows), " c ",
                    Where(span.compressed_rows), " q ", Where(span.q), " qs ", Where(span.q_scales),
                    " topk ", Where(span.topk), " w ", span.topk_width);
  }
  return s;
}

class PackedWireTest : public ::testing::Test {
 protected:
  void SetUp() override {
    profile_ = FindProfile("dsv4.1-flash");
    ASSERT_NE(profile_, nullptr);
    info_ = Describe(*profile_, 8);
    model_ = MakeWireModel(8, *profile_);
    absl::StatusOr<int> fd = client::SealedMemfd("wiretest", kRegionBytes);
    ASSERT_TRUE(fd.ok()) << fd.status();
    void* p = mmap(nullptr, kRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    OwnedFd object(*fd);
    ASSERT_NE(p, MAP_FAILED);
    data_ = static_cast<uint8_t*>(p);
    absl::StatusOr<std::string> name =
        registry_.Register("t", registry_.NewSession(), std::move(object), kRegionBytes, {});
    ASSERT_TRUE(name.ok()) << name.status();
    name_ = *name;
  }
  void TearDown() override {
    registry_.CloseAll();
    if (data_ != nullptr) munmap(data_, kRegionBytes);
  }

  // An inline step of three spans at different positions (different compressed counts).
  v1::StepRequest Inline(int32_t layer, const client::StepOptions& o = {}) {
    v1::StepRequest r =
        client::MakeStep(info_, layer, {{"a", 64, 6, 5}, {"b", 11, 5, 0}, {"c", 7, 3, 0}}, o, rng_);
    PadTopk(&r, 40);
    return r;
  }
  v1::StepRequest Packed(v1::StepRequest r, uint64_t offset = 0) {
    auto end =
        client::ShmRegion::PlaceInto(data_, kRegionBytes, name_, &r, offset, Layout::kPacked);
    EXPECT_TRUE(end.ok()) << end.status();
    return r;
  }
  absl::Status Parse(const v1::StepRequest& r, const std::string& tenant = "t",
                     bool regions = true) {
    out_ = StepRequest();
    storage_ = ParseStorage();
    const RegionContext ctx{regions ? &registry_ : nullptr, tenant};
    const absl::Status st = ParseStepRequest(r, &model_, limits_, &out_, &storage_, &ctx);
    // The decoder reads the same bytes to the same step and error, or declines them.
    const std::string wire = r.SerializeAsString();
    StepView view;
    if (DecodePackedStep({reinterpret_cast<const uint8_t*>(wire.data()), wire.size()}, &view)) {
      ++decoded_;
      StepRequest got;
      ParseStorage storage;
      EXPECT_EQ(ParseStepView(view, &model_, limits_, &got, &storage, &ctx), st);
      if (st.ok()) {
        EXPECT_EQ(Describe(got), Describe(out_));
      }
    }
    return st;
  }
  // Whether `b` lies in the server's mapping of the region (its own, at another address).
  bool InRegion(std::span<const uint8_t> b) const {
    if (storage_.looked_up.empty()) return false;
    const ShmMapping& m = *storage_.looked_up[0].second;
    return b.data() >= m.data() && b.data() + b.size() <= m.data() + m.size();
  }

  const ModelProfile* profile_ = nullptr;
  v1::ModelInfo info_;
  WireModel model_;
  const Limits limits_ = [] {
    Limits l;
    l.max_rows_per_step = 1000;
    l.max_spans_per_step = 64;
    return l;
  }();
  std::string name_;
  uint8_t* data_ = nullptr;
  RegionRegistry registry_;
  std::mt19937_64 rng_{3};
  int decoded_ = 0;  // requests Parse saw the decoder read
  StepRequest out_;
  ParseStorage storage_;
};

TEST_F(PackedWireTest, PackedParsesToTheSameSpansAsInline) {
  client::StepOptions mx;
  mx.output_format = v1::OUTPUT_FORMAT_MXFP8;
  mx.want_lse = true;
  for (int32_t layer : {kSwaOnlyLayer, kTopkLayer}) {
    const v1::StepRequest inline_req = Inline(layer, mx);
    const v1::StepRequest packed = Packed(inline_req);
    EXPECT_LT(packed.ByteSizeLong(), 512u) << "three spans, a few references";
    for (const v1::Span& s : packed.spans()) {
      EXPECT_FALSE(s.has_kv_rows() || s.has_q() || s.has_compressed_rows() || s.has_topk());
    }
    ASSERT_TRUE(Parse(inline_req).ok());
    const StepRequest want = std::move(out_);
    ParseStorage want_storage = std::move(storage_);
    ASSERT_TRUE(Parse(packed).ok()) << Parse(packed);
    EXPECT_EQ(storage_.looked_up.size(), 1u) << "one lookup for every reference to the region";
    ASSERT_EQ(out_.spans.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      const SpanInput &g = out_.spans[i], &w = want.spans[i];
      EXPECT_EQ(g.sequence_id, w.sequence_id);
      EXPECT_EQ(g.first_position, w.first_position);
      EXPECT_EQ(g.num_rows, w.num_rows);
      EXPECT_EQ(g.roles, w.roles);
      auto same = [](auto a, auto b) {
        return a.size() == b.size() &&
               (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
      };
      EXPECT_TRUE(same(g.kv_rows, w.kv_rows)) << "span " << i;
      EXPECT_TRUE(same(g.q, w.q)) << "span " << i;
      EXPECT_TRUE(same(g.compressed_rows, w.compressed_rows)) << "span " << i;
      EXPECT_TRUE(same(g.topk, w.topk)) << "span " << i;
      EXPECT_EQ(g.topk_width, w.topk_width);
      // Read in place from the region, ids too (the launch reads each id once and checks it).
      EXPECT_TRUE(InRegion(g.kv_rows) && InRegion(g.q));
      if (!g.topk.empty()) {
        EXPECT_TRUE(
            InRegion({reinterpret_cast<const uint8_t*>(g.topk.data()), g.topk.size_bytes()}));
      }
    }
    if (layer == kTopkLayer) {
      EXPECT_EQ(out_.spans[0].compressed_rows.size(), 3u * 1024);
      EXPECT_EQ(out_.spans[1].compressed_rows.size(), 3u * 1024);
      EXPECT_EQ(out_.spans[2].compressed_rows.size(), 2u * 1024);
      EXPECT_EQ(out_.spans[1].topk_width, 40);
    }
    EXPECT_EQ(out_.destination.out.size(), 14u * 8 * 512);
    EXPECT_EQ(out_.destination.mx_scales.size(), 14u * 8 * 16);
    EXPECT_EQ(out_.destination.lse.size(), 14u * 8 * 4);
    EXPECT_TRUE(InRegion(out_.destination.out));
  }
}

// MXFP8 queries packed (PackedInputs.q_scales): one byte per lane in packed.q, the scales in
// their own range, split among the spans as inline; sizes checked against the format.
TEST_F(PackedWireTest, Mxfp8QueriesPackedParseLikeInline) {
  client::StepOptions o;
  o.mxfp8_q = true;
  const v1::StepRequest inline_req = Inline(kTopkLayer, o);
  ASSERT_TRUE(Parse(inline_req).ok());
  EXPECT_EQ(out_.q_format, QFormat::kMxfp8);
  const StepRequest want = std::move(out_);
  ParseStorage want_storage = std::move(storage_);
  const v1::StepRequest packed = Packed(inline_req);
  ASSERT_TRUE(packed.packed().has_q_scales());
  EXPECT_EQ(packed.packed().q().size(), 14u * 8 * 512);
  EXPECT_EQ(packed.packed().q_scales().size(), 14u * 8 * 16);
  ASSERT_TRUE(Parse(packed).ok()) << Parse(packed);
  EXPECT_EQ(out_.q_format, QFormat::kMxfp8);
  ASSERT_EQ(out_.spans.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const SpanInput &g = out_.spans[i], &w = want.spans[i];
    ASSERT_EQ(g.q.size(), w.q.size());
    ASSERT_EQ(g.q_scales.size(), w.q_scales.size());
    EXPECT_EQ(g.q_scales.size(), g.q.size() / 32);
    EXPECT_EQ(std::memcmp(g.q.data(), w.q.data(), g.q.size()), 0) << "span " << i;
    EXPECT_EQ(std::memcmp(g.q_scales.data(), w.q_scales.data(), g.q_scales.size()), 0);
    EXPECT_TRUE(InRegion(g.q) && InRegion(g.q_scales));
  }
  auto expect = [&](const v1::StepRequest& r, const std::string& text) {
    const absl::Status st = Parse(r);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(text));
  };
  {
    v1::StepRequest r = packed;
    r.mutable_packed()->mutable_q_scales()->set_size(14 * 8 * 16 - 1);
    expect(r, "packed.q_scales: region");
    r.mutable_packed()->clear_q_scales();  // bf16 queries need two bytes per lane
    expect(r, absl::StrCat("packed.q: region '", name_, "' size ", 14 * 8 * 512,
                           ", the tensor needs ", 14 * 8 * 1024, " bytes"));
  }
  {
    v1::StepRequest r = packed;
    *r.mutable_spans(0)->mutable_q_scales() = inline_req.spans(0).q_scales();
    expect(r, "spans[0].q_scales: set in a packed request");
  }
}

TEST_F(PackedWireTest, MisuseIsRefusedNamingTheField) {
  const v1::StepRequest good = Packed(Inline(kTopkLayer));
  auto expect = [&](const v1::StepRequest& r, absl::StatusCode code, const std::string& text,
                    const std::string& tenant = "t", bool regions = true) {
    const absl::Status st = Parse(r, tenant, regions);
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(text));
  };
  ASSERT_TRUE(Parse(good).ok());
  expect(good, absl::StatusCode::kInvalidArgument,
         "packed: shared-memory regions are not enabled on this server", "t", false);
  expect(good, absl::StatusCode::kPermissionDenied,
         absl::StrCat("packed.kv_rows: region '", name_, "' belongs to another tenant"), "u");
  {
    v1::StepRequest r = good;
    r.mutable_packed()->mutable_q()->set_region("/smla-nobody");
    expect(r, absl::StatusCode::kNotFound, "packed.q: region '/smla-nobody' is not registered");
  }
  {
    v1::StepRequest r = good;
    r.mutable_packed()->clear_kv_rows();
    expect(r, absl::StatusCode::kInvalidArgument, "packed.kv_rows: unset");
  }
  {
    v1::StepRequest r = good;
    r.mutable_packed()->mutable_q()->set_size(r.packed().q().size() - 2);
    expect(r, absl::StatusCode::kInvalidArgument,
           absl::StrCat("packed.q: region '", name_, "' size ", r.packed().q().size(),
                        ", the tensor needs ", 14 * 8 * 1024, " bytes"));
  }
  {
    v1::StepRequest r = good;
    r.mutable_packed()->mutable_kv_rows()->set_offset(kRegionBytes - 1024);
    expect(r, absl::StatusCode::kInvalidArgument,
           absl::StrCat("packed.kv_rows: offset ", kRegionBytes - 1024, " + size ", 14 * 1024,
                        " is outside region"));
  }
  {
    v1::StepRequest r = good;
    r.mutable_packed()->mutable_kv_rows()->set_offset(~uint64_t{0} - 8);
    expect(r, absl::StatusCode::kInvalidArgument, "is outside region");
  }
  {
    v1::StepRequest r = good;
    r.mutable_packed()->mutable_compressed_rows()->set_size(7 * 1024);
    expect(r, absl::StatusCode::kInvalidArgument, "packed.compressed_rows: region");
    r.mutable_packed()->clear_compressed_rows();
    expect(r, absl::StatusCode::kInvalidArgument,
           "packed.compressed_rows: unset, the spans complete 8 entries of the 1/2 cache");
  }
  {
    v1::StepRequest r = Packed(Inline(kSwaOnlyLayer));
    *r.mutable_packed()->mutable_compressed_rows() = good.packed().compressed_rows();
    expect(r, absl::StatusCode::kInvalidArgument,
           "packed.compressed_rows: layer 0 has no compressed cache, got 8192 bytes");
  }
  {
    v1::StepRequest r = good;
    r.mutable_packed()->set_topk_width(0);
    expect(r, absl::StatusCode::kInvalidArgument, "packed.topk_width: 0, must be positive");
    r.mutable_packed()->clear_topk();
    r.mutable_packed()->set_topk_width(40);
    expect(r, absl::StatusCode::kInvalidArgument, "packed.topk_width: 40 without packed.topk");
  }
  {  // a width that does not match the range's size
    v1::StepRequest r = good;
    r.mutable_packed()->set_topk_width(20);
    expect(r, absl::StatusCode::kInvalidArgument, "packed.topk: region");
  }
  {
    v1::StepRequest r = good;
    r.mutable_packed()->mutable_topk()->set_offset(r.packed().topk().offset() + 2);
    expect(r, absl::StatusCode::kInvalidArgument,
           absl::StrCat("packed.topk: offset ", r.packed().topk().offset(),
                        " is not a multiple of 4"));
  }
  {
    v1::StepRequest r = good;
    *r.mutable_spans(1)->mutable_q() = Inline(kTopkLayer).spans(1).q();
    expect(r, absl::StatusCode::kInvalidArgument,
           "spans[1].q: set in a packed request (packed.q carries every span's)");
  }
  {  // the metadata checks still apply
    v1::StepRequest r = good;
    r.mutable_spans(2)->set_num_rows(0);
    expect(r, absl::StatusCode::kInvalidArgument, "spans[2].num_rows: 0, must be positive");
  }
  // After unregistering, the region is gone.
  ASSERT_TRUE(registry_.Unregister("t", name_).ok());
  expect(good, absl::StatusCode::kNotFound, "is not registered");
}

TEST_F(PackedWireTest, PlacePadsNarrowerTopkRowsWithNone) {
  v1::StepRequest r = Inline(kTopkLayer);  // widths 40
  std::vector<int32_t> narrow(3 * 20);
  for (int i = 0; i < 60; ++i) narrow[i] = i % 7;
  *r.mutable_spans(2)->mutable_topk() = client::PackInt32(narrow, {3, 20});
  const v1::StepRequest packed = Packed(r);
  EXPECT_EQ(packed.packed().topk_width(), 40);
  ASSERT_TRUE(Parse(packed).ok()) << Parse(packed);
  const SpanInput& s = out_.spans[2];
  ASSERT_EQ(s.topk.size(), 3u * 40);
  for (int t = 0; t < 3; ++t) {
    for (int k = 0; k < 40; ++k) {
      EXPECT_EQ(s.topk[t * 40 + k], k < 20 ? narrow[t * 20 + k] : -1) << t << "," << k;
    }
  }
  // Top-k ids in some spans only cannot be packed; the request stays as it was.
  v1::StepRequest partial = Inline(kTopkLayer);
  partial.mutable_spans(1)->clear_topk();
  const std::string before = partial.SerializeAsString();
  auto end = client::ShmRegion::PlaceInto(data_, kRegionBytes, name_, &partial, 0, Layout::kPacked);
  EXPECT_EQ(end.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(end.status().message()), HasSubstr("top-k ids in every span or in none"));
  EXPECT_EQ(partial.SerializeAsString(), before);
}

// Chosen ids are used where they lie in the region (no host copy): the launch copies them to the
// device once, where they are checked (input_checks.h), and the message names the entry.
TEST_F(PackedWireTest, IdsAreReadInPlaceAndTheLaunchNamesABadOne) {
  const v1::StepRequest r = Packed(Inline(kTopkLayer));
  absl::StatusOr<ModelConfig> config =
      ParseModelConfig("dsv4.1-flash:tp=8:kv=fp8_dsv4:page_rows=16:pool=4MiB");
  ASSERT_TRUE(config.ok()) << config.status();
  Limits limits;
  StepContext ctx{&*config, profile_, &limits, true, 0};
  ASSERT_TRUE(Parse(r).ok());
  ASSERT_TRUE(ValidateStep(out_, ctx).ok()) << ValidateStep(out_, ctx);
  int32_t* ids = reinterpret_cast<int32_t*>(data_ + r.packed().topk().offset());
  ASSERT_EQ(out_.spans.size(), 3u);
  for (const SpanInput& s : out_.spans) {
    EXPECT_TRUE(InRegion({reinterpret_cast<const uint8_t*>(s.topk.data()), s.topk.size_bytes()}));
  }
  const LayerSpec& spec = profile_->layers[kTopkLayer];
  // Span b (first position 11) row 2 sits at position 13: 7 entries of the 1/2 cache visible.
  int32_t& id = ids[(6 + 2) * 40 + 3];
  const int32_t saved = id;
  id = 7;
  EXPECT_THAT(std::string(ExplainChosenEntries(out_.spans[1], 1, spec).message()),
              HasSubstr("spans[1].topk[2][3]: entry 7 not visible at position 13 (sequence "
                        "has 7 visible entries)"));
  id = -2;
  EXPECT_THAT(std::string(ExplainChosenEntries(out_.spans[1], 1, spec).message()),
              HasSubstr("spans[1].topk[2][3]: entry -2 is invalid (-1 means none)"));
  id = saved;
  EXPECT_TRUE(ExplainChosenEntries(out_.spans[1], 1, spec).ok());
}

// The view protobuf's parse of `wire` gives, or "refused".
std::string ProtobufView(const std::string& wire) {
  v1::StepRequest pb;
  if (!pb.ParseFromString(wire)) return "refused";
  StepView v;
  ViewOf(pb, &v);
  return Describe(v);
}

// The decoder's view of `wire`, or "declined".
std::string DecoderView(const std::string& wire) {
  StepView v;
  if (!DecodePackedStep({reinterpret_cast<const uint8_t*>(wire.data()), wire.size()}, &v)) {
    return "declined";
  }
  return Describe(v);
}

std::string Serialized(const std::function<void(v1::StepRequest*)>& fill) {
  v1::StepRequest r;
  fill(&r);
  return r.SerializeAsString();
}

// What packed requests hold, in any encoding protobuf accepts, reads as protobuf reads it; the
// decoded view then parses to the same step (Parse checks that).
TEST_F(PackedWireTest, DecoderReadsPackedRequestsAsProtobufDoes) {
  client::StepOptions mx;
  mx.mxfp8_q = true;
  mx.output_format = v1::OUTPUT_FORMAT_MXFP8;
  mx.want_lse = true;
  mx.inverse_rope = true;
  for (const v1::StepRequest& r : {Packed(Inline(kTopkLayer)), Packed(Inline(kTopkLayer, mx)),
                                   Packed(Inline(kSwaOnlyLayer))}) {
    const std::string wire = r.SerializeAsString();
    ASSERT_NE(DecoderView(wire), "declined");
    EXPECT_EQ(DecoderView(wire), ProtobufView(wire));
    const int before = decoded_;
    EXPECT_TRUE(Parse(r).ok()) << Parse(r);
    EXPECT_EQ(decoded_, before + 1);
  }
  // Protobuf's rules for repeated occurrences: a scalar or string keeps its last value, spans
  // append, roles come one by one or packed.
  v1::StepRequest packed = Packed(Inline(kTopkLayer));
  packed.set_request_id("first");
  packed.set_layer(kTopkLayer);
  std::string wire = packed.SerializeAsString();
  wire += Serialized([](v1::StepRequest* r) {
    r->set_layer(5);
    r->set_request_id("again");
    r->set_timeout_us(-5);
  });
  wire += Serialized([](v1::StepRequest* r) {
    v1::Span* s = r->add_spans();
    s->set_sequence_id("d");
    s->set_first_position(3);
    s->set_num_rows(2);
    s->add_roles(v1::ROW_ROLE_DRAFT);
    s->add_roles(static_cast<v1::RowRole>(7));
  });
  // A span whose roles come one by one (field 4, varint), twice.
  wire += std::string("\x22\x09\x0a\x01\x65\x18\x02\x20\x01\x20\x00", 11);
  ASSERT_NE(DecoderView(wire), "declined");
  EXPECT_EQ(DecoderView(wire), ProtobufView(wire));
  EXPECT_THAT(DecoderView(wire), HasSubstr("id 'again' model 'dsv4.1-flash' layer 5 "));
  EXPECT_THAT(DecoderView(wire), HasSubstr("span 'e' 0 2 roles [1,0]"));
}

// Whatever it does not read, it declines; protobuf then reads the request.
TEST_F(PackedWireTest, DecoderDeclinesWhatItDoesNotRead) {
  const v1::StepRequest packed = Packed(Inline(kTopkLayer));
  const std::string wire = packed.SerializeAsString();
  v1::StepRequest per_span = Inline(kTopkLayer);
  ASSERT_TRUE(client::ShmRegion::PlaceInto(data_, kRegionBytes, name_, &per_span).ok());
  v1::StepRequest no_packed = packed;
  no_packed.clear_packed();
  v1::StepRequest accented = packed;
  accented.set_request_id("r\xc3\xa9q");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"inline", Inline(kTopkLayer).SerializeAsString()},
      {"per-span regions", per_span.SerializeAsString()},
      {"no packed inputs", no_packed.SerializeAsString()},
      {"a UTF-8 request id", accented.SerializeAsString()},
      {"ring_attach",
       wire + Serialized([](v1::StepRequest* r) { r->mutable_ring_attach()->set_slots(1); })},
      {"an unknown field", wire + std::string("\xf8\x06\x01", 3)},
      {"a span's tensor", wire + Serialized([](v1::StepRequest* r) {
                            r->add_spans()->mutable_q()->set_dtype(v1::DTYPE_BF16);
                          })},
      {"out_region twice (merged)",
       wire + Serialized([](v1::StepRequest* r) { r->mutable_out_region()->set_offset(64); })},
      {"packed twice (merged)",
       wire + Serialized([](v1::StepRequest* r) { r->mutable_packed()->set_topk_width(40); })},
      {"layer as a length-delimited field", wire + std::string("\x1a\x00", 2)},
      {"a request id longer than any id", wire + Serialized([](v1::StepRequest* r) {
                                            r->set_request_id(std::string(kMaxIdBytes + 1, 'r'));
                                          })},
      {"more spans than it reads", wire + Serialized([](v1::StepRequest* r) {
                                     for (size_t i = 0; i < kMaxDecodedSpans; ++i) r->add_spans();
                                   })},
  };
  for (const auto& [what, bytes] : cases) {
    EXPECT_EQ(DecoderView(bytes), "declined") << what;
    EXPECT_NE(ProtobufView(bytes), "refused") << what;
  }
  // A tag longer than five bytes: protobuf refuses it.
  const std::string long_tag = wire + std::string("\x98\x80\x80\x80\x80\x00\x01", 7);
  EXPECT_EQ(DecoderView(long_tag), "declined");
  EXPECT_EQ(ProtobufView(long_tag), "refused");
}

// Bytes it accepts, protobuf reads to the same view: every cut of a packed request and every
// single-bit or byte change of it.
TEST_F(PackedWireTest, DecoderAcceptsOnlyWhatProtobufReadsTheSame) {
  client::StepOptions mx;
  mx.mxfp8_q = true;
  mx.output_format = v1::OUTPUT_FORMAT_MXFP8;
  mx.want_lse = true;
  const std::string wire = Packed(Inline(kTopkLayer, mx)).SerializeAsString();
  int accepted = 0, mutants = 0;
  auto check = [&](const std::string& bytes, const std::string& what) {
    ++mutants;
    const std::string got = DecoderView(bytes);
    if (got == "declined") return;
    ++accepted;
    EXPECT_EQ(got, ProtobufView(bytes)) << what;
  };
  for (size_t n = 0; n <= wire.size(); ++n) check(wire.substr(0, n), absl::StrCat("cut at ", n));
  for (size_t i = 0; i < wire.size(); ++i) {
    std::string bytes = wire;
    for (int bit = 0; bit < 8; ++bit) {
      bytes[i] = static_cast<char>(wire[i] ^ (1 << bit));
      check(bytes, absl::StrCat("byte ", i, " bit ", bit));
    }
    for (const char c : {'\x00', '\x7f', '\x80', '\xff'}) {
      bytes[i] = c;
      check(bytes, absl::StrCat("byte ", i, " = ", static_cast<int>(c)));
    }
  }
  // Many changes keep a valid packed request (a number, a name's letter): they are read.
  EXPECT_GT(accepted, mutants / 10) << accepted << " of " << mutants;
}

// Parse + validation time of a C=32 decode step (6 rows each, top-512 of the 1/1 cache at
// 128K), packed and per span.
TEST_F(PackedWireTest, DISABLED_TimeC32Decode) {
  client::StepOptions o;
  o.output_format = v1::OUTPUT_FORMAT_MXFP8;
  o.inverse_rope = true;
  info_ = Describe(*profile_, 16);
  model_ = MakeWireModel(16, *profile_);
  std::vector<client::SpanSpec> spans;
  for (int i = 0; i < 32; ++i) spans.push_back({absl::StrCat("bench-1234-w0-s", i), 131072, 6, 5});
  const v1::StepRequest inline_req = client::MakeStep(info_, 20, spans, o, rng_);
  absl::StatusOr<ModelConfig> config =
      ParseModelConfig("dsv4.1-flash:tp=4:kv=fp8_dsv4:page_rows=64:pool=64MiB");
  ASSERT_TRUE(config.ok());
  Limits limits;
  StepContext ctx{&*config, profile_, &limits, true, 1 << 20};
  const RegionContext regions{&registry_, "t"};
  using Clock = std::chrono::steady_clock;
  auto us = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  const int n = 2000;
  for (Layout layout : {Layout::kPacked, Layout::kPerSpan}) {
    v1::StepRequest r = inline_req;
    ASSERT_TRUE(client::ShmRegion::PlaceInto(data_, kRegionBytes, name_, &r, 0, layout).ok());
    const std::string wire = r.SerializeAsString();
    double parse_us = 0, validate_us = 0, decode_us = 0;
    for (int i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      v1::StepRequest pb;
      ASSERT_TRUE(pb.ParseFromString(wire));
      const auto t1 = Clock::now();
      StepRequest step;
      ParseStorage storage;
      ASSERT_TRUE(ParseStepRequest(pb, &model_, limits_, &step, &storage, &regions).ok());
      const auto t2 = Clock::now();
      ASSERT_TRUE(ValidateStep(step, ctx).ok());
      const auto t3 = Clock::now();
      decode_us += us(t0, t1);
      parse_us += us(t1, t2);
      validate_us += us(t2, t3);
    }
    std::printf(
        "%s: %zu request bytes; per call us: protobuf decode %.1f, parse %.1f, "
        "validate %.1f\n",
        layout == Layout::kPacked ? "packed" : "per span", wire.size(), decode_us / n, parse_us / n,
        validate_us / n);
    if (layout != Layout::kPacked) continue;
    // The ring's path: the decoder into a view it reuses, then the view's parse.
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(wire.data()),
                                         wire.size());
    StepView view;
    decode_us = parse_us = 0;
    for (int i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      ASSERT_TRUE(DecodePackedStep(bytes, &view));
      const auto t1 = Clock::now();
      StepRequest step;
      ParseStorage storage;
      ASSERT_TRUE(ParseStepView(view, &model_, limits_, &step, &storage, &regions).ok());
      const auto t2 = Clock::now();
      decode_us += us(t0, t1);
      parse_us += us(t1, t2);
    }
    std::printf("packed, decoded without protobuf: per call us: decode %.2f, parse %.1f\n",
                decode_us / n, parse_us / n);
  }
}

}  // namespace
}  // namespace smla::server::edge
