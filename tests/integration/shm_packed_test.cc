// The packed shared-memory request (StepRequest.packed: one region range per tensor kind for
// all spans) on the real smla-server: results equal the inline call bit for bit, unary and
// streamed, with bf16 and with MXFP8 queries, outputs in the region or inline, read with or
// without protobuf, and misuse (out of bounds, inconsistent sizes, a bad
// id, after unregister) is refused with a clear error and changes nothing. A foreign region:
// shm_tenant_test.cc.
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "harness.h"
#include "smla/client/shm.h"

namespace smla::testing {
namespace {

using ::testing::HasSubstr;
using Layout = client::ShmRegion::Layout;

constexpr int32_t kLayer = 2;  // SWA + top-512 of the 1/2 cache
constexpr uint64_t kRegionBytes = 8 << 20;

std::string Unique(const std::string& what) { return absl::StrCat(what, "-", getpid()); }

// Spans of `ids`, all at `pos` with 6 rows (5 drafts): one top-k width for all.
std::vector<client::SpanSpec> Spans(const std::vector<std::string>& ids, int64_t pos) {
  std::vector<client::SpanSpec> s;
  for (const std::string& id : ids) s.push_back({id, pos, 6, 5});
  return s;
}

void ExpectError(Harness& h, const v1::StepRequest& r, absl::StatusCode code,
                 const std::string& text) {
  auto resp = h.client->Step(r);
  ASSERT_FALSE(resp.ok());
  EXPECT_EQ(resp.status().code(), code) << resp.status();
  EXPECT_THAT(std::string(resp.status().message()), HasSubstr(text));
}

class ShmPackedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(h_.Start({kDsv41, "--allow_shm"}, "dsv4.1-flash"));
    ASSERT_NO_FATAL_FAILURE(h_.UploadTables(1024));
    auto region = client::ShmRegion::Create(h_.client.get(), Unique("packed"), kRegionBytes);
    ASSERT_TRUE(region.ok()) << region.status();
    region_ = *std::move(region);
  }
  // Sequences pre-filled with 64 positions on kLayer (checked against the reference).
  void Prefill(const std::vector<std::string>& ids) {
    for (const std::string& id : ids) {
      ASSERT_TRUE(h_.client->CreateSequence(h_.ModelName(), id).ok());
      h_.StepAndCheck(h_.Make(kLayer, {{id, 0, 64, 0}}));
    }
  }
  v1::StepRequest Packed(v1::StepRequest r) {
    auto end = region_->Place(&r, 0, Layout::kPacked);
    EXPECT_TRUE(end.ok()) << end.status();
    return r;
  }
  Harness h_;
  std::unique_ptr<client::ShmRegion> region_;
};

TEST_F(ShmPackedTest, ResultsEqualInlineBitForBit) {
  // Twin sequences: a* get every request inline, b* the same request packed in the region.
  const std::vector<std::string> a = {"a0", "a1", "a2"}, b = {"b0", "b1", "b2"};
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(h_.client->CreateSequence(h_.ModelName(), a[i]).ok());
    ASSERT_TRUE(h_.client->CreateSequence(h_.ModelName(), b[i]).ok());
    v1::StepRequest p = h_.Make(kLayer, {{a[i], 0, 64, 0}});
    h_.StepAndCheck(p);
    p.mutable_spans(0)->set_sequence_id(b[i]);
    ASSERT_TRUE(h_.client->Step(p).ok());
  }
  const client::StepOptions bf16_lse = Bf16WithLse();
  const client::StepOptions mx_rope = Mxfp8WithRope();
  // MXFP8 queries too (PackedInputs.q_scales), unary and streamed.
  client::StepOptions mxq_lse = bf16_lse;
  mxq_lse.mxfp8_q = true;
  client::StepOptions mxq_rope = mx_rope;
  mxq_rope.mxfp8_q = true;
  const std::vector<client::StepOptions> variants = {
      client::StepOptions{}, bf16_lse, mx_rope, bf16_lse, mxq_lse, mxq_rope};
  auto stream = h_.client->OpenStream();
  ASSERT_TRUE(stream.ok());
  int64_t pos = 64;
  for (size_t v = 0; v < variants.size(); ++v, pos += 6) {
    const v1::StepRequest inline_req = h_.Make(kLayer, Spans(a, pos), variants[v]);
    const v1::StepResponse inline_resp = h_.StepAndCheck(inline_req);
    v1::StepRequest twin = inline_req;
    for (int i = 0; i < static_cast<int>(b.size()); ++i) {
      twin.mutable_spans(i)->set_sequence_id(b[i]);
    }
    const v1::StepRequest packed = Packed(twin);
    ASSERT_TRUE(packed.has_packed());
    EXPECT_LT(packed.ByteSizeLong(), 512u) << "three spans, a handful of references";
    // Unary and stream both. The server reads a packed request without protobuf, unless it holds
    // what that reader leaves to protobuf (packed_step_decoder.h), such as a non-ASCII request
    // id; the later calls rewrite the same rows with the same bytes.
    client::StepStream* via = v % 2 == 0 ? nullptr : stream->get();
    for (const std::string id : {"packed-step", "packed-\xc3\xa9tape"}) {
      v1::StepRequest r = packed;
      r.set_request_id(id);
      v1::StepResponse resp;
      ASSERT_NO_FATAL_FAILURE(SendStep(*h_.client, via, r, &resp));
      EXPECT_EQ(resp.request_id(), id);
      EXPECT_EQ(resp.out().data_case(), v1::Tensor::kRegion);
      EXPECT_LT(resp.ByteSizeLong(), 512u);
      ASSERT_TRUE(region_->Inline(&resp).ok());
      ExpectSameOutputs(resp, inline_resp, absl::StrCat("variant ", v, " ", id));
    }
    // Packed inputs with the outputs sent back inline.
    v1::StepRequest r = packed;
    r.clear_out_region();
    r.clear_mx_scales_region();
    r.clear_lse_region();
    v1::StepResponse resp;
    ASSERT_NO_FATAL_FAILURE(SendStep(*h_.client, via, r, &resp));
    EXPECT_EQ(resp.out().data_case(), v1::Tensor::kInlineData);
    ExpectSameOutputs(resp, inline_resp, absl::StrCat("variant ", v, " inline outputs"));
  }
  (*stream)->WritesDone();
  EXPECT_TRUE((*stream)->Finish().ok());
  {  // spans of different row counts, so of different top-k widths: Place pads with -1
    const v1::StepRequest inline_req =
        h_.Make(kLayer, {{a[0], pos, 6, 5}, {a[1], pos, 1, 0}, {a[2], pos, 3, 2}}, bf16_lse);
    ASSERT_NE(inline_req.spans(0).topk().shape(1), inline_req.spans(1).topk().shape(1));
    const v1::StepResponse inline_resp = h_.StepAndCheck(inline_req);
    v1::StepRequest twin = inline_req;
    for (int i = 0; i < static_cast<int>(b.size()); ++i) {
      twin.mutable_spans(i)->set_sequence_id(b[i]);
    }
    auto resp = h_.client->Step(Packed(twin));
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_TRUE(region_->Inline(&*resp).ok());
    EXPECT_TRUE(resp->out().inline_data() == inline_resp.out().inline_data());
    EXPECT_TRUE(resp->lse().inline_data() == inline_resp.lse().inline_data());
  }
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(h_.Length(b[i], kLayer), h_.Length(a[i], kLayer));
  }
}

TEST_F(ShmPackedTest, MisuseIsRefusedAndChangesNothing) {
  const std::vector<std::string> seqs = {"s0", "s1"};
  ASSERT_NO_FATAL_FAILURE(Prefill(seqs));
  const v1::StepRequest good = Packed(h_.Make(kLayer, Spans(seqs, 64)));
  const v1::PackedInputs& p = good.packed();
  {  // q past the end of the region
    v1::StepRequest r = good;
    r.mutable_packed()->mutable_q()->set_offset(kRegionBytes - 64);
    ExpectError(h_, r, absl::StatusCode::kInvalidArgument,
                absl::StrCat("packed.q: offset ", kRegionBytes - 64, " + size ", p.q().size(),
                             " is outside region"));
  }
  {  // sizes that do not match the spans
    v1::StepRequest r = good;
    r.mutable_packed()->mutable_kv_rows()->set_size(p.kv_rows().size() - 1024);
    ExpectError(h_, r, absl::StatusCode::kInvalidArgument,
                absl::StrCat("packed.kv_rows: region '", region_->name(), "' size ",
                             p.kv_rows().size() - 1024, ", the tensor needs ", p.kv_rows().size(),
                             " bytes"));
    r = good;
    r.mutable_packed()->mutable_compressed_rows()->set_size(p.compressed_rows().size() + 1024);
    ExpectError(h_, r, absl::StatusCode::kInvalidArgument, "packed.compressed_rows: region");
    r = good;
    r.mutable_packed()->set_topk_width(p.topk_width() / 2);
    ExpectError(h_, r, absl::StatusCode::kInvalidArgument, "packed.topk: region");
  }
  {  // a span that still carries its own tensor
    v1::StepRequest r = good;
    *r.mutable_spans(1)->mutable_kv_rows() = h_.Make(kLayer, Spans({"s1"}, 64)).spans(0).kv_rows();
    ExpectError(h_, r, absl::StatusCode::kInvalidArgument,
                "spans[1].kv_rows: set in a packed request");
  }
  {  // an id past what span 1's row 2 (position 66) may see: the exact check names it
    int32_t* ids = reinterpret_cast<int32_t*>(region_->data() + p.topk().offset());
    int32_t& id = ids[(6 + 2) * p.topk_width() + 5];
    const int32_t saved = id;
    id = 33;  // (66 + 1) / 2 = 33 entries visible: 0..32
    ExpectError(h_, good, absl::StatusCode::kInvalidArgument,
                "spans[1].topk[2][5]: entry 33 not visible at position 66 (sequence has 33 "
                "visible entries)");
    id = -7;
    ExpectError(h_, good, absl::StatusCode::kInvalidArgument,
                "spans[1].topk[2][5]: entry -7 is invalid (-1 means none)");
    // Streamed, the error is the request's own and the stream goes on.
    auto stream = h_.client->OpenStream();
    ASSERT_TRUE(stream.ok());
    v1::StepResponse resp;
    ASSERT_TRUE((*stream)->Write(good));
    ASSERT_TRUE((*stream)->Read(&resp));
    EXPECT_EQ(resp.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
    EXPECT_THAT(resp.message(), HasSubstr("spans[1].topk[2][5]: entry -7"));
    (*stream)->WritesDone();
    EXPECT_TRUE((*stream)->Finish().ok());
    id = saved;
  }
  {
    v1::StepRequest r = good;
    r.mutable_packed()->mutable_topk()->set_region("/smla-nobody");
    ExpectError(h_, r, absl::StatusCode::kNotFound,
                "packed.topk: region '/smla-nobody' is not registered");
  }
  // Nothing was written by any of the refused calls.
  for (const std::string& s : seqs) EXPECT_EQ(h_.Length(s, kLayer), 64);
  // After unregistering, the region is gone for packed steps too.
  ASSERT_TRUE(region_->Unregister().ok());
  ExpectError(h_, good, absl::StatusCode::kNotFound, "is not registered");
  for (const std::string& s : seqs) EXPECT_EQ(h_.Length(s, kLayer), 64);
  // A later valid step gives the right answer.
  h_.StepAndCheck(h_.Make(kLayer, Spans(seqs, 64)));
}

}  // namespace
}  // namespace smla::testing
