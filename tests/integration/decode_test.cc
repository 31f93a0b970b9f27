// Speculative decode with rollback through the real server: every output matches the
// reference computed from what the test wrote.
#include <algorithm>

#include "harness.h"

namespace smla::testing {
namespace {

using client::SpanSpec;
using client::StepOptions;

// Prefills `seqs` to `context` on `layers` in multi-span chunks, then runs `rounds` of
// 1 verify + 5 drafts per sequence, accepting a random number of drafts and rewriting from the
// first rejected one. Even rounds go through the unary call, odd ones through a stream.
void RunSpeculativeDecode(Harness& h, const std::vector<int32_t>& layers,
                          const std::vector<std::string>& seqs, int32_t context, int rounds) {
  for (const auto& s : seqs) ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), s).ok());
  for (int32_t layer : layers) {
    for (int32_t first = 0; first < context; first += 100) {
      std::vector<SpanSpec> spans;
      for (const auto& s : seqs) spans.push_back({s, first, std::min(100, context - first), 0});
      h.StepAndCheck(h.Make(layer, spans));
    }
  }
  std::vector<int64_t> length(seqs.size(), context);
  int64_t rolled_back = 0;
  auto stream = h.client->OpenStream();
  ASSERT_TRUE(stream.ok());
  for (int round = 0; round < rounds; ++round) {
    StepOptions o;
    o.inverse_rope = h.model_.geometry() == "rope_inside";
    o.want_lse = round % 2 == 0;
    o.output_format = round % 3 == 1 ? v1::OUTPUT_FORMAT_MXFP8 : v1::OUTPUT_FORMAT_BF16;
    std::vector<SpanSpec> spans;
    for (size_t i = 0; i < seqs.size(); ++i) spans.push_back({seqs[i], length[i], 6, 5});
    for (int32_t layer : layers) {
      const v1::StepRequest req = h.Make(layer, spans, o);
      if (round % 2 == 0) {
        h.StepAndCheck(req);
      } else {
        ASSERT_TRUE((*stream)->Write(req));
        v1::StepResponse resp;
        ASSERT_TRUE((*stream)->Read(&resp));
        ASSERT_EQ(resp.code(), 0) << resp.message();
        h.Check(req, resp);
        // The batch's time holds the kernel's; the stream's parts fit in the server's time.
        const v1::StepTimings& tm = resp.timings();
        EXPECT_GE(tm.batch_us(), tm.kernel_us());
        EXPECT_GE(tm.parse_us(), 0);
        EXPECT_GE(tm.admit_us(), 0);
        EXPECT_LE(tm.parse_us() + tm.admit_us() + tm.queued_us() + tm.batch_us(),
                  tm.server_us() + 2);  // each rounded down to whole microseconds
      }
      for (size_t i = 0; i < seqs.size(); ++i) {
        EXPECT_EQ(h.Length(seqs[i], layer), length[i] + 6);
      }
    }
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t accepted = static_cast<int64_t>(h.rng() % 6);
      length[i] += 1 + accepted;
      rolled_back += 5 - accepted;
    }
  }
  ASSERT_TRUE((*stream)->WritesDone());
  EXPECT_TRUE((*stream)->Finish().ok());
  EXPECT_GT(rolled_back, 0);

  // An explicit truncate, then a step from the new end.
  const v1::ModelInfo& m = h.model_;
  const int64_t cut = length[0] - 4;
  ASSERT_TRUE(h.client->Truncate({m.profile(), seqs[0]}, cut).ok());
  h.ref->Truncate(seqs[0], cut);
  for (int32_t layer : layers) {
    EXPECT_EQ(h.Length(seqs[0], layer), cut);
    StepOptions o;
    o.want_lse = true;
    h.StepAndCheck(h.Make(layer, {{seqs[0], cut, 3, 2}}, o));
  }
}

TEST(DecodeTest, Dsv41SpeculativeDecodeWithRollback) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kDsv41}, "dsv4.1-flash"));
  ASSERT_NO_FATAL_FAILURE(h.UploadTables(4096));
  // Layer 0 SWA-only, 2 top-512 of 1/2, 20 top-512 of 1/1.
  RunSpeculativeDecode(h, {0, 2, 20}, {"a", "b", "c"}, 300, 4);
}

TEST(DecodeTest, Dsv4DenseCompressedLayer) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(
      h.Start({"--model=dsv4-flash:tp=8:page_rows=16:pool=32MiB"}, "dsv4-flash"));
  ASSERT_NO_FATAL_FAILURE(h.UploadTables(4096));
  // Layer 2 top-512 of 1/4, layer 3 every entry of 1/128 (two entries visible past 255).
  ASSERT_EQ(h.model_.layers(3).kind(), v1::LAYER_KIND_SWA_ALL_COMPRESSED);
  RunSpeculativeDecode(h, {2, 3}, {"x", "y"}, 300, 3);
}

TEST(DecodeTest, GlmChosenPositions) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kGlm53}, "glm-5.3-flash"));
  RunSpeculativeDecode(h, {0}, {"g0", "g1"}, 200, 3);
}

// The check itself must be able to fail: a response altered by one value is caught.
TEST(DecodeTest, ReferenceCatchesAWrongValue) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kGlm53}, "glm-5.3-flash"));
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "s").ok());
  const v1::StepRequest req = h.Make(0, {{"s", 0, 8, 0}});
  auto resp = h.client->Step(req);
  ASSERT_TRUE(resp.ok()) << resp.status();
  auto expected = h.ref->Step(req);
  ASSERT_TRUE(expected.ok());
  EXPECT_TRUE(client::Reference::Compare(*expected, *resp).ok);
  std::string data = resp->out().inline_data();
  data[2 * 700 + 1] ^= 0x40;  // flips an exponent bit of one bf16 value
  resp->mutable_out()->set_inline_data(data);
  EXPECT_FALSE(client::Reference::Compare(*expected, *resp).ok);
}

}  // namespace
}  // namespace smla::testing
