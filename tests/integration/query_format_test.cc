// MXFP8 queries through the real server (step.proto "Query formats"): a step sent with MXFP8
// queries gives the same output bits as the same step sent with the bf16 values they decode
// to; ordinary queries sent as MXFP8 stay within the fp8-query tolerance of the bf16 answer;
// NaN codes and NaN scale bytes are INVALID_ARGUMENT naming the element and change nothing.
#include <string>

#include "harness.h"
#include "smla/client/tensor.h"

namespace smla::testing {
namespace {

using ::testing::HasSubstr;

v1::StepRequest AsMxfp8(v1::StepRequest r) {
  for (v1::Span& s : *r.mutable_spans()) EXPECT_TRUE(client::EncodeSpanQuery(&s).ok());
  return r;
}

// The same request with bf16 queries: the values the MXFP8 ones decode to.
v1::StepRequest AsDecodedBf16(v1::StepRequest r) {
  for (v1::Span& s : *r.mutable_spans()) {
    auto bits = client::SpanQueryBf16(s);
    EXPECT_TRUE(bits.ok()) << bits.status();
    const v1::Tensor& q = s.q();
    *s.mutable_q() = client::PackBf16(*bits, {q.shape(0), q.shape(1), q.shape(2)});
    s.clear_q_scales();
  }
  return r;
}

void ExpectSameOutputBits(const v1::StepResponse& a, const v1::StepResponse& b) {
  EXPECT_EQ(a.out().dtype(), b.out().dtype());
  EXPECT_TRUE(a.out().inline_data() == b.out().inline_data()) << "outputs differ";
  EXPECT_TRUE(a.mx_scales().inline_data() == b.mx_scales().inline_data()) << "scales differ";
  EXPECT_TRUE(a.lse().inline_data() == b.lse().inline_data()) << "LSE differs";
}

// Prefills two sequences to `context` on `layer`, then sends decode steps (6 rows each, both
// output formats) as MXFP8 and as their decoded bf16 values: the bits agree, and the MXFP8
// output matches the reference, which decodes the queries as the server does.
void ExpectMxfp8MatchesItsBf16Values(Harness& h, int32_t layer, int32_t context) {
  for (const char* s : {"a", "b"}) ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), s).ok());
  h.StepAndCheck(h.Make(layer, {{"a", 0, context, 0}, {"b", 0, context, 0}}));
  for (int round = 0; round < 2; ++round) {
    client::StepOptions o;
    o.want_lse = round == 0;
    o.output_format = round == 1 ? v1::OUTPUT_FORMAT_MXFP8 : v1::OUTPUT_FORMAT_BF16;
    const v1::StepRequest mx =
        AsMxfp8(h.Make(layer, {{"a", context, 6, 5}, {"b", context, 6, 5}}, o));
    ASSERT_EQ(mx.spans(0).q().dtype(), v1::DTYPE_E4M3);
    const v1::StepResponse from_bf16 = h.StepAndCheck(AsDecodedBf16(mx));
    // Same positions again: the rows are replaced by the same rows.
    const v1::StepResponse from_mx = h.StepAndCheck(mx);
    ExpectSameOutputBits(from_bf16, from_mx);
  }
}

TEST(QueryFormatTest, Mxfp8QueriesGiveTheBitsOfTheirBf16ValuesWidth512) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kDsv41}, "dsv4.1-flash"));
  h.UploadTables(256);
  ExpectMxfp8MatchesItsBf16Values(h, 2, 40);
}

TEST(QueryFormatTest, Mxfp8QueriesGiveTheBitsOfTheirBf16ValuesWidth576) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kGlm52}, "glm-5.2"));
  ASSERT_EQ(h.model_.qk_width(), 576);
  ExpectMxfp8MatchesItsBf16Values(h, 0, 40);
}

// Ordinary random queries sent as MXFP8: within 7e-2 * max|ref| per (row, head) of the answer
// to the bf16 queries they were encoded from, and within the usual tolerance of the reference
// on the decoded queries.
TEST(QueryFormatTest, RandomQueriesAsMxfp8StayWithinTheFp8QueryTolerance) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kGlm52}, "glm-5.2"));
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "s").ok());
  h.StepAndCheck(h.Make(0, {{"s", 0, 64, 0}}));
  client::StepOptions o;
  o.want_lse = true;
  const v1::StepRequest bf16 = h.Make(0, {{"s", 64, 6, 5}}, o);
  auto from_bf16 = h.ref->Step(bf16);  // records the rows the MXFP8 step writes too
  ASSERT_TRUE(from_bf16.ok()) << from_bf16.status();
  const v1::StepRequest mx = AsMxfp8(bf16);
  auto resp = h.client->Step(mx);
  ASSERT_TRUE(resp.ok()) << resp.status();
  const client::Comparison loose = client::Reference::Compare(*from_bf16, *resp, 7e-2);
  EXPECT_TRUE(loose.ok) << loose.first_mismatch;
  EXPECT_GT(loose.max_rel_error, 0);  // the queries did change
  h.Check(mx, *resp);
}

void ExpectError(const absl::StatusOr<v1::StepResponse>& r, const std::string& needle) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(needle));
}

// Sets byte `index` of a span's tensor (q or q_scales).
void Poke(v1::Tensor* t, size_t index, uint8_t value) {
  std::string bytes = t->inline_data();
  bytes[index] = static_cast<char>(value);
  t->set_inline_data(bytes);
}

TEST(QueryFormatTest, NaNCodesAndScalesAreRejectedAndChangeNothing) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kDsv41}, "dsv4.1-flash"));
  h.UploadTables(256);
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "s").ok());
  h.StepAndCheck(h.Make(2, {{"s", 0, 40, 0}}));
  const int64_t H = h.model_.heads_per_rank(), W = h.model_.qk_width();
  const int64_t pages = h.client->Info()->models(0).pool().pages_used();
  {
    // Appending rows (checked while the device attends): code 0x7F at row 1, head 2, lane 9.
    v1::StepRequest r = AsMxfp8(h.Make(2, {{"s", 40, 2, 0}}));
    Poke(r.mutable_spans(0)->mutable_q(), (1 * H + 2) * W + 9, 0x7f);
    ExpectError(h.client->Step(r), "spans[0].q[1][2][9]: e4m3 code 0x7f is NaN");
  }
  {
    // Rewriting stored rows (put back when the checks refuse): 0xFF, then scale byte 255.
    v1::StepRequest r = AsMxfp8(h.Make(2, {{"s", 38, 2, 0}}));
    Poke(r.mutable_spans(0)->mutable_q(), (0 * H + 1) * W + 500, 0xff);
    ExpectError(h.client->Step(r), "spans[0].q[0][1][500]: e4m3 code 0xff");
    r = AsMxfp8(h.Make(2, {{"s", 38, 2, 0}}));
    Poke(r.mutable_spans(0)->mutable_q_scales(), (1 * H + 3) * (W / 32) + 5, 0xff);
    ExpectError(h.client->Step(r), "spans[0].q_scales[1][3][5]: scale byte 255");
  }
  // The wire's checks and ValidateStep's, each naming the field.
  {
    v1::StepRequest r = AsMxfp8(h.Make(2, {{"s", 40, 2, 0}}));
    r.mutable_spans(0)->clear_q_scales();
    ExpectError(h.client->Step(r), absl::StrCat("spans[0].q_scales: 2 rows x ", H, " heads x ",
                                                W / 32, " scale bytes expected, got 0 bytes"));
    r = AsMxfp8(h.Make(2, {{"s", 40, 2, 0}}));
    r.mutable_spans(0)->mutable_q_scales()->set_shape(2, 18);
    ExpectError(h.client->Step(r), "spans[0].q_scales: shape");
    r = h.Make(2, {{"s", 40, 2, 0}});
    *r.mutable_spans(0)->mutable_q_scales() = AsMxfp8(r).spans(0).q_scales();
    ExpectError(h.client->Step(r), "spans[0].q_scales: set for bf16 queries");
    ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "t").ok());
    r = h.Make(2, {{"s", 40, 2, 0}, {"t", 0, 2, 0}});
    *r.mutable_spans(0) = AsMxfp8(r).spans(0);
    ExpectError(h.client->Step(r), "spans[1].q: dtype DTYPE_BF16, but spans[0].q is DTYPE_E4M3");
  }
  // Nothing changed: the length and the pages stay, and the next step (which attends over the
  // rows the rejected rewrite named) matches the reference.
  EXPECT_EQ(h.Length("s", 2), 40);
  EXPECT_EQ(h.client->Info()->models(0).pool().pages_used(), pages);
  h.StepAndCheck(AsMxfp8(h.Make(2, {{"s", 40, 3, 0}})));
  EXPECT_EQ(h.Length("s", 2), 43);
}

}  // namespace
}  // namespace smla::testing
