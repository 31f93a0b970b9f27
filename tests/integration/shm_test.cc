// The zero-copy transport on the real smla-server: shared-memory steps return exactly the
// inline results, region misuse is refused with a clear error and changes nothing, and a
// region goes away with its registration.
#include "smla/client/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "harness.h"
#include "smla/client/gpu_region.h"

namespace smla::testing {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kLayer = 2;  // SWA + top-512 of the 1/2 cache
constexpr uint64_t kRegionBytes = 8 << 20;

std::string Unique(const std::string& what) { return absl::StrCat(what, "-", getpid()); }

class ShmTest : public ::testing::Test {
 protected:
  void StartServer(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {kDsv41};
    args.insert(args.end(), extra.begin(), extra.end());
    ASSERT_NO_FATAL_FAILURE(h_.Start(args, "dsv4.1-flash"));
    ASSERT_NO_FATAL_FAILURE(h_.UploadTables(1024));
  }
  // A sequence pre-filled with 64 positions on kLayer (checked against the reference).
  void Prefill(const std::string& id) {
    ASSERT_TRUE(h_.client->CreateSequence(h_.ModelName(), id).ok());
    h_.StepAndCheck(h_.Make(kLayer, {{id, 0, 64, 0}}));
  }
  Harness h_;
};

TEST_F(ShmTest, ResultsEqualInlineBitForBit) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--allow_shm"}));
  auto region = client::ShmRegion::Create(h_.client.get(), Unique("eq"), kRegionBytes);
  ASSERT_TRUE(region.ok()) << region.status();
  // Once registered, the object has no name left in /dev/shm (a killed client leaks nothing).
  EXPECT_LT(shm_open((*region)->name().c_str(), O_RDONLY, 0), 0);
  EXPECT_EQ(errno, ENOENT);
  // Twin sequences: "a" gets every request inline, "b" the same request through the region.
  ASSERT_TRUE(h_.client->CreateSequence(h_.ModelName(), "a").ok());
  ASSERT_TRUE(h_.client->CreateSequence(h_.ModelName(), "b").ok());
  {
    v1::StepRequest p = h_.Make(kLayer, {{"a", 0, 64, 0}});
    h_.StepAndCheck(p);
    p.mutable_spans(0)->set_sequence_id("b");
    ASSERT_TRUE((*region)->Place(&p).ok());
    ASSERT_TRUE(h_.client->Step(p).ok());
  }
  const std::vector<client::StepOptions> variants = {client::StepOptions{}, Bf16WithLse(),
                                                     Mxfp8WithRope()};
  auto stream = h_.client->OpenStream();
  ASSERT_TRUE(stream.ok());
  int64_t pos = 64;
  for (size_t v = 0; v < variants.size(); ++v, pos += 6) {
    const v1::StepRequest inline_req = h_.Make(kLayer, {{"a", pos, 6, 5}}, variants[v]);
    const v1::StepResponse inline_resp = h_.StepAndCheck(inline_req);
    v1::StepRequest shm_req = inline_req;
    shm_req.mutable_spans(0)->set_sequence_id("b");
    auto end = (*region)->Place(&shm_req);
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_LT(shm_req.ByteSizeLong(), 1024u) << "a placed step should be a few hundred bytes";
    v1::StepResponse shm_resp;
    // Unary and stream both.
    ASSERT_NO_FATAL_FAILURE(
        SendStep(*h_.client, v % 2 == 0 ? nullptr : stream->get(), shm_req, &shm_resp));
    EXPECT_EQ(shm_resp.out().data_case(), v1::Tensor::kRegion);
    EXPECT_LT(shm_resp.ByteSizeLong(), 1024u);
    ASSERT_TRUE((*region)->Inline(&shm_resp).ok());
    ExpectSameOutputs(shm_resp, inline_resp, absl::StrCat("variant ", v));
  }
  (*stream)->WritesDone();
  EXPECT_TRUE((*stream)->Finish().ok());
}

// GPU regions (gpu_region_test.cc on a GPU host) are refused clearly where they cannot work:
// by a CPU server, and, on any server, a handle that names no memory or a registration that
// also names a memfd handover.
TEST_F(ShmTest, GpuRegionsAreRefusedWhereTheyCannotWork) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--allow_shm"}));
  const std::vector<uint8_t> handle(64, 0);  // the size of a CUDA or HIP IPC handle
  const char* backend = std::getenv("SMLA_TEST_BACKEND");
  const bool cpu = backend == nullptr || std::string(backend) == "cpu";
  auto r = client::GpuRegion::Register(h_.client.get(), handle, 1 << 20);
  ASSERT_FALSE(r.ok());
  if (cpu) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("GPU regions need a GPU backend"));
  } else {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("gpu_handle: no device memory"));
  }
  v1::RegisterRegionRequest both;
  both.set_size(1 << 20);
  both.set_gpu_handle(std::string(64, '\0'));
  both.set_handover("0123456789abcdef0123456789abcdef");
  auto lease = client::RegionLease::Open(h_.client.get(), both);
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kInvalidArgument) << lease.status();
  EXPECT_THAT(std::string(lease.status().message()),
              HasSubstr("a GPU region names neither a region name nor a handover token"));
}

// Places a valid step for `seq` and returns it; the caller breaks one reference.
v1::StepRequest Placed(Harness& h, const client::ShmRegion& region, const std::string& seq,
                       int64_t pos, bool lse = false) {
  client::StepOptions o;
  o.want_lse = lse;
  v1::StepRequest r = h.Make(kLayer, {{seq, pos, 6, 5}}, o);
  EXPECT_TRUE(region.Place(&r).ok());
  return r;
}

void ExpectError(Harness& h, const v1::StepRequest& r, absl::StatusCode code,
                 const std::string& text) {
  auto resp = h.client->Step(r);
  ASSERT_FALSE(resp.ok());
  EXPECT_EQ(resp.status().code(), code) << resp.status();
  EXPECT_THAT(std::string(resp.status().message()), HasSubstr(text));
}

TEST_F(ShmTest, MisuseIsRefusedAndChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--allow_shm"}));
  auto region = client::ShmRegion::Create(h_.client.get(), Unique("misuse"), kRegionBytes);
  ASSERT_TRUE(region.ok()) << region.status();
  ASSERT_NO_FATAL_FAILURE(Prefill("s"));
  const std::string name = (*region)->name();

  {  // q past the end of the region
    v1::StepRequest r = Placed(h_, **region, "s", 64);
    r.mutable_spans(0)->mutable_q()->mutable_region()->set_offset(kRegionBytes - 64);
    ExpectError(h_, r, absl::StatusCode::kInvalidArgument,
                absl::StrCat("spans[0].q.region: offset ", kRegionBytes - 64));
  }
  {  // offset + size overflows 64 bits
    v1::StepRequest r = Placed(h_, **region, "s", 64);
    r.mutable_spans(0)->mutable_kv_rows()->mutable_region()->set_offset(~uint64_t{0} - 8);
    ExpectError(h_, r, absl::StatusCode::kInvalidArgument, "is outside region");
  }
  {  // size that does not match the tensor's shape
    v1::StepRequest r = Placed(h_, **region, "s", 64);
    r.mutable_spans(0)->mutable_kv_rows()->mutable_region()->set_size(100);
    ExpectError(h_, r, absl::StatusCode::kInvalidArgument, "the tensor needs");
  }
  {  // int32 ids at an odd offset
    v1::StepRequest r = Placed(h_, **region, "s", 64);
    auto* ref = r.mutable_spans(0)->mutable_topk()->mutable_region();
    ref->set_offset(ref->offset() + 2);
    ExpectError(h_, r, absl::StatusCode::kInvalidArgument, "not a multiple of 4");
  }
  {  // output past the end
    v1::StepRequest r = Placed(h_, **region, "s", 64, true);
    r.mutable_lse_region()->set_offset(kRegionBytes);
    ExpectError(h_, r, absl::StatusCode::kInvalidArgument, "lse_region");
  }
  {  // an LSE region without want_lse
    v1::StepRequest r = Placed(h_, **region, "s", 64, true);
    r.set_want_lse(false);
    ExpectError(h_, r, absl::StatusCode::kInvalidArgument, "lse_region: set without want_lse");
  }
  {  // a region nobody registered
    v1::StepRequest r = Placed(h_, **region, "s", 64);
    r.mutable_spans(0)->mutable_q()->mutable_region()->set_region("/smla-nobody");
    ExpectError(h_, r, absl::StatusCode::kNotFound, "'/smla-nobody' is not registered");
  }
  {  // registering by name, with an unknown token, past the memfd's size, a token twice
    auto info = h_.client->Info();
    ASSERT_TRUE(info.ok()) << info.status();
    absl::StatusOr<int> fd = client::SealedMemfd("misuse", 4096);
    ASSERT_TRUE(fd.ok()) << fd.status();
    absl::StatusOr<std::string> token = client::HandOver(info->shm_socket(), *fd);
    ASSERT_TRUE(token.ok()) << token.status();
    close(*fd);
    struct Case {
      std::string name, handover;
      uint64_t size;
      grpc::StatusCode code;
      std::string text;
    };
    for (const Case& c : std::vector<Case>{
             {name, "", 4096, grpc::StatusCode::INVALID_ARGUMENT, "not registered by name"},
             {"", "0123456789abcdef0123456789abcdef", 4096, grpc::StatusCode::NOT_FOUND,
              "no pending region memory has this token"},
             {"", *token, 8192, grpc::StatusCode::INVALID_ARGUMENT, "the memfd holds 4096 bytes"},
             {"", *token, 4096, grpc::StatusCode::NOT_FOUND, "no pending region memory"}}) {
      grpc::ClientContext ctx;
      v1::RegisterRegionRequest req;
      req.set_name(c.name);
      req.set_handover(c.handover);
      req.set_size(c.size);
      auto reader = h_.client->stub()->RegisterRegion(&ctx, req);
      v1::RegisterRegionResponse ack;
      EXPECT_FALSE(reader->Read(&ack)) << c.text;
      const grpc::Status st = reader->Finish();
      EXPECT_EQ(st.error_code(), c.code) << c.text;
      EXPECT_THAT(st.error_message(), HasSubstr(c.text));
    }
  }
  // Nothing was written by any of the refused calls.
  EXPECT_EQ(h_.Length("s", kLayer), 64);
  // After unregistering, the region is gone for steps and for a second unregister.
  const v1::StepRequest later = Placed(h_, **region, "s", 64);
  ASSERT_TRUE((*region)->Unregister().ok());
  ExpectError(h_, later, absl::StatusCode::kNotFound, "is not registered");
  {
    grpc::ClientContext ctx;
    v1::UnregisterRegionRequest req;
    req.set_name(name);
    v1::UnregisterRegionResponse resp;
    EXPECT_EQ(h_.client->stub()->UnregisterRegion(&ctx, req, &resp).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  EXPECT_EQ(h_.Length("s", kLayer), 64);
  // A later valid step gives the right answer.
  h_.StepAndCheck(h_.Make(kLayer, {{"s", 64, 6, 5}}));
}

TEST_F(ShmTest, ServerWithoutAllowShmRefusesRegions) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  grpc::ClientContext ctx;
  v1::RegisterRegionRequest req;
  req.set_handover("0123456789abcdef0123456789abcdef");
  req.set_size(4096);
  auto reader = h_.client->stub()->RegisterRegion(&ctx, req);
  v1::RegisterRegionResponse ack;
  EXPECT_FALSE(reader->Read(&ack));
  const grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("--allow_shm"));
  auto region = client::ShmRegion::Create(h_.client.get(), Unique("off2"), 4096);
  ASSERT_FALSE(region.ok());
  EXPECT_THAT(std::string(region.status().message()), HasSubstr("--allow_shm"));
  // A step naming a region is refused naming the field.
  ASSERT_NO_FATAL_FAILURE(Prefill("s"));
  v1::StepRequest r = h_.Make(kLayer, {{"s", 64, 6, 5}});
  v1::RegionRef ref;
  ref.set_region("/smla-x");
  ref.set_size(r.spans(0).q().inline_data().size());
  *r.mutable_spans(0)->mutable_q()->mutable_region() = ref;
  ExpectError(h_, r, absl::StatusCode::kInvalidArgument,
              "spans[0].q: shared-memory regions are not enabled");
  EXPECT_EQ(h_.Length("s", kLayer), 64);
}

TEST_F(ShmTest, RegionEndsWithItsRegisteringCall) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--allow_shm"}));
  ASSERT_NO_FATAL_FAILURE(Prefill("s"));
  // Memory this test owns, registered by a call that is then cancelled (as when the client's
  // process or channel goes away).
  auto info = h_.client->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  absl::StatusOr<int> fd = client::SealedMemfd("lease", kRegionBytes);
  ASSERT_TRUE(fd.ok()) << fd.status();
  absl::StatusOr<std::string> token = client::HandOver(info->shm_socket(), *fd);
  ASSERT_TRUE(token.ok()) << token.status();
  auto ctx = std::make_unique<grpc::ClientContext>();
  v1::RegisterRegionRequest req;
  req.set_handover(*token);
  req.set_size(kRegionBytes);
  auto reader = h_.client->stub()->RegisterRegion(ctx.get(), req);
  v1::RegisterRegionResponse ack;
  ASSERT_TRUE(reader->Read(&ack));
  EXPECT_EQ(ack.size(), kRegionBytes);
  const std::string name = ack.name();
  // A reference past the end: INVALID_ARGUMENT while the region is registered, NOT_FOUND
  // once it is gone, and never a write.
  v1::StepRequest r = h_.Make(kLayer, {{"s", 64, 6, 5}});
  v1::Tensor* q = r.mutable_spans(0)->mutable_q();
  const uint64_t q_bytes = q->inline_data().size();
  q->mutable_region()->set_region(name);
  q->mutable_region()->set_offset(kRegionBytes);
  q->mutable_region()->set_size(q_bytes);
  ExpectError(h_, r, absl::StatusCode::kInvalidArgument, "is outside region");
  ctx->TryCancel();
  EXPECT_FALSE(reader->Read(&ack));
  reader->Finish();
  // The server drops the region when it sees the cancel; give it a moment.
  absl::Status st;
  for (int i = 0; i < 100; ++i) {
    st = h_.client->Step(r).status();
    if (st.code() == absl::StatusCode::kNotFound) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("is not registered"));
  EXPECT_EQ(h_.Length("s", kLayer), 64);
  close(*fd);
}

}  // namespace
}  // namespace smla::testing
