// GPU regions on the real smla-server with a GPU backend (run on a GPU host with
// SMLA_TEST_BACKEND=cuda): steps whose inputs and outputs lie in this process's device memory
// return exactly the inline results, misuse is refused with a clear error, and a region whose
// owner dies mid-step fails nobody else.
#include "smla/client/gpu_region.h"

#include <cuda_runtime.h>

#include <cstring>
#include <span>

#include "absl/strings/str_cat.h"
#include "child_process.h"
#include "harness.h"
#include "smla/client/shm.h"
#include "smla/client/step_ring.h"

namespace smla::testing {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kLayer = 2;  // SWA + top-512 of the 1/2 cache
constexpr uint64_t kRegionBytes = 8 << 20;

// A device allocation and its IPC handle; freed when it goes.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&data_, bytes), cudaSuccess);
    EXPECT_EQ(cudaIpcGetMemHandle(&handle_, data_), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data_); }
  std::span<const uint8_t> handle() const {
    return {reinterpret_cast<const uint8_t*>(&handle_), sizeof(handle_)};
  }
  void Upload(const std::vector<uint8_t>& host, size_t bytes) {
    ASSERT_EQ(cudaMemcpy(data_, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void Download(std::vector<uint8_t>& host) {
    ASSERT_EQ(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
  }

 private:
  void* data_ = nullptr;
  size_t bytes_;
  cudaIpcMemHandle_t handle_{};
};

bool GpuServer() {
  const char* backend = std::getenv("SMLA_TEST_BACKEND");
  return backend != nullptr && std::string(backend) != "cpu";
}

class GpuRegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!GpuServer()) GTEST_SKIP() << "GPU regions need a GPU server: set SMLA_TEST_BACKEND=cuda";
    ASSERT_NO_FATAL_FAILURE(h_.Start({kDsv41, "--allow_shm"}, "dsv4.1-flash"));
    ASSERT_NO_FATAL_FAILURE(h_.UploadTables(1024));
  }
  Harness h_;
};

// Steps of two spans: in the packed layout their queries lie one after another, which the
// attention reads in place; in the per-span layout they do not, and the checks copy them.
TEST_F(GpuRegionTest, ResultsEqualInlineBitForBit) {
  DeviceBuffer device(kRegionBytes);
  auto region = client::GpuRegion::Register(h_.client.get(), device.handle(), kRegionBytes);
  ASSERT_TRUE(region.ok()) << region.status();
  std::vector<uint8_t> mirror(kRegionBytes);
  // Twin sequences: "a" and "c" get every request inline, "b" and "d" the same request through
  // the region.
  for (const char* id : {"a", "b", "c", "d"}) {
    ASSERT_TRUE(h_.client->CreateSequence(h_.ModelName(), id).ok()) << id;
  }
  auto through_region = [&](v1::StepRequest r, client::StepStream* stream,
                            client::ShmRegion::Layout layout) {
    for (v1::Span& span : *r.mutable_spans()) {
      span.set_sequence_id(span.sequence_id() == "a" ? "b" : "d");
    }
    // Poison: output bytes the step does not write read back as 0xA5.
    std::fill(mirror.begin(), mirror.end(), 0xA5);
    auto end =
        client::ShmRegion::PlaceInto(mirror.data(), kRegionBytes, (*region)->name(), &r, 0, layout);
    EXPECT_TRUE(end.ok()) << end.status();
    if (!end.ok()) return v1::StepResponse();
    device.Upload(mirror, kRegionBytes);
    v1::StepResponse resp;
    SendStep(*h_.client, stream, r, &resp);
    EXPECT_EQ(resp.out().data_case(), v1::Tensor::kRegion);
    device.Download(mirror);
    EXPECT_TRUE(
        client::ShmRegion::InlineFrom(mirror.data(), kRegionBytes, (*region)->name(), &resp).ok());
    return resp;
  };
  {
    const v1::StepRequest p = h_.Make(kLayer, {{"a", 0, 64, 0}, {"c", 0, 64, 0}});
    h_.StepAndCheck(p);
    through_region(p, nullptr, client::ShmRegion::Layout::kPerSpan);
  }
  const client::StepOptions bf16_lse = Bf16WithLse();
  const client::StepOptions mx_rope = Mxfp8WithRope();
  client::StepOptions mx_queries = bf16_lse;
  mx_queries.mxfp8_q = true;
  const std::vector<client::StepOptions> variants = {client::StepOptions{}, bf16_lse, mx_rope,
                                                     mx_queries};
  auto stream = h_.client->OpenStream();
  ASSERT_TRUE(stream.ok());
  int64_t pos = 64;
  for (size_t v = 0; v < variants.size(); ++v) {
    for (auto layout : {client::ShmRegion::Layout::kPerSpan, client::ShmRegion::Layout::kPacked}) {
      const v1::StepRequest req =
          h_.Make(kLayer, {{"a", pos, 6, 5}, {"c", pos, 6, 5}}, variants[v]);
      const v1::StepResponse inline_resp = h_.StepAndCheck(req);
      const v1::StepResponse gpu_resp =
          through_region(req, v % 2 == 0 ? nullptr : stream->get(), layout);
      ExpectSameOutputs(gpu_resp, inline_resp,
                        absl::StrCat("variant ", v, " layout ", static_cast<int>(layout)));
      pos += 6;
    }
  }
  (*stream)->WritesDone();
  EXPECT_TRUE((*stream)->Finish().ok());
}

// Steps through a step ring (in shared memory) whose tensors lie in a GPU region: each answer
// equals the inline one, and what the server holds for a step is let go with it (the ring
// reuses each slot's parse storage), so many calls hold no more server memory.
TEST_F(GpuRegionTest, RingStepsLetGoOfWhatTheyRead) {
  DeviceBuffer device(kRegionBytes);
  auto region = client::GpuRegion::Register(h_.client.get(), device.handle(), kRegionBytes);
  ASSERT_TRUE(region.ok()) << region.status();
  auto ring_region = client::ShmRegion::Create(h_.client.get(), "gpu-ring", 1 << 20);
  ASSERT_TRUE(ring_region.ok()) << ring_region.status();
  ASSERT_TRUE(h_.client->CreateSequence(h_.ModelName(), "a").ok());
  ASSERT_TRUE(h_.client->CreateSequence(h_.ModelName(), "b").ok());
  v1::StepRequest fill = h_.Make(kLayer, {{"a", 0, 64, 0}});
  h_.StepAndCheck(fill);
  fill.mutable_spans(0)->set_sequence_id("b");
  ASSERT_TRUE(h_.client->Step(fill).ok());
  // One decode request of 6 rows, re-sent at the same positions (rows are rewritten).
  v1::StepRequest req = h_.Make(kLayer, {{"a", 64, 6, 5}});
  const v1::StepResponse want = h_.StepAndCheck(req);
  req.mutable_spans(0)->set_sequence_id("b");
  std::vector<uint8_t> mirror(kRegionBytes, 0xA5);
  auto end = client::ShmRegion::PlaceInto(mirror.data(), kRegionBytes, (*region)->name(), &req, 0,
                                          client::ShmRegion::Layout::kPacked);
  ASSERT_TRUE(end.ok()) << end.status();
  device.Upload(mirror, kRegionBytes);
  auto stream = h_.client->OpenStream();
  ASSERT_TRUE(stream.ok());
  auto ring = client::StepRing::Attach(stream->get(), ring_region->get(), 0, 4, 64 << 10);
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto call = [&](int i) {
    v1::StepResponse resp;
    ASSERT_TRUE((*ring)->Call(req, &resp).ok());
    ASSERT_EQ(resp.code(), 0) << resp.message();
    device.Download(mirror);
    ASSERT_TRUE(
        client::ShmRegion::InlineFrom(mirror.data(), kRegionBytes, (*region)->name(), &resp).ok());
    ExpectSameOutputs(resp, want, absl::StrCat("call ", i));
  };
  for (int i = 0; i < 50; ++i) ASSERT_NO_FATAL_FAILURE(call(i));
  const int64_t before = RssBytes(h_.server->pid());
  for (int i = 0; i < 400; ++i) {
    v1::StepResponse resp;
    ASSERT_TRUE((*ring)->Call(req, &resp).ok());
    ASSERT_EQ(resp.code(), 0) << resp.message();
  }
  ASSERT_NO_FATAL_FAILURE(call(450));
  // Each call holds its region mappings and parse storage: kept, 400 calls would grow the
  // server by far more.
  EXPECT_LT(RssBytes(h_.server->pid()) - before, int64_t{8} << 20);
  ring->reset();
  (*stream)->WritesDone();
  EXPECT_TRUE((*stream)->Finish().ok());
}

// Contents of a GPU region are checked on the device (the host never reads them): a top-k id
// its row may not see, a NaN KV row or a NaN MXFP8 query code fails the step with the message
// the inline path gives, changes nothing, and the next valid step gets the reference answer.
TEST_F(GpuRegionTest, BadContentsFailWithTheInlineMessage) {
  DeviceBuffer device(kRegionBytes);
  auto region = client::GpuRegion::Register(h_.client.get(), device.handle(), kRegionBytes);
  ASSERT_TRUE(region.ok()) << region.status();
  ASSERT_TRUE(h_.client->CreateSequence(h_.ModelName(), "s").ok());
  h_.StepAndCheck(h_.Make(kLayer, {{"s", 0, 64, 0}}));
  std::vector<uint8_t> mirror(kRegionBytes);
  client::StepOptions mx_queries;
  mx_queries.mxfp8_q = true;
  const v1::StepRequest good = h_.Make(kLayer, {{"s", 64, 6, 5}}, mx_queries);
  auto poke = [](std::string* bytes, size_t at, const void* v, size_t n) {
    std::memcpy(bytes->data() + at, v, n);
  };
  v1::StepRequest bad_id = good, bad_kv = good, bad_q = good;
  const int32_t past = 1000;  // row 2 sits at position 66: 33 entries of the 1/2 cache visible
  const int64_t width = good.spans(0).topk().shape(1);
  poke(bad_id.mutable_spans(0)->mutable_topk()->mutable_inline_data(), (2 * width + 7) * 4, &past,
       4);
  const uint16_t nan = 0x7fc0;
  poke(bad_kv.mutable_spans(0)->mutable_kv_rows()->mutable_inline_data(), (3 * 512 + 5) * 2, &nan,
       2);
  const uint8_t nan_code = 0x7f;
  poke(bad_q.mutable_spans(0)->mutable_q()->mutable_inline_data(), 9, &nan_code, 1);
  const std::pair<const v1::StepRequest*, const char*> cases[] = {
      {&bad_id, "spans[0].topk[2][7]: entry 1000 not visible at position 66"},
      {&bad_kv, "spans[0].kv_rows[3][5]: nan (KV rows must be finite)"},
      {&bad_q, "spans[0].q[0][0][9]: e4m3 code 0x7f is NaN"}};
  for (const auto& [bad, want] : cases) {
    SCOPED_TRACE(want);
    v1::StepRequest r = *bad;
    ASSERT_TRUE(client::ShmRegion::PlaceInto(mirror.data(), kRegionBytes, (*region)->name(), &r, 0,
                                             client::ShmRegion::Layout::kPacked)
                    .ok());
    device.Upload(mirror, kRegionBytes);
    auto resp = h_.client->Step(r);
    ASSERT_FALSE(resp.ok());
    EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument) << resp.status();
    EXPECT_THAT(std::string(resp.status().message()), HasSubstr(want));
    EXPECT_EQ(h_.Length("s", kLayer), 64);
  }
  h_.StepAndCheck(good);
}

TEST_F(GpuRegionTest, MisuseIsRefused) {
  DeviceBuffer device(1 << 20);
  {  // more bytes than the allocation holds
    auto r = client::GpuRegion::Register(h_.client.get(), device.handle(), 2 << 20);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("size: 2097152 bytes, the allocation holds"));
  }
  {  // a handle that names no memory
    const std::vector<uint8_t> zeros(device.handle().size(), 0);
    auto r = client::GpuRegion::Register(h_.client.get(), zeros, 1 << 20);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("gpu_handle: no device memory"));
  }
  auto region = client::GpuRegion::Register(h_.client.get(), device.handle(), 1 << 20);
  ASSERT_TRUE(region.ok()) << region.status();
  auto seq = h_.client->CreateSequence(h_.ModelName(), "s");
  ASSERT_TRUE(seq.ok());
  h_.StepAndCheck(h_.Make(kLayer, {{"s", 0, 64, 0}}));
  std::vector<uint8_t> mirror(1 << 20);
  v1::StepRequest r = h_.Make(kLayer, {{"s", 64, 6, 5}});
  ASSERT_TRUE(client::ShmRegion::PlaceInto(mirror.data(), 1 << 20, (*region)->name(), &r).ok());
  {  // a reference past the end of the region
    v1::StepRequest bad = r;
    bad.mutable_spans(0)->mutable_q()->mutable_region()->set_offset((1 << 20) - 64);
    auto resp = h_.client->Step(bad);
    ASSERT_FALSE(resp.ok());
    EXPECT_THAT(std::string(resp.status().message()), HasSubstr("spans[0].q.region: offset"));
  }
  // Unregistered: later steps naming it are NOT_FOUND, and the sequence did not move.
  ASSERT_TRUE((*region)->Unregister().ok());
  auto resp = h_.client->Step(r);
  ASSERT_FALSE(resp.ok());
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kNotFound) << resp.status();
  auto length = h_.client->Length(*seq, kLayer);
  ASSERT_TRUE(length.ok());
  EXPECT_EQ(*length, 64);
}

// The child side of KilledMidStep: registers a GPU region of its own device memory, places one
// step in it (inputs and outputs) and sends it; the parent kills it while the step runs.
TEST(GpuRegionChild, StepUntilKilled) {
  ChildClient c;
  ASSERT_NO_FATAL_FAILURE(ConnectChild(&c));
  if (c.client == nullptr) GTEST_SKIP() << "run by GpuRegionOwnerTest.KilledMidStep";
  const v1::ModelInfo& m = c.model;
  ASSERT_TRUE(c.client->CreateSequence(m.profile(), "owner").ok());
  DeviceBuffer device(kRegionBytes);
  auto region = client::GpuRegion::Register(c.client.get(), device.handle(), kRegionBytes);
  ASSERT_TRUE(region.ok()) << region.status();
  v1::StepRequest step = OwnerStep(m);
  std::vector<uint8_t> mirror(kRegionBytes);
  auto end = client::ShmRegion::PlaceInto(mirror.data(), kRegionBytes, (*region)->name(), &step, 0,
                                          client::ShmRegion::Layout::kPerSpan);
  ASSERT_TRUE(end.ok()) << end.status();
  device.Upload(mirror, kRegionBytes);
  SendUntilKilled(*c.client, step);
}

// A client that dies while its step, whose tensors lie in its GPU region, runs (the server holds
// every attention for 1.5 s): the step, launched, completes whole, and the server goes on
// serving the other clients, healthy.
TEST(GpuRegionOwnerTest, KilledMidStep) {
  if (!GpuServer()) GTEST_SKIP() << "GPU regions need a GPU server: set SMLA_TEST_BACKEND=cuda";
  Harness h;
  ASSERT_NO_FATAL_FAILURE(
      h.Start({kDsv41, "--allow_shm", "--inject_attend_delay_ms=1500"}, "dsv4.1-flash"));
  ASSERT_NO_FATAL_FAILURE(h.UploadTables(1024));
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "mine").ok());
  EXPECT_EQ(KillOwnerMidStep(h, "GpuRegionChild.StepUntilKilled"), OwnerStepRows(h.model_))
      << "the launched step was not committed whole";
  h.StepAndCheck(h.Make(0, {{"mine", 0, 4, 0}}));
  EXPECT_TRUE(h.client->Health().value_or(false));
}

}  // namespace
}  // namespace smla::testing
