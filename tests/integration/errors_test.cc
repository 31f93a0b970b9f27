// Every error class of docs/architecture.md through the real server, each leaving the store
// unchanged: lengths stay, pages stay, and a later valid step still gives the right answer.
#include <cmath>
#include <cstring>

#include "harness.h"
#include "smla/client/tensor.h"

namespace smla::testing {
namespace {

using ::testing::HasSubstr;

void ExpectError(const absl::StatusOr<v1::StepResponse>& r, absl::StatusCode code,
                 const std::string& needle) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(needle));
}

TEST(ErrorsTest, EveryClassLeavesTheStoreUnchanged) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kDsv41}, "dsv4.1-flash"));
  const std::string model = h.ModelName();
  ASSERT_TRUE(h.client->CreateSequence(model, "s").ok());

  // FAILED_PRECONDITION: sinks not uploaded; then inverse RoPE without a cos/sin table.
  ExpectError(h.client->Step(h.Make(2, {{"s", 0, 4, 0}})), absl::StatusCode::kFailedPrecondition,
              "SetSinks");
  std::vector<float> sinks(int64_t{h.model_.layers_size()} * h.model_.heads_per_rank(), 0.5f);
  ASSERT_TRUE(
      h.client->SetSinks(model, sinks, h.model_.layers_size(), h.model_.heads_per_rank()).ok());
  h.ref->SetSinks(sinks);
  client::StepOptions rope;
  rope.inverse_rope = true;
  ExpectError(h.client->Step(h.Make(2, {{"s", 0, 4, 0}}, rope)),
              absl::StatusCode::kFailedPrecondition, "SetRopeTable");
  EXPECT_EQ(h.Length("s", 2), 0);

  h.StepAndCheck(h.Make(2, {{"s", 0, 40, 0}}));
  const int64_t pages = h.client->Info()->models(0).pool().pages_used();

  // INVALID_ARGUMENT, each naming the field.
  {
    v1::StepRequest r = h.Make(2, {{"s", 40, 2, 0}});
    r.mutable_spans(0)->mutable_q()->set_shape(1, 7);  // heads
    ExpectError(h.client->Step(r), absl::StatusCode::kInvalidArgument, "spans[0].q");
  }
  {
    v1::StepRequest r = h.Make(2, {{"s", 40, 2, 0}});
    std::string kv = r.spans(0).kv_rows().inline_data();
    const uint16_t nan = 0x7fc0;
    std::memcpy(kv.data() + 2 * (512 + 9), &nan, 2);  // row 1, column 9
    r.mutable_spans(0)->mutable_kv_rows()->set_inline_data(kv);
    ExpectError(h.client->Step(r), absl::StatusCode::kInvalidArgument, "kv_rows[1][9]");
  }
  {
    v1::StepRequest r = h.Make(2, {{"s", 41, 2, 0}});  // stored length is 40
    ExpectError(h.client->Step(r), absl::StatusCode::kInvalidArgument, "spans[0]");
  }
  {
    v1::StepRequest r = h.Make(2, {{"s", 40, 2, 0}});
    std::string ids = r.spans(0).topk().inline_data();
    const int32_t far = 500;  // 1/2 cache has 20 visible entries at position 40
    std::memcpy(ids.data(), &far, 4);
    r.mutable_spans(0)->mutable_topk()->set_inline_data(ids);
    ExpectError(h.client->Step(r), absl::StatusCode::kInvalidArgument, "topk[0][0]");
  }
  {
    v1::StepRequest r = h.Make(2, {{"s", 40, 2, 0}});
    r.mutable_spans(0)->mutable_kv_rows()->set_dtype(v1::DTYPE_F32);
    ExpectError(h.client->Step(r), absl::StatusCode::kInvalidArgument, "spans[0].kv_rows: dtype");
  }

  // NOT_FOUND: model, layer, sequence.
  {
    v1::StepRequest r = h.Make(2, {{"s", 40, 2, 0}});
    r.set_model("no-such-model");
    ExpectError(h.client->Step(r), absl::StatusCode::kNotFound, "no-such-model");
    r = h.Make(2, {{"s", 40, 2, 0}});
    r.set_layer(99);
    ExpectError(h.client->Step(r), absl::StatusCode::kNotFound, "99");
    ExpectError(h.client->Step(h.Make(2, {{"nobody", 0, 2, 0}})), absl::StatusCode::kNotFound,
                "nobody");
  }

  // ALREADY_EXISTS.
  EXPECT_EQ(h.client->CreateSequence(model, "s").status().code(), absl::StatusCode::kAlreadyExists);

  // In a stream, a bad request gets its own code and the stream goes on.
  {
    auto stream = h.client->OpenStream();
    ASSERT_TRUE(stream.ok());
    v1::StepRequest bad = h.Make(2, {{"s", 45, 2, 0}});
    ASSERT_TRUE((*stream)->Write(bad));
    v1::StepResponse resp;
    ASSERT_TRUE((*stream)->Read(&resp));
    EXPECT_EQ(resp.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_FALSE(resp.has_out());
    const v1::StepRequest good = h.Make(2, {{"s", 40, 3, 2}});
    ASSERT_TRUE((*stream)->Write(good));
    ASSERT_TRUE((*stream)->Read(&resp));
    ASSERT_EQ(resp.code(), 0) << resp.message();
    EXPECT_EQ(h.Length("s", 2), 43);
    EXPECT_EQ(h.client->Info()->models(0).pool().pages_used(), pages);
    h.Check(good, resp);
    (*stream)->WritesDone();
    EXPECT_TRUE((*stream)->Finish().ok());
  }
  // Nothing above changed the store: the sequence continues where the last success left it.
  h.StepAndCheck(h.Make(2, {{"s", 43, 6, 5}}));
}

// A pool filled to exactly its capacity, then one page more.
TEST(ErrorsTest, PoolFilledToCapacityThenOnePageMore) {
  Harness h;
  // glm-5.3-flash: one layer whose cache grows by a page every 16 positions.
  ASSERT_NO_FATAL_FAILURE(
      h.Start({"--model=glm-5.3-flash:tp=8:page_rows=16:pool_pages=8"}, "glm-5.3-flash"));
  const std::string model = h.ModelName();
  ASSERT_EQ(h.model_.pool().pages_total(), 8);
  ASSERT_TRUE(h.client->CreateSequence(model, "full").ok());
  ASSERT_TRUE(h.client->CreateSequence(model, "other").ok());
  h.StepAndCheck(h.Make(0, {{"full", 0, 64, 0}}));
  h.StepAndCheck(h.Make(0, {{"full", 64, 64, 0}}));
  EXPECT_EQ(h.client->Info()->models(0).pool().pages_used(), 8);

  // One page more, from either sequence: refused, nothing written.
  ExpectError(h.client->Step(h.Make(0, {{"full", 128, 1, 0}})),
              absl::StatusCode::kResourceExhausted, "");
  ExpectError(h.client->Step(h.Make(0, {{"other", 0, 1, 0}})), absl::StatusCode::kResourceExhausted,
              "");
  // All-or-nothing over spans: one span fits (a rewrite), the other needs a page.
  ExpectError(h.client->Step(h.Make(0, {{"full", 120, 8, 0}, {"other", 0, 1, 0}})),
              absl::StatusCode::kResourceExhausted, "");
  EXPECT_EQ(h.client->Info()->models(0).pool().pages_used(), 8);
  EXPECT_EQ(h.Length("full", 0), 128);
  EXPECT_EQ(h.Length("other", 0), 0);

  // Rewriting stored positions needs no page; the earlier failures changed nothing.
  h.StepAndCheck(h.Make(0, {{"full", 120, 8, 0}}));
  ASSERT_TRUE(h.client->Release({model, "full"}).ok());
  EXPECT_EQ(h.client->Info()->models(0).pool().pages_used(), 0);
  h.StepAndCheck(h.Make(0, {{"other", 0, 16, 0}}));
}

}  // namespace
}  // namespace smla::testing
