// The inline data path through the real server: steps written as raw bytes (what any protobuf
// client sends) are answered with plain protobuf responses; an unparseable message gets
// INVALID_ARGUMENT (in its own response on a stream, which goes on; as the call's status when
// unary); a stream whose client never reads holds a bounded number of bytes, however large its
// steps.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "harness.h"

namespace smla::testing {
namespace {

using ::testing::HasSubstr;

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string s;
  for (const auto& x : slices) s.append(reinterpret_cast<const char*>(x.begin()), x.size());
  return s;
}

// A StepStream call on raw bytes, as a client of another protobuf library would drive it.
struct RawStream {
  explicit RawStream(const std::string& target)
      : channel(grpc::CreateChannel(target, grpc::InsecureChannelCredentials())),
        method("/smla.v1.Smla/StepStream", grpc::internal::RpcMethod::BIDI_STREAMING),
        rw(grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            channel.get(), method, &ctx)) {}
  std::shared_ptr<grpc::Channel> channel;
  grpc::internal::RpcMethod method;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> rw;
};

TEST(InlinePathTest, UnparseableStreamMessageIsInvalidArgumentAndTheStreamGoesOn) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kDsv41}, "dsv4.1-flash"));
  ASSERT_NO_FATAL_FAILURE(h.UploadTables(1024));
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "s").ok());
  RawStream raw(h.server->target());
  ASSERT_TRUE(raw.rw->Write(Bytes(std::string("\xff\xff\xff\xff", 4))));
  grpc::ByteBuffer reply;
  ASSERT_TRUE(raw.rw->Read(&reply)) << "the stream ended on an unparseable message";
  v1::StepResponse r;
  ASSERT_TRUE(r.ParseFromString(Flatten(reply)));
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.message(), HasSubstr("not a valid smla.v1.StepRequest"));
  // The same stream serves a valid step afterwards, answered as plain protobuf.
  const v1::StepRequest req = h.Make(0, {{"s", 0, 8, 0}});
  ASSERT_TRUE(raw.rw->Write(Bytes(req.SerializeAsString())));
  ASSERT_TRUE(raw.rw->Read(&reply));
  v1::StepResponse ok;
  ASSERT_TRUE(ok.ParseFromString(Flatten(reply)));
  ASSERT_EQ(ok.code(), 0) << ok.message();
  h.Check(req, ok);
  raw.rw->WritesDone();
  EXPECT_TRUE(raw.rw->Finish().ok());
}

TEST(InlinePathTest, UnparseableUnaryStepIsInvalidArgument) {
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Start({kDsv41}, "dsv4.1-flash"));
  auto channel = grpc::CreateChannel(h.server->target(), grpc::InsecureChannelCredentials());
  grpc::internal::RpcMethod method("/smla.v1.Smla/Step", grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::ClientContext ctx;
  grpc::ByteBuffer reply;
  const grpc::Status st = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(), method, &ctx, Bytes(std::string("\x0a\x7f", 2)), &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("not a valid smla.v1.StepRequest"));
}

// Steps of 1,024 rows (8 MiB of queries and 8 MiB of output each): with the count bound alone
// (16 in flight) a client that never reads would pin over 250 MiB; the byte bound holds the
// stream to --stream_max_inflight_bytes plus one step, and the staging cache to
// --inline_cache_bytes.
TEST(InlinePathTest, SlowReaderWithLargeStepsHoldsBoundedBytes) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "RSS does not follow live memory under AddressSanitizer's quarantine";
#endif
  Harness h;
  ASSERT_NO_FATAL_FAILURE(
      h.Start({kDsv41, "--max_rows_per_step=1024", "--stream_max_inflight_bytes=32MiB",
               "--inline_cache_bytes=16MiB"},
              "dsv4.1-flash"));
  ASSERT_NO_FATAL_FAILURE(h.UploadTables(4096));
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "slow").ok());
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "other").ok());
  h.StepAndCheck(h.Make(0, {{"other", 0, 64, 0}}));  // warm
  const int64_t rss_before = RssBytes(h.server->pid());
  ASSERT_GT(rss_before, 0);
  RawStream raw(h.server->target());
  constexpr int kWrites = 24;
  std::vector<std::string> reqs;
  for (int i = 0; i < kWrites; ++i) {
    reqs.push_back(h.Make(0, {{"slow", 1024 * i, 1024, 0}}).SerializeAsString());
  }
  std::atomic<int> written{0};
  std::thread writer([&] {
    for (int i = 0; i < kWrites; ++i) {
      if (!raw.rw->Write(Bytes(reqs[i]))) return;
      ++written;
    }
  });
  int64_t rss_peak = rss_before;
  for (int i = 0; i < 40; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    rss_peak = std::max(rss_peak, RssBytes(h.server->pid()));
  }
  h.StepAndCheck(h.Make(0, {{"other", 64, 8, 0}}));  // others are served meanwhile
  std::printf(
      "slow reader, %zu-byte steps: %d of %d writes went through; server RSS %lld -> "
      "peak %lld KiB\n",
      reqs[0].size(), written.load(), kWrites, static_cast<long long>(rss_before / 1024),
      static_cast<long long>(rss_peak / 1024));
  EXPECT_LT(written.load(), kWrites);
  // 32 MiB of stream bound, one more step (16 + 8 MiB of staging), the messages gRPC has
  // received but not yet handed over, and 16 MiB of cache: under 160 MiB.
  EXPECT_LT(rss_peak - rss_before, int64_t{160} << 20);
  raw.ctx.TryCancel();
  writer.join();
  raw.rw->Finish().IgnoreError();
  EXPECT_TRUE(h.client->Health().value_or(false));
}

}  // namespace
}  // namespace smla::testing
