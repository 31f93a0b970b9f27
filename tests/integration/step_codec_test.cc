// The client's side of the inline data path (client/src/step_codec.h): a request encoded with its
// tensors referenced is byte for byte what protobuf serializes and holds the message exactly as
// long as gRPC holds the bytes; a large response decoded over copy threads is what protobuf
// parses.
#include "step_codec.h"

#include <algorithm>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "gtest/gtest.h"

namespace smla::client {
namespace {

std::string RandomBytes(size_t n, std::mt19937_64& rng) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// Spans with tensors from a few bytes (copied into the message's own runs) to hundreds of KiB
// (referenced).
v1::StepRequest Request(std::mt19937_64& rng) {
  v1::StepRequest r;
  r.set_request_id("codec");
  r.set_model("dsv4.1-flash");
  r.set_layer(5);
  for (int s = 0; s < 4; ++s) {
    v1::Span* span = r.add_spans();
    span->set_sequence_id(absl::StrCat("s", s));
    span->set_first_position(10 * s);
    span->set_num_rows(3);
    span->mutable_q()->set_inline_data(RandomBytes((300 << 10) + 7 * s, rng));
    span->mutable_kv_rows()->set_inline_data(RandomBytes(s == 0 ? 5 : 9000 + s, rng));
    span->mutable_topk()->set_inline_data(RandomBytes(64, rng));
    span->mutable_q()->add_shape(3);
  }
  return r;
}

TEST(StepCodecTest, EncodedRequestIsProtobufsBytesAndHoldsTheMessage) {
  std::mt19937_64 rng(1);
  auto request = std::make_shared<const v1::StepRequest>(Request(rng));
  const std::string want = request->SerializeAsString();
  {
    const grpc::ByteBuffer bytes = EncodeStepRequest(request);
    EXPECT_GT(request.use_count(), 1) << "large tensors were copied, not referenced";
    EXPECT_EQ(Flatten(bytes), want);
    // The copy is what is tested: gRPC copies buffers by reference.
    grpc::ByteBuffer shared(bytes);  // NOLINT(performance-unnecessary-copy-initialization)
    EXPECT_EQ(Flatten(shared), want);
  }
  EXPECT_EQ(request.use_count(), 1) << "the slices did not let go of the message";
}

TEST(StepCodecTest, SmallRequestsAreEncodedToo) {
  auto request = std::make_shared<v1::StepRequest>();
  request->set_request_id("tiny");
  EXPECT_EQ(Flatten(EncodeStepRequest(request)), request->SerializeAsString());
  EXPECT_EQ(Flatten(EncodeStepRequest(std::make_shared<v1::StepRequest>())), "");
}

grpc::ByteBuffer Sliced(const std::string& bytes, std::mt19937_64& rng) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size();) {
    const size_t n = std::min<size_t>(bytes.size() - at, 1 + rng() % 70000);
    slices.emplace_back(bytes.data() + at, n);
    at += n;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST(StepCodecTest, DecodedResponseIsWhatProtobufParses) {
  std::mt19937_64 rng(2);
  v1::ParallelCopier copier(2);
  for (size_t out_bytes : {size_t{1000}, size_t{3} << 20}) {
    v1::StepResponse want;
    want.set_request_id("r");
    want.mutable_out()->set_dtype(v1::DTYPE_BF16);
    want.mutable_out()->add_shape(4);
    want.mutable_out()->set_inline_data(RandomBytes(out_bytes, rng));
    want.mutable_lse()->set_inline_data(RandomBytes(4096, rng));
    want.mutable_timings()->set_kernel_us(12);
    const std::string wire = want.SerializeAsString();
    for (v1::ParallelCopier* c : {&copier, static_cast<v1::ParallelCopier*>(nullptr)}) {
      v1::StepResponse got;
      got.set_message("stale");  // decoding replaces what the message held
      ASSERT_TRUE(DecodeStepResponse(Sliced(wire, rng), c, &got).ok());
      EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(want, got));
    }
  }
}

// Decoding into the response object of the previous call reuses its tensors' strings (a 2 MiB
// output lands in the 3 MiB string of the call before instead of a new one), and the result is
// still exactly what protobuf parses: sizes that shrink and grow, a tensor that goes away, one
// that moves between fields.
TEST(StepCodecTest, DecodingAgainKeepsTheTensorsStrings) {
  std::mt19937_64 rng(4);
  v1::ParallelCopier copier(2);
  auto response = [&](size_t out_bytes, size_t lse_bytes, size_t scale_bytes) {
    v1::StepResponse r;
    r.set_request_id("again");
    r.mutable_out()->set_dtype(v1::DTYPE_E4M3);
    r.mutable_out()->set_inline_data(RandomBytes(out_bytes, rng));
    if (lse_bytes > 0) r.mutable_lse()->set_inline_data(RandomBytes(lse_bytes, rng));
    if (scale_bytes > 0) r.mutable_mx_scales()->set_inline_data(RandomBytes(scale_bytes, rng));
    return r;
  };
  const v1::StepResponse calls[] = {
      response(size_t{3} << 20, 8192, 0), response(size_t{2} << 20, 0, 65536),
      response(size_t{4} << 20, 4096, 65536), response(size_t{1} << 20, 0, 0)};
  v1::StepResponse got;
  size_t capacity = 0;
  for (const v1::StepResponse& want : calls) {
    ASSERT_TRUE(DecodeStepResponse(Sliced(want.SerializeAsString(), rng), &copier, &got).ok());
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(want, got));
    // Protobuf's Clear frees the tensors, so only a kept string can be larger than its bytes.
    EXPECT_GE(got.out().inline_data().capacity(), capacity);
    capacity = std::max(capacity, got.out().inline_data().capacity());
  }
  EXPECT_GE(capacity, size_t{4} << 20);
}

TEST(StepCodecTest, MalformedResponseIsInvalidArgument) {
  std::mt19937_64 rng(3);
  v1::StepResponse want;
  want.mutable_out()->set_inline_data(RandomBytes(1 << 20, rng));
  std::string wire = want.SerializeAsString();
  wire.resize(wire.size() - 10);  // the tensor's bytes end early
  v1::StepResponse got;
  const absl::Status st = DecodeStepResponse(Sliced(wire, rng), nullptr, &got);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
}

}  // namespace
}  // namespace smla::client
