// The fault-injecting wrapper of --inject_backend_failure_after / --inject_attend_delay_ms
// passes every operation it does not fault to the backend it wraps, the ones kernels::Backend
// gives defaults included: a default would quietly swap the GPU backend's behaviour (its device
// timing, batched and on-device copies, GPU regions) for the CPU backend's under fault tests.
#include "edge/fault_backend.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace smla::server::edge {
namespace {

using ::testing::_;
using ::testing::Return;

class MockBackend : public kernels::Backend {
 public:
  MockBackend() { info_.name = "mock"; }
  const kernels::DeviceInfo& device() const override { return info_; }
  MOCK_METHOD(absl::StatusOr<kernels::Buffer>, Allocate, (size_t), (override));
  MOCK_METHOD(absl::StatusOr<std::unique_ptr<kernels::Stream>>, CreateStream, (), (override));
  MOCK_METHOD(absl::Status, CopyToDevice, (void*, const void*, size_t, kernels::Stream&),
              (override));
  MOCK_METHOD(absl::Status, CopyToHost, (void*, const void*, size_t, kernels::Stream&), (override));
  MOCK_METHOD(absl::Status, Fill, (void*, uint8_t, size_t, kernels::Stream&), (override));
  MOCK_METHOD(absl::Status, CopyBatch,
              (std::span<const kernels::CopyOp>, kernels::CopyDirection, kernels::Stream&),
              (override));
  MOCK_METHOD(absl::Status, WriteRows, (const kernels::WriteRowsParams&, kernels::Stream&),
              (override));
  MOCK_METHOD(absl::Status, ExpandMxfp8Query, (const kernels::ExpandQueryParams&, kernels::Stream&),
              (override));
  MOCK_METHOD(absl::Status, CheckInputs, (const kernels::CheckInputsParams&, kernels::Stream&),
              (override));
  MOCK_METHOD(absl::Status, Attend, (const kernels::AttendParams&, kernels::Stream&), (override));
  MOCK_METHOD(absl::Status, Synchronize, (kernels::Stream&), (override));
  MOCK_METHOD(absl::StatusOr<std::unique_ptr<kernels::Event>>, CreateEvent, (), (override));
  MOCK_METHOD(absl::Status, RecordEvent, (kernels::Event&, kernels::Stream&), (override));
  MOCK_METHOD(absl::StatusOr<double>, ElapsedSeconds,
              (const kernels::Event&, const kernels::Event&), (override));
  MOCK_METHOD(absl::Status, RegisterHostMemory, (void*, size_t), (override));
  MOCK_METHOD(void, UnregisterHostMemory, (void*), (override));
  MOCK_METHOD(absl::StatusOr<kernels::Buffer>, OpenIpcMemory, (std::span<const uint8_t>, size_t),
              (override));
  MOCK_METHOD(absl::StatusOr<kernels::Buffer>, AllocateHost, (size_t), (override));

 private:
  kernels::DeviceInfo info_;
};

// A buffer over `bytes` that owns nothing: what the mock hands back.
absl::StatusOr<kernels::Buffer> Unowned(uint8_t* bytes, size_t size) {
  return kernels::Buffer(bytes, size, nullptr);
}

TEST(FaultBackendTest, PassesEveryOperationThrough) {
  auto owned = std::make_unique<MockBackend>();
  MockBackend& inner = *owned;
  FaultInjectingBackend backend(std::move(owned), FaultOptions{});
  kernels::Stream stream;
  kernels::HostClockEvent a, b;
  std::vector<uint8_t> bytes(64);
  const std::vector<uint8_t> handle(8, 1);
  const std::vector<kernels::CopyOp> copies(2);

  EXPECT_EQ(backend.device().name, "mock");
  EXPECT_CALL(inner, Allocate(64)).WillOnce([&](size_t n) { return Unowned(bytes.data(), n); });
  EXPECT_CALL(inner, CreateStream()).WillOnce([] {
    return absl::StatusOr<std::unique_ptr<kernels::Stream>>(std::make_unique<kernels::Stream>());
  });
  EXPECT_CALL(inner, CopyToDevice(bytes.data(), bytes.data() + 8, 8, _))
      .WillOnce(Return(absl::OkStatus()));
  EXPECT_CALL(inner, CopyToHost(bytes.data(), bytes.data() + 8, 8, _))
      .WillOnce(Return(absl::OkStatus()));
  EXPECT_CALL(inner, Fill(bytes.data(), 7, 8, _)).WillOnce(Return(absl::OkStatus()));
  EXPECT_CALL(inner, CopyBatch(_, kernels::CopyDirection::kOnDevice, _))
      .WillOnce([](std::span<const kernels::CopyOp> c, kernels::CopyDirection, kernels::Stream&) {
        return c.size() == 2 ? absl::OkStatus() : absl::InternalError("copies lost");
      });
  EXPECT_CALL(inner, WriteRows(_, _)).WillOnce(Return(absl::OkStatus()));
  EXPECT_CALL(inner, ExpandMxfp8Query(_, _)).WillOnce(Return(absl::OkStatus()));
  EXPECT_CALL(inner, CheckInputs(_, _)).WillOnce(Return(absl::OkStatus()));
  EXPECT_CALL(inner, Attend(_, _)).WillOnce(Return(absl::OkStatus()));
  EXPECT_CALL(inner, Synchronize(_)).WillOnce(Return(absl::OkStatus()));
  EXPECT_CALL(inner, CreateEvent()).WillOnce([] {
    return absl::StatusOr<std::unique_ptr<kernels::Event>>(
        std::make_unique<kernels::HostClockEvent>());
  });
  EXPECT_CALL(inner, RecordEvent(_, _)).WillOnce(Return(absl::OkStatus()));
  EXPECT_CALL(inner, ElapsedSeconds(_, _)).WillOnce(Return(0.25));
  EXPECT_CALL(inner, RegisterHostMemory(bytes.data(), 64)).WillOnce(Return(absl::OkStatus()));
  EXPECT_CALL(inner, UnregisterHostMemory(bytes.data()));
  EXPECT_CALL(inner, OpenIpcMemory(_, 32)).WillOnce([&](std::span<const uint8_t> h, size_t n) {
    EXPECT_EQ(h.size(), 8u);
    return Unowned(bytes.data(), n);
  });
  EXPECT_CALL(inner, AllocateHost(16)).WillOnce([&](size_t n) { return Unowned(bytes.data(), n); });

  EXPECT_TRUE(backend.Allocate(64).ok());
  EXPECT_TRUE(backend.CreateStream().ok());
  EXPECT_TRUE(backend.CopyToDevice(bytes.data(), bytes.data() + 8, 8, stream).ok());
  EXPECT_TRUE(backend.CopyToHost(bytes.data(), bytes.data() + 8, 8, stream).ok());
  EXPECT_TRUE(backend.Fill(bytes.data(), 7, 8, stream).ok());
  EXPECT_TRUE(backend.CopyBatch(copies, kernels::CopyDirection::kOnDevice, stream).ok());
  EXPECT_TRUE(backend.WriteRows({}, stream).ok());
  EXPECT_TRUE(backend.ExpandMxfp8Query({}, stream).ok());
  EXPECT_TRUE(backend.CheckInputs({}, stream).ok());
  EXPECT_TRUE(backend.Attend({}, stream).ok());
  EXPECT_TRUE(backend.Synchronize(stream).ok());
  EXPECT_TRUE(backend.CreateEvent().ok());
  EXPECT_TRUE(backend.RecordEvent(a, stream).ok());
  EXPECT_EQ(backend.ElapsedSeconds(a, b).value_or(-1.0), 0.25);
  EXPECT_TRUE(backend.RegisterHostMemory(bytes.data(), 64).ok());
  backend.UnregisterHostMemory(bytes.data());
  auto region = backend.OpenIpcMemory(handle, 32);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ(region->size(), 32u);
  EXPECT_TRUE(backend.AllocateHost(16).ok());
}

// Armed with a failure budget, Attend fails with INTERNAL once the budget is spent, and the
// operations around it still pass through.
TEST(FaultBackendTest, AttendFailsOnceArmedAndSpent) {
  auto owned = std::make_unique<MockBackend>();
  MockBackend& inner = *owned;
  FaultOptions options;
  options.attends_before_failure = 1;
  FaultInjectingBackend backend(std::move(owned), options);
  kernels::Stream stream;
  EXPECT_CALL(inner, Attend(_, _)).Times(2).WillRepeatedly(Return(absl::OkStatus()));
  EXPECT_CALL(inner, Synchronize(_)).WillOnce(Return(absl::OkStatus()));
  EXPECT_TRUE(backend.Attend({}, stream).ok());  // not armed: warm-up calls do not count
  backend.Arm();
  EXPECT_TRUE(backend.Attend({}, stream).ok());
  const absl::Status failed = backend.Attend({}, stream);
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_TRUE(backend.Synchronize(stream).ok());
}

}  // namespace
}  // namespace smla::server::edge
